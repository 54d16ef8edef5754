"""Structured logging: one JSON object per line on stderr, secrets redacted.

Why these choices:

* **structlog's native filtering logger** for the gateway's own events, not the stdlib
  bridge: ``make_filtering_bound_logger`` turns calls below the level into a bare
  ``return None``. :func:`get_logger` therefore returns
  ``structlog.typing.FilteringBoundLogger`` (which also has ``await log.ainfo(...)``).
* **Everyone else's logs join them.** uvicorn, httpx, asyncio and any library log through
  the stdlib; :func:`configure_logging` puts one handler on the root logger whose
  formatter is structlog's ``ProcessorFormatter`` with the same processors (timestamp,
  level, logger name, redaction, renderer), so a uvicorn warning is the same kind of line
  as a gateway event. uvicorn is served with ``log_config=None`` (toolforge.api.serve):
  its loggers propagate to that handler instead of printing their own format.
* **Console or JSON by where stderr goes**: console lines (structlog's ``ConsoleRenderer``)
  when stderr is a terminal, JSON lines otherwise; ``LOG_FORMAT=console|json`` (or
  ``LOG_JSON``) overrides.
* **orjson** renders each event as one compact line, written whole under a lock.
* **Redaction is a processor**, the last one before rendering, so nothing a caller binds,
  passes or raises reaches the output unredacted (docs/protocol.md: "secrets redacted
  everywhere"). ``exc_info`` becomes a structured traceback first, without local
  variables: a password in a local named ``pw`` matches no redaction rule.
* **One bind per configuration**, not structlog's cache: :func:`configure_logging` runs
  once per ``create_app``, and tests call it many times with different levels and
  captured streams, so a logger cached on first use would keep the first configuration.
  Binding anew on every call (structlog's lazy proxy) costs about 30 µs cold, and
  ``stream.started`` is logged on the time to first event: the loggers from
  :func:`get_logger` bind again only when structlog's configuration has changed.
* **stderr is looked up at write time**, so pytest's capsys/capfd and any later
  redirection see the output.
* **A log call never raises.** An event orjson cannot encode (an integer past 64 bits, a
  lone surrogate) goes through the stdlib encoder; one neither can (nesting past the
  recursion limit) becomes a stub line that says so. Never an exception mid-stream.

Event names are the module's constants (``STREAM_STARTED = "stream.started"``, ...),
collected in :data:`EVENT_NAMES`.
"""

from __future__ import annotations

import json as _stdlib_json
import logging
import sys
import threading
from typing import Any, Final, cast

import orjson
import structlog
from structlog.typing import EventDict, FilteringBoundLogger, Processor, WrappedLogger

from toolforge.core.redact import redact

__all__ = [
    "ARTIFACTS_PRUNED",
    "ARTIFACTS_WRITE_FAILED",
    "ARTIFACTS_WRITTEN",
    "AUTH_FAILED",
    "AUTH_THROTTLED",
    "BACKEND_SETUP",
    "CLIENT_DISCONNECTED",
    "EVENT_NAMES",
    "FRAME_DEGRADED",
    "FRAME_REPAIRED",
    "GATEWAY_READY",
    "MODE_SELECTED",
    "SERVER_CRASHED",
    "SERVER_DECISION",
    "SERVER_READY",
    "SERVER_RESTARTED",
    "SERVER_STOPPED",
    "STREAM_CANCELLED",
    "STREAM_FINISHED",
    "STREAM_INTERNAL_ERROR",
    "STREAM_STARTED",
    "TOOL_ATTEMPT",
    "TOOL_FINISHED",
    "TOOL_QUEUED",
    "UPSTREAM_ERROR",
    "WEB_NOT_BUILT",
    "WORKFLOW_SKIPPED",
    "configure_logging",
    "get_logger",
    "logs_are_json",
]


