// The OpenAI-compatible proxy through the official `openai` npm package (docs/proxy.md), from Node.
//
// Run by tests/api/test_proxy_node.py, which starts a gateway on loopback in front of a
// scripted upstream and passes its URL in TOOLFORGE_URL. The upstream answers requests in
// the order they arrive, one script each, so these tests must run one after another in
// this file's order (`node --test --test-concurrency=1`; node:test runs a file's top-level
// tests in sequence) and the pytest side lists its scripts in the same order.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import OpenAI from 'openai';

const url = process.env.TOOLFORGE_URL;
assert.ok(url, 'TOOLFORGE_URL is not set: run this through tests/api/test_proxy_node.py');

const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 10_000 });
const model = 'm';
const messages = [{ role: 'user', content: 'Weather in Paris?' }];
const WEATHER = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'The weather in a city.',
    parameters: {
      type: 'object',
      properties: { city: { type: 'string' } },
      required: ['city'],
      additionalProperties: false,
    },
  },
};

// Upstream script 1: the tokens "Hel", "lo ", "there".
test('a streamed text answer', { timeout: 15_000 }, async () => {
  const stream = await client.chat.completions.create({ model, messages, stream: true });
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  assert.equal(chunks[0].choices[0].delta.role, 'assistant');
  const text = chunks.map((c) => c.choices[0]?.delta.content ?? '').join('');
  assert.equal(text, 'Hello there');
  assert.equal(chunks.at(-1).choices[0].finish_reason, 'stop');
  assert.equal(new Set(chunks.map((c) => c.id)).size, 1);
});

// Upstream script 2: a native get_weather({"city": "Paris"}) call, its arguments in two pieces.
test('a streamed tool call arrives as tool_calls deltas', { timeout: 15_000 }, async () => {
  const stream = await client.chat.completions.create({
    model,
    messages,
    tools: [WEATHER],
    stream: true,
  });
  // Accumulate by index, as the OpenAI docs tell a streaming client to: the first delta of
  // a call brings its id, type and name, later ones append to the arguments.
  const calls = [];
  let finish = null;
  let last = null;
  for await (const chunk of stream) {
    last = chunk;
    const choice = chunk.choices[0];
    if (!choice) continue;
    for (const delta of choice.delta.tool_calls ?? []) {
      const call = (calls[delta.index] ??= { id: '', type: '', name: '', arguments: '' });
      call.id += delta.id ?? '';
      call.type += delta.type ?? '';
      call.name += delta.function?.name ?? '';
      call.arguments += delta.function?.arguments ?? '';
    }
    finish = choice.finish_reason ?? finish;
  }
  assert.equal(calls.length, 1);
  const [call] = calls;
  assert.equal(call.type, 'function');
  assert.equal(call.name, 'get_weather');
  assert.deepEqual(JSON.parse(call.arguments), { city: 'Paris' });
  assert.match(call.id, /\S/);
  assert.equal(finish, 'tool_calls');
  // The SDK keeps fields it does not know: ToolForge's extension rides on the last chunk.
  assert.equal(typeof last.toolforge?.stream_id, 'string');
});

// No upstream script: the gateway refuses before calling the upstream.
test('n: 2 is refused with a BadRequestError', { timeout: 15_000 }, async () => {
  await assert.rejects(client.chat.completions.create({ model, messages, n: 2 }), (err) => {
    assert.ok(err instanceof OpenAI.BadRequestError, `not a BadRequestError: ${err}`);
    assert.equal(err.status, 400);
    assert.match(err.message, /n=2/);
    return true;
  });
});

// Upstream scripts 3 and 4: the booking workflow's search, then its booking (sentinel frames).
test('a workflow run by the gateway answers with its result', { timeout: 15_000 }, async () => {
  const reply = await client.chat.completions.create({
    model,
    messages: [{ role: 'user', content: 'Book a table for 2 at an italian place at 20:00.' }],
    toolforge: { workflow: 'book_a_table' },
  });
  const choice = reply.choices[0];
  assert.equal(choice.finish_reason, 'stop');
  assert.equal(JSON.parse(choice.message.content).place_id, 'trattoria-roma');
  assert.deepEqual(reply.toolforge.workflow.completed_steps, ['places.search', 'bookings.create']);
  assert.deepEqual(
    reply.toolforge.server_tools.map((c) => [c.name, c.ok]),
    [['places.search', true], ['bookings.create', true]],
  );
});

// Upstream scripts 5 to 8: a booking before any search, four times: the workflow fails.
test('a workflow the model does not follow is an UnprocessableEntityError', { timeout: 15_000 }, async () => {
  await assert.rejects(
    client.chat.completions.create({ model, messages, toolforge: { workflow: 'book_a_table' } }),
    (err) => {
      assert.ok(err instanceof OpenAI.UnprocessableEntityError, `not a 422: ${err}`);
      assert.equal(err.code, 'STEP_ENFORCEMENT_EXHAUSTED');
      assert.equal(err.error.details[0].pending_steps, 'places.search');
      return true;
    },
  );
});
