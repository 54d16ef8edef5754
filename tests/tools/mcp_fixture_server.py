"""A real MCP server for the tests, written with the ``mcp`` package's low-level ``Server``.

``python -m tests.tools.mcp_fixture_server [--http PORT] [--bad-schema]``: stdio by
default, streamable HTTP on 127.0.0.1:PORT with ``--http``. Its tools (listed two per
page, so a client must follow ``nextCursor``; the listing carries a cache hint):

* ``echo {text}`` → the text; ``add {a, b}`` → structured ``{"sum"}``;
* ``fail {}`` → an ``isError`` result; ``sleep {seconds}`` → sleeps, then ``"slept"``;
* ``pid {}`` → the server's process id (a restart changes it);
* ``crash {}`` → the process exits at once (a crash mid-call);
* ``env {name}`` → one of the process's environment variables (or null);
* with ``--bad-schema``, ``union {}`` whose input schema uses ``oneOf``;
* with ``--shrink``, every listing after the first leaves ``echo`` out.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import anyio
import mcp_types as types
import uvicorn
from mcp.server import Server
from mcp.server.caching import CacheHint
from mcp.server.stdio import stdio_server

__all__ = ["build_server", "main"]

PAGE = 2


def _tools(bad_schema: bool) -> list[types.Tool]:
    obj = {"type": "object"}
    tools = [
        types.Tool(
            name="echo",
            description="Echo the text back.",
            input_schema={
                **obj,
                "properties": {"text": {"type": "string", "minLength": 1}},
                "required": ["text"],
                "additionalProperties": False,
            },
        ),
        types.Tool(
            name="add",
            description="Add two integers.",
            input_schema={
                **obj,
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
            annotations=types.ToolAnnotations(idempotent_hint=True, read_only_hint=True),
        ),
        types.Tool(name="fail", description="Always fails.", input_schema={**obj}),
        types.Tool(
            name="sleep",
            description="Sleep a while.",
            input_schema={**obj, "properties": {"seconds": {"type": "number"}}},
        ),
        types.Tool(name="pid", description="The server's process id.", input_schema={**obj}),
        types.Tool(name="crash", description="Exit the process.", input_schema={**obj}),
        types.Tool(
            name="env",
            description="One environment variable of the server's process.",
            input_schema={**obj, "properties": {"name": {"type": "string"}}},
        ),
    ]
    if bad_schema:
        tools.append(
            types.Tool(
                name="union",
                description="A schema outside the subset.",
                input_schema={
                    **obj,
                    "properties": {"v": {"oneOf": [{"type": "string"}, {"type": "integer"}]}},
                },
            )
        )
    return tools


def _text(text: str, *, error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=error)


def build_server(*, bad_schema: bool = False, shrink: bool = False) -> Server[Any]:
    tools = _tools(bad_schema)
    listings = 0

    async def list_tools(
        ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        nonlocal listings
        start = int(params.cursor) if params is not None and params.cursor else 0
        listings += start == 0
        offered = [t for t in tools if not (shrink and listings > 1 and t.name == "echo")]
        page = offered[start : start + PAGE]
        nxt = str(start + PAGE) if start + PAGE < len(offered) else None
        return types.ListToolsResult(tools=page, next_cursor=nxt)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        args = params.arguments or {}
        if params.name == "echo":
            return _text(str(args["text"]))
        if params.name == "add":
            total = int(args["a"]) + int(args["b"])
            return types.CallToolResult(
                content=[types.TextContent(text=str(total))], structured_content={"sum": total}
            )
        if params.name == "fail":
            return _text("the widget is broken (code 7)", error=True)
        if params.name == "sleep":
            await anyio.sleep(float(args.get("seconds", 1)))
            return _text("slept")
        if params.name == "pid":
            return types.CallToolResult(
                content=[types.TextContent(text=str(os.getpid()))],
                structured_content={"pid": os.getpid()},
            )
        if params.name == "env":
            value = os.environ.get(str(args.get("name")))
            return types.CallToolResult(
                content=[types.TextContent(text=str(value))], structured_content={"value": value}
            )
        if params.name == "crash":
            os._exit(3)
        return _text(f"unknown tool {params.name}", error=True)

    return Server(
        "fixture",
        version="1.0",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        cache_hints={"tools/list": CacheHint(ttl_ms=60_000)},
    )


async def _stdio(server: Server[Any]) -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, default=None)
    parser.add_argument("--bad-schema", action="store_true")
    parser.add_argument("--shrink", action="store_true")
    args = parser.parse_args()
    server = build_server(bad_schema=args.bad_schema, shrink=args.shrink)
    if args.http is None:
        anyio.run(_stdio, server)
    else:
        app = server.streamable_http_app()
        uvicorn.run(app, host="127.0.0.1", port=args.http, log_level="warning")


if __name__ == "__main__":
    main()
