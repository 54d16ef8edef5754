"""A stand-in for llama-server's process life, for ServerManager tests: real process, real
HTTP on loopback, none of the model. It answers ``/health`` (503 for ``--load-s`` seconds,
then 200) and ``/props``, and obeys the flags the manager passes. Environment knobs make
it misbehave: ``FAKE_EXIT_AT_START`` (exit with that status at once), ``FAKE_CRASH_AFTER_S``
(die with status 134 that long after start; with ``FAKE_CRASH_MARKER`` set, only the
first process does, leaving that file behind), ``FAKE_NEVER_HEALTHY`` (503 forever).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model")
    parser.add_argument("--alias")
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    parser.add_argument("--ctx-size", type=int, default=4096)
    parser.add_argument("--parallel", type=int, default=1)
    parser.add_argument("--load-s", type=float, default=0.2)
    args, _ = parser.parse_known_args()
    if code := os.environ.get("FAKE_EXIT_AT_START"):
        print("fake: failing at start as asked", flush=True)
        sys.exit(int(code))
    started = time.monotonic()
    never = bool(os.environ.get("FAKE_NEVER_HEALTHY"))

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a: object) -> None:
            pass

        def _json(self, status: int, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health":
                loading = never or time.monotonic() - started < args.load_s
                self._json(503 if loading else 200, {"status": "loading" if loading else "ok"})
            elif self.path == "/props":
                self._json(
                    200,
                    {
                        "default_generation_settings": {"n_ctx": args.ctx_size // args.parallel},
                        "total_slots": args.parallel,
                        "model_alias": args.alias,
                        "pid": os.getpid(),
                    },
                )
            else:
                self._json(404, {"error": "not found"})

    marker = os.environ.get("FAKE_CRASH_MARKER")
    crashed_before = marker is not None and os.path.exists(marker)
    if (after := os.environ.get("FAKE_CRASH_AFTER_S")) and not crashed_before:
        if marker is not None:
            open(marker, "w").close()

        def crash() -> None:
            time.sleep(float(after))
            print("fake: crashing as asked", flush=True)
            os._exit(134)

        threading.Thread(target=crash, daemon=True).start()
    print(f"fake llama-server on {args.host}:{args.port}", flush=True)
    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