# Event names: ``subject.what_happened``, stable, because dashboards and alerts match on
# them. ``log.info(STREAM_STARTED, stream_id=...)``.
STREAM_STARTED: Final = "stream.started"
WORKFLOW_SKIPPED: Final = "workflow.skipped"  # a bundled workflow whose tools are absent
STREAM_FINISHED: Final = "stream.finished"
STREAM_CANCELLED: Final = "stream.cancelled"
STREAM_INTERNAL_ERROR: Final = "stream.internal_error"
CLIENT_DISCONNECTED: Final = "client.disconnected"
UPSTREAM_ERROR: Final = "upstream.error"
MODE_SELECTED: Final = "mode.selected"  # docs/protocol.md: auto mode probes once and logs it
FRAME_REPAIRED: Final = "frame.repaired"
FRAME_DEGRADED: Final = "frame.degraded"
TOOL_QUEUED: Final = "tool.queued"  # docs/tools.md: queue depth and wait are logged
TOOL_ATTEMPT: Final = "tool.attempt"  # docs/tools.md: each attempt is logged
TOOL_FINISHED: Final = "tool.finished"
SERVER_DECISION: Final = "server.decision"  # docs/servers.md: every budget decision is logged
BACKEND_SETUP: Final = "backend.setup"  # obtaining llama-server / the model: one line a step
SERVER_READY: Final = "server.ready"
SERVER_CRASHED: Final = "server.crashed"
SERVER_RESTARTED: Final = "server.restarted"
SERVER_STOPPED: Final = "server.stopped"
ARTIFACTS_WRITTEN: Final = "artifacts.written"
GATEWAY_READY: Final = "gateway.ready"  # serving: the URL and the demo request
ARTIFACTS_WRITE_FAILED: Final = "artifacts.write_failed"
AUTH_FAILED: Final = "auth.failed"  # no key, or a wrong one: the reason and address, never the key
AUTH_THROTTLED: Final = "auth.throttled"  # an address reached AUTH_FAILURE_LIMIT: 429 for a while
ARTIFACTS_PRUNED: Final = "artifacts.pruned"  # retention removed old runs (ARTIFACTS_MAX_*)
WEB_NOT_BUILT: Final = "web.not_built"  # /sdk/* or /ui/* asked for, the build missing

EVENT_NAMES: Final = frozenset(
    {
        STREAM_STARTED,
        WORKFLOW_SKIPPED,
        STREAM_FINISHED,
        STREAM_CANCELLED,
        STREAM_INTERNAL_ERROR,
        CLIENT_DISCONNECTED,
        UPSTREAM_ERROR,
        MODE_SELECTED,
        FRAME_REPAIRED,
        FRAME_DEGRADED,
        TOOL_QUEUED,
        TOOL_ATTEMPT,
        TOOL_FINISHED,
        SERVER_DECISION,
        BACKEND_SETUP,
        SERVER_READY,
        SERVER_CRASHED,
        SERVER_RESTARTED,
        SERVER_STOPPED,
        ARTIFACTS_WRITTEN,
        ARTIFACTS_WRITE_FAILED,
        ARTIFACTS_PRUNED,
        WEB_NOT_BUILT,
        GATEWAY_READY,
        AUTH_FAILED,
        AUTH_THROTTLED,
    }
)
"""Every event name above, for tests and for tooling that checks dashboards."""

_LEVELS = logging.getLevelNamesMapping()

# Structured tracebacks without locals: a local variable holding a raw password under an
# innocent name ("pw") is a secret that no redaction rule can recognise.
_DICT_TRACEBACKS: Final = structlog.processors.ExceptionRenderer(
    structlog.tracebacks.ExceptionDictTransformer(show_locals=False)
)


_json_mode = True  # what the last configure_logging chose (logs_are_json)


