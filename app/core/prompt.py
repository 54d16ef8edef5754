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
]


def render_system_prompt(
    template: str,
    *,
    result_schema: str,
    schemas: Mapping[str, Mapping[str, Any]] | None = None,
    tools: Sequence[Mapping[str, Any]] = (),
) -> str:
    """Fill ``template`` with the result schema, the object schemas and the tools."""
    schemas_section = ""
    if schemas:
        lines = ["", "Schemas (each OBJECT and RESULT frame's JSON must match its schema):"]
        for name, schema in schemas.items():
            lines.append(f"- {name}: {orjson.dumps(schema).decode()}")
        schemas_section = "\n".join(lines) + "\n"
    tools_section = ""
    if tools:
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
