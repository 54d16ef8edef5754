// cancel(), the caller's signal and requestTimeoutMs: each stops the stream on the gateway
// (the model's request is closed), and `done` says how it ended.
import assert from "node:assert/strict";
import { test } from "node:test";

import { startStream, ToolForgeError } from "../dist/index.js";
import { artifact, tagged, URL_ } from "./helpers.mjs";

const lastFrame = async (streamId) => (await artifact(streamId, "frames.ndjson")).at(-1);

test("cancel() mid-stream: done resolves with reason cancelled, within a moment", async () => {
  let handle;
  let cancelledAt;
  handle = startStream({
    baseUrl: URL_,
    input: tagged("slow"),
    onText: () => {
      if (cancelledAt === undefined) {
        cancelledAt = Date.now();
        void handle.cancel();
      }
    },
  });
  const outcome = await handle.done;
  assert.equal(outcome.reason, "cancelled");
  assert.ok(Date.now() - cancelledAt < 5000); // "a moment": never a hang, even on a busy machine
  assert.ok(outcome.text.length < 600, "the model was stopped long before its 10 s (890 chars)");
  assert.equal((await lastFrame(outcome.streamId)).data.reason, "cancelled");
});

test("cancel() while paused still ends the stream", async () => {
  let handle;
  let once = false;
  handle = startStream({
    baseUrl: URL_,
    input: tagged("slow"),
    onText: () => {
      if (!once) {
        once = true;
        handle.pause();
        setTimeout(() => void handle.cancel(), 100);
      }
    },
  });
  const outcome = await handle.done;
  assert.equal(outcome.reason, "cancelled");
  assert.equal(handle.paused, false);
});

test("the caller's signal aborts: done rejects ABORTED and the gateway cancels", async () => {
  const controller = new AbortController();
  const handle = startStream({
    baseUrl: URL_,
    input: tagged("slow"),
    signal: controller.signal,
    onText: () => controller.abort(new Error("user left")),
  });
  await assert.rejects(handle.done, (error) => {
    assert.ok(error instanceof ToolForgeError);
    assert.equal(error.code, "ABORTED");
    assert.equal(error.cause.message, "user left");
    return true;
  });
  assert.equal((await lastFrame(handle.streamId)).data.reason, "cancelled");
});

test("requestTimeoutMs: done rejects REQUEST_TIMEOUT and the stream is cancelled", async () => {
  const started = Date.now();
  const handle = startStream({ baseUrl: URL_, input: tagged("slow"), requestTimeoutMs: 400 });
  await assert.rejects(handle.done, { code: "REQUEST_TIMEOUT", retryable: true });
  const took = Date.now() - started;
  assert.ok(took >= 400 && took < 5000, `took ${took} ms`);
  assert.equal((await lastFrame(handle.streamId)).data.reason, "cancelled");
});

test("a callback that throws ends the run with its error, and the stream is cancelled", async () => {
  const boom = new Error("bug in onText");
  const handle = startStream({
    baseUrl: URL_,
    input: tagged("slow"),
    onText: () => {
      throw boom;
    },
  });
  await assert.rejects(handle.done, (error) => error === boom);
  assert.equal((await lastFrame(handle.streamId)).data.reason, "cancelled");
});
