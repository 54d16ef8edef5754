"""The SDK tests' gateway as a process of its own, for ``npm test`` in clients/ts.

    python -m tests.clients.serve     # from the repository root

Serves a gateway on a free loopback port in front of the scripted model of
``tests/clients/cases.py`` (the same one ``tests/clients/test_ts_sdk.py`` starts), with
its artifacts in a temporary folder; prints one JSON line, ``{"url", "artifacts"}``, once
it answers; and stops, removing the folder, when its standard input closes or it is
terminated. ``clients/ts/test/run.mjs`` starts it when ``TOOLFORGE_URL`` is unset.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
import tempfile
from pathlib import Path

from tests.clients.cases import serve_cases
from toolforge.eval.conformance.tool_pack import conformance_registry


async def _stdin_closed() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while await reader.read(4096):
        pass


async def main() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    with tempfile.TemporaryDirectory(prefix="toolforge-sdk-tests-") as tmp:
        async with contextlib.AsyncExitStack() as stack:
            gw = await serve_cases(stack, Path(tmp) / "artifacts", conformance_registry())
            print(json.dumps({"url": gw.url, "artifacts": str(gw.artifacts)}), flush=True)
            watcher = asyncio.create_task(_stdin_closed())
            watcher.add_done_callback(lambda _: stop.set())
            await stop.wait()
            watcher.cancel()


if __name__ == "__main__":
    asyncio.run(main())
