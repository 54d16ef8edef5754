"""The sentinel-mode system prompt and the message list sent upstream. Pure functions.

The template (``prompts/system.txt``) is read by the caller and passed in, so this module
does no I/O; ``string.Template`` keeps the template readable and free of brace escaping
(JSON examples in it would fight ``str.format``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from string import Template
from typing import Any

import orjson

from toolforge.core.workflow import WorkflowDef

__all__ = [
    "build_messages",
    "render_system_prompt",
    "render_tool_result",
    "render_workflow_prompt",
    "tool_signature",
]


def render_system_prompt(
    template: str,
    *,
    result_schema: str,
    schemas: Mapping[str, Mapping[str, Any]] | None = None,
    tools: Sequence[Mapping[str, Any]] = (),
    signatures: bool = False,
) -> str:
    """Fill ``template`` with the result schema, the object schemas and the tools: each
    tool with its JSON Schema, or (``signatures``: a workflow's turns, whose compiled
    constraint narrows the tools and their arguments each turn) as one signature line
    where its arguments are scalars (:func:`tool_signature`)."""
    schemas_section = ""
    if schemas:
        lines = ["", "Schemas (each OBJECT and RESULT frame's JSON must match its schema):"]
        for name, schema in schemas.items():
            lines.append(f"- {name}: {orjson.dumps(schema).decode()}")
        schemas_section = "\n".join(lines) + "\n"
    tools_section = ""
    if tools and signatures:
        lines = ["", "Tools you may call (name(argument: type, ...); ? marks an optional one):"]
        for tool in tools:
            schema = tool.get("input_schema", {})
            signature = tool_signature(tool["name"], schema)
            if signature is None:  # nested objects, arrays, references: the schema itself
                signature = f"{tool['name']} input_schema={orjson.dumps(schema).decode()}"
            lines.append(f"- {signature}: {tool.get('description', '')}")
        tools_section = "\n".join(lines) + "\n"
    elif tools:
        lines = ["", "Tools you may call (arguments must match input_schema):"]
        for tool in tools:
            lines.append(
                f"- {tool['name']}: {tool.get('description', '')} "
                f"input_schema={orjson.dumps(tool.get('input_schema', {})).decode()}"
            )
        tools_section = "\n".join(lines) + "\n"
    return Template(template).safe_substitute(
        result_schema=result_schema,
        schemas_section=schemas_section,
        tools_section=tools_section,
    )


def render_workflow_prompt(template: str, workflow: WorkflowDef) -> str:
    """The workflow's part of the system prompt (``prompts/workflow.txt``): its steps, how
    it ends, its instructions."""
    return Template(template).safe_substitute(
        name=workflow.name,
        instructions=workflow.instructions or workflow.description,
        steps=", ".join(workflow.required_steps) or "(none)",
        terminal=" or ".join(sorted(workflow.terminal_tools)),
    )


def build_messages(system: str, messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Our system prompt first, then the caller's messages unchanged (theirs included)."""
    return [{"role": "system", "content": system}, *(dict(m) for m in messages)]


def render_tool_result(call_id: str, name: str, envelope: Mapping[str, Any]) -> str:
    """The message that resumes the model after a tool call (sentinel mode).

    A user message, because every chat template accepts one and a ``tool`` message would
    need the upstream's own tool-call ids. The envelope's strings had their sentinels
    escaped by the executor, so a tool result can never open or close a frame.
    """
    body = orjson.dumps(envelope).decode()
    if envelope.get("ok"):
        next_step = "Continue: call another tool if you need one, or write your RESULT frame."
    else:
        next_step = "The call failed. Fix what the error says and call again, or answer without it."
    return f"Result of tool call {call_id} ({name}):\n{body}\n{next_step}"


_SCALARS = frozenset({"string", "integer", "number", "boolean"})


def tool_signature(name: str, schema: Mapping[str, Any]) -> str | None:
    """A tool as one line a small model reads: ``book(place_id: string, party_size:
    integer 1..20, note?: string)``, with each argument's format, bounds, choices and
    description; None where an argument is not a scalar (an object, an array, a ``$ref``):
    the caller shows the JSON Schema then. The prompt only describes the call: the schema
    is what validates it (and, constrained, what the grammar enforces), so a third of the
    prompt's tokens are not spent on JSON Schema's own keywords."""
    props = schema.get("properties", {})
    if not isinstance(props, Mapping) or set(schema) - _TOOL_KEYS:
        return None
    required = schema.get("required", [])
    args: list[str] = []
    for arg, prop in props.items():
        text = _argument(prop)
        if text is None:
            return None
        args.append(f"{arg}{'' if arg in required else '?'}: {text}")
    return f"{name}({', '.join(args)})"


_TOOL_KEYS = frozenset(
    {"type", "properties", "required", "additionalProperties", "title", "description"}
)


def _argument(prop: object) -> str | None:
    """One scalar argument's type and what narrows it, or None."""
    if not isinstance(prop, Mapping):
        return None
    branches = prop.get("anyOf")
    if isinstance(branches, list):  # an optional value: X | None
        real = [b for b in branches if isinstance(b, Mapping) and b.get("type") != "null"]
        if len(real) != 1 or len(real) == len(branches):
            return None
        rest = {k: v for k, v in prop.items() if k not in ("anyOf", "default")}
        return _argument({**real[0], **rest})
    if "enum" in prop and isinstance(prop["enum"], list):
        text = "one of " + " | ".join(orjson.dumps(v).decode() for v in prop["enum"])
    elif prop.get("type") in _SCALARS:
        text = str(prop["type"])
        if isinstance(prop.get("format"), str):
            text += f" ({prop['format']})"
        low, high = prop.get("minimum"), prop.get("maximum")
        if low is not None or high is not None:
            text += f" {'' if low is None else low}..{'' if high is None else high}"
        if isinstance(prop.get("pattern"), str):
            text += f" matching {prop['pattern']}"
    else:
        return None
    if isinstance(prop.get("description"), str) and prop["description"]:
        text += f" ({prop['description']})"
    return text
