"""Generate the parts of the docs that other files own, so they never drift:

* ``docs/configuration.md`` — every environment variable, from the ``Settings`` class
  (:mod:`toolforge.settings`): its names, default and the reason comment above the field;
* the performance table in ``README.md`` (between ``<!-- perf:begin -->`` and
  ``<!-- perf:end -->``) — every target of the latest runs recorded in ``bench/RESULTS.md``.

    python -m toolforge.tools.gen_docs           # (re)write them   (make docs)
    python -m toolforge.tools.gen_docs --check   # exit 1, naming the stale file, if one is

``tests/test_docs.py`` runs the check, so a setting added without its row, or a benchmark
re-run without the README, fails the tests.
"""

from __future__ import annotations

import argparse
import enum
import re
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Final

from pydantic import AliasChoices
from pydantic_core import PydanticUndefined

from toolforge.settings import Settings

__all__ = [
    "EXTERNAL_VARIABLES",
    "check",
    "main",
    "performance_rows",
    "render_configuration",
    "render_readme",
    "settings_rows",
    "write",
]

ROOT: Final = Path(__file__).resolve().parents[1]
CONFIGURATION: Final = ROOT / "docs" / "configuration.md"
README: Final = ROOT / "README.md"
RESULTS: Final = ROOT / "bench" / "RESULTS.md"
SETTINGS_SOURCE: Final = ROOT / "app" / "settings.py"

PERF_BEGIN: Final = "<!-- perf:begin (generated from bench/RESULTS.md by make docs) -->"
PERF_END: Final = "<!-- perf:end -->"

# Settings whose field carries no reason comment of its own (a group's first field has it,
# or the name says it all): what the table says of them.
_NOTES: Final[dict[str, str]] = {
    "upstream_api_key": "sent as `Authorization: Bearer …`; never logged",
    "model_id": "the model sent upstream when a request names none",
    "upstream_first_byte_timeout_s": "the wait for the upstream's first byte (prompt processing)",
    "upstream_idle_timeout_s": "the gap allowed between two tokens of the upstream",
    "max_json_depth": "JSON nesting limit of a frame body",
    "frame_timeout_ms": "a frame open longer than this is abandoned with `FRAME_TIMEOUT`",
    "tool_timeout_ms": "one attempt of a server tool",
    "tool_concurrency": "tool calls running at once (a FIFO queue past it), over every stream",
    "repair_retries": "model repairs of an invalid JSON value before it is degraded",
    "budget_tokens": "the context budget for `BUDGET_MODE=manual`",
    "llama_threads": "the managed llama-server's threads (unset: its own choice)",
    "local_model_path": "a GGUF model to serve instead of the embedded one",
    "mcp_servers": "the same JSON as `MCP_CONFIG`'s file, inline",
    "context_keep_recent": "the last iterations compaction never cuts",
    "context_threshold": "the share of the budget over which a conversation is compacted",
    "anthropic_max_tokens": "`max_tokens` for `UPSTREAM_KIND=anthropic` when a request sets none",
    "rate_limit_window_s": "the rate limit's window, fixed",
    "rate_limit_streams": "streams one key may have running at once (0: no limit)",
    "auth_failure_window_s": "the window of `AUTH_FAILURE_LIMIT`, fixed",
    "artifacts_dir": "where `runs/<stream_id>/` go",
    "artifacts_max_bytes": "the most `runs/` may hold; the oldest runs go first (0: no limit)",
    "inline_workflow_max_tool_calls": "the tool calls an inline workflow may allow",
    "inline_workflow_max_budget_tokens": "an inline workflow's `budget_tokens` at most",
    "redis_url": "Redis for the state replicas share; unset keeps everything in memory",
    "log_level": "the level of the structured logs on stderr",
    "log_json": "the older switch for JSON logs; set, it wins over `LOG_FORMAT`",
}

