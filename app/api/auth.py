"""API keys, per-key tool allowlists and rate limits (docs/security.md, docs/deployment.md).

One check for every request: :class:`toolforge.api.fastpath.GatewayApp` calls
:meth:`Access.admit` before it dispatches anything, so the fast paths (``POST
/v1/stream``, ``POST /v1/chat/completions``) and every FastAPI route pass the same gate,
and a route added later is covered without a line of its own. The admitted key goes in
the ASGI scope (:data:`SCOPE_KEY`); routes read it with :func:`request_key` to record a
stream's owner, narrow the tools and refuse another key's follow-up calls.

Keys are kept as SHA-256 digests only (API keys are long random strings: a plain digest
is enough, no password hashing needed) and a presented key is compared with every stored
digest with :func:`hmac.compare_digest`, without stopping at the first match.

**Failed checks** are counted (``toolforge_auth_failures_total`` by reason), logged
(``auth.failed``: the reason, the path and the client's address, never the key) and
throttled per client address (:class:`~toolforge.runtime.ratelimit.FailureThrottle`):
after ``AUTH_FAILURE_LIMIT`` wrong keys in ``AUTH_FAILURE_WINDOW_S``, every request from
that address gets 429 with ``Retry-After`` until the window ends, a right key included,
so that guessing cannot go on at the speed of the network.

**Public paths.** ``/healthz`` and ``/readyz`` need no key. ``/readyz`` answers the public
ready or not only; a request that presents a key there has it checked (a wrong one counted
and throttled like anywhere else) and, with a right one, gets the details (the route asks
:func:`request_key`).

**Stream slots.** A key's concurrent streams (``RATE_LIMIT_STREAMS``) are counted per
stream, not per HTTP response: :meth:`Access.open_stream` takes a :class:`StreamSlot`
for a request that may start one, :func:`own` hands it to the stream the request started,
and :meth:`Access.request_ended` gives it back when that stream has ended, which is later
than the response when the client left a stream that goes on (``on_disconnect:
"continue"``). Resuming a stream takes no slot of its own: the stream holds one already.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import hmac
import ipaddress
import json
import tomllib
from collections.abc import Iterable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Final

from fastapi import Depends, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from starlette.types import Scope

from toolforge.core.workflow import RESPOND, WorkflowDef
from toolforge.errors import ErrorCode, RequestError, ToolForgeError
from toolforge.log import AUTH_FAILED, AUTH_THROTTLED, get_logger
from toolforge.runtime.metrics import GatewayMetrics
from toolforge.runtime.planner import StreamPlan
from toolforge.runtime.ratelimit import FailureThrottle, RateLimit, RateLimiter
from toolforge.runtime.streams import StreamRegistry
from toolforge.settings import Settings

__all__ = [
    "PUBLIC_PATHS",
    "SCOPE_KEY",
    "UI_PAGES",
    "UI_PREFIXES",
    "Access",
    "ApiKey",
    "KeyDep",
    "KeyRing",
    "RateLimited",
    "StreamSlot",
    "allowed_tools",
    "allowed_workflow",
    "check_owner",
    "check_workflow",
    "digest",
    "exposure_warning",
    "is_loopback",
    "key_secrets",
    "load_keys",
    "own",
    "request_key",
]

log = get_logger(__name__)

SCOPE_KEY: Final = "toolforge.key"  # the admitted ApiKey in the ASGI scope (None: auth off)
PUBLIC_PATHS: Final = frozenset({"/healthz", "/readyz"})
# Public paths that say more to a right key: a key presented there is checked.
_KEYED_PUBLIC: Final = frozenset({"/readyz"})
# The web UI's static files (app/api/web.py): a page, scripts and styles, no data. A
# browser loads them without a header; the UI's API calls carry the key like any client's.
UI_PAGES: Final = frozenset({"/", "/ui", "/sdk"})
UI_PREFIXES: Final = ("/ui/", "/sdk/")
_SHA256_PREFIX: Final = "sha256:"


NO_LIMIT: Final = RateLimit()


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


@dataclass(frozen=True, slots=True)
class ApiKey:
    """One configured key: a name (logs, rate-limit state, stream ownership), its
    digest, the tools it may use (None: every tool) and its limits."""

    name: str
    digest: bytes
    tools: frozenset[str] | None = None
    limit: RateLimit = NO_LIMIT

    def allows(self, tool: str) -> bool:
        return self.tools is None or tool in self.tools


class _FileLimit(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    requests: int | None = Field(None, ge=0)
    window_s: float | None = Field(None, gt=0)
    streams: int | None = Field(None, ge=0)


class _FileKey(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")]
    key: Annotated[str, Field(min_length=16)] | None = None
    sha256: Annotated[str, Field(pattern=r"^[0-9a-fA-F]{64}$")] | None = None
    tools: list[str] | None = None
    rate_limit: _FileLimit = _FileLimit()

    @model_validator(mode="after")
    def _one_secret(self) -> _FileKey:
        if (self.key is None) == (self.sha256 is None):
            raise ValueError("give exactly one of 'key' and 'sha256'")
        return self


class _KeysFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    keys: list[_FileKey]


def _invalid(message: str) -> ToolForgeError:
    return ToolForgeError(ErrorCode.KEYS_INVALID, message)


def load_keys(settings: Settings) -> list[ApiKey]:
    """The keys of ``API_KEYS`` and ``API_KEYS_FILE`` (both may be given); a typed
    ``KEYS_INVALID`` error for anything that cannot be used, at start-up."""
    default = RateLimit(
        requests=settings.rate_limit_requests,
        window_s=settings.rate_limit_window_s,
        streams=settings.rate_limit_streams,
    )
    keys: list[ApiKey] = []
    for entry in (settings.api_keys or "").split(","):
        entry = entry.strip()
        if not entry:
            continue
        if entry.startswith(_SHA256_PREFIX):
            hexdigest = entry.removeprefix(_SHA256_PREFIX)
            try:
                raw = bytes.fromhex(hexdigest)
            except ValueError:
                raw = b""
            if len(raw) != 32:
                raise _invalid("API_KEYS: 'sha256:' must be followed by 64 hex digits")
        else:
            if len(entry) < 16:
                raise _invalid("API_KEYS: a key shorter than 16 characters is guessable")
            raw = digest(entry)
        keys.append(ApiKey(name=f"key-{raw.hex()[:12]}", digest=raw, limit=default))
    if settings.api_keys_file is not None:
        keys.extend(_file_keys(settings.api_keys_file, default))
    if len({k.digest for k in keys}) != len(keys):
        raise _invalid("the same key is configured twice")
    names = [k.name for k in keys]
    if len(set(names)) != len(names):
        raise _invalid(f"two keys share a name: {sorted(n for n in names if names.count(n) > 1)}")
    return keys


def _file_keys(path: Path, default: RateLimit) -> Iterable[ApiKey]:
    try:
        text = path.read_text(encoding="utf-8")
        raw: Any = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
        parsed = _KeysFile.model_validate(raw)
    except (OSError, ValueError, ValidationError) as exc:
        raise _invalid(f"API_KEYS_FILE {path}: {exc}") from exc
    for entry in parsed.keys:
        secret = bytes.fromhex(entry.sha256) if entry.sha256 else digest(entry.key or "")
        given = entry.rate_limit
        yield ApiKey(
            name=entry.name,
            digest=secret,
            tools=frozenset(entry.tools) if entry.tools is not None else None,
            limit=RateLimit(
                requests=default.requests if given.requests is None else given.requests,
                window_s=default.window_s if given.window_s is None else given.window_s,
                streams=default.streams if given.streams is None else given.streams,
            ),
        )


def key_secrets(settings: Settings) -> list[str]:
    """The API keys configured in clear (``API_KEYS`` entries and a keys file's ``key``
    fields; ``sha256:`` digests are no secret): what the redactor must never let out."""
    found = [
        entry.strip()
        for entry in (settings.api_keys or "").split(",")
        if entry.strip() and not entry.strip().startswith(_SHA256_PREFIX)
    ]
    path = settings.api_keys_file
    if path is not None:
        try:
            text = path.read_text(encoding="utf-8")
            raw: Any = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
            found.extend(e.key for e in _KeysFile.model_validate(raw).keys if e.key)
        except (OSError, ValueError, ValidationError):
            pass  # load_keys reports it (and stops the start-up)
    return found


class KeyRing:
    """The configured keys, by digest only."""

    def __init__(self, keys: Sequence[ApiKey]) -> None:
        self._keys = tuple(keys)

    def __len__(self) -> int:
        return len(self._keys)

    def match(self, presented: str) -> ApiKey | None:
        """The key whose digest matches ``presented``'s: every stored digest is compared,
        each in constant time, so the time taken says nothing about which one matched."""
        candidate = digest(presented)
        found: ApiKey | None = None
        for key in self._keys:
            if hmac.compare_digest(candidate, key.digest):
                found = key
        return found


class RateLimited(RequestError):
    """429 with the seconds to wait (the ``Retry-After`` header)."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(ErrorCode.RATE_LIMITED, message, http_status=429)
        self.retry_after = max(1, int(retry_after_s + 0.999))


