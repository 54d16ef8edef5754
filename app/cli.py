"""The ``toolforge`` console script: ``toolforge serve --host --port --upstream --model``."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import uvicorn

from app.api.app import create_app
from app.settings import Settings

__all__ = ["main"]


def _serve(args: argparse.Namespace) -> None:
    overrides: dict[str, Any] = {}
    if args.upstream:
        overrides["upstream_base_url"] = args.upstream
    if args.model:
        overrides["model_id"] = args.model
    settings = Settings(**overrides)  # environment first, flags override (SPEC §8)
    app = create_app(settings)
    # httptools + uvloop when installed (uvicorn[standard]): the cheaper HTTP parser
    # matters on the per-event path (bench/RESULTS.md).
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="toolforge", description="ToolForge gateway")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the gateway over HTTP")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--upstream", help="OpenAI-compatible base URL (UPSTREAM_BASE_URL)")
    serve.add_argument("--model", help="model id sent upstream (MODEL_ID)")
    serve.set_defaults(func=_serve)
    args = parser.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
