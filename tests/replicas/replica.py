"""One gateway replica for the multi-replica tests: ``python -m tests.replicas.replica
--port P``. Its settings come from the environment (``REDIS_URL``, ``UPSTREAM_BASE_URL``,
...), as ``toolforge serve`` reads them; only the tool registry is the tests' own:

- ``wait`` sleeps ``ms`` and answers when it started and ended (wall clock), so a test can
  count how many calls ran at once across processes;
- ``guarded`` needs approval.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

from pydantic import BaseModel

from toolforge.api.app import create_app
from toolforge.api.serve import run
from toolforge.core.tool_specs import ToolRegistry, ToolSpec
from toolforge.settings import Settings

__all__ = ["registry"]


class WaitArgs(BaseModel):
    ms: int = 300


class GuardedArgs(BaseModel):
    what: str


async def _wait(args: WaitArgs) -> dict[str, object]:
    started = time.time()
    await asyncio.sleep(args.ms / 1000)
    return {"started": started, "ended": time.time(), "pid": os.getpid()}


async def _guarded(args: GuardedArgs) -> dict[str, object]:
    return {"done": args.what, "pid": os.getpid()}


def registry() -> ToolRegistry:
    return ToolRegistry(
        [
            ToolSpec(
                name="wait",
                description="Wait a while.",
                args_model=WaitArgs,
                fn=_wait,
                retries=0,
            ),
            ToolSpec(
                name="guarded",
                description="Do something a person must approve.",
                args_model=GuardedArgs,
                fn=_guarded,
                retries=0,
                needs_approval=True,
            ),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    run(create_app(Settings(), tools=registry()), host="127.0.0.1", port=args.port)


if __name__ == "__main__":
    main()
