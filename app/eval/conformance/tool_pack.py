"""The conformance tool pack: small tools whose behaviour a case can dial from its arguments.

The demo pack (``places.search``, ``bookings.create``) shows the happy paths; these make
the edges reachable from a data-only case: a result of any size, a result that echoes
sentinels or secrets back, a tool that is slow, that fails a chosen number of times
before succeeding, that fails for good, that needs approval, that counts its runs (to
see an idempotent replay not run it again), and one that is registered but not
model-facing. Every scripted case's gateway gets ``demo + conformance`` (a fresh copy:
counters and bookings start at zero for each case).

Retries are fast here (50 ms apart instead of 2 s) and timeouts short (300 ms), so
cases that exercise them stay quick; the policy under test is the executor's, not these
numbers.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field

from toolforge.core.tool_specs import PermanentToolError, ToolRegistry, ToolSpec, TransientToolError
from toolforge.tools import default_registry

__all__ = ["CONFORMANCE_TOOLS", "conformance_registry", "conformance_tools"]

CONFORMANCE_TOOLS: Final = (
    "conf.echo",
    "conf.blob",
    "conf.sleep",
    "conf.flaky",
    "conf.fail",
    "conf.approve",
    "conf.counter",
    "conf.secret",
    "conf.internal",
)

_CLOSED = ConfigDict(extra="forbid")


class EchoArgs(BaseModel):
    model_config = _CLOSED

    value: Any = Field(description="Any JSON value; it comes back as the result's 'value'.")


class BlobArgs(BaseModel):
    model_config = _CLOSED

    size: int = Field(ge=0, le=1_000_000, description="How many characters to return.")


class SleepArgs(BaseModel):
    model_config = _CLOSED

    ms: int = Field(ge=0, le=10_000, description="How long to sleep, in milliseconds.")


class FlakyArgs(BaseModel):
    model_config = _CLOSED

    key: str = Field(min_length=1, max_length=64, description="Counts failures per key.")
    failures: int = Field(ge=0, le=10, description="Fail this many times, then succeed.")


class FailArgs(BaseModel):
    model_config = _CLOSED

    reason: str = Field(default="no", max_length=200)


class ApproveArgs(BaseModel):
    model_config = _CLOSED

    action: str = Field(min_length=1, max_length=200, description="What would be done.")


class CounterArgs(BaseModel):
    model_config = _CLOSED

    key: str = Field(min_length=1, max_length=64)


class SecretArgs(BaseModel):
    model_config = _CLOSED

    api_key: str = Field(description="A credential (always redacted in logs and artifacts).")
    note: str = Field(default="", description="Personal data (this tool's redact list).")


def conformance_tools() -> list[ToolSpec[Any]]:
    """Fresh specs (fresh counters) for one gateway."""
    failures_so_far: dict[str, int] = {}
    runs: dict[str, int] = {}

    async def echo(args: EchoArgs) -> dict[str, object]:
        return {"value": args.value}

    async def blob(args: BlobArgs) -> dict[str, object]:
        return {"blob": "x" * args.size}

    async def sleep(args: SleepArgs) -> dict[str, object]:
        await asyncio.sleep(args.ms / 1000)
        return {"slept_ms": args.ms}

    async def flaky(args: FlakyArgs) -> dict[str, object]:
        seen = failures_so_far.get(args.key, 0)
        if seen < args.failures:
            failures_so_far[args.key] = seen + 1
            raise TransientToolError(f"not yet (failure {seen + 1} of {args.failures})")
        return {"key": args.key, "failed_before": seen}

    async def fail(args: FailArgs) -> dict[str, object]:
        raise PermanentToolError(f"refused: {args.reason}")

    async def approve(args: ApproveArgs) -> dict[str, object]:
        return {"done": args.action}

    async def counter(args: CounterArgs) -> dict[str, object]:
        runs[args.key] = runs.get(args.key, 0) + 1
        return {"key": args.key, "runs": runs[args.key]}

    async def secret(args: SecretArgs) -> dict[str, object]:
        return {"token": "sk-conformance0123456789", "ok": True}

    fast_retry_s = 0.05
    return [
        ToolSpec(name="conf.echo", description="Echo a value.", args_model=EchoArgs, fn=echo),
        ToolSpec(name="conf.blob", description="A long string.", args_model=BlobArgs, fn=blob),
        ToolSpec(
            name="conf.sleep",
            description="Sleep, then answer (times out after 300 ms).",
            args_model=SleepArgs,
            fn=sleep,
            timeout_s=0.3,
            retry_delay_s=fast_retry_s,
        ),
        ToolSpec(
            name="conf.flaky",
            description="Fail transiently a number of times, then succeed.",
            args_model=FlakyArgs,
            fn=flaky,
            retry_delay_s=fast_retry_s,
        ),
        ToolSpec(name="conf.fail", description="Always fail.", args_model=FailArgs, fn=fail),
        ToolSpec(
            name="conf.approve",
            description="Do something that a person must approve first.",
            args_model=ApproveArgs,
            fn=approve,
            needs_approval=True,
        ),
        ToolSpec(
            name="conf.counter",
            description="Count runs per key.",
            args_model=CounterArgs,
            fn=counter,
            idempotent=True,
        ),
        ToolSpec(
            name="conf.secret",
            description="Handle a credential and personal data.",
            args_model=SecretArgs,
            fn=secret,
            redact_keys=frozenset({"note"}),
        ),
        ToolSpec(
            name="conf.internal",
            description="Registered, but never shown to (or runnable by) a model.",
            args_model=EchoArgs,
            fn=echo,
            model_facing=False,
        ),
    ]


def conformance_registry(*, with_pack: bool = True) -> ToolRegistry:
    """The demo tools, plus the conformance pack unless ``with_pack`` is false."""
    specs = list(default_registry())
    if with_pack:
        specs += conformance_tools()
    return ToolRegistry(specs)
