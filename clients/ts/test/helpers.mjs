// Shared by the SDK's tests: where the gateway is (started in front of the scripted
// upstream of tests/clients/cases.py by `npm test`, test/run.mjs, or by
// tests/clients/test_ts_sdk.py), its artifacts, and a TCP proxy that can cut a connection
// (a real drop, not a mocked one).
import assert from "node:assert/strict";
import { readFile } from "node:fs/promises";
import net from "node:net";
import { join } from "node:path";

export const URL_ = process.env.TOOLFORGE_URL;
export const ARTIFACTS = process.env.TOOLFORGE_ARTIFACTS;
if (!URL_ || !ARTIFACTS) {
  throw new Error(
    "TOOLFORGE_URL and TOOLFORGE_ARTIFACTS are unset: run these tests with `npm test` " +
      "(test/run.mjs starts a gateway) or from tests/clients/test_ts_sdk.py",
  );
}

/** The request input that selects a scripted case (tests/clients/cases.py). */
export const tagged = (c, text = "hello") => `${text} [case:${c}]`;

/** A run's artifact file, once the gateway has written it (just after `done`). */
export async function artifact(streamId, file, timeoutMs = 10000) {
  const path = join(ARTIFACTS, "runs", streamId, file);
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      const text = await readFile(path, "utf8");
      return file.endsWith(".ndjson")
        ? text.trim().split("\n").map((line) => JSON.parse(line))
        : JSON.parse(text);
    } catch (error) {
      if (Date.now() > deadline) throw error;
      await new Promise((r) => setTimeout(r, 25));
    }
  }
}

/** Frame ids as received: 1..n, each once, in order (pings have none). */
export function assertContiguous(events) {
  const ids = events.filter((e) => e.event !== "ping").map((e) => e.id);
  assert.deepEqual(ids, Array.from({ length: ids.length }, (_, i) => i + 1));
  assert.equal(events.filter((e) => e.event === "done").length, 1);
  assert.equal(events.filter((e) => e.event !== "ping").at(-1).event, "done");
}

/**
 * A TCP proxy to the gateway. `cut(n)`: the first connection whose response has passed
 * `n` bytes is destroyed on both sides (the client sees its body fail mid-stream, the
 * gateway sees its client go). `forgetStream`: later resumes (GET) ask for an unknown
 * stream id instead (a stream that expired). `requests` keeps each request head.
 */
export async function startProxy({ cutAfterBytes, forgetStream = false } = {}) {
  const target = new URL(URL_);
  const requests = [];
  let cutDone = false;
  const sockets = new Set();
  const server = net.createServer((client) => {
    const upstream = net.connect(Number(target.port), target.hostname);
    sockets.add(client).add(upstream);
    let head = "";
    let received = 0;
    const index = requests.length;
    requests.push("");
    client.on("data", (chunk) => {
      if (forgetStream && index > 0) {
        chunk = Buffer.from(
          chunk.toString("latin1").replace(/^GET \/v1\/streams\/s_\w+/, "GET /v1/streams/s_expired"),
          "latin1",
        );
      }
      if (head.length < 4096) {
        head += chunk.toString("latin1");
        requests[index] = head.split("\r\n\r\n")[0];
      }
      upstream.write(chunk);
    });
    upstream.on("data", (chunk) => {
      received += chunk.length;
      if (!cutDone && cutAfterBytes !== undefined && received > cutAfterBytes) {
        cutDone = true;
        client.write(chunk.subarray(0, chunk.length - (received - cutAfterBytes)));
        client.destroy();
        upstream.destroy();
        return;
      }
      client.write(chunk);
    });
    const close = () => {
      client.destroy();
      upstream.destroy();
    };
    client.on("error", close).on("close", close);
    upstream.on("error", close).on("close", close);
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    requests,
    get cut() {
      return cutDone;
    },
    async close() {
      for (const s of sockets) s.destroy();
      await new Promise((resolve) => server.close(resolve));
    },
  };
}
