// A dropped connection: the SDK resumes with GET /v1/streams/{id} and Last-Event-ID, and
// every frame arrives exactly once. The drop is real: a TCP proxy cuts the connection.
import assert from "node:assert/strict";
import { test } from "node:test";

import { startStream } from "../dist/index.js";
import { artifact, assertContiguous, startProxy, tagged } from "./helpers.mjs";

test("a drop mid-stream: resumed after the last frame, nothing lost or repeated", async (t) => {
  const proxy = await startProxy({ cutAfterBytes: 700 });
  t.after(() => proxy.close());
  const events = [];
  const handle = startStream({
    baseUrl: proxy.url,
    input: tagged("drop"),
    onEvent: (e) => events.push(e),
  });
  const outcome = await handle.done;
  assert.ok(proxy.cut, "the proxy cut the first connection");
  assert.equal(outcome.reconnects, 1);
  assertContiguous(events);
  assert.equal(outcome.result.answer, "Still here.");
  const words = Array.from({ length: 60 }, (_, i) => `w${i}`).join(" ") + " ";
  assert.equal(outcome.text, words);
  // The second request is the resume, after the last frame the client had.
  assert.match(proxy.requests[0], /^POST \/v1\/stream /);
  assert.match(proxy.requests[1], new RegExp(`^GET /v1/streams/${outcome.streamId} `));
  const lastEventId = Number(/last-event-id: (\d+)/i.exec(proxy.requests[1])[1]);
  assert.ok(lastEventId >= 1 && lastEventId < events.length - 5, `resumed after ${lastEventId}`);
  const recorded = await artifact(outcome.streamId, "frames.ndjson");
  assert.equal(recorded.at(-1).data.reason, "stop"); // the stream ran on through the drop
  assert.equal(recorded.length, outcome.lastEventId);
});

test("resume: false: a drop rejects done with CONNECTION_LOST, and the gateway cancels", async (t) => {
  const proxy = await startProxy({ cutAfterBytes: 700 });
  t.after(() => proxy.close());
  const handle = startStream({ baseUrl: proxy.url, input: tagged("drop"), resume: false });
  await assert.rejects(handle.done, { code: "CONNECTION_LOST", retryable: true });
  assert.equal(proxy.requests.filter((r) => r.startsWith("GET ")).length, 0); // no resume
  const recorded = await artifact(handle.streamId, "frames.ndjson");
  // The gateway ended it at the drop (or at the SDK's cancel, should that come first).
  assert.ok(["client_disconnected", "cancelled"].includes(recorded.at(-1).data.reason));
});

test("a resume that keeps failing gives up after its attempts: CONNECTION_LOST", async (t) => {
  // The proxy cuts the POST's response, then closes: each resume finds nothing listening.
  const proxy = await startProxy({ cutAfterBytes: 700 });
  const handle = startStream({
    baseUrl: proxy.url,
    input: tagged("drop"),
    resume: { attempts: 2, delayMs: 50 },
  });
  // Close the proxy as soon as it has cut: the resume finds nothing listening.
  const closing = (async () => {
    while (!proxy.cut) await new Promise((r) => setTimeout(r, 5));
    await proxy.close();
  })();
  t.after(() => closing);
  await assert.rejects(handle.done, (error) => {
    assert.equal(error.code, "CONNECTION_LOST");
    assert.match(error.message, /could not resume stream s_\w+ after frame \d+ \(2 attempts\)/);
    return true;
  });
  // With on_disconnect "continue" the gateway runs the stream on; the SDK's best-effort
  // cancel could not reach it through the closed proxy, so it ends by itself.
  const recorded = await artifact(handle.streamId, "frames.ndjson");
  assert.equal(recorded.at(-1).event, "done");
});

test("a stream the gateway no longer has (404) is NOT_FOUND at once, not retried", async (t) => {
  const proxy = await startProxy({ cutAfterBytes: 700, forgetStream: true });
  t.after(() => proxy.close());
  const handle = startStream({ baseUrl: proxy.url, input: tagged("drop") });
  await assert.rejects(handle.done, { code: "NOT_FOUND", status: 404 });
  // One resume, no retry loop (a third connection, the SDK's cancel, may follow).
  assert.equal(proxy.requests.filter((r) => r.startsWith("GET ")).length, 1);
  assert.match(proxy.requests[1], /^GET \/v1\/streams\/s_expired /);
  // Giving up, the SDK cancels the stream it can no longer read: nothing runs on.
  const recorded = await artifact(handle.streamId, "frames.ndjson");
  assert.equal(recorded.at(-1).data.reason, "cancelled");
});
