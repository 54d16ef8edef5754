"""Ollama model management through its HTTP API (docs/servers.md: load/unload, ``keep_alive``).

The ServerManager drives Ollama here rather than through a process: which models are
loaded (``GET /api/ps``), load one with an explicit context (``POST /api/generate`` with
an empty prompt, Ollama's documented way to preload), unload one (the same with
``keep_alive: 0``), what a model is (``POST /api/show``: trained context length,
capabilities such as ``tools``) and the server version (``GET /api/version``).

Why ``load`` takes ``num_ctx``: Ollama allocates the KV cache when it loads a runner, for
the ``num_ctx`` of the request that loads it, and reloads the model when a later request
asks for another one. Loading with the budget the chat requests will send
(:class:`~toolforge.upstream.ollama.OllamaUpstream` sends it on every request) means the first
chat does not pay for a second load.

Results are frozen dataclasses; every failure is an :class:`~toolforge.errors.UpstreamError`
(:class:`~toolforge.upstream.ollama.OllamaModelNotFound` for a model Ollama does not have),
mapped in the same places as the chat adapter's.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, TypeGuard

import httpx
import orjson

from toolforge.errors import ErrorCode, UpstreamError
from toolforge.upstream.exchange import Exchange, snippet
from toolforge.upstream.ollama import ollama_root
from toolforge.upstream.ollama_wire import http_error

__all__ = ["DEFAULT_KEEP_ALIVE", "LoadedModel", "ModelInfo", "OllamaControl", "same_model"]

DEFAULT_KEEP_ALIVE: Final = "30m"
"""How long a model ``load`` loads stays loaded when idle. Ollama's own default is 5 min;
a gateway that was just told to serve a model should not lose it to a short lull (each
reload costs seconds to minutes)."""


@dataclass(frozen=True, slots=True)
class LoadedModel:
    """One model in memory, as ``GET /api/ps`` reports it.

    ``size`` is the bytes it occupies in total, ``size_vram`` the part in GPU memory.
    ``context_length`` is the context Ollama allocated (newer servers report it;
    ``None`` from older ones). ``expires_at`` is when it unloads if left idle (``None``: not sent
    or not a timestamp).
    """

    name: str
    size: int
    size_vram: int
    context_length: int | None = None
    expires_at: datetime | None = None
    digest: str | None = None
    parameter_size: str | None = None
    quantization_level: str | None = None

    @property
    def gpu_fraction(self) -> float:
        """The share of the model in GPU memory: 1.0 all on the GPU, 0.0 all on the CPU."""
        return self.size_vram / self.size if self.size > 0 else 0.0


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What ``POST /api/show`` says about a model.

    ``context_length`` is the length the model was trained for (``model_info``'s
    ``<architecture>.context_length``), the upper bound for ``num_ctx``; ``None`` when not
    reported. ``capabilities`` (``"completion"``, ``"tools"``, ``"vision"``, ...) is
    ``None`` on servers too old to report them.
    """

    model: str
    architecture: str | None = None
    context_length: int | None = None
    capabilities: frozenset[str] | None = None
    family: str | None = None
    parameter_size: str | None = None
    quantization_level: str | None = None

    @property
    def supports_tools(self) -> bool | None:
        """Whether the model's template does native tool calls; ``None``: not reported."""
        return None if self.capabilities is None else "tools" in self.capabilities


