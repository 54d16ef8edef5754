"""ToolForge's own tools as an MCP server (``toolforge mcp-serve``).

The configured packs (``TOOL_PACKS``) are served with the ``mcp`` package's low-level
``Server``, over stdio or streamable HTTP (``/mcp``). The SDK serves both protocol eras:
the 2026-07-28 per-request revision and the ``initialize`` handshake of older clients.
Every call goes through the same :class:`~toolforge.runtime.executor.ToolExecutor` as in
the gateway: validation, timeout, retries, the concurrency limit, redaction in the logs.
A failed call is an ``isError`` result whose text is ``CODE: message`` (what a model can
read), with the error object as structured content. Tools that need approval are
refused: an MCP client has no approvals endpoint here.
"""

from __future__ import annotations

import uuid
from typing import Any, Final

import mcp_types as types
from mcp.server import Server
from mcp.server.caching import CacheHint
from mcp.server.stdio import stdio_server

from toolforge import __version__
from toolforge.core.tool_specs import dump_json
from toolforge.runtime.executor import ToolExecutor

__all__ = ["build_mcp_server", "serve_stdio"]

PAGE_SIZE: Final = 50


def build_mcp_server(executor: ToolExecutor) -> Server[Any]:
    """An MCP server whose tools are ``executor``'s model-facing tools."""
    registry = executor.registry

    def listing() -> list[types.Tool]:
        return [
            types.Tool(
                name=spec.name,
                description=spec.description,
                input_schema=spec.input_schema,
                annotations=types.ToolAnnotations(idempotent_hint=spec.idempotent),
            )
            for spec in registry.visible()
        ]

    async def list_tools(
        ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        tools = listing()
        start = 0
        if params is not None and params.cursor:
            try:
                start = int(params.cursor)
            except ValueError:
                start = len(tools)
        end = start + PAGE_SIZE
        return types.ListToolsResult(
            tools=tools[start:end], next_cursor=str(end) if end < len(tools) else None
        )

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        result = await executor.run(
            params.name, params.arguments or {}, call_id=f"mcp-{uuid.uuid4().hex[:12]}"
        )
        envelope = result.envelope
        if envelope.ok:
            return types.CallToolResult(
                content=[types.TextContent(text=dump_json(envelope.data).decode())],
                structured_content=envelope.data,
            )
        error = envelope.errors[0] if envelope.errors else {"code": "TOOL_FAILED"}
        return types.CallToolResult(
            content=[types.TextContent(text=f"{error.get('code')}: {error.get('message')}")],
            structured_content={"error": error},
            is_error=True,
        )

    return Server(
        "toolforge",
        version=__version__,
        instructions="ToolForge's tools (the configured packs).",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        # The tool set is fixed for the life of the process.
        cache_hints={"tools/list": CacheHint(ttl_ms=300_000, scope="public")},
    )


async def serve_stdio(server: Server[Any]) -> None:
    """Serve ``server`` on this process's stdin/stdout until the client closes it."""
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())
