"""docker/compose_test.py (``make compose-test``) in parts that need no Docker engine: which
images it stands in for without a registry, what each stand-in runs, the compose file
that docker-compose 1.x reads, and its SSE reader against a real server on loopback.
The whole driver runs only with ``make compose-test`` (docs/docker.md has its last run)."""

from __future__ import annotations

import http.server
import importlib.util
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def driver() -> ModuleType:
    spec = importlib.util.spec_from_file_location("compose_test", ROOT / "docker/compose_test.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["compose_test"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_stand_ins_are_exactly_the_registry_images(driver: ModuleType) -> None:
    compose = yaml.safe_load((ROOT / "docker/compose.yaml").read_text())
    from_compose = {
        s["image"] for s in compose["services"].values() if "build" not in s and "image" in s
    }
    images = driver._external_images()
    assert len(images) == len(set(images))
    assert set(images) == {"python:3.11-slim-bookworm", "debian:12-slim"} | from_compose
    # Built by the driver itself, never stood in for.
    assert driver.GATEWAY_IMAGE not in images and driver.LLAMA_IMAGE not in images


@pytest.mark.parametrize(
    ("image", "command"),
    [
        ("python:3.11-slim-bookworm", ["python3"]),
        ("redis:7.4-alpine", ["redis-server"]),
        ("nginx:1.27-alpine", ["nginx", "-g", "daemon off;"]),
        ("debian:12-slim", ["bash"]),
        ("library/nginx:1.27", ["nginx", "-g", "daemon off;"]),
    ],
)
def test_a_stand_in_runs_what_the_official_image_runs(
    driver: ModuleType, image: str, command: list[str]
) -> None:
    assert driver._stand_in_command(image) == command


def test_compose_1_reads_a_copy_without_the_project_name(
    driver: ModuleType, tmp_path: Path
) -> None:
    v1 = driver.compose_file(driver.Engine(["docker-compose"]), tmp_path)
    assert v1.parent == tmp_path
    original = yaml.safe_load((ROOT / "docker/compose.yaml").read_text())
    copy = yaml.safe_load(v1.read_text())
    assert "name" not in copy and original.pop("name") == driver.PROJECT
    assert copy == original  # nothing else differs
    v2 = driver.compose_file(driver.Engine(["docker", "compose"]), tmp_path)
    assert v2 == ROOT / "docker/compose.yaml"


def test_compose_commands_name_the_project_and_the_docker_folder(
    driver: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Relative paths in the copy (``..``, ``./nginx.conf``) resolve against docker/."""
    seen: list[list[str]] = []
    monkeypatch.setattr(driver, "run", lambda args, **_: seen.append(list(args)))
    driver.compose(driver.Engine(["docker-compose"]), tmp_path / "compose.yaml", "ps")
    assert seen == [
        [
            "docker-compose",
            "-p",
            "toolforge",
            "--project-directory",
            str(ROOT / "docker"),
            "-f",
            str(tmp_path / "compose.yaml"),
            "ps",
        ]
    ]


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        if self.path == "/json":
            body = b'{"error": {"code": "UNAUTHORIZED"}}'
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("X-Stream-Id", "s_1")
        self.send_header("Connection", "close")
        self.end_headers()
        blocks = [
            b'id: 1\nevent: stream.begin\ndata: {"stream_id": "s_1"}\n\n',
            b": ping\n\n",
            b'id: 2\nevent: text.delta\ndata: {"chunk": "a"}\n\n',
            b'id: 3\nevent: done\ndata: {"reason": "stop"}\n\n',
        ]
        wire = b"".join(blocks)
        for i in range(0, len(wire), 7):  # frames split anywhere, as TCP may
            self.wfile.write(wire[i : i + 7])
            self.wfile.flush()
        self.close_connection = True

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[int]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield int(httpd.server_address[1])
    httpd.shutdown()
    httpd.server_close()


def test_the_sse_reader_skips_pings_and_joins_split_frames(driver: ModuleType, server: int) -> None:
    got = driver.sse(server, "GET", "/stream", key="k")
    assert got.status == 200 and got.headers["x-stream-id"] == "s_1"
    assert [(f.id, f.event) for f in got.frames] == [
        (1, "stream.begin"),
        (2, "text.delta"),
        (3, "done"),
    ]
    driver._numbered(got.frames)
    part = driver.sse(server, "GET", "/stream", key="k", stop_after=2)
    assert [f.id for f in part.frames] == [1, 2]
    with pytest.raises(driver.Failed, match=r"not 2\.\.n"):
        driver._numbered(got.frames, first=2)
    refused = driver.sse(server, "GET", "/json", key=None)
    assert refused.status == 401 and b"UNAUTHORIZED" in refused.body