def configure_logging(*, level: str = "INFO", json: bool | None = None) -> None:
    """Configure structlog, and the stdlib's root logger through it, for the whole
    process. Safe to call any number of times.

    ``level`` is a stdlib level name (``"DEBUG"``, ``"info"``, ...; ``ValueError``
    otherwise). ``json=None`` renders JSON lines unless stderr is a terminal, where it
    renders structlog's console lines; ``True``/``False`` force one. Redaction applies
    either way.
    """
    global _json_mode
    try:
        min_level = _LEVELS[level.strip().upper()]
    except KeyError:
        raise ValueError(f"unknown log level {level!r}; use one of {sorted(_LEVELS)}") from None
    if json is None:
        json = not _stderr_is_a_terminal()
    _json_mode = json
    exceptions: Processor
    renderer: Processor
    if json:
        exceptions = _DICT_TRACEBACKS
        renderer = structlog.processors.JSONRenderer(serializer=_dumps)
    else:
        # Tracebacks become text before redaction, so they are redacted too.
        exceptions = structlog.processors.format_exc_info
        renderer = structlog.dev.ConsoleRenderer(colors=_stderr_is_a_terminal())
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        _add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]
    structlog.configure(
        processors=[*shared, exceptions, _redact_event, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(min_level),
        logger_factory=_StderrLoggerFactory(),
        cache_logger_on_first_use=False,
    )
    _configure_stdlib(min_level, shared, exceptions, renderer)


def logs_are_json() -> bool:
    """Whether the last :func:`configure_logging` chose JSON lines (else console lines)."""
    return _json_mode


def _configure_stdlib(
    level: int, shared: list[Processor], exceptions: Processor, renderer: Processor
) -> None:
    """The root logger's one handler: stdlib records through the same processors."""
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            exceptions,
            _redact_event,
            _RenderToStr(renderer),
        ],
    )
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, _StderrHandler):
            root.removeHandler(handler)
    handler = _StderrHandler()
    handler.setFormatter(formatter)
    root.addHandler(handler)
    root.setLevel(level)
    # uvicorn's own logging config (a Config with the default log_config, as an embedding
    # application or an earlier server in this process may have made) gives its loggers
    # their own handlers and turns propagation off: their lines would bypass this format.
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi"):
        server_log = logging.getLogger(name)
        server_log.handlers.clear()
        server_log.propagate = True
    # httpx logs every request at INFO ("HTTP Request: POST ..."): one line per upstream
    # call is noise beside stream.finished, and a cost on the stream's path. DEBUG shows it.
    for chatty in ("httpx", "httpcore"):
        logging.getLogger(chatty).setLevel(
            logging.DEBUG if level <= logging.DEBUG else logging.WARNING
        )


class _RenderToStr:
    """The renderer for stdlib records: ProcessorFormatter wants ``str``, orjson gives
    ``bytes``."""

    def __init__(self, renderer: Processor) -> None:
        self._renderer = renderer

    def __call__(self, logger: WrappedLogger, method: str, event_dict: EventDict) -> str:
        out = self._renderer(logger, method, event_dict)
        return out.decode("utf-8", "replace") if isinstance(out, bytes) else str(out)


