"""``GET /v1/servers``: the managed model servers and the decisions behind them
(docs/servers.md)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from toolforge.api.deps import GatewayDep
from toolforge.core.redact import public_url

__all__ = ["router"]

router = APIRouter()


@router.get("/v1/servers", summary="Managed model servers: backend, model, state, budget, VRAM")
async def servers(gw: GatewayDep) -> dict[str, Any]:
    """Every managed server with its state and budget decision, and the upstream in use.

    With a remote upstream (``UPSTREAM_BASE_URL`` set) nothing is managed: ``servers`` is
    empty and ``upstream.managed`` is false.
    """
    backend = gw.backend
    return {
        "upstream": {
            "base_url": public_url(gw.settings.upstream_base_url),  # no user:pass@
            "kind": gw.settings.upstream_kind,
            "model": gw.settings.model_id,
            "managed": backend is not None,
        },
        "servers": await gw.servers.describe() if gw.servers is not None else [],
        **(backend.describe() if backend is not None else {"budget": None, "nvml": None}),
    }
