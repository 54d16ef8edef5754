// Client-side tools (docs/tools.md): the SDK runs onToolCall and posts its result; the model
// resumes. Failures and the per-tool timeout reach the model as error results.
import assert from "node:assert/strict";
import { test } from "node:test";

import { startStream } from "../dist/index.js";
import { artifact, assertContiguous, tagged, URL_ } from "./helpers.mjs";

const WEATHER = {
  name: "get_weather",
  description: "The weather in a city, from the user's device.",
  parameters: {
    type: "object",
    properties: { city: { type: "string" } },
    required: ["city"],
    additionalProperties: false,
  },
};

function weatherStream(onToolCall, extra = {}) {
  const events = [];
  const handle = startStream({
    baseUrl: URL_,
    input: tagged("client", "Weather in Oslo?"),
    tools: [],
    clientTools: [WEATHER],
    onToolCall,
    onEvent: (e) => events.push(e),
    ...extra,
  });
  return { handle, events };
}

const toolResult = (events) => events.find((e) => e.event === "tool.result").data;

test("a client tool runs in the client, its result is posted, the model resumes", async () => {
  const seen = [];
  const { handle, events } = weatherStream(async (call) => {
    seen.push(call);
    assert.equal(call.signal.aborted, false);
    return { sky: "clear", celsius: 21 };
  });
  const outcome = await handle.done;
  assertContiguous(events);
  assert.equal(seen.length, 1);
  assert.equal(seen[0].id, "t1");
  assert.equal(seen[0].name, "get_weather");
  assert.deepEqual(seen[0].args, { city: "Oslo" });
  assert.equal(seen[0].streamId, outcome.streamId);
  const call = events.find((e) => e.event === "tool.call").data;
  assert.equal(call.executor, "client");
  const result = toolResult(events);
  assert.equal(result.ok, true);
  assert.deepEqual(result.result, { sky: "clear", celsius: 21 });
  assert.equal(outcome.result.answer, "It is sunny in Oslo.");
  const logs = await artifact(outcome.streamId, "tool_logs.json");
  assert.deepEqual(logs[0].result, { sky: "clear", celsius: 21 });
});

test("a tool that throws: the model reads the error, with the tool's own code", async () => {
  const { handle, events } = weatherStream(() => {
    throw Object.assign(new Error("location services are off"), { code: "GPS_OFF" });
  });
  const outcome = await handle.done;
  const result = toolResult(events);
  assert.equal(result.ok, false);
  assert.equal(result.error.code, "TOOL_FAILED");
  assert.equal(result.error.message, "location services are off");
  assert.deepEqual(result.error.details, [{ client_code: "GPS_OFF" }]);
  assert.equal(outcome.reason, "stop"); // the model went on
});

test("toolTimeoutMs: a tool past it is aborted, the model gets CLIENT_TOOL_TIMEOUT", async () => {
  let aborted;
  const started = Date.now();
  const { handle, events } = weatherStream(
    (call) =>
      new Promise((_, reject) => {
        call.signal.addEventListener("abort", () => {
          aborted = Date.now() - started;
          reject(call.signal.reason);
        });
      }),
    { toolTimeoutMs: 300 },
  );
  const outcome = await handle.done;
  assert.ok(aborted >= 280 && aborted < 5000, `aborted after ${aborted} ms`);
  const result = toolResult(events);
  assert.equal(result.ok, false);
  assert.deepEqual(result.error.details, [{ client_code: "CLIENT_TOOL_TIMEOUT" }]);
  assert.match(result.error.message, /within 300 ms/);
  assert.equal(outcome.reason, "stop");
});

test("no onToolCall: the call is answered CLIENT_TOOL_UNHANDLED, nothing waits", async () => {
  const started = Date.now();
  const { handle, events } = weatherStream(undefined);
  await handle.done;
  assert.ok(Date.now() - started < 5000);
  assert.deepEqual(toolResult(events).error.details, [{ client_code: "CLIENT_TOOL_UNHANDLED" }]);
});

test("onApproval decides a call that needs approval", async () => {
  for (const approve of [true, false]) {
    const asked = [];
    const events = [];
    const handle = startStream({
      baseUrl: URL_,
      input: tagged("approve"),
      onApproval: (call) => {
        asked.push(call);
        return approve;
      },
      onEvent: (e) => events.push(e),
    });
    const outcome = await handle.done;
    assert.equal(asked.length, 1);
    assert.equal(asked[0].name, "conf.approve");
    assert.equal(asked[0].needs_approval, true);
    assert.equal(asked[0].streamId, outcome.streamId);
    const result = toolResult(events);
    assert.equal(result.ok, approve);
    if (!approve) assert.equal(result.error.code, "TOOL_APPROVAL_DENIED");
  }
});

test("handle.approve approves a waiting call", async () => {
  const events = [];
  let handle;
  handle = startStream({
    baseUrl: URL_,
    input: tagged("approve"),
    onEvent: (e) => {
      events.push(e);
      if (e.event === "tool.call" && e.data.needs_approval) {
        handle.approve(e.data.id).catch((error) => assert.fail(error));
      }
    },
  });
  const outcome = await handle.done;
  assert.equal(toolResult(events).ok, true);
  assert.equal(outcome.result.answer, "Done: the order is placed.");
});
