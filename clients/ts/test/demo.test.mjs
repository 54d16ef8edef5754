// The demo request (docs/protocol.md) through startStream: search, book, an Action object, the reply;
// every callback, in order, with the values the gateway validated.
import assert from "node:assert/strict";
import { test } from "node:test";

import { EVENT_NAMES, getRun, listRuns, startStream } from "../dist/index.js";
import { artifact, assertContiguous, URL_ } from "./helpers.mjs";

test("the demo: two server tools, an OBJECT frame and the RESULT", async () => {
  const events = [];
  const text = [];
  const json = [];
  const results = [];
  const handle = startStream({
    baseUrl: URL_,
    input: "Find pizza near me; book a table at 7pm if open.",
    objectSchemas: ["Action"],
    profile: "demo",
    onEvent: (e) => events.push(e),
    onText: (chunk) => text.push(chunk),
    onJSON: (u) => json.push(u),
    onResult: (u) => results.push(u),
    onToolCall: () => assert.fail("no client tool in the demo"),
  });
  const outcome = await handle.done;

  assertContiguous(events);
  assert.ok(events.every((e) => EVENT_NAMES.includes(e.event)));
  assert.equal(outcome.reason, "stop");
  assert.equal(outcome.streamId, handle.streamId);
  assert.match(outcome.streamId, /^s_/);
  assert.equal(outcome.reconnects, 0);
  assert.equal(outcome.lastEventId, events.at(-1).id);

  const calls = events.filter((e) => e.event === "tool.call").map((e) => e.data);
  assert.deepEqual(
    calls.map((c) => c.name),
    ["places.search", "bookings.create"],
  );
  assert.ok(calls.every((c) => c.executor !== "client")); // the gateway ran them
  assert.deepEqual(calls[1].args, { place_id: "trattoria-roma", time: "19:00", party_size: 2 });
  const toolResults = events.filter((e) => e.event === "tool.result").map((e) => e.data);
  assert.ok(toolResults.every((r) => r.ok === true));
  assert.ok(toolResults[0].result.places.some((p) => p.id === "trattoria-roma"));

  // onJSON: begin (with its schema), the body's pieces, the END's validated value.
  assert.deepEqual(json[0], { id: "o1", schema: "Action" });
  const body = json.filter((u) => u.delta !== undefined).map((u) => u.delta).join("");
  assert.deepEqual(JSON.parse(body), { mode: "book", target: { kind: "place", id: "trattoria-roma" } });
  assert.deepEqual(json.at(-1), {
    id: "o1",
    end: true,
    value: { mode: "book", target: { kind: "place", id: "trattoria-roma" } },
    repaired: false,
    degraded: false,
  });
  assert.deepEqual(outcome.objects.map((o) => o.value), [json.at(-1).value]);

  assert.deepEqual(results[0], { id: "r1", schema: "AssistantReply" });
  assert.equal(results.at(-1).end, true);
  assert.equal(outcome.result.answer, "Booked a table for 2 at Trattoria Roma at 19:00.");
  assert.equal(outcome.resultFrame.degraded, false);

  assert.equal(outcome.text, text.join(""));
  assert.match(outcome.text, /Let me look for pizza places\. .*Trattoria Roma is open at 7pm\./s);

  // What the client saw is what the gateway recorded, and what a replay gets back.
  const recorded = await artifact(outcome.streamId, "frames.ndjson");
  const seen = events.filter((e) => e.event !== "ping");
  assert.deepEqual(recorded.map((f) => [f.id, f.event]), seen.map((e) => [e.id, e.event]));
  await artifact(outcome.streamId, "metrics.json"); // the last file written: the run is listed
  const listed = await listRuns({ baseUrl: URL_, limit: 500 });
  const mine = listed.find((r) => r.stream_id === outcome.streamId);
  assert.equal(mine.reason, "stop");
  assert.equal(mine.input, "Find pizza near me; book a table at 7pm if open.");
  const run = await getRun(outcome.streamId, { baseUrl: URL_ });
  assert.deepEqual(run.frames, seen);
  await assert.rejects(getRun("s_nothing", { baseUrl: URL_ }), { code: "NOT_FOUND", status: 404 });
});

test("typed errors before the stream: a bad body is BAD_REQUEST with its details", async () => {
  const handle = startStream({ baseUrl: URL_, input: "x", extra: { inptu: "typo" } });
  await assert.rejects(handle.done, (error) => {
    assert.equal(error.name, "ToolForgeError");
    assert.equal(error.code, "BAD_REQUEST");
    assert.equal(error.status, 422);
    assert.match(error.message, /did you mean 'input'/);
    assert.equal(error.details[0].field, "inptu");
    return true;
  });
});

test("an unreachable gateway is CONNECTION_LOST, never a hang", async () => {
  const handle = startStream({ baseUrl: "http://127.0.0.1:9", input: "x" });
  await assert.rejects(handle.done, { name: "ToolForgeError", code: "CONNECTION_LOST" });
});

test("messages and an Idempotency-Key: the same key replays the stored stream", async () => {
  const key = `k-${process.pid}-${Date.now()}`;
  const run = async () => {
    const events = [];
    const outcome = await startStream({
      baseUrl: URL_,
      messages: [{ role: "user", content: "show me [case:xss]" }],
      idempotencyKey: key,
      onEvent: (e) => events.push(e),
    }).done;
    return { outcome, events: events.filter((e) => e.event !== "ping") };
  };
  const first = await run();
  const again = await run();
  assert.equal(again.outcome.streamId, first.outcome.streamId);
  assert.deepEqual(again.events, first.events);
  assert.match(first.outcome.result.answer, /^Answer <img/);
});
