// After `tsc`: copies the SDK's one runtime dependency, eventsource-parser's ESM build, to
// dist/vendor/, so that a browser can load dist/ as it is (the demo UI maps the bare
// specifier "eventsource-parser" there with an import map: no bundler, no CDN).
import { copyFileSync, mkdirSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const pkg = dirname(createRequire(import.meta.url).resolve("eventsource-parser/package.json"));
mkdirSync(join(root, "dist", "vendor"), { recursive: true });
copyFileSync(join(pkg, "dist", "index.js"), join(root, "dist", "vendor", "eventsource-parser.js"));
copyFileSync(join(pkg, "LICENSE"), join(root, "dist", "vendor", "eventsource-parser.LICENSE"));