# Variables the gateway reads besides its settings, by the library or module that does.
EXTERNAL_VARIABLES: Final[dict[str, str]] = {
    "HTTP_PROXY": "a proxy for upstream requests (httpx; loopback upstreams never use it)",
    "HTTPS_PROXY": "the same, for https upstreams",
    "ALL_PROXY": "the same, for any scheme",
    "NO_PROXY": "hosts reached without the proxy",
    "OTEL_EXPORTER_OTLP_ENDPOINT": "OpenTelemetry traces (the `otel` extra; docs/observability.md)",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "the same, for traces only",
    "OTEL_TRACES_EXPORTER": "the OpenTelemetry exporter (`otlp`, `console`, `none`)",
    "OTEL_SERVICE_NAME": "the service name on every span",
    "OTEL_SDK_DISABLED": "`true`: no traces whatever the rest says",
    "TOOLFORGE_CACHE_DIR": "where `toolforge obtain` keeps llama-server and the models "
    "(default `~/.cache/toolforge`)",
    "XDG_CACHE_HOME": "the cache's parent when `TOOLFORGE_CACHE_DIR` is unset",
    "NO_COLOR": "set: `toolforge demo` draws no colours",
    "ANTHROPIC_API_KEY": "`toolforge eval --backend anthropic`'s key",
    "TOOLFORGE_API_KEY": "the key `toolforge demo` and `toolforge eval` send to a gateway",
}

# The page that explains a section of the settings whose header in app/settings.py names none.
_SECTION_PAGES: Final[dict[str, list[str]]] = {
    "upstream": ["servers.md", "proxy.md"],
    "streaming": ["protocol.md", "tools.md"],
    "storage and ops": ["protocol.md", "deployment.md", "observability.md"],
}

_SECTION = re.compile(r"^\s*# -- (.+?) -+\s*$")
_FIELD = re.compile(r"^    (\w+): [^=]+= Field\(")


def _comments() -> Iterator[tuple[str, str, str]]:
    """``(field, section, reason comment)`` in source order; the comment is the block of
    ``#`` lines right above the field (empty when there is none)."""
    lines = SETTINGS_SOURCE.read_text(encoding="utf-8").splitlines()
    section = "general"
    block: list[str] = []
    for line in lines:
        stripped = line.strip()
        if m := _SECTION.match(line):
            section, block = m.group(1), []
        elif stripped.startswith("#"):
            block.append(stripped.lstrip("#").strip())
        elif m := _FIELD.match(line):
            yield m.group(1), section, " ".join(block)
            block = []
        elif not stripped or not line.startswith("        "):
            block = []


