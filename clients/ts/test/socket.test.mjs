// transport: "ws" (docs/websocket.md): the same frames over one WebSocket, a client tool's
// result and an approval sent on the socket, a dropped socket resumed on a new one. A TCP
// proxy in front of the gateway records each connection's request: a stream whose
// commands go on its socket opens one connection, and never posts.
import assert from "node:assert/strict";
import { test } from "node:test";

import { startStream } from "../dist/index.js";
import { assertContiguous, startProxy, tagged } from "./helpers.mjs";

// Node >= 22 and browsers have a global WebSocket; on Node 20, undici's (the same
// implementation), from the node tests' dependencies.
const WebSocket =
  globalThis.WebSocket ??
  (await import(new URL("../../../tests/node/node_modules/undici/index.js", import.meta.url)))
    .WebSocket;

const WEATHER = {
  name: "get_weather",
  description: "The weather in a city, from the user's device.",
  parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
};

async function throughProxy(t, options = {}) {
  const proxy = await startProxy(options);
  t.after(() => proxy.close());
  return proxy;
}

test("ws: a client tool's result goes on the socket, the model resumes", async (t) => {
  const proxy = await throughProxy(t);
  const events = [];
  const handle = startStream({
    baseUrl: proxy.url,
    transport: "ws",
    WebSocket,
    input: tagged("client", "Weather in Oslo?"),
    tools: [],
    clientTools: [WEATHER],
    onToolCall: async (call) => ({ city: call.args.city, sky: "clear" }),
    onEvent: (e) => events.push(e),
  });
  const outcome = await handle.done;
  assertContiguous(events);
  assert.equal(outcome.result.answer, "It is sunny in Oslo.");
  const result = events.find((e) => e.event === "tool.result").data;
  assert.equal(result.ok, true);
  assert.deepEqual(result.result, { city: "Oslo", sky: "clear" });
  assert.equal(proxy.requests.length, 1); // the socket only: no POST of the result
  assert.match(proxy.requests[0], /^GET \/v1\/stream\/ws /);
  assert.match(proxy.requests[0], /upgrade: websocket/i);
});

test("ws: approvals by onApproval and by handle.approve go on the socket", async (t) => {
  const proxy = await throughProxy(t);
  for (const approve of [true, false]) {
    const events = [];
    const handle = startStream({
      baseUrl: proxy.url,
      transport: "ws",
      WebSocket,
      input: tagged("approve"),
      onApproval: () => approve,
      onEvent: (e) => events.push(e),
    });
    await handle.done;
    const result = events.find((e) => e.event === "tool.result").data;
    assert.equal(result.ok, approve);
    if (!approve) assert.equal(result.error.code, "TOOL_APPROVAL_DENIED");
  }
  const events = [];
  let handle;
  const answered = [];
  handle = startStream({
    baseUrl: proxy.url,
    transport: "ws",
    WebSocket,
    input: tagged("approve"),
    onEvent: (e) => {
      events.push(e);
      if (e.event === "tool.call" && e.data.needs_approval) {
        answered.push(handle.approve(e.data.id));
      }
    },
  });
  const outcome = await handle.done;
  await Promise.all(answered);
  assert.equal(answered.length, 1);
  assert.equal(events.find((e) => e.event === "tool.result").data.ok, true);
  assert.equal(outcome.result.answer, "Done: the order is placed.");
  assert.equal(proxy.requests.length, 3); // three sockets, nothing posted
  assert.ok(proxy.requests.every((r) => r.startsWith("GET /v1/stream/ws ")));
});

// Cut past the handshake's answer and the first message, which may hold several frames
// (toolforge.frames.v1): a socket cut before its first frame has no stream to resume.
const CUT_AFTER_BYTES = 800;

test("ws: a dropped socket resumes on a new one after the last frame", async (t) => {
  const proxy = await throughProxy(t, { cutAfterBytes: CUT_AFTER_BYTES });
  const events = [];
  const handle = startStream({
    baseUrl: proxy.url,
    transport: "ws",
    WebSocket,
    input: tagged("drop"),
    onEvent: (e) => events.push(e),
  });
  const outcome = await handle.done;
  assert.ok(proxy.cut, "the proxy cut the first socket");
  assert.equal(outcome.reconnects, 1);
  assertContiguous(events); // every frame once
  assert.equal(outcome.result.answer, "Still here.");
  const words = Array.from({ length: 60 }, (_, i) => `w${i}`).join(" ") + " ";
  assert.equal(outcome.text, words);
  assert.equal(proxy.requests.length, 2);
  assert.match(proxy.requests[1], /^GET \/v1\/stream\/ws /);
});

// The socket offers the subprotocol toolforge.frames.v1; a gateway that selects it sends
// each batch of frames as one message of JSON lines. A constructor that leaves the offer
// out stands for a gateway that selects none: one frame per message, read the same.
function spying(Base, { offer = true } = {}) {
  const made = [];
  class Spy extends Base {
    constructor(url, protocols) {
      super(url, offer ? protocols : undefined);
      this.messages = [];
      this.addEventListener("message", (event) => this.messages.push(String(event.data)));
      made.push(this);
    }
  }
  return { Spy, made };
}

for (const offer of [true, false]) {
  const framing = offer ? "toolforge.frames.v1 selected" : "no subprotocol selected";
  test(`ws (${framing}): a client tool and a drop resumed read the same`, async (t) => {
    const { Spy, made } = spying(WebSocket, { offer });
    const proxy = await throughProxy(t);
    const events = [];
    const outcome = await startStream({
      baseUrl: proxy.url,
      transport: "ws",
      WebSocket: Spy,
      input: tagged("client", "Weather in Oslo?"),
      tools: [],
      clientTools: [WEATHER],
      onToolCall: async (call) => ({ city: call.args.city, sky: "clear" }),
      onEvent: (e) => events.push(e),
    }).done;
    assertContiguous(events);
    assert.equal(outcome.result.answer, "It is sunny in Oslo.");
    assert.equal(made.length, 1);
    assert.equal(made[0].protocol, offer ? "toolforge.frames.v1" : "");
    if (offer) assert.match(proxy.requests[0], /sec-websocket-protocol: toolforge\.frames\.v1/i);
    else assert.doesNotMatch(proxy.requests[0], /sec-websocket-protocol/i);
    const lines = made[0].messages.flatMap((m) => m.split("\n"));
    if (!offer) assert.ok(made[0].messages.every((m) => !m.includes("\n")));
    const frames = lines.map((l) => JSON.parse(l)).filter((m) => typeof m.id === "number");
    assert.deepEqual(frames.map((f) => f.id), events.map((e) => Number(e.id)));

    const cut = await throughProxy(t, { cutAfterBytes: CUT_AFTER_BYTES });
    const dropped = [];
    const resumed = await startStream({
      baseUrl: cut.url,
      transport: "ws",
      WebSocket: Spy,
      input: tagged("drop"),
      onEvent: (e) => dropped.push(e),
    }).done;
    assert.ok(cut.cut, "the proxy cut the first socket");
    assert.equal(resumed.reconnects, 1);
    assertContiguous(dropped);
    assert.equal(resumed.result.answer, "Still here.");
    assert.ok(made.slice(1).every((ws) => ws.protocol === (offer ? "toolforge.frames.v1" : "")));
  });
}