class _StderrHandler(logging.Handler):
    """Writes each formatted record to whatever ``sys.stderr`` is at the time (like
    :class:`_StderrLogger`), one whole line under the same lock; never raises."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:  # a broken record or argument: logging must not raise
            line = f'{{"event": "log record not formattable", "logger": "{record.name}"}}'
        _StderrLogger(record.name).msg(line)


def get_logger(name: str) -> FilteringBoundLogger:
    """A logger whose events carry ``logger=name`` (the module's ``__name__``, by convention).

    Cheap and configuration-independent: module-level ``log = get_logger(__name__)`` is
    fine, and follows later :func:`configure_logging` calls.
    """
    return cast(FilteringBoundLogger, _Logger(name))


class _Logger:
    """The bound logger for ``name`` under structlog's current configuration, built once
    per configuration.

    structlog's own lazy proxy (``structlog.get_logger``) binds a new logger on every
    call: about 6 µs hot and 30 µs cold for an event that is then filtered out, and
    ``stream.started`` is logged on the time to first event. Here a call costs one look
    at the configuration (``structlog.get_config``, public) and one bind after it changed:
    :func:`configure_logging`, ``structlog.reset_defaults``, or any other ``configure``.
    ``capture_logs`` edits the processor list in place, which a bound logger shares.
    The level methods are properties: through ``__getattr__`` alone a call costs 4 µs.
    """

    __slots__ = ("_bound", "_context", "_factory", "_name", "_processors", "_wrapper")

    def __init__(self, name: str) -> None:
        self._name = name
        self._bound: Any = None
        self._processors = self._wrapper = self._factory = self._context = None

    def _current(self) -> Any:
        config = structlog.get_config()
        processors = config["processors"]
        wrapper = config["wrapper_class"]
        factory = config["logger_factory"]
        context = config["context_class"]
        if (
            self._bound is None
            or processors is not self._processors
            or wrapper is not self._wrapper
            or factory is not self._factory
            or context is not self._context
        ):
            # The name travels as the logger factory's argument (a ``logger=`` initial
            # value would collide with structlog's own parameter); _add_logger_name puts
            # it in the event.
            self._bound = structlog.get_logger(self._name).bind()
            self._processors, self._wrapper = processors, wrapper
            self._factory, self._context = factory, context
        return self._bound

    @property
    def debug(self) -> Any:
        return self._current().debug

    @property
    def info(self) -> Any:
        return self._current().info

    @property
    def warning(self) -> Any:
        return self._current().warning

    @property
    def error(self) -> Any:
        return self._current().error

    @property
    def exception(self) -> Any:
        return self._current().exception

    @property
    def critical(self) -> Any:
        return self._current().critical

    @property
    def bind(self) -> Any:
        return self._current().bind

    def __getattr__(self, attr: str) -> Any:  # the rest of FilteringBoundLogger
        return getattr(self._current(), attr)


def _add_logger_name(logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    record = event_dict.get("_record")
    name = record.name if isinstance(record, logging.LogRecord) else getattr(logger, "name", None)
    if name is not None:
        event_dict.setdefault("logger", name)
    return event_dict


def _redact_event(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    """The processor that runs :func:`toolforge.core.redact.redact` over every event."""
    return cast(EventDict, redact(event_dict))


def _dumps(obj: Any, **kwargs: Any) -> bytes:
    """orjson first; then the stdlib (big integers, lone surrogates); then a stub line."""
    try:
        # OPT_NON_STR_KEYS: redaction keeps non-string keys (ints, tuples) as they are.
        return orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS, **kwargs)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        pass
    try:
        return _stdlib_json.dumps(
            obj, default=repr, skipkeys=True, allow_nan=False, separators=(",", ":")
        ).encode("utf-8")
    except (TypeError, ValueError, RecursionError) as exc:
        head = obj if isinstance(obj, dict) else {}
        stub = {k: str(head[k]) for k in ("timestamp", "level", "logger", "event") if k in head}
        stub["log_error"] = f"event not serialisable: {type(exc).__name__}"
        return orjson.dumps(stub, default=str)


def _stderr_is_a_terminal() -> bool:
    try:
        return sys.stderr is not None and sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stream
        return False


class _StderrLogger:
    """Writes each rendered line to whatever ``sys.stderr`` is at the time of the call."""

    _lock = threading.Lock()  # one whole line per event, even from worker threads

    def __init__(self, name: str | None = None) -> None:
        self.name = name

    def msg(self, message: str | bytes) -> None:
        text = message.decode("utf-8", "replace") if isinstance(message, bytes) else message
        with self._lock:
            stream = sys.stderr
            if stream is None:  # pythonw, or a daemon that closed it
                return
            try:
                stream.write(text + "\n")
                stream.flush()
            except (OSError, ValueError):  # closed or broken stream: logging must not raise
                pass

    log = debug = info = warn = warning = error = err = critical = exception = fatal = msg


class _StderrLoggerFactory:
    def __call__(self, *args: Any) -> _StderrLogger:
        return _StderrLogger(args[0] if args and isinstance(args[0], str) else None)
