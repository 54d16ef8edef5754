// pause() stops reading: the gateway's queue fills behind the socket buffers, the gateway
// stops reading the model (docs/protocol.md §7), and after resume() nothing is missing.
import assert from "node:assert/strict";
import { test } from "node:test";

import { startStream } from "../dist/index.js";
import { artifact, assertContiguous, tagged, URL_ } from "./helpers.mjs";

// tests/clients/cases.py: PAUSE_CHUNKS chunks of PAUSE_CHUNK_CHARS, each starting "<i>".
const CHUNKS = 1500;
const CHARS = 4000;
const chunk = (i) => `<${i}>`.padEnd(CHARS, "x");

test("pause for 2 s with a fast upstream: the queue fills, the model waits, nothing is lost", async () => {
  const events = [];
  let pausedAt;
  let deliveredWhilePaused = 0;
  let handle;
  handle = startStream({
    baseUrl: URL_,
    input: tagged("pause"),
    onEvent: (e) => {
      events.push(e);
      if (handle?.paused) deliveredWhilePaused++;
    },
    onText: () => {
      if (pausedAt === undefined) {
        pausedAt = Date.now();
        handle.pause();
        setTimeout(() => handle.resume(), 2000);
      }
    },
  });
  const outcome = await handle.done;
  const resumedAfter = Date.now() - pausedAt;

  assert.ok(resumedAfter >= 2000, `resumed after ${resumedAfter} ms`);
  assert.equal(deliveredWhilePaused, 0, "no callback fires while paused");
  assertContiguous(events);
  const expected = Array.from({ length: CHUNKS }, (_, i) => chunk(i)).join("");
  assert.equal(outcome.text.length, expected.length);
  assert.ok(outcome.text === expected, "the text arrived whole and in order");
  assert.equal(outcome.result.answer, "That was long.");
  assert.equal(outcome.reason, "stop");

  // The gateway's side: its queue filled and it stopped reading the upstream for most of
  // the pause (the rest went to filling the socket buffers).
  const metrics = await artifact(outcome.streamId, "metrics.json");
  assert.equal(metrics.queue_high_water, metrics.queue_max_frames);
  assert.ok(metrics.queue_paused_ms >= 500, `upstream paused ${metrics.queue_paused_ms} ms`);
});
