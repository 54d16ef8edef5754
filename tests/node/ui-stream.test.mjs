// The AI SDK's UI message stream (docs/ui-stream.md), from Node, with the `ai` package's
// own pieces: DefaultChatTransport (what useChat sends and reads with) and
// readUIMessageStream (how the messages are rebuilt from the chunks).
//
// Run by tests/api/test_ui_stream_node.py, which starts a gateway on loopback in front of
// a scripted upstream (and a tool that needs an approval) and passes its URL in
// TOOLFORGE_URL; the tests run in this file's order, as the pytest side lists its scripts.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { DefaultChatTransport, readUIMessageStream } from 'ai';

const url = process.env.TOOLFORGE_URL;
assert.ok(url, 'TOOLFORGE_URL is not set: run this through tests/api/test_ui_stream_node.py');

const user = { id: 'u1', role: 'user', parts: [{ type: 'text', text: 'Weather in Paris?' }] };

async function turn(messages, body = {}, message = undefined) {
  const transport = new DefaultChatTransport({ api: `${url}/v1/ui/chat`, body });
  const stream = await transport.sendMessages({
    chatId: 'c1',
    messages,
    trigger: 'submit-message',
    messageId: undefined,
    abortSignal: undefined,
  });
  let last;
  for await (const built of readUIMessageStream({ stream, message, terminateOnError: true })) {
    last = built;
  }
  return last;
}

test('a text answer is rebuilt as one assistant message', async () => {
  const message = await turn([user]);
  assert.equal(message.role, 'assistant');
  const text = message.parts.filter((p) => p.type === 'text').map((p) => p.text).join('');
  assert.equal(text, 'Sunny and warm.');
});

test('a server tool call and its result, then the answer', async () => {
  const message = await turn([user], { toolforge: { server_tools: ['lookup'] } });
  const tool = message.parts.find((p) => p.type === 'tool-lookup');
  assert.ok(tool, JSON.stringify(message.parts));
  assert.equal(tool.state, 'output-available');
  assert.deepEqual(tool.input, { city: 'Paris' });
  assert.deepEqual(tool.output, { sky: 'sunny' });
  const text = message.parts.filter((p) => p.type === 'text').map((p) => p.text).join('');
  assert.equal(text, 'Sunny in Paris.');
});

test('an approval request, answered, and the same message goes on', async () => {
  const body = { toolforge: { server_tools: ['book'] } };
  const asked = await turn([user], body);
  const part = asked.parts.find((p) => p.type === 'tool-book');
  assert.equal(part.state, 'approval-requested');
  part.state = 'approval-responded';
  part.approval = { ...part.approval, approved: true };
  const done = await turn([user, asked], body, asked);
  assert.equal(done.id, asked.id);
  const booked = done.parts.find((p) => p.type === 'tool-book');
  assert.equal(booked.state, 'output-available');
  assert.deepEqual(booked.output, { booked: 4 });
  const text = done.parts.filter((p) => p.type === 'text').map((p) => p.text).join('');
  assert.equal(text, 'Booked.');
});
