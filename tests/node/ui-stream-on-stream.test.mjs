// The AI SDK's UI message stream from `POST /v1/stream` itself (docs/ui-stream.md, "On
// /v1/stream"), read with the `ai` package's own pieces: DefaultChatTransport (what useChat
// sends and reads with) pointed at /v1/stream, asking once with the `format=ui` query
// parameter in its `api` and once with the Accept parameter through its `headers` option;
// readUIMessageStream rebuilds the messages.
//
// Run by tests/api/test_ui_stream_on_stream.py, which starts a gateway on loopback in front
// of a scripted upstream (a lookup tool, and a booking tool that needs an approval) and
// passes its URL in TOOLFORGE_URL; the cases run in this file's order, as the pytest side
// lists its scripts: for each way of asking, a server tool's turn, then an approval's two.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { DefaultChatTransport, readUIMessageStream } from 'ai';

const url = process.env.TOOLFORGE_URL;
assert.ok(url, 'TOOLFORGE_URL is not set: run this through tests/api/test_ui_stream_on_stream.py');

const user = { id: 'u1', role: 'user', parts: [{ type: 'text', text: 'Weather in Paris?' }] };

const WAYS = {
  'the format query parameter': () =>
    new DefaultChatTransport({ api: `${url}/v1/stream?format=ui`, body: {} }),
  'the Accept header': () =>
    new DefaultChatTransport({
      api: `${url}/v1/stream`,
      headers: { Accept: 'text/event-stream; x-vercel-ai-ui-message-stream=v1' },
    }),
};

async function turn(transport, messages, body, message = undefined) {
  const stream = await transport.sendMessages({
    chatId: 'c1',
    messages,
    trigger: 'submit-message',
    messageId: undefined,
    abortSignal: undefined,
    body,
  });
  let last;
  for await (const built of readUIMessageStream({ stream, message, terminateOnError: true })) {
    last = built;
  }
  return last;
}

const textOf = (message) =>
  message.parts.filter((p) => p.type === 'text').map((p) => p.text).join('');

for (const [way, transportFor] of Object.entries(WAYS)) {
  test(`${way}: a server tool call and its result, then the answer`, async () => {
    const transport = transportFor();
    const message = await turn(transport, [user], { toolforge: { server_tools: ['lookup'] } });
    assert.equal(message.role, 'assistant');
    const tool = message.parts.find((p) => p.type === 'tool-lookup');
    assert.ok(tool, JSON.stringify(message.parts));
    assert.equal(tool.state, 'output-available');
    assert.deepEqual(tool.input, { city: 'Paris' });
    assert.deepEqual(tool.output, { sky: 'sunny' });
    assert.equal(textOf(message), 'Sunny in Paris.');
  });

  test(`${way}: an approval answered in the next request, the same message going on`, async () => {
    const transport = transportFor();
    const body = { toolforge: { server_tools: ['book'] } };
    const asked = await turn(transport, [user], body);
    const part = asked.parts.find((p) => p.type === 'tool-book');
    assert.ok(part, JSON.stringify(asked.parts));
    assert.equal(part.state, 'approval-requested');
    part.state = 'approval-responded';
    part.approval = { ...part.approval, approved: true };
    const done = await turn(transport, [user, asked], body, asked);
    assert.equal(done.id, asked.id);
    const booked = done.parts.find((p) => p.type === 'tool-book');
    assert.equal(booked.state, 'output-available');
    assert.deepEqual(booked.output, { booked: 4 });
    assert.equal(textOf(done), 'Booked.');
  });
}
