// The AI SDK's Open Responses provider (@ai-sdk/open-responses) against POST /v1/responses
// (docs/responses.md), from Node: streamText with a tool over two steps, as a user of the
// `ai` package writes it, unchanged.
//
// Run by tests/api/test_responses_node.py, which starts a gateway on loopback in front of a
// scripted upstream and passes its URL in TOOLFORGE_URL; the tests run in this file's order.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { createOpenResponses } from '@ai-sdk/open-responses';
import { generateText, jsonSchema, stepCountIs, streamText, tool } from 'ai';

const url = process.env.TOOLFORGE_URL;
assert.ok(url, 'TOOLFORGE_URL is not set: run this through tests/api/test_responses_node.py');

const provider = createOpenResponses({ url: `${url}/v1/responses`, name: 'toolforge' });
const ran = [];
const tools = {
  get_weather: tool({
    description: 'The weather in a city.',
    inputSchema: jsonSchema({
      type: 'object',
      properties: { city: { type: 'string' } },
      required: ['city'],
      additionalProperties: false,
    }),
    execute: async ({ city }) => {
      ran.push(city);
      return { city, sky: 'sunny' };
    },
  }),
};

test('streamText with a tool over two steps', async () => {
  const result = streamText({
    model: provider('m'),
    prompt: 'Weather in Paris?',
    tools,
    stopWhen: stepCountIs(2),
  });
  let text = '';
  for await (const part of result.textStream) text += part;
  assert.equal(text, 'Sunny in Paris.');
  assert.deepEqual(ran, ['Paris']);
  const steps = await result.steps;
  assert.equal(steps.length, 2);
  assert.equal(steps[0].toolCalls[0].toolName, 'get_weather');
  assert.deepEqual(steps[0].toolCalls[0].input, { city: 'Paris' });
  assert.deepEqual(steps[0].toolResults[0].output, { city: 'Paris', sky: 'sunny' });
});

test('generateText, not streamed', async () => {
  const { text } = await generateText({ model: provider('m'), prompt: 'Say hello.' });
  assert.equal(text, 'Hello there');
});
