"""The ``Retry-After`` header of a refusal that says when to come back.

Two refusals carry the seconds to wait: an API key over its rate or stream limit
(:class:`toolforge.api.auth.RateLimited`, 429) and a request that waited
``ADMISSION_TIMEOUT_MS`` for an upstream slot in vain
(:class:`toolforge.runtime.admission.AdmissionRefused`, 503). Every front door answers
them in its own error shape, and each adds the header through :func:`retry_headers`.
"""

from __future__ import annotations

from toolforge.api.auth import RateLimited
from toolforge.errors import ToolForgeError
from toolforge.runtime.admission import AdmissionRefused

__all__ = ["retry_headers"]


def retry_headers(exc: ToolForgeError) -> dict[str, str] | None:
    """``{"Retry-After": seconds}`` for a refusal that says when to retry, else None."""
    if isinstance(exc, RateLimited | AdmissionRefused):
        return {"Retry-After": str(exc.retry_after)}
    return None
