// AG-UI through @ag-ui/client's HttpAgent (docs/agui.md), from Node: the client
// CopilotKit and the other AG-UI front-ends are built on, unchanged.
//
// Run by tests/api/test_agui_node.py, which starts a gateway on loopback in front of a
// scripted upstream (and a tool that needs an approval) and passes its URL in
// TOOLFORGE_URL. The upstream answers requests in the order they arrive, so these tests
// run one after another in this file's order, as the pytest side lists its scripts.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { HttpAgent } from '@ag-ui/client';

const url = process.env.TOOLFORGE_URL;
assert.ok(url, 'TOOLFORGE_URL is not set: run this through tests/api/test_agui_node.py');

const WEATHER = {
  name: 'get_weather',
  description: 'The weather in a city.',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
};

function agent(threadId) {
  return new HttpAgent({
    url: `${url}/v1/agui`,
    threadId,
    initialMessages: [{ id: 'u1', role: 'user', content: 'Weather in Paris?' }],
  });
}

function recorder() {
  const events = [];
  return { events, subscriber: { onEvent: ({ event }) => { events.push(event); } } };
}

test('a text run rebuilds the assistant message', async () => {
  const a = agent('t-text');
  const { events, subscriber } = recorder();
  const { newMessages } = await a.runAgent({ runId: 'r1' }, subscriber);
  assert.equal(events[0].type, 'RUN_STARTED');
  assert.equal(events.at(-1).type, 'RUN_FINISHED');
  const said = newMessages.filter((m) => m.role === 'assistant');
  assert.equal(said.length, 1);
  assert.equal(said[0].content, 'Sunny and warm.');
});

test('a frontend tool: the run ends with its call, the next run takes its result', async () => {
  const a = agent('t-tool');
  let pending = [];
  const first = await a.runAgent({ runId: 'r1', tools: [WEATHER] }, {
    onRunFinishedEvent: (params) => { pending = params.pendingToolCallIds ?? []; },
  });
  const call = first.newMessages.find((m) => m.role === 'assistant').toolCalls[0];
  assert.equal(call.function.name, 'get_weather');
  assert.deepEqual(JSON.parse(call.function.arguments), { city: 'Paris' });
  assert.deepEqual(pending, [call.id]);
  a.addMessage({ id: 'tr1', role: 'tool', toolCallId: call.id, content: '{"sky": "sunny"}' });
  const second = await a.runAgent({ runId: 'r2', tools: [WEATHER] });
  const said = second.newMessages.filter((m) => m.role === 'assistant');
  assert.equal(said.at(-1).content, 'Sunny in Paris.');
});

test('an approval is an interrupt, and resume answers it', async () => {
  const a = agent('t-approval');
  const forwardedProps = { toolforge: { server_tools: ['book'] } };
  let outcome;
  await a.runAgent({ runId: 'r1', forwardedProps }, {
    onRunFinishedEvent: (params) => { outcome = params.outcome; },
  });
  assert.equal(outcome, 'interrupt');
  assert.equal(a.pendingInterrupts.length, 1);
  const [interrupt] = a.pendingInterrupts;
  assert.equal(interrupt.reason, 'tool_approval');
  const { events, subscriber } = recorder();
  const resumed = await a.runAgent({
    runId: 'r2',
    forwardedProps,
    resume: [{ interruptId: interrupt.id, status: 'resolved', payload: { approve: true } }],
  }, subscriber);
  const result = events.find((e) => e.type === 'TOOL_CALL_RESULT');
  assert.equal(result.toolCallId, interrupt.toolCallId);
  assert.deepEqual(JSON.parse(result.content), { booked: 4 });
  const said = resumed.newMessages.filter((m) => m.role === 'assistant' && m.content);
  assert.equal(said.at(-1).content, 'Booked.');
  assert.equal(a.pendingInterrupts.length, 0);
});
