// The SDK's frame types are generated from the gateway's JSON Schemas: they must not drift.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { generate } from "../scripts/gen-frames.mjs";
import { EVENT_NAMES } from "../dist/index.js";

const schemas = new URL("../../../schemas/frames/frames.json", import.meta.url);
const generated = new URL("../src/frames.ts", import.meta.url);

test("src/frames.ts is what schemas/frames/frames.json generates (npm run gen)", () => {
  const fresh = generate(JSON.parse(readFileSync(schemas, "utf8")));
  assert.equal(
    readFileSync(generated, "utf8"),
    fresh,
    "clients/ts/src/frames.ts is stale: run `npm run gen --prefix clients/ts` and commit it",
  );
});

test("EVENT_NAMES lists every event of the protocol", () => {
  const root = JSON.parse(readFileSync(schemas, "utf8"));
  assert.deepEqual([...EVENT_NAMES], Object.keys(root.$defs.StreamEvent.discriminator.mapping));
});

test("the generator refuses a schema keyword it cannot express", () => {
  const root = JSON.parse(readFileSync(schemas, "utf8"));
  root.$defs.TextDelta.properties.chunk = { type: "string", if: { const: "x" } };
  assert.throws(() => generate(root), /unsupported JSON Schema keyword if/);
});
