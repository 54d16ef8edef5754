"""The TypeScript SDK (clients/ts) against a real gateway on loopback (clients/ts/README.md): this
test starts the gateway in front of the scripted model of ``tests/clients/cases.py`` and runs
``node --test`` on ``clients/ts/test/*.test.mjs``, which drive the SDK's built ``dist/``:
the demo, client-side tools, pause with a fast upstream, a drop and resume, cancel,
timeouts. Node, ``clients/ts/node_modules`` and ``dist/`` come from ``make test`` (the
Makefile installs and builds what is missing); without them this test fails, never skips.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from pathlib import Path

import pytest

from tests.clients.cases import serve_cases
from toolforge.eval.conformance.tool_pack import conformance_registry

TS_DIR = Path(__file__).resolve().parents[2] / "clients" / "ts"
# node starts in well under a second; the slowest file (pause) takes about 3 s.
TIMEOUT_S = 100.0


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not on PATH: run `make test`, which installs nodejs", pytrace=False)
    if not (TS_DIR / "dist" / "index.js").is_file():
        pytest.fail(
            f"{TS_DIR / 'dist'} is not built: run `make test` (or `make ts-build`), which "
            "runs npm ci and tsc in clients/ts",
            pytrace=False,
        )
    return node


@pytest.mark.timeout(TIMEOUT_S + 20)
async def test_the_typescript_sdk_against_the_gateway(tmp_path: Path) -> None:
    node = _node()
    async with contextlib.AsyncExitStack() as stack:
        gw = await serve_cases(stack, tmp_path / "artifacts", conformance_registry())
        files = sorted(str(p) for p in (TS_DIR / "test").glob("*.test.mjs"))
        # A subprocess on the event loop (not subprocess.run): the gateway under test is
        # served by this same loop and must keep answering while node runs.
        proc = await asyncio.create_subprocess_exec(
            node,
            "--test",
            *files,
            cwd=TS_DIR,
            env={**os.environ, "TOOLFORGE_URL": gw.url, "TOOLFORGE_ARTIFACTS": str(gw.artifacts)},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            async with asyncio.timeout(TIMEOUT_S):
                out, _ = await proc.communicate()
        except TimeoutError:
            proc.kill()
            out, _ = await proc.communicate()
            pytest.fail(f"node --test ran past {TIMEOUT_S:.0f} s:\n{out.decode(errors='replace')}")
        report = out.decode(errors="replace")
        assert proc.returncode == 0, f"node --test failed:\n{report}"
        assert "# fail 0" in report and "# skipped 0" in report, report
        # Nothing left running: every stream ended, no upstream connection open.
        await gw.settle(upstream_closed=True, timeout_s=10)
