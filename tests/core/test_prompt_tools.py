"""How the system prompt shows tools (toolforge.core.prompt): one signature line per tool
whose arguments are scalars, the JSON Schema itself for anything else."""

from __future__ import annotations

from typing import Any

import orjson

from toolforge.core.prompt import render_system_prompt, tool_signature

BOOK: dict[str, Any] = {
    "type": "object",
    "title": "BookArgs",
    "additionalProperties": False,
    "properties": {
        "place_id": {"type": "string", "title": "Place Id", "description": "from a search"},
        "date": {"type": "string", "format": "date"},
        "party_size": {"type": "integer", "minimum": 1, "maximum": 20},
        "time": {"type": "string", "pattern": "^[0-2][0-9]:(00|30)$"},
        "seat": {"enum": ["inside", "terrace"]},
        "contact": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
    },
    "required": ["place_id", "date", "party_size", "time"],
}


def test_a_tool_of_scalar_arguments_is_one_signature_with_what_narrows_each() -> None:
    assert tool_signature("book", BOOK) == (
        "book(place_id: string (from a search), date: string (date), party_size: integer "
        '1..20, time: string matching ^[0-2][0-9]:(00|30)$, seat?: one of "inside" | '
        '"terrace", contact?: string)'
    )


def test_nested_or_referenced_arguments_show_the_schema_itself() -> None:
    nested = {"type": "object", "properties": {"items": {"type": "array"}}}
    referenced = {"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}, "$defs": {}}
    assert tool_signature("t", nested) is None
    assert tool_signature("t", referenced) is None
    tools = [
        {"name": "book", "description": "Book a table.", "input_schema": BOOK},
        {"name": "order", "description": "Order.", "input_schema": nested},
    ]
    prompt = render_system_prompt(
        "$tools_section", result_schema="Any", tools=tools, signatures=True
    )
    assert "- book(place_id: string" in prompt and ": Book a table." in prompt
    assert f"- order input_schema={orjson.dumps(nested).decode()}: Order." in prompt
    # The signature is shorter than the schema it stands for.
    assert len(tool_signature("book", BOOK) or "") < len(orjson.dumps(BOOK)) / 2


def test_a_plain_requests_prompt_teaches_each_tools_schema() -> None:
    # Without a workflow nothing narrows the tools turn by turn: the schema is shown whole.
    tools = [{"name": "book", "description": "Book a table.", "input_schema": BOOK}]
    prompt = render_system_prompt("$tools_section", result_schema="Any", tools=tools)
    assert f"- book: Book a table. input_schema={orjson.dumps(BOOK).decode()}" in prompt
