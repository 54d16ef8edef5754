"""MCP tool sources, the pure part: the configuration, names, and result conversion.

The configuration is the format MCP clients already use, ``{"mcpServers": {"<name>":
{...}}}``, each server either **stdio** (``command``, ``args``, ``env``, optional
``cwd``) or **streamable HTTP** (``url``, ``headers``). ToolForge reads a few keys of its
own beside them (all optional):

``timeout_s``           per-attempt timeout of the server's tools (default TOOL_TIMEOUT_MS)
``retries``             retries of transient *transport* failures (default 2, 2 s apart)
``retry_delay_s``       the delay between them
``tools``               which of the server's tools to register (default: all)
``output_allowlist``    the redaction allowlist for every tool of the server: the
                        result keys logs and artifacts keep. Default ``[]``: nothing a
                        third-party server returns is written to logs or artifacts, only
                        that it answered. ``["*"]`` keeps everything.
``redact_keys``         argument keys never logged (on top of the usual secrets)
``needs_approval``      ``true`` (every tool) or a list of tool names
``disabled``, ``type``, ``description``: accepted for compatibility, ``disabled: true``
skips the server.

A server's environment is explicit (docs/security.md): a stdio server gets its ``env`` and the
MCP SDK's short list of safe variables (``HOME``, ``PATH``, ``USER``...), never the
gateway's own environment (so not ``UPSTREAM_API_KEY``).

Tools are registered as ``<server>.<tool>``. The runtime side (sessions, restarts) is
:mod:`toolforge.runtime.mcp`; this module never awaits and never imports the SDK.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from toolforge.core.tool_rules import ToolConfigError

__all__ = [
    "MCP_SOURCE_PREFIX",
    "McpListedTool",
    "McpServerConfig",
    "call_result_data",
    "listed_tool",
    "parse_mcp_servers",
    "tool_name",
]

MCP_SOURCE_PREFIX: Final = "mcp:"
_SERVER_NAME: Final = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_MAX_TEXT_CHARS: Final = 60_000


class McpServerConfig(BaseModel):
    """One entry of ``mcpServers`` (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict, repr=False)
    type: Literal["stdio", "http", "streamable-http", "streamableHttp"] | None = None
    description: str | None = None
    disabled: bool = False
    timeout_s: float | None = Field(default=None, gt=0)
    retries: int = Field(default=2, ge=0, le=5)
    retry_delay_s: float = Field(default=2.0, ge=0)
    tools: list[str] | None = None
    output_allowlist: list[str] = Field(default_factory=list)
    redact_keys: list[str] = Field(default_factory=list)
    needs_approval: bool | list[str] = False

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError('give either "command" (stdio) or "url" (streamable HTTP)')
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url {self.url!r} is not http(s)")
        if self.command is not None and (self.headers or self.url):
            raise ValueError('"headers" is for HTTP servers')
        if self.url is not None and (self.args or self.env or self.cwd):
            raise ValueError('"args", "env" and "cwd" are for stdio servers')
        return self

    @property
    def transport(self) -> Literal["stdio", "http"]:
        return "stdio" if self.command is not None else "http"

    def approval_needed(self, tool: str) -> bool:
        if isinstance(self.needs_approval, bool):
            return self.needs_approval
        return tool in self.needs_approval


def parse_mcp_servers(document: object, *, where: str) -> dict[str, McpServerConfig]:
    """The servers of one ``{"mcpServers": {...}}`` document (JSON text or parsed), in
    order, without the disabled ones. Raises :class:`ToolConfigError` naming ``where``
    (the file, or ``MCP_SERVERS``) and what is wrong."""
    if isinstance(document, str | bytes):
        try:
            document = orjson.loads(document)
        except orjson.JSONDecodeError as exc:
            raise ToolConfigError(f"{where} is not JSON: {exc}") from None
    if not isinstance(document, Mapping) or not isinstance(document.get("mcpServers"), Mapping):
        raise ToolConfigError(f'{where} must be a JSON object {{"mcpServers": {{"<name>": …}}}}')
    out: dict[str, McpServerConfig] = {}
    for name, entry in document["mcpServers"].items():
        if not _SERVER_NAME.match(name):
            raise ToolConfigError(
                f"{where}: server name {name!r} must be 1-64 letters, digits, '_' or '-' "
                "(it prefixes its tools' names: <server>.<tool>)"
            )
        try:
            config = McpServerConfig.model_validate(entry)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'entry'}: {e['msg']}"
                for e in exc.errors(include_url=False, include_input=False)
            )
            raise ToolConfigError(f"{where}: server {name!r}: {problems}") from None
        if not config.disabled:
            out[name] = config
    return out


def tool_name(server: str, tool: str) -> str:
    """The registry name of a server's tool."""
    return f"{server}.{tool}"


class McpListedTool(BaseModel):
    """What the gateway keeps of one listed tool (``tools/list``)."""

    model_config = ConfigDict(frozen=True)

    name: str
    description: str
    input_schema: dict[str, Any]
    idempotent: bool
    read_only: bool


def listed_tool(tool: Mapping[str, Any]) -> McpListedTool:
    """A listed tool, from its wire form (camelCase keys, as the server sent it)."""
    annotations = tool.get("annotations") or {}
    description = tool.get("description") or tool.get("title") or tool["name"]
    return McpListedTool(
        name=tool["name"],
        description=str(description),
        input_schema=dict(tool.get("inputSchema") or {}),
        idempotent=bool(annotations.get("idempotentHint") or annotations.get("readOnlyHint")),
        read_only=bool(annotations.get("readOnlyHint")),
    )


def _block(block: Mapping[str, Any]) -> object:
    kind = block.get("type")
    if kind == "text":
        return {"type": "text", "text": str(block.get("text", ""))[:_MAX_TEXT_CHARS]}
    if kind in ("image", "audio"):  # the bytes are no use to a text model, and large
        return {"type": kind, "mime_type": block.get("mimeType"), "omitted": True}
    if kind == "resource_link":
        return {"type": kind, "uri": block.get("uri"), "name": block.get("name")}
    if kind == "resource":
        res = block.get("resource") or {}
        return {"type": kind, "uri": res.get("uri"), "text": res.get("text")}
    return {"type": kind}


def call_result_data(result: Mapping[str, Any]) -> tuple[bool, object, str]:
    """A ``CallToolResult`` (wire form) as ``(ok, data, error_message)``.

    ``data`` is the structured content when the server gave one; else the text, when
    every block is text (``{"text": "..."}``); else ``{"content": [blocks]}`` with
    binary blocks described, not inlined. ``isError`` results are ``ok=False`` with the
    server's text as the message, which the model reads.
    """
    blocks = [b for b in result.get("content") or [] if isinstance(b, Mapping)]
    texts = [str(b.get("text", "")) for b in blocks if b.get("type") == "text"]
    if result.get("isError"):
        message = " ".join(t.strip() for t in texts if t.strip()) or "the tool reported an error"
        return False, None, message[:2000]
    structured = result.get("structuredContent")
    if structured is not None:
        return True, structured, ""
    if blocks and len(texts) == len(blocks):
        return True, {"text": "\n".join(texts)[:_MAX_TEXT_CHARS]}, ""
    return True, {"content": [_block(b) for b in blocks]}, ""
