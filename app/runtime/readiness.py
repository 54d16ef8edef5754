"""``GET /readyz``'s question, asked of the upstream at most once per interval.

``/readyz`` is public (load balancers and orchestrators call it without a key), so what it
costs must not grow with how often it is called: one upstream request per
``READYZ_CACHE_S``, whatever the rate of calls. :class:`ReadinessCheck` keeps the last
answer for that long, and calls that arrive while a check is in flight wait for that one
(a flood on a cold cache is still one request). The request itself is the upstream
dialect's (``models_request`` of :mod:`toolforge.upstream.openai_compat` and
:mod:`toolforge.upstream.anthropic`), sent with the upstream's key; the answer keeps only
what may be shown: the URL without credentials (:func:`toolforge.core.redact.public_url`)
and a reason that is a status or an exception's type, never the upstream's text.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Final

import httpx

from toolforge.core.redact import public_url
from toolforge.upstream import anthropic, openai_compat

__all__ = ["Readiness", "ReadinessCheck", "readiness_request"]

# A readiness probe answers in milliseconds or the upstream is as good as down for it.
_TIMEOUT_S: Final = 2.0


@dataclass(frozen=True, slots=True)
class Readiness:
    """One answer: ``ready``, the upstream as it may be shown, and why not (if not)."""

    ready: bool
    upstream: str | None
    reason: str | None = None
    checked_at: float = 0.0  # the check's clock
    replica: str | None = None  # with REDIS_URL: the replica (worker) that answered

    def details(self, now: float) -> dict[str, object]:
        """What a caller with a key (or any caller of a local-only gateway) is shown."""
        out: dict[str, object] = {
            "status": "ready" if self.ready else "unavailable",
            "upstream": self.upstream,
            "checked_s_ago": round(max(0.0, now - self.checked_at), 3),
        }
        if self.reason is not None:
            out["reason"] = self.reason
        if self.replica is not None:
            out["replica"] = self.replica
        return out


def readiness_request(
    kind: str, base_url: str | None, *, api_key: str | None, anthropic_version: str
) -> tuple[str, Mapping[str, str]] | None:
    """The URL and headers that say whether the upstream of ``UPSTREAM_KIND`` ``kind`` at
    ``base_url`` answers (None: no upstream URL, an adapter injected by an embedding
    application)."""
    if base_url is None:
        return None
    if kind == "anthropic":
        return anthropic.models_request(base_url, api_key=api_key, version=anthropic_version)
    return openai_compat.models_request(base_url, api_key=api_key)


class ReadinessCheck:
    """The upstream's readiness, asked at most once per ``ttl_s`` (see the module
    docstring). ``request`` None: always ready, shown as ``shown`` (the adapter).
    ``replica``: this replica's id in the details, with Redis (which worker answered)."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        request: tuple[str, Mapping[str, str]] | None,
        *,
        ttl_s: float,
        shown: str | None = None,
        replica: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._replica = replica
        self._request = request
        self._ttl_s = ttl_s
        self._clock = clock
        self._shown = public_url(request[0] if request is not None else shown)
        self._last: Readiness | None = None
        self._inflight: asyncio.Future[Readiness] | None = None

    @property
    def clock(self) -> Callable[[], float]:
        return self._clock

    async def check(self) -> Readiness:
        """The cached answer while it is fresh; else the answer of one new check, shared
        by every caller that arrives before it ends."""
        last = self._last
        if last is not None and self._clock() - last.checked_at < self._ttl_s:
            return last
        inflight = self._inflight
        if inflight is None:
            inflight = self._inflight = asyncio.ensure_future(self._ask())
            inflight.add_done_callback(self._store)
        # Shielded: a caller that leaves does not cancel the check the others wait for.
        return await asyncio.shield(inflight)

    def _store(self, done: asyncio.Future[Readiness]) -> None:
        self._inflight = None
        if not done.cancelled() and done.exception() is None:
            self._last = done.result()

    async def _ask(self) -> Readiness:
        answer = await self._probe()
        return answer if self._replica is None else replace(answer, replica=self._replica)

    async def _probe(self) -> Readiness:
        request = self._request
        if request is None:
            return Readiness(True, self._shown, checked_at=self._clock())
        url, headers = request
        try:
            response = await self._client.get(url, headers=dict(headers), timeout=_TIMEOUT_S)
        except httpx.HTTPError as exc:
            return Readiness(False, self._shown, type(exc).__name__, self._clock())
        # 4xx still means "it answers" (a proxy without /models, a key without the scope).
        if response.status_code >= 500:
            return Readiness(False, self._shown, f"HTTP {response.status_code}", self._clock())
        return Readiness(True, self._shown, checked_at=self._clock())
