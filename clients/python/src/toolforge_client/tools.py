"""Client-side tools (docs/tools.md): plain functions, sync or async, that the SDK runs when the
model calls them, posting the result back to the gateway.

The JSON Schema of a tool's arguments comes from, in this order:

1. ``parameters=`` given explicitly (a JSON Schema dict): the function gets the
   arguments as keyword arguments;
2. a single parameter annotated with a pydantic model: the function gets the model,
   validated, and the schema is the model's;
3. the function's signature (each parameter annotated): the function gets keyword
   arguments, validated by pydantic.

A tool's name is the function's name (or ``name=``; dots are allowed, ``device.location``),
its description the docstring's first paragraph (or ``description=``).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, get_type_hints

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

__all__ = [
    "ClientTool",
    "ToolOutcome",
    "as_client_tool",
    "client_tool",
    "outcome_of",
    "run_tool_async",
    "run_tool_sync",
]

ToolFunction = Callable[..., Any]


@dataclass(frozen=True)
class ClientTool:
    """A tool the caller runs. ``fn`` None: declared only (answer its calls yourself with
    ``stream.submit_tool_result``). ``timeout``: seconds, else the client's
    ``tool_timeout``."""

    name: str
    description: str
    parameters: dict[str, Any]
    fn: ToolFunction | None = None
    timeout: float | None = None
    args_model: type[BaseModel] | None = None
    model_arg: bool = False  # fn takes the validated model itself, not keyword arguments

    def to_wire(self) -> dict[str, Any]:
        """The ``client_tools`` entry of ``POST /v1/stream``."""
        return {"name": self.name, "description": self.description, "parameters": self.parameters}

    def prepare(self, args: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Positional and keyword arguments for ``fn`` from the call's ``args``."""
        if self.args_model is not None:
            model = self.args_model.model_validate(args)
            if self.model_arg:
                return (model,), {}
            return (), {name: getattr(model, name) for name in type(model).model_fields}
        if not isinstance(args, Mapping):
            raise TypeError(f"arguments must be a JSON object, got {type(args).__name__}")
        return (), dict(args)


def client_tool(
    fn: ToolFunction | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    parameters: Mapping[str, Any] | type[BaseModel] | None = None,
    timeout: float | None = None,
) -> Any:
    """Make ``fn`` a :class:`ClientTool`; usable bare (``@client_tool``) or with options
    (``@client_tool(name="device.location", timeout=2)``)."""

    def wrap(f: ToolFunction) -> ClientTool:
        return _from_function(f, name, description, parameters, timeout)

    return wrap(fn) if fn is not None else wrap


def as_client_tool(tool: ClientTool | ToolFunction | Mapping[str, Any]) -> ClientTool:
    """A :class:`ClientTool` from a tool, a plain function, or a declaration dict
    (``{"name", "description", "parameters"}``: answered by hand)."""
    if isinstance(tool, ClientTool):
        return tool
    if isinstance(tool, Mapping):
        return ClientTool(
            name=str(tool["name"]),
            description=str(tool.get("description", "")),
            parameters=dict(tool.get("parameters", {"type": "object", "properties": {}})),
        )
    if callable(tool):
        return _from_function(tool, None, None, None, None)
    raise TypeError(f"a client tool is a function, a ClientTool or a dict, not {tool!r}")


def _from_function(
    fn: ToolFunction,
    name: str | None,
    description: str | None,
    parameters: Mapping[str, Any] | type[BaseModel] | None,
    timeout: float | None,
) -> ClientTool:
    doc = inspect.getdoc(fn) or ""
    desc = description if description is not None else doc.split("\n\n", 1)[0].strip()
    tool_name = name or getattr(fn, "__name__", "")
    if not tool_name or tool_name == "<lambda>":
        raise ValueError("give a client tool a name= (a lambda has none)")
    if isinstance(parameters, Mapping):
        return ClientTool(tool_name, desc, dict(parameters), fn, timeout)
    model, model_arg = _args_model(fn, parameters)
    schema = model.model_json_schema()
    schema.pop("title", None)
    return ClientTool(tool_name, desc, schema, fn, timeout, model, model_arg)


