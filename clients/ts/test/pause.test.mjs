// pause() and resume() are the gateway's commands (docs/protocol.md §7): the gateway stops
// reading the model, so no new model tokens come through until resume(); events keep being
// delivered (stream.paused, what was made before). Over HTTP (sse) and on the socket (ws).
// The "slow" case trickles 200 tokens 50 ms apart: unpaused, 1 s brings about 20.
import assert from "node:assert/strict";
import { test } from "node:test";

import { startStream } from "../dist/index.js";
import { assertContiguous, startProxy, tagged, URL_ } from "./helpers.mjs";

const WebSocket =
  globalThis.WebSocket ??
  (await import(new URL("../../../tests/node/node_modules/undici/index.js", import.meta.url)))
    .WebSocket;

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const count = (events, name) => events.filter((e) => e.event === name).length;

async function until(events, predicate) {
  const deadline = Date.now() + 5000;
  while (!predicate(events)) {
    if (Date.now() > deadline) throw new Error(`waited 5 s: ${events.map((e) => e.event)}`);
    await sleep(10);
  }
}

for (const transport of ["sse", "ws"]) {
  test(`${transport}: pause stops the model on the gateway until resume`, async (t) => {
    // Through a proxy that records each request: on ws, the commands never post.
    const proxy = await startProxy();
    t.after(() => proxy.close());
    const events = [];
    const handle = startStream({
      baseUrl: proxy.url,
      transport,
      WebSocket,
      input: tagged("slow"),
      onEvent: (e) => events.push(e),
    });
    await until(events, (es) => count(es, "text.delta") >= 3);
    const paused = await handle.pause();
    assert.deepEqual(paused, { stream_id: handle.streamId, paused: true });
    assert.equal(handle.paused, true);
    await until(events, (es) => count(es, "stream.paused") === 1);
    const atPause = events.length;
    await sleep(1000); // about 20 tokens' time
    const held = events.slice(atPause);
    // What the model made before the pause landed (one read at most), nothing after.
    assert.ok(count(held, "text.delta") <= 2, `${count(held, "text.delta")} tokens while paused`);
    assert.equal(count(events, "stream.resumed"), 0);

    assert.deepEqual(await handle.resume(), { stream_id: handle.streamId, paused: false });
    assert.equal(handle.paused, false);
    await until(events, (es) => count(es, "stream.resumed") === 1);
    const atResume = events.length;
    await until(events, (es) => count(es.slice(atResume), "text.delta") >= 3); // it goes on
    await handle.cancel();
    const outcome = await handle.done;
    assert.equal(outcome.reason, "cancelled");
    assertContiguous(events);
    const resumed = events.find((e) => e.event === "stream.resumed");
    assert.equal(resumed.data.reason, "resumed");
    assert.ok(resumed.data.paused_ms >= 900, `paused ${resumed.data.paused_ms} ms`);
    // The text is whole and in order: t0 t1 t2 ...
    const words = outcome.text.trim().split(" ");
    assert.deepEqual(words, words.map((_, i) => `t${i}`));
    if (transport === "ws") {
      const posts = proxy.requests.filter((r) => /\/(pause|resume)\b/.test(r));
      assert.deepEqual(posts, []); // on the socket, not over HTTP
    }
  });
}

test("a pause asked before the stream id is known is sent with stream.begin", async () => {
  const events = [];
  const handle = startStream({ baseUrl: URL_, input: tagged("slow"), onEvent: (e) => events.push(e) });
  assert.equal(await handle.pause(), undefined); // no id yet: sent later
  await until(events, (es) => count(es, "stream.paused") === 1);
  await sleep(500);
  assert.ok(count(events, "text.delta") <= 2, `${count(events, "text.delta")} tokens`);
  await handle.resume();
  await until(events, (es) => count(es, "text.delta") >= 4);
  await handle.cancel();
  assert.equal((await handle.done).reason, "cancelled");
});
