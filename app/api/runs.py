"""``GET /v1/runs`` and ``GET /v1/runs/{stream_id}``: past runs from the artifacts, newest
first, for the web UI's list and replay (docs/protocol.md). The reading, and its path-escape
safety, is :class:`toolforge.runtime.past_runs.PastRuns`; the list comes from the
artifacts' index (:mod:`toolforge.runtime.run_index`), not from reading every run."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from toolforge.api.auth import KeyDep
from toolforge.api.deps import GatewayDep
from toolforge.errors import ErrorCode, RequestError
from toolforge.runtime.past_runs import MAX_LIST, PastRuns

__all__ = ["router"]

router = APIRouter()


@router.get("/v1/runs", summary="Past runs from the artifacts, newest first")
async def list_runs(
    gw: GatewayDep,
    key: KeyDep,
    limit: Annotated[int, Query(ge=1, le=MAX_LIST, description="the most runs to list")] = 50,
) -> dict[str, Any]:
    """Each run's ``stream_id``, ``ended_at``, ``reason``, ``model``, ``mode``, ``input``
    (the first user message, shortened), ``frames``, ``duration_ms`` and ``owner`` (the
    API key's name). With API keys, a key sees its own runs only (docs/deployment.md)."""
    owner = None if key is None else key.name
    return {"runs": await PastRuns(gw.artifacts).newest(limit, owner=owner)}


@router.get("/v1/runs/{stream_id}", summary="One past run: its frames and artifact files")
async def get_run(stream_id: str, gw: GatewayDep, key: KeyDep) -> dict[str, Any]:
    """``frames`` (frames.ndjson: every numbered frame as sent), ``prompt``, ``result``,
    ``tool_logs``, ``metrics`` (``null`` when missing), and ``truncated`` when the run was
    longer than the replay reads (16 MiB). 404 for an unknown run, 400 for an invalid id,
    and 404 for another API key's run."""
    run = await PastRuns(gw.artifacts).get(stream_id)
    prompt = run.get("prompt")
    if key is not None and (not isinstance(prompt, dict) or prompt.get("owner") != key.name):
        raise RequestError(
            ErrorCode.NOT_FOUND,
            f"no run {stream_id!r} of this API key (GET /v1/runs lists its runs)",
            http_status=404,
        )
    return run