_UNAUTHORIZED: Final = RequestError(
    ErrorCode.UNAUTHORIZED,
    "this gateway needs an API key: send 'Authorization: Bearer <key>' "
    "(docs/deployment.md, API keys)",
    http_status=401,
)
_WRONG_KEY: Final = RequestError(
    ErrorCode.UNAUTHORIZED,
    "the API key is not one this gateway knows; check the key you send "
    "(docs/deployment.md, API keys)",
    http_status=401,
)


@dataclass(slots=True, eq=False)
class StreamSlot:
    """One of a key's concurrent streams, taken for one request (see the module
    docstring). ``stream_id``: the stream the request started, set by :func:`own`."""

    key: ApiKey
    stream_id: str | None = None
    released: bool = False


# The slot of the request being served (set around the dispatch, read by own()).
_REQUEST_SLOT: ContextVar[StreamSlot | None] = ContextVar("toolforge_stream_slot", default=None)


class Access:
    """The gate every request passes when keys are configured (see the module docstring).

    ``throttle``: failed checks per client address (None: not throttled); ``metrics``:
    where failures are counted; ``sessions``: the stream registry, where a slot's stream
    is found when its request ends (set once the app's lifespan has built it)."""

    def __init__(
        self,
        keys: KeyRing,
        limiter: RateLimiter,
        *,
        metrics_public: bool,
        throttle: FailureThrottle | None = None,
        metrics: GatewayMetrics | None = None,
    ) -> None:
        self.keys = keys
        self.limiter = limiter
        self.public = PUBLIC_PATHS | ({"/metrics"} if metrics_public else frozenset())
        self.throttle = throttle
        self.metrics = metrics
        self.sessions: StreamRegistry | None = None
        self._holding: set[asyncio.Task[None]] = set()  # slots held by streams that go on

    async def admit(self, scope: Scope) -> ApiKey | None:
        """The request's key (None for a public path), or a 401 / 429 error.

        On ``/readyz`` a key is optional: a right one is admitted (the details), a wrong
        one is counted and throttled like anywhere else but answered as the public is
        (a probe configured with an old key keeps working)."""
        path = scope["path"]
        token = _bearer(scope)
        public = path in self.public
        if public and (token is None or path not in _KEYED_PUBLIC):
            return None
        if scope["method"] in ("GET", "HEAD") and (
            path in UI_PAGES or path.startswith(UI_PREFIXES)
        ):
            return None
        address = _address(scope)
        throttle = self.throttle
        if throttle is not None:
            wait = throttle.wait(address)
            if wait > 0:
                self._count("throttled")
                raise RateLimited(
                    "too many requests with a wrong API key came from this address; "
                    "retry after the Retry-After header's seconds",
                    wait,
                )
        if token is None:
            self._count("missing")
            log.info(AUTH_FAILED, reason="missing", path=path, client=address)
            raise _UNAUTHORIZED
        key = self.keys.match(token)
        if key is None:
            self._count("wrong")
            log.warning(AUTH_FAILED, reason="wrong", path=path, client=address)
            if throttle is not None and throttle.failed(address):
                log.warning(
                    AUTH_THROTTLED,
                    client=address,
                    failures=throttle.limit,
                    window_s=throttle.window_s,
                )
            if public:
                return None
            raise _WRONG_KEY
        if key.limit.requests:
            wait = await self.limiter.hit(key.name, key.limit)
            if wait > 0:
                raise RateLimited(
                    f"key {key.name!r} sent more than {key.limit.requests} requests in "
                    f"{key.limit.window_s:g} s; retry after the Retry-After header's seconds",
                    wait,
                )
        return key

    def _count(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.auth_failed(reason)

    async def open_stream(self, key: ApiKey) -> StreamSlot | None:
        """Take one of the key's concurrent streams (None: the key has no such limit),
        or a 429. Give it back with :meth:`request_ended`."""
        if not key.limit.streams:
            return None
        if not await self.limiter.open_stream(key.name, key.limit):
            raise RateLimited(
                f"key {key.name!r} has {key.limit.streams} streams open, its limit; "
                "end one, or retry later",
                1.0,
            )
        return StreamSlot(key)

    @contextlib.contextmanager
    def serving(self, slot: StreamSlot | None) -> Iterator[None]:
        """Around the dispatch of the request that took ``slot``: :func:`own` finds it."""
        token = _REQUEST_SLOT.set(slot)
        try:
            yield
        finally:
            _REQUEST_SLOT.reset(token)

    async def request_ended(self, slot: StreamSlot | None) -> None:
        """The response of the request that took ``slot`` has ended: the slot goes back
        now, or, when the stream it started is still running (its client left a stream
        that goes on), once that stream has ended."""
        if slot is None or slot.released:
            return
        session = None
        if slot.stream_id is not None and self.sessions is not None:
            session = self.sessions.find(slot.stream_id)
        if session is None or not session.running:
            await self._release(slot)
            return
        task = asyncio.create_task(self._release_after(slot, session.wait()))
        self._holding.add(task)
        task.add_done_callback(self._holding.discard)

    async def _release_after(self, slot: StreamSlot, ended: Any) -> None:
        try:
            await ended
        finally:
            await self._release(slot)

    async def _release(self, slot: StreamSlot) -> None:
        if not slot.released:
            slot.released = True
            await self.limiter.close_stream(slot.key.name)


def _bearer(scope: Scope) -> str | None:
    """The token of the request's ``Authorization: Bearer`` header, if it has one."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            header: str = value.decode("latin-1")
            scheme, _, rest = header.partition(" ")
            if scheme.lower() == "bearer" and rest.strip():
                return rest.strip()
            return None
    return None


def _address(scope: Scope) -> str:
    """The client's address as the server saw it (behind a proxy, the proxy's, unless
    uvicorn is told to trust its forwarded headers: docs/deployment.md)."""
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


def request_key(request: Request) -> ApiKey | None:
    """The key :class:`Access` admitted for this request (None: auth off)."""
    key: ApiKey | None = request.scope.get(SCOPE_KEY)
    return key


async def _key(request: Request) -> ApiKey | None:  # async: no thread hop (deps.py)
    return request_key(request)


KeyDep = Annotated[ApiKey | None, Depends(_key)]


def allowed_tools(
    key: ApiKey | None, requested: Sequence[str] | None, known: Iterable[str]
) -> list[str] | None:
    """``requested`` (a request's tool names; None: every tool in ``known``, the
    registry's) narrowed to what ``key`` may use: the model is shown these and only these
    may run. A name the key may not use is a 403, never silently dropped."""
    if key is None or key.tools is None:
        return list(requested) if requested is not None else None
    if requested is None:
        return [name for name in known if key.allows(name)]
    refused = [name for name in requested if not key.allows(name)]
    if refused:
        raise RequestError(
            ErrorCode.FORBIDDEN,
            f"this API key may not use the tool(s) {', '.join(refused)}; "
            f"it may use: {', '.join(sorted(key.tools)) or 'none'}",
            http_status=403,
        )
    return list(requested)


def allowed_workflow(key: ApiKey | None, workflow: WorkflowDef) -> bool:
    """Whether ``key`` may use every tool ``workflow`` runs (its built-in ``respond``
    aside): a workflow names its own tools, so a key's allowlist bounds it whole."""
    return (
        key is None
        or key.tools is None
        or all(key.allows(name) for name in workflow.tools if name != RESPOND)
    )


def check_workflow(key: ApiKey | None, workflow: WorkflowDef) -> WorkflowDef:
    """``workflow``, or a 403 naming the tools of it that ``key`` may not use."""
    if not allowed_workflow(key, workflow):
        allowed_tools(key, [name for name in workflow.tools if name != RESPOND], ())
    return workflow


def own(plan: StreamPlan, key: ApiKey | None) -> StreamPlan:
    """``plan`` owned by ``key`` (a new plan: plans are frozen): the owner on the plan
    (follow-up calls) and in its prompt record, so ``prompt.json`` says whose run it is
    (``GET /v1/runs``). The request's stream slot, if it took one, is the stream's from
    now on."""
    if key is None:
        return plan
    slot = _REQUEST_SLOT.get()
    if slot is not None and slot.key is key and slot.stream_id is None:
        slot.stream_id = plan.stream_id  # the stream holds the request's slot
    return dataclasses.replace(
        plan, owner=key.name, prompt_record={**plan.prompt_record, "owner": key.name}
    )


def check_owner(key: ApiKey | None, owner: str | None, stream_id: str) -> None:
    """A stream's follow-up calls (resume, cancel, approvals, tool results) come from the
    key that started it, or get a 403."""
    if key is not None and owner != key.name:
        raise RequestError(
            ErrorCode.FORBIDDEN,
            f"stream {stream_id!r} was started with another API key; only that key may "
            "resume it, cancel it or answer its calls",
            http_status=403,
        )


def exposure_warning(host: str, settings: Settings) -> str | None:
    """What ``toolforge serve`` warns at start-up when it serves beyond this machine
    (``--host``) with no API keys: anyone who reaches the port may run tools and spend
    the upstream's key. None when keys are set or the host is loopback."""
    if is_loopback(host) or settings.api_keys or settings.api_keys_file:
        return None
    return (
        f"WARNING: serving on {host} with no API keys: anyone who can reach this port can "
        "run tools and use the upstream. Set API_KEYS or API_KEYS_FILE "
        "(docs/deployment.md, API keys), or serve on 127.0.0.1."
    )


def is_loopback(host: str) -> bool:
    """Whether ``host`` (``--host``) serves this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
