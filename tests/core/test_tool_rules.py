"""The tool rules of docs/tools.md (the allowlist, the JSON Schema subset), JSON-Schema tools'
argument validation, and the pure side of MCP sources (configuration, result conversion)."""

from __future__ import annotations

from typing import Any

import pytest

from toolforge.core.mcp import call_result_data, listed_tool, parse_mcp_servers
from toolforge.core.tool_rules import (
    ToolConfigError,
    apply_allowlist,
    check_registry,
    schema_violations,
)
from toolforge.core.tool_specs import (
    JsonArgs,
    ToolArgumentsError,
    ToolInvocationRecord,
    ToolRegistry,
    ToolSpec,
    validate_args,
)
from toolforge.tools import default_registry

OBJ: dict[str, Any] = {"type": "object"}


async def _fn(args: Any) -> object:
    return {}


def json_tool(schema: dict[str, Any], allow: frozenset[str] | None = frozenset()) -> ToolSpec[Any]:
    return ToolSpec(
        name="srv.tool",
        description="d",
        args_model=JsonArgs,
        json_schema=schema,
        fn=_fn,
        output_allowlist=allow,
        source="mcp:srv",
    )


@pytest.mark.parametrize(
    ("schema", "keyword"),
    [
        (
            {**OBJ, "properties": {"v": {"oneOf": [{"type": "string"}, {"type": "integer"}]}}},
            "oneOf",
        ),
        ({**OBJ, "allOf": [{"required": ["a"]}]}, "allOf"),
        ({**OBJ, "properties": {"v": {"not": {"type": "null"}}}}, "not"),
        ({**OBJ, "if": {}, "then": {}}, "if"),
        ({**OBJ, "patternProperties": {"^x": {}}}, "patternProperties"),
        ({**OBJ, "properties": {"v": {"items": {"anyOf": [{}, {}, {}]}}}}, "anyOf"),
        ({**OBJ, "properties": {"v": {"$ref": "https://example.com/s.json"}}}, "$ref"),
        ({"type": "array"}, "root must be"),
    ],
)
def test_schemas_outside_the_subset_name_the_keyword(schema: dict[str, Any], keyword: str) -> None:
    problems = schema_violations(schema)
    assert problems and any(keyword in p for p in problems), problems


def test_the_subset_allows_what_pydantic_writes() -> None:
    nullable = {**OBJ, "properties": {"v": {"anyOf": [{"type": "string"}, {"type": "null"}]}}}
    local_ref = {**OBJ, "properties": {"p": {"$ref": "#/$defs/P"}}, "$defs": {"P": OBJ}}
    assert schema_violations(nullable) == [] and schema_violations(local_ref) == []
    for spec in default_registry():
        assert schema_violations(spec.input_schema) == [], spec.name


def test_a_missing_allowlist_is_a_start_up_error() -> None:
    with pytest.raises(ToolConfigError) as caught:
        check_registry(ToolRegistry([json_tool(OBJ, allow=None)]))
    assert "srv.tool (mcp:srv): no output redaction allowlist" in caught.value.message
    check_registry(ToolRegistry([json_tool(OBJ)]))  # an empty allowlist is a declared one


def test_a_name_no_adapter_can_send_is_refused() -> None:
    spec = ToolSpec(
        name="srv.a__b",
        description="d",
        args_model=JsonArgs,
        json_schema=OBJ,
        fn=_fn,
        output_allowlist=frozenset(),
    )
    with pytest.raises(ToolConfigError, match="cannot be sent natively"):
        check_registry([spec])


def test_the_allowlist_strips_every_other_field() -> None:
    value = {"id": 1, "secret": "x", "items": [{"id": 2, "name": "n", "token": "t"}]}
    assert apply_allowlist(value, frozenset({"id", "items"})) == {"id": 1, "items": [{"id": 2}]}
    assert apply_allowlist(value, frozenset()) == {}
    assert apply_allowlist(value, frozenset({"*"})) == value
    assert apply_allowlist("text", frozenset()) == "text"


def test_json_schema_tools_validate_their_arguments() -> None:
    spec = json_tool(
        {
            **OBJ,
            "properties": {"a": {"type": "integer", "minimum": 0}, "s": {"type": "string"}},
            "required": ["a"],
            "additionalProperties": False,
        }
    )
    assert validate_args(spec, {"a": 3}).root == {"a": 3}
    with pytest.raises(ToolArgumentsError) as caught:
        validate_args(spec, {"a": -1, "s": 5, "x": "secret-value"})
    paths = {d["path"]: d["constraint"] for d in caught.value.details}
    assert paths == {"$": "additionalProperties", "$.a": "minimum", "$.s": "type"}
    assert "secret-value" not in caught.value.message  # values are never echoed
    with pytest.raises(ToolArgumentsError, match="missing required properties: a"):
        validate_args(spec, "{}")
    with pytest.raises(ToolArgumentsError):
        validate_args(spec, "[1]")  # not an object


def test_the_record_keeps_raw_out_of_its_dict() -> None:
    record = ToolInvocationRecord("c", "t", {}, {}, None, 1.0, 2.0, 1, raw={"content": ["x"]})
    assert record.raw == {"content": ["x"]} and "raw" not in record.to_dict()


def test_mcp_config_parsing() -> None:
    servers = parse_mcp_servers(
        '{"mcpServers": {"a": {"command": "srv", "args": ["-x"], "env": {"K": "v"}},'
        ' "b": {"url": "http://h/mcp", "headers": {"Authorization": "Bearer t"}},'
        ' "c": {"command": "off", "disabled": true}}}',
        where="MCP_SERVERS",
    )
    assert list(servers) == ["a", "b"]
    assert servers["a"].transport == "stdio" and servers["a"].env == {"K": "v"}
    assert servers["b"].transport == "http" and servers["b"].output_allowlist == []
    assert "Bearer" not in repr(servers["b"])  # headers never in a repr (logs)
    for bad, why in [
        ("{", "not JSON"),
        ('{"mcpServers": {"a": {}}}', "either"),
        ('{"mcpServers": {"a": {"url": "ftp://x"}}}', "http"),
        ('{"mcpServers": {"a": {"command": "x", "colour": 1}}}', "colour"),
    ]:
        with pytest.raises(ToolConfigError, match=why):
            parse_mcp_servers(bad, where="MCP_SERVERS")


def test_mcp_results_become_data_or_errors() -> None:
    assert call_result_data({"content": [], "structuredContent": {"sum": 5}}) == (
        True,
        {"sum": 5},
        "",
    )
    text = {"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    assert call_result_data(text) == (True, {"text": "a\nb"}, "")
    image = {"content": [{"type": "image", "data": "AAAA", "mimeType": "image/png"}]}
    ok, data, _ = call_result_data(image)
    assert ok and data == {
        "content": [{"type": "image", "mime_type": "image/png", "omitted": True}]
    }
    failed = {"content": [{"type": "text", "text": "no such city"}], "isError": True}
    assert call_result_data(failed) == (False, None, "no such city")
    tool = listed_tool({"name": "t", "inputSchema": OBJ, "annotations": {"readOnlyHint": True}})
    assert tool.idempotent and tool.description == "t"