class OllamaControl:
    """Model management on the Ollama server at ``base_url`` (its root; ``/v1`` ignored).

    Timeouts, in seconds: ``connect_s`` to connect; ``timeout_s`` for a quick request
    (ps, show, version, unload); ``load_timeout_s`` for ``load``, which reads the model
    from disk into memory (minutes for a large model on a slow disk).
    """

    def __init__(
        self,
        client: httpx.AsyncClient,
        base_url: str,
        *,
        connect_s: float = 5.0,
        timeout_s: float = 10.0,
        load_timeout_s: float = 300.0,
    ) -> None:
        self._client = client
        self._root = ollama_root(base_url)
        self._connect_s = connect_s
        self._timeout_s = timeout_s
        self._load_timeout_s = load_timeout_s

    @property
    def base_url(self) -> str:
        """The server's root URL (without ``/v1``)."""
        return self._root

    def __repr__(self) -> str:
        return f"OllamaControl({self._root!r})"

    async def version(self) -> str:
        """The server's version (``"0.12.6"``)."""
        body = await self._call("GET", "/api/version")
        version = body.get("version")
        if not isinstance(version, str):
            raise _shape("/api/version", body)
        return version

    async def loaded(self) -> tuple[LoadedModel, ...]:
        """The models in memory now."""
        body = await self._call("GET", "/api/ps")
        models = body.get("models")
        if models is None:
            return ()
        if type(models) is not list:
            raise _shape("/api/ps", body)
        return tuple(_loaded_model(item, body) for item in models)

    async def load(
        self, model: str, *, num_ctx: int, keep_alive: str | float = DEFAULT_KEEP_ALIVE
    ) -> LoadedModel | None:
        """Load ``model`` with a ``num_ctx`` context and keep it ``keep_alive`` when idle.

        Returns how ``/api/ps`` then lists it (compare its ``context_length`` with
        ``num_ctx``: the server may allocate less), or ``None`` if it does not.
        """
        if type(num_ctx) is not int or num_ctx <= 0:
            raise ValueError(f"num_ctx must be a positive int, got {num_ctx!r}")
        body = {
            "model": model,
            "prompt": "",
            "stream": False,
            "keep_alive": keep_alive,
            "options": {"num_ctx": num_ctx},
        }
        await self._call("POST", "/api/generate", body, model=model, read_s=self._load_timeout_s)
        for loaded in await self.loaded():
            if same_model(loaded.name, model):
                return loaded
        return None

    async def unload(self, model: str) -> None:
        """Unload ``model`` now (``keep_alive: 0``). A model that is not loaded is no
        error; one Ollama does not have is
        :class:`~toolforge.upstream.ollama.OllamaModelNotFound`."""
        body = {"model": model, "prompt": "", "stream": False, "keep_alive": 0}
        await self._call("POST", "/api/generate", body, model=model)

    async def show(self, model: str) -> ModelInfo:
        """What the server knows about ``model``: trained context, capabilities, size."""
        body = await self._call("POST", "/api/show", {"model": model}, model=model)
        info = body.get("model_info")
        details = body.get("details")
        capabilities = body.get("capabilities")
        info = info if type(info) is dict else {}
        details = details if type(details) is dict else {}
        if not (
            capabilities is None
            or (type(capabilities) is list and all(type(c) is str for c in capabilities))
        ):
            raise _shape("/api/show", body)
        architecture = _text(info.get("general.architecture"))
        return ModelInfo(
            model=model,
            architecture=architecture,
            context_length=_context_length(info, architecture),
            capabilities=None if capabilities is None else frozenset(capabilities),
            family=_text(details.get("family")),
            parameter_size=_text(details.get("parameter_size")),
            quantization_level=_text(details.get("quantization_level")),
        )

    async def context_length(self, model: str) -> int | None:
        """The context ``model`` was trained for (``None``: not reported)."""
        return (await self.show(model)).context_length

    async def capabilities(self, model: str) -> frozenset[str] | None:
        """``model``'s capabilities (``None``: the server does not report them)."""
        return (await self.show(model)).capabilities

    async def _call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        model: str | None = None,
        read_s: float | None = None,
    ) -> dict[str, Any]:
        """One request; its JSON object answer, or the :class:`UpstreamError` for it."""
        url = httpx.URL(self._root + path)
        read_s = self._timeout_s if read_s is None else read_s
        exchange = Exchange(str(url), self._connect_s, read_s, read_s)
        with exchange.until(None):  # httpx's own timeouts bound it; Exchange maps errors
            response = await self._client.request(
                method,
                url,
                content=None if body is None else orjson.dumps(body),
                headers={"Content-Type": "application/json"} if body is not None else None,
                timeout=httpx.Timeout(
                    connect=self._connect_s, read=read_s, write=read_s, pool=self._connect_s
                ),
            )
        if response.status_code >= 400:
            raise http_error(response.status_code, response.text, url=str(url), model=model)
        try:
            parsed = orjson.loads(response.content)
        except orjson.JSONDecodeError as exc:
            raise UpstreamError(
                ErrorCode.UPSTREAM_PROTOCOL,
                f"Ollama {path} answered something that is not JSON: {snippet(response.text)}",
            ) from exc
        if type(parsed) is not dict:
            raise _shape(path, parsed)
        return parsed


def _loaded_model(item: Any, body: Any) -> LoadedModel:
    if type(item) is not dict:
        raise _shape("/api/ps", body)
    name = item.get("name") or item.get("model")  # newer servers may send only "model"
    size, size_vram = item.get("size"), item.get("size_vram")
    context_length = item.get("context_length")
    if not (
        isinstance(name, str)
        and _count(size)
        and _count(size_vram)
        and (context_length is None or _count(context_length))
    ):
        raise _shape("/api/ps", body)
    details = item.get("details")
    details = details if type(details) is dict else {}
    return LoadedModel(
        name=name,
        size=size,
        size_vram=size_vram,
        context_length=context_length or None,  # omitted or 0: not reported
        expires_at=_timestamp(item.get("expires_at")),
        digest=_text(item.get("digest")),
        parameter_size=_text(details.get("parameter_size")),
        quantization_level=_text(details.get("quantization_level")),
    )


def _context_length(info: dict[str, Any], architecture: str | None) -> int | None:
    if architecture is not None:
        value = info.get(f"{architecture}.context_length")
        return value if _count(value) and value > 0 else None
    # No architecture key: the one "<arch>.context_length" there is, if exactly one.
    values = [v for k, v in info.items() if k.endswith(".context_length") and _count(v)]
    return values[0] if len(values) == 1 and values[0] > 0 else None


def same_model(listed: str, asked: str) -> bool:
    """``llama3.2`` is ``llama3.2:latest``: Ollama's default tag (docs, "Model names")."""
    return _with_tag(listed) == _with_tag(asked)


def _with_tag(name: str) -> str:
    return name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"


def _count(value: Any) -> TypeGuard[int]:
    return type(value) is int and value >= 0


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _timestamp(value: Any) -> datetime | None:
    # Go writes RFC 3339 with up to 9 fractional digits; 3.11's fromisoformat reads them.
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def _shape(path: str, body: Any) -> UpstreamError:
    text = orjson.dumps(body, option=orjson.OPT_NON_STR_KEYS).decode()
    return UpstreamError(
        ErrorCode.UPSTREAM_PROTOCOL, f"Ollama {path} answered an unexpected shape: {snippet(text)}"
    )