def _default(value: Any) -> str:
    if value is None or value is PydanticUndefined:
        return "unset"
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`"


def _names(alias: object) -> list[str]:
    if isinstance(alias, AliasChoices):
        return [str(choice) for choice in alias.choices]
    return [str(alias)]


def settings_rows() -> list[tuple[str, list[str], str, str]]:
    """``(section, environment names, default, description)`` per setting, in source
    order. Raises ``ValueError`` for a setting with no environment name or no reason."""
    fields = Settings.model_fields
    rows = []
    seen = set()
    for name, section, comment in _comments():
        field = fields[name]
        if field.validation_alias is None:
            raise ValueError(f"Settings.{name} has no environment name (validation_alias)")
        text = comment or field.description or _NOTES.get(name)
        if not text:
            raise ValueError(f"Settings.{name} has no reason comment: write one above the field")
        rows.append((section, _names(field.validation_alias), _default(field.default), text))
        seen.add(name)
    if missing := set(fields) - seen:
        raise ValueError(f"fields the source scan missed: {sorted(missing)}")
    return rows


def settings_variables() -> set[str]:
    """Every environment name the settings read."""
    return {env for _, names, _, _ in settings_rows() for env in names}


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_configuration() -> str:
    out = [
        "# Configuration: every environment variable",
        "",
        "<!-- Generated from app/settings.py by `make docs` (python -m toolforge.tools.gen_docs);",
        "     edit the field and its comment there, never this file. -->",
        "",
        "The gateway reads one `Settings` object (`app/settings.py`), from the environment first;",
        "`toolforge serve`'s flags (`--host`, `--port`, `--upstream`, `--model`) override it.",
        "An empty variable counts as unset. The page named under a section explains its",
        "settings in context ([README.md](README.md) lists every page).",
    ]
    section = None
    for sect, names, default, text in settings_rows():
        if sect != section:
            section = sect
            title = sect.split(" (")[0]
            out += ["", f"## {title[0].upper()}{title[1:]}", ""]
            pages = re.findall(r"docs/([\w-]+\.md)", sect) or _SECTION_PAGES.get(title, [])
            if pages:
                out += ["Explained in " + ", ".join(f"[{p}]({p})" for p in pages) + ".", ""]
            out += ["| variable | default | |", "|---|---|---|"]
        shown = " (or ".join(f"`{n}`" for n in names) + (")" if len(names) > 1 else "")
        out.append(f"| {shown} | {_cell(default)} | {_cell(text)} |")
    out += [
        "",
        "## Read besides the settings",
        "",
        "| variable | |",
        "|---|---|",
    ]
    out += [f"| `{name}` | {_cell(text)} |" for name, text in EXTERNAL_VARIABLES.items()]
    return "\n".join(out) + "\n"


# -- the README's performance table -------------------------------------------------------

_TARGET = re.compile(r"^- (?P<what>.+?): \*\*(?P<verdict>MET|MISSED)\*\*\s*$")
# The sections whose latest run the README shows, by their heading in RESULTS.md.
_PERF_SECTIONS: Final = (
    "Gateway (bench/gateway.py)",
    "Tool round trip (bench/tool_roundtrip.py)",
    "llama-server (bench/llama.py)",
)


def performance_rows(text: str) -> list[tuple[str, str, str]]:
    """``(benchmark, target as measured, MET|MISSED)`` for every target line of the
    sections the README shows, in RESULTS.md's order."""
    rows = []
    section = part = None
    for line in text.splitlines():
        if line.startswith("## "):
            title = line[3:].strip()
            section = title if title in _PERF_SECTIONS else None
            part = section.split(" (")[0] if section else None
        elif line.startswith("### ") and section:
            heading = line[4:].split(" (")[0].split(" — ")[-1].strip()
            part = f"{section.split(' (')[0]}: {heading[0].lower()}{heading[1:]}"
        elif part and (m := _TARGET.match(line)):
            rows.append((part, m.group("what"), m.group("verdict")))
    missing = set(_PERF_SECTIONS) - {s for s in _PERF_SECTIONS if f"## {s}" in text}
    if missing:
        raise ValueError(f"bench/RESULTS.md has no section {sorted(missing)}")
    return rows


def _code_of(text: str) -> str:
    m = re.search(r"^- code: (\S+)", text, re.MULTILINE)
    return m.group(1) if m else "?"


def render_performance(text: str) -> str:
    rows = performance_rows(text)
    met = sum(1 for *_, v in rows if v == "MET")
    out = [
        PERF_BEGIN,
        f"{met} of {len(rows)} targets met in the latest recorded runs (gateway benchmark at code "
        f"`{_code_of(text)}`, on a shared 2-vCPU machine; [bench/RESULTS.md](bench/RESULTS.md)).",
        "",
        "| benchmark | target, as measured | |",
        "|---|---|---|",
    ]
    out += [f"| {b} | {_cell(what)} | **{v}** |" for b, what, v in rows]
    out.append(PERF_END)
    return "\n".join(out)


def render_readme(readme: str, results: str) -> str:
    """``readme`` with its performance block regenerated from ``results``."""
    start, end = readme.find(PERF_BEGIN), readme.find(PERF_END)
    if start == -1 or end == -1:
        raise ValueError(f"README.md has no {PERF_BEGIN!r} … {PERF_END!r} block")
    return readme[:start] + render_performance(results) + readme[end + len(PERF_END) :]


def _targets() -> dict[Path, str]:
    readme = README.read_text(encoding="utf-8")
    results = RESULTS.read_text(encoding="utf-8")
    return {CONFIGURATION: render_configuration(), README: render_readme(readme, results)}


def check() -> list[Path]:
    """The generated files that differ from what the sources give now."""
    return [
        path
        for path, text in _targets().items()
        if not path.is_file() or path.read_text(encoding="utf-8") != text
    ]


def write() -> list[Path]:
    written = []
    for path, text in _targets().items():
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gen_docs", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a file is stale")
    args = parser.parse_args(argv)
    if args.check:
        stale = check()
        for path in stale:
            print(f"{path.relative_to(ROOT)} is stale: run make docs", file=sys.stderr)
        return 1 if stale else 0
    for path in write():
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
