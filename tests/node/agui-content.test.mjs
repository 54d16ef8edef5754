// Images and documents through @ag-ui/client's HttpAgent (docs/agui.md, "Images and
// documents"): a user message with an image part, sent as the client sends it.
//
// Run by tests/api/test_agui_content.py, which starts a gateway on loopback in front of a
// scripted upstream and passes its URL in TOOLFORGE_URL, and in TOOLFORGE_TAKES_IMAGES
// whether its upstream is sent images ("1") or takes text only.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { HttpAgent } from '@ag-ui/client';

const url = process.env.TOOLFORGE_URL;
assert.ok(url, 'TOOLFORGE_URL is not set: run this through tests/api/test_agui_content.py');
const takesImages = process.env.TOOLFORGE_TAKES_IMAGES === '1';

const IMAGE = { type: 'data', value: 'iVBORw0KGgo=', mimeType: 'image/png' };

test('an image in a user message: passed on, or refused by name', async () => {
  const agent = new HttpAgent({
    url: `${url}/v1/agui`,
    threadId: 't-image',
    initialMessages: [{
      id: 'u1',
      role: 'user',
      content: [{ type: 'text', text: 'What is this?' }, { type: 'image', source: IMAGE }],
    }],
  });
  if (takesImages) {
    const { newMessages } = await agent.runAgent({ runId: 'r1' });
    const said = newMessages.filter((m) => m.role === 'assistant');
    assert.equal(said.at(-1).content, 'A heart.');
    return;
  }
  await assert.rejects(agent.runAgent({ runId: 'r1' }), (error) => {
    assert.match(error.message, /HTTP 400/);
    const body = JSON.parse(error.message.slice(error.message.indexOf('{')));
    assert.equal(body.error.details[0].field, 'messages[0].content[1]');
    assert.match(body.error.message, /image/);
    return true;
  });
});
