"""The TypeScript SDK's ``transport: "ws"`` against a gateway with API keys: a socket
without a key, or with a wrong one, is refused with the gateway's typed error (a
``ToolForgeError`` with its code and HTTP status); the right key streams. The other
socket cases (a client tool, approvals, a drop and resume) run with the SDK's own tests,
``clients/ts/test/socket.test.mjs``, against the shared keyless gateway.

Node and ``clients/ts/dist`` are needed as for tests/clients/test_ts_sdk.py (this test
fails, never skips, without them)."""

from __future__ import annotations

import asyncio
import json

from tests.api.conftest import HarnessFactory, sentinel_reply
from tests.api.test_auth import KEY_A
from tests.clients.test_ts_sdk import TS_DIR, _node
from toolforge.eval.scripted_upstream import Script

_SCRIPT = """
import { startStream } from "./dist/index.js";
const WebSocket = globalThis.WebSocket
  ?? (await import("../../tests/node/node_modules/undici/index.js")).WebSocket;
const [baseUrl, good] = process.argv.slice(1);
const out = [];
for (const apiKey of [undefined, "tf-key-wrong-wrong-wrong", good]) {
  try {
    const options = { baseUrl, apiKey, transport: "ws", WebSocket, input: "Hi" };
    const done = await startStream(options).done;
    out.push({ answer: done.result.answer });
  } catch (error) {
    out.push({ name: error.name, code: error.code, status: error.status });
  }
}
console.log(JSON.stringify(out));
"""


async def test_a_socket_without_a_key_is_refused_with_a_typed_error(
    make_gateway: HarnessFactory,
) -> None:
    node = _node()
    gw = await make_gateway([Script.from_tokens([sentinel_reply("ok")])], api_keys=KEY_A)
    proc = await asyncio.create_subprocess_exec(
        node, "--input-type=module", "-e", _SCRIPT, gw.url, KEY_A,
        cwd=TS_DIR, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    async with asyncio.timeout(60):
        out, _ = await proc.communicate()
    report = out.decode(errors="replace")
    assert proc.returncode == 0, report
    no_key, wrong_key, right_key = json.loads(report.strip().splitlines()[-1])
    assert no_key == {"name": "ToolForgeError", "code": "UNAUTHORIZED", "status": 401}
    assert wrong_key == {"name": "ToolForgeError", "code": "UNAUTHORIZED", "status": 401}
    assert right_key == {"answer": "ok"}
    assert len(gw.upstream.requests) == 1  # only the keyed stream reached the model