def _args_model(fn: ToolFunction, given: type[BaseModel] | None) -> tuple[type[BaseModel], bool]:
    signature = inspect.signature(fn)
    params = [
        p
        for p in signature.parameters.values()
        if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]
    hints = get_type_hints(fn)
    if given is not None:
        return given, len(params) == 1 and _is_model(hints.get(params[0].name))
    if len(params) == 1 and _is_model(hints.get(params[0].name)):
        model: type[BaseModel] = hints[params[0].name]
        return model, True
    fields: dict[str, Any] = {}
    for p in params:
        if p.name not in hints:
            raise TypeError(
                f"client tool {fn.__name__!r}: parameter {p.name!r} has no type annotation "
                "(annotate it, or give parameters= a JSON Schema)"
            )
        default = ... if p.default is inspect.Parameter.empty else p.default
        fields[p.name] = (hints[p.name], default)
    config = ConfigDict(extra="forbid")
    return create_model(f"{fn.__name__}_args", __config__=config, **fields), False


def _is_model(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, BaseModel)


@dataclass(frozen=True)
class ToolOutcome:
    """What is posted to ``…/tool_results/{call_id}``: ``{"ok", "result"|"error"}``."""

    ok: bool
    result: Any = None
    error_code: str = ""
    error_message: str = ""

    def to_wire(self) -> dict[str, Any]:
        if self.ok:
            return {"ok": True, "result": self.result}
        return {
            "ok": False,
            "error": {"code": self.error_code[:64], "message": self.error_message[:4096]},
        }


def outcome_of(value: Any) -> ToolOutcome:
    """A function's return value as an ok outcome, if it is JSON (pydantic models are
    dumped); else a ``RESULT_NOT_JSON`` error, so the model hears why."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        return ToolOutcome(False, error_code="RESULT_NOT_JSON", error_message=str(exc))
    return ToolOutcome(True, value)


def _failure(exc: BaseException) -> ToolOutcome:
    if isinstance(exc, ValidationError):
        return ToolOutcome(False, error_code="TOOL_ARGS_INVALID", error_message=str(exc))
    code = getattr(exc, "code", None)
    return ToolOutcome(
        False,
        error_code=code if isinstance(code, str) and code else type(exc).__name__,
        error_message=str(exc) or type(exc).__name__,
    )


def _timed_out(tool: ClientTool, timeout: float) -> ToolOutcome:
    return ToolOutcome(
        False,
        error_code="CLIENT_TOOL_TIMEOUT",
        error_message=f"client tool {tool.name!r} did not finish in {timeout:g} s",
    )


def run_tool_sync(tool: ClientTool, args: Any, timeout: float | None) -> ToolOutcome:
    """Run ``tool`` in a worker thread (an async function on its own event loop there),
    waiting at most ``timeout`` seconds. A sync function that overruns is abandoned (its
    thread finishes on its own); an async one is cancelled."""
    assert tool.fn is not None
    fn = tool.fn
    box: list[ToolOutcome] = []

    def work() -> None:
        try:
            call_args, kwargs = tool.prepare(args)
            if inspect.iscoroutinefunction(fn):

                async def bounded() -> Any:
                    return await asyncio.wait_for(fn(*call_args, **kwargs), timeout)

                box.append(outcome_of(asyncio.run(bounded())))
            else:
                box.append(outcome_of(fn(*call_args, **kwargs)))
        except TimeoutError:
            box.append(_timed_out(tool, timeout or 0))
        except BaseException as exc:  # the model hears about any failure of the tool
            box.append(_failure(exc))

    worker = threading.Thread(target=work, name=f"toolforge-tool-{tool.name}", daemon=True)
    worker.start()
    worker.join(timeout)
    if not box:
        return _timed_out(tool, timeout or 0)
    return box[0]


async def run_tool_async(tool: ClientTool, args: Any, limit_s: float | None) -> ToolOutcome:
    """Run ``tool`` on this event loop (a sync function in a thread), at most ``limit_s``
    seconds; an async function that overruns is cancelled."""
    assert tool.fn is not None
    fn = tool.fn
    try:
        call_args, kwargs = tool.prepare(args)
        if inspect.iscoroutinefunction(fn):
            value = await asyncio.wait_for(fn(*call_args, **kwargs), limit_s)
        else:
            value = await asyncio.wait_for(asyncio.to_thread(fn, *call_args, **kwargs), limit_s)
    except TimeoutError:
        return _timed_out(tool, limit_s or 0)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # the model hears about any failure of the tool
        return _failure(exc)
    return outcome_of(value)
