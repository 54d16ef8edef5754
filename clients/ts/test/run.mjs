// `npm test`: the SDK's tests against a gateway. With TOOLFORGE_URL (and
// TOOLFORGE_ARTIFACTS) set, against that gateway, as tests/clients/test_ts_sdk.py runs
// them. Unset, this script starts one itself: the repository's gateway in front of the
// scripted model of tests/clients/cases.py (`python -m tests.clients.serve`, from the
// Python environment `make install` makes at the repository's root, or TOOLFORGE_PYTHON),
// runs the tests, and stops it.
import { spawn, spawnSync } from "node:child_process";
import { existsSync, readdirSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const repo = resolve(here, "..", "..", "..");
const files = readdirSync(here)
  .filter((name) => name.endsWith(".test.mjs"))
  .sort()
  .map((name) => join(here, name));

function runTests(env) {
  const node = spawn(process.execPath, ["--test", ...files], { env, stdio: "inherit" });
  return new Promise((done) => node.on("exit", (code, signal) => done(code ?? (signal ? 1 : 0))));
}

function fail(message) {
  console.error(`npm test: ${message}`);
  process.exit(1);
}

if (process.env.TOOLFORGE_URL) {
  process.exit(await runTests(process.env));
}

const python = process.env.TOOLFORGE_PYTHON ?? join(repo, ".venv", "bin", "python");
const setup =
  "run `make install` at the repository's root (it makes .venv with the gateway), " +
  "set TOOLFORGE_PYTHON to a Python that has the toolforge package, or set TOOLFORGE_URL " +
  "and TOOLFORGE_ARTIFACTS to a gateway of yours that serves tests/clients/cases.py";
if (!existsSync(join(repo, "tests", "clients", "serve.py"))) {
  fail(`the gateway these tests start lives in the ToolForge repository (${repo} is not it): ${setup}`);
}
if (!existsSync(python)) fail(`no Python environment at ${python}: ${setup}`);
const probe = spawnSync(python, ["-c", "import toolforge, tests.clients.serve"], { cwd: repo });
if (probe.status !== 0) {
  fail(`${python} cannot import the gateway (${String(probe.stderr).trim().split("\n").pop()}): ${setup}`);
}

const gateway = spawn(python, ["-m", "tests.clients.serve"], {
  cwd: repo,
  stdio: ["pipe", "pipe", "inherit"],
});
const stop = () => gateway.stdin.end();
process.on("exit", () => gateway.kill());
const first = await new Promise((resolveLine, reject) => {
  createInterface({ input: gateway.stdout }).once("line", resolveLine);
  gateway.once("exit", (code) => reject(new Error(`the gateway exited (${code}) before it answered`)));
  setTimeout(() => reject(new Error("the gateway did not answer within 60 s")), 60_000).unref();
}).catch((error) => fail(error.message));
const { url, artifacts } = JSON.parse(first);
console.log(`npm test: a gateway at ${url} (tests/clients/serve.py), artifacts in ${artifacts}`);
const code = await runTests({ ...process.env, TOOLFORGE_URL: url, TOOLFORGE_ARTIFACTS: artifacts });
stop();
await new Promise((done) => {
  gateway.once("exit", done);
  setTimeout(() => gateway.kill(), 10_000).unref();
});
process.exit(code);
