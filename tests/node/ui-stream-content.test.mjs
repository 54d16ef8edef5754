// Files through the `ai` package's DefaultChatTransport (docs/ui-stream.md, "Images and
// files"): a user message with an image file part, sent as useChat sends it.
//
// Run by tests/api/test_ui_stream_content.py, which starts a gateway on loopback in front
// of a scripted upstream and passes its URL in TOOLFORGE_URL, and in
// TOOLFORGE_TAKES_IMAGES whether its upstream is sent images ("1") or takes text only.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { DefaultChatTransport, readUIMessageStream } from 'ai';

const url = process.env.TOOLFORGE_URL;
assert.ok(url, 'TOOLFORGE_URL is not set: run this through tests/api/test_ui_stream_content.py');
const takesImages = process.env.TOOLFORGE_TAKES_IMAGES === '1';

const user = {
  id: 'u1',
  role: 'user',
  parts: [
    { type: 'text', text: 'What is this?' },
    { type: 'file', mediaType: 'image/png', url: 'data:image/png;base64,iVBORw0KGgo=' },
  ],
};

function send() {
  const transport = new DefaultChatTransport({ api: `${url}/v1/ui/chat` });
  return transport.sendMessages({
    chatId: 'c1',
    messages: [user],
    trigger: 'submit-message',
    messageId: undefined,
    abortSignal: undefined,
  });
}

test('an image file part: passed on, or refused by name', async () => {
  if (!takesImages) {
    await assert.rejects(send(), (error) => {
      const body = JSON.parse(error.message);
      assert.equal(body.error.details[0].field, 'messages[0].parts[1]');
      assert.match(body.error.message, /image/);
      return true;
    });
    return;
  }
  let last;
  for await (const built of readUIMessageStream({ stream: await send(), terminateOnError: true })) {
    last = built;
  }
  const text = last.parts.filter((p) => p.type === 'text').map((p) => p.text).join('');
  assert.equal(text, 'A heart.');
});
