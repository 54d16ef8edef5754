"""``make compose-test``: build docker/compose.yaml's stack on this machine, run it, and check
it through its load balancer, the way a user of the stack would reach it.

The steps, each printed as it starts:

1. **The engine.** ``docker``, a compose (``docker compose`` or ``docker-compose``) and,
   when no registry answers, ``debootstrap``: installed from Debian's packages
   (``docker.io``, ``docker-compose``, ``debootstrap``) with apt-get when missing, as root;
   otherwise the script names what to install and stops. A ``dockerd`` is started when none
   answers (``DOCKERD_ARGS``, by default ``--iptables=false --bridge=none``: what works
   inside a container or a sandbox), and left running after.
2. **Base images.** With a registry, the Dockerfile's and compose.yaml's images are pulled
   as usual. Without one, a Debian bookworm root file system is made with ``debootstrap``
   (once: cached under ``~/.cache/toolforge/docker``), given a Python virtual environment
   and this machine's CA certificates, imported with ``docker import``, and tagged as
   local stand-ins under the names the files use (``python:3.11-slim-bookworm``,
   ``debian:12-slim``, ``redis:…``, ``nginx:…``), each with the command the official
   image has. A stand-in is never made over an image that exists already.
3. **Build and start**: the two images (llama-server with the model, the gateway), then
   the stack, detached; every service healthy within ``--up-timeout`` seconds.
4. **Checks through nginx**, with a key made up for the run:
   - keys are required (no key and a wrong key: 401; ``/healthz`` is public);
   - the web UI is in the image (``/`` and the SDK build it loads);
   - the demo stream (the booking workflow) runs to ``done``, its frames numbered 1..n;
   - a stream is read in part, its replica is stopped (``docker stop``), and a resume
     through nginx (served by the other replica from Redis) gets the rest, every frame
     exactly once, to ``done``;
   - ``compose down`` leaves no container, network or volume of the project.
5. **The record**: one JSON line (result, seconds, each check) appended to
   ``~/.cache/toolforge/compose-test/runs.jsonl`` and printed; docs/docker.md quotes the
   last one.

Stdlib only: it runs before anything is installed, with the machine's ``python3``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOCKER_DIR = ROOT / "docker"
DOCKERFILE = DOCKER_DIR / "Dockerfile"
COMPOSE = DOCKER_DIR / "compose.yaml"
PROJECT = "toolforge"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "toolforge"
DOCKER_CACHE = CACHE / "docker"
RUNS = CACHE / "compose-test" / "runs.jsonl"
# No iptables and no default bridge: what a dockerd inside a container or a sandbox can
# have (compose's own bridge networks still work). The storage driver is dockerd's choice:
# overlay2 where the kernel has it (builds in minutes), vfs otherwise (a full copy of the
# file system per layer: the same build takes several times as long).
DEFAULT_DOCKERD_ARGS = "--iptables=false --bridge=none"
DEBIAN_MIRROR = os.environ.get("DEBIAN_MIRROR", "http://deb.debian.org/debian")
# What the stand-in base has: Python (a venv at /opt/venv, first on PATH, as `python` and
# `pip` are in python:3.11-slim), the runtime libraries the Dockerfile's stages install
# anyway, and the two servers that compose.yaml takes from the official images.
BASE_PACKAGES = (
    "ca-certificates,python3,python3-pip,python3-venv,python-is-python3,curl,wget,"
    "libgomp1,redis-server,nginx-light"
)
BASE_IMAGE = "toolforge/debootstrap:bookworm"
STAND_IN_LABEL = "org.toolforge.stand-in"
GATEWAY_IMAGE = "toolforge/gateway:local"
LLAMA_IMAGE = "toolforge/llama-server:local"
GATEWAYS = ("gateway-1", "gateway-2")
DEMO_BODY = {
    "input": "Find pizza near me; book a table for 2 at 7pm if open.",
    "workflow": "book_a_table",
    "profile": "demo",
}
LONG_BODY = {
    "input": "Count from 1 to 300, one number per line, and nothing else.",
    "sampling": {"temperature": 0, "max_tokens": 1200},
}


class Failed(Exception):
    """A check or a step failed: the message says which and why."""


def say(message: str) -> None:
    print(f"compose-test: {message}", flush=True)


def run(
    args: Sequence[str],
    *,
    check: bool = True,
    capture: bool = False,
    env: dict[str, str] | None = None,
    timeout: float | None = None,
    input_bytes: bytes | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """Run a command; its output goes to the terminal unless ``capture``."""
    result = subprocess.run(
        list(args),
        check=False,
        stdout=subprocess.PIPE if capture else None,
        stderr=subprocess.PIPE if capture else None,
        env={**os.environ, **(env or {})},
        timeout=timeout,
        input=input_bytes,
    )
    if check and result.returncode != 0:
        detail = (result.stderr or b"").decode(errors="replace").strip()[-2000:]
        raise Failed(
            f"`{' '.join(args)}` exited {result.returncode}" + (f": {detail}" if detail else "")
        )
    return result


def output(args: Sequence[str], **kwargs: Any) -> str:
    return run(args, capture=True, **kwargs).stdout.decode().strip()


# -- 1. the engine -------------------------------------------------------------------------


@dataclass
class Engine:
    compose: list[str]  # ["docker", "compose"] or ["docker-compose"]
    started_dockerd: int | None = None  # the pid of a dockerd this run started

    @property
    def v1(self) -> bool:
        return self.compose == ["docker-compose"]


def _compose_command() -> list[str] | None:
    if (
        shutil.which("docker")
        and run(["docker", "compose", "version"], check=False, capture=True).returncode == 0
    ):
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


def _apt_install(packages: Sequence[str]) -> None:
    if os.geteuid() != 0:
        raise Failed(
            f"missing: {', '.join(packages)}. Install them (Debian/Ubuntu: "
            f"sudo apt-get install {' '.join(packages)}), or run `make compose-test` as root "
            "to have them installed"
        )
    say(f"installing {' '.join(packages)} with apt-get")
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    run(["apt-get", "update", "-q"], env=env)
    run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages], env=env)


def ensure_tools(need_debootstrap: bool) -> list[str]:
    missing = []
    if not shutil.which("docker"):
        missing.append("docker.io")
    elif not shutil.which("dockerd") and not _daemon_answers():
        missing.append("docker.io")
    if _compose_command() is None:
        missing.append("docker-compose")
    if need_debootstrap and not shutil.which("debootstrap"):
        missing.append("debootstrap")
    if missing:
        _apt_install(sorted(set(missing)))
    compose = _compose_command()
    if compose is None:
        raise Failed("no compose command after installing docker-compose")
    return compose


def _daemon_answers() -> bool:
    if not shutil.which("docker"):
        return False
    return run(["docker", "info"], check=False, capture=True, timeout=30).returncode == 0


def ensure_daemon() -> int | None:
    """A dockerd that answers; the pid of one started here (None: one ran already)."""
    if _daemon_answers():
        return None
    if os.geteuid() != 0:
        raise Failed("no Docker daemon answers, and only root can start one here")
    args = os.environ.get("DOCKERD_ARGS", DEFAULT_DOCKERD_ARGS).split()
    DOCKER_CACHE.mkdir(parents=True, exist_ok=True)
    log_path = DOCKER_CACHE / "dockerd.log"
    say(f"starting dockerd {' '.join(args)} (log: {log_path})")
    with log_path.open("ab") as log:
        process = subprocess.Popen(  # left running: later runs and the user reuse it
            ["dockerd", *args], stdout=log, stderr=log, start_new_session=True
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise Failed(f"dockerd exited {process.returncode}; see {log_path}")
        if _daemon_answers():
            return process.pid
        time.sleep(1)
    raise Failed(f"dockerd did not answer within 60 s; see {log_path}")


def registry_answers() -> bool:
    """Whether Docker Hub's registry answers at all (401 without a token is an answer)."""
    try:
        urllib.request.urlopen("https://registry-1.docker.io/v2/", timeout=8)
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError):
        return False
    return True


# -- 2. base images without a registry -----------------------------------------------------


def _image_exists(name: str) -> bool:
    return run(["docker", "image", "inspect", name], check=False, capture=True).returncode == 0


def _external_images() -> list[str]:
    """The images the Dockerfile and compose.yaml take from a registry."""
    stages: list[str] = []
    bases: list[str] = []
    for line in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        words = line.split()
        if len(words) >= 4 and words[0].upper() == "FROM" and words[2].upper() == "AS":
            if words[1] not in stages and words[1] not in bases:
                bases.append(words[1])
            stages.append(words[3])
    built = {GATEWAY_IMAGE, LLAMA_IMAGE}
    for line in COMPOSE.read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        if stripped.startswith("image:"):
            image = stripped.split(":", 1)[1].strip().strip("\"'")
            if image not in built and image not in bases:
                bases.append(image)
    return bases


def _stand_in_command(image: str) -> list[str]:
    """The command the official image runs, for the stand-in of ``image``."""
    repo = image.rsplit(":", 1)[0].rsplit("/", 1)[-1]
    return {
        "python": ["python3"],
        "redis": ["redis-server"],
        "nginx": ["nginx", "-g", "daemon off;"],
    }.get(repo, ["bash"])


def _debootstrap_tarball() -> Path:
    tarball = DOCKER_CACHE / "bookworm-base.tar"
    if tarball.exists():
        return tarball
    rootfs = DOCKER_CACHE / "rootfs"
    if not (rootfs / "usr" / "bin" / "python3").exists():
        partial = DOCKER_CACHE / "rootfs.partial"
        shutil.rmtree(partial, ignore_errors=True)
        say(f"debootstrap bookworm from {DEBIAN_MIRROR} (a few minutes, once)")
        run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={BASE_PACKAGES}",
                "bookworm",
                str(partial),
                DEBIAN_MIRROR,
            ]
        )
        partial.rename(rootfs)
    # This machine's CA certificates too (a TLS-inspecting proxy's, where there is one), so
    # pip and apt inside the builds trust what this machine trusts.
    local_cas = Path("/usr/local/share/ca-certificates")
    if local_cas.is_dir():
        target = rootfs / "usr/local/share/ca-certificates"
        target.mkdir(parents=True, exist_ok=True)
        for cert in local_cas.glob("*.crt"):
            shutil.copy2(cert, target / cert.name)
    run(["chroot", str(rootfs), "update-ca-certificates"], capture=True)
    if not (rootfs / "opt/venv/bin/python").exists():
        run(["chroot", str(rootfs), "python3", "-m", "venv", "/opt/venv"])
    run(["chroot", str(rootfs), "apt-get", "clean"])
    partial_tar = tarball.with_suffix(".partial")
    say(f"packing the base into {tarball}")
    run(["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(partial_tar), "."])
    partial_tar.rename(tarball)
    return tarball


def ensure_stand_ins() -> list[str]:
    """Local stand-ins for the registry's images that are missing; the names made."""
    missing = [image for image in _external_images() if not _image_exists(image)]
    if not missing:
        return []
    if not _image_exists(BASE_IMAGE):
        tarball = _debootstrap_tarball()
        say(f"docker import {tarball.name} as {BASE_IMAGE}")
        path = "/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        changes = [
            f"ENV PATH={path}",
            "ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt",
            "ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
            "ENV LANG=C.UTF-8",
            f"LABEL {STAND_IN_LABEL}=debootstrap",
            'CMD ["bash"]',
        ]
        args = ["docker", "import"]
        for change in changes:
            args += ["--change", change]
        run([*args, str(tarball), BASE_IMAGE])
    for image in missing:
        command = json.dumps(_stand_in_command(image))
        dockerfile = f"FROM {BASE_IMAGE}\nLABEL {STAND_IN_LABEL}={image}\nCMD {command}\n"
        say(f"stand-in for {image} (no registry): {BASE_IMAGE} running {command}")
        run(
            ["docker", "build", "-q", "-t", image, "-"],
            env={"DOCKER_BUILDKIT": "0"},
            input_bytes=dockerfile.encode(),
            capture=True,
        )
    return missing


# -- 3. build and start --------------------------------------------------------------------


def build_images(offline: bool) -> None:
    """The two images compose.yaml builds, built here so that the build can use the host's
    network (a compose network has no way out when dockerd runs without iptables)."""
    env = {"DOCKER_BUILDKIT": "0"} if offline else {}
    for target, tag in (("llama-server", LLAMA_IMAGE), ("gateway", GATEWAY_IMAGE)):
        say(f"building {tag} (target {target}); the first build compiles llama-server")
        network = ["--network", "host"] if offline else []
        run(
            [
                "docker",
                "build",
                *network,
                "-f",
                str(DOCKERFILE),
                "--target",
                target,
                "-t",
                tag,
                str(ROOT),
            ],
            env=env,
        )


def compose_file(engine: Engine, workdir: Path) -> Path:
    """compose.yaml as the compose at hand reads it: docker-compose 1.x knows no top-level
    ``name`` (the project is named with ``-p``), so it reads a copy without it."""
    if not engine.v1:
        return COMPOSE
    lines = COMPOSE.read_text(encoding="utf-8").splitlines(keepends=True)
    kept = [line for line in lines if not line.startswith("name:")]
    copy = workdir / "compose.yaml"
    copy.write_text("".join(kept), encoding="utf-8")
    return copy


def compose(
    engine: Engine, file: Path, *args: str, **kwargs: Any
) -> subprocess.CompletedProcess[bytes]:
    return run(
        [
            *engine.compose,
            "-p",
            PROJECT,
            "--project-directory",
            str(DOCKER_DIR),
            "-f",
            str(file),
            *args,
        ],
        **kwargs,
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def project_containers(all_states: bool = False) -> list[str]:
    args = ["docker", "ps", "-q", "--filter", f"label=com.docker.compose.project={PROJECT}"]
    return output([*args, "-a"] if all_states else args).split()


def container_of(service: str) -> str:
    ids = output(
        [
            "docker",
            "ps",
            "-aq",
            "--filter",
            f"label=com.docker.compose.project={PROJECT}",
            "--filter",
            f"label=com.docker.compose.service={service}",
        ]
    ).split()
    if len(ids) != 1:
        raise Failed(f"expected one container for {service}, found {len(ids)}")
    return ids[0]


def wait_healthy(services: Sequence[str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        for service in services:
            try:
                cid = container_of(service)
            except Failed:
                states[service] = "absent"
                continue
            state = json.loads(output(["docker", "inspect", "--format", "{{json .State}}", cid]))
            states[service] = (state.get("Health") or {}).get("Status") or state.get("Status", "?")
        if all(s == "healthy" for s in states.values()):
            return
        time.sleep(3)
    raise Failed(f"not healthy within {timeout_s:.0f} s: {states}")


# -- 4. the checks, through nginx ----------------------------------------------------------


@dataclass
class Frame:
    id: int
    event: str
    data: dict[str, Any]


@dataclass
class Sse:
    status: int
    headers: dict[str, str]
    frames: list[Frame] = field(default_factory=list)
    body: bytes = b""


def sse(
    port: int,
    method: str,
    path: str,
    *,
    key: str | None,
    body: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
    stop_after: int | None = None,
    timeout_s: float = 300,
) -> Sse:
    """One request to the load balancer; an event stream's frames (pings skipped) until
    the body ends or ``stop_after`` frames, when the connection is dropped."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    sent = dict(headers or {})
    if key is not None:
        sent["Authorization"] = f"Bearer {key}"
    payload = None
    if body is not None:
        payload = json.dumps(body).encode()
        sent["Content-Type"] = "application/json"
    try:
        conn.request(method, path, body=payload, headers=sent)
        response = conn.getresponse()
        got = Sse(response.status, {k.lower(): v for k, v in response.getheaders()})
        if "text/event-stream" not in got.headers.get("content-type", ""):
            got.body = response.read()
            return got
        for block in _blocks(response):
            fields = dict(line.split(": ", 1) for line in block.split("\n") if ": " in line)
            if "id" not in fields:
                continue  # a ping
            got.frames.append(Frame(int(fields["id"]), fields["event"], json.loads(fields["data"])))
            if stop_after is not None and len(got.frames) >= stop_after:
                break
        return got
    finally:
        conn.close()  # mid-stream: the drop


def _blocks(response: http.client.HTTPResponse) -> Iterator[str]:
    pending = b""
    while chunk := response.read1(65536):
        pending += chunk
        while b"\n\n" in pending:
            block, pending = pending.split(b"\n\n", 1)
            yield block.decode()


def _numbered(frames: Sequence[Frame], first: int = 1) -> None:
    ids = [f.id for f in frames]
    if ids != list(range(first, first + len(ids))):
        raise Failed(f"frame ids are not {first}..n in order: {ids[:5]}...{ids[-5:]}")


def check_keys(port: int, key: str) -> str:
    health = sse(port, "GET", "/healthz", key=None)
    if health.status != 200:
        raise Failed(f"/healthz without a key: {health.status}, expected 200")
    for label, sent in (("no key", None), ("a wrong key", "tf-wrong-" + secrets.token_hex(8))):
        got = sse(port, "POST", "/v1/stream", key=sent, body={"input": "hi"})
        if got.status != 401:
            raise Failed(f"POST /v1/stream with {label}: {got.status}, expected 401")
        code = json.loads(got.body).get("error", {}).get("code")
        if not code:
            raise Failed(f"POST /v1/stream with {label}: 401 without a typed error: {got.body!r}")
    return "401 without a key and with a wrong one; /healthz public"


def check_ui(port: int, key: str) -> str:
    """The web UI ships in the image: its page, and the SDK build the page loads."""
    page = sse(port, "GET", "/", key=key)
    if page.status != 200 or b"<html" not in page.body.lower():
        raise Failed(f"GET /: {page.status} {page.body[:200]!r}")
    sdk = sse(port, "GET", "/sdk/index.js", key=key)
    if sdk.status != 200 or not sdk.body:
        raise Failed(f"GET /sdk/index.js: {sdk.status} {sdk.body[:200]!r}")
    return f"GET / {len(page.body)} bytes of HTML, /sdk/index.js {len(sdk.body)} bytes"


def check_demo(port: int, key: str) -> str:
    got = sse(port, "POST", "/v1/stream", key=key, body=DEMO_BODY)
    if got.status != 200:
        raise Failed(f"the demo stream: {got.status} {got.body[:300]!r}")
    frames = got.frames
    _numbered(frames)
    events = [f.event for f in frames]
    if (
        not events
        or events[0] != "stream.begin"
        or events[-1] != "done"
        or events.count("done") != 1
    ):
        raise Failed(f"the demo stream is not begin ... done: {events[:3]} ... {events[-3:]}")
    calls = [f.data.get("name") for f in frames if f.event == "tool.call"]
    reason = frames[-1].data.get("reason")
    if reason != "stop":
        raise Failed(f"the demo stream ended {reason!r}: {frames[-1].data}")
    if not calls:
        raise Failed("the demo stream made no tool call (the workflow searches first)")
    return f"{len(frames)} frames, tool calls {calls}, done {reason}"


def _logs(service: str) -> str:
    result = run(["docker", "logs", container_of(service)], capture=True, check=False)
    return (result.stdout + result.stderr).decode(errors="replace")


def _owner(stream_id: str) -> str:
    """The gateway service that runs ``stream_id`` (its log names the stream)."""
    owners = [service for service in GATEWAYS if stream_id in _logs(service)]
    if len(owners) != 1:
        raise Failed(f"stream {stream_id} is in the logs of {owners or 'no gateway'}")
    return owners[0]


def check_resume_after_stop(port: int, key: str) -> str:
    first = sse(port, "POST", "/v1/stream", key=key, body=LONG_BODY, stop_after=8)
    if first.status != 200 or len(first.frames) < 8:
        raise Failed(f"the long stream: {first.status}, {len(first.frames)} frames")
    stream_id = first.headers["x-stream-id"]
    _numbered(first.frames)
    owner = _owner(stream_id)
    say(f"stream {stream_id} runs on {owner}; docker stop {owner}")
    started = time.monotonic()
    run(["docker", "stop", container_of(owner)], capture=True)
    stopped_s = time.monotonic() - started
    last = first.frames[-1].id
    resumed_at = time.monotonic()
    rest = sse(
        port, "GET", f"/v1/streams/{stream_id}", key=key, headers={"Last-Event-ID": str(last)}
    )
    resume_s = time.monotonic() - resumed_at
    if rest.status != 200:
        raise Failed(f"the resume through nginx: {rest.status} {rest.body[:300]!r}")
    _numbered(rest.frames, first=last + 1)
    whole = first.frames + rest.frames
    if [f.event for f in whole].count("done") != 1 or whole[-1].event != "done":
        raise Failed("the resumed stream does not end with exactly one done")
    reason = whole[-1].data.get("reason")
    if resume_s > 15:  # the stream had ended: only a balancer waiting on the dead replica
        raise Failed(f"the resume took {resume_s:.0f} s: nginx waited for the stopped replica")
    survivor = next(s for s in GATEWAYS if s != owner)
    run(["docker", "start", container_of(owner)], capture=True)  # the stack whole again
    return (
        f"{len(first.frames)} frames from {owner}, stopped in {stopped_s:.1f} s, "
        f"{len(rest.frames)} more after id {last} from {survivor} (via Redis) in "
        f"{resume_s:.1f} s, each once, done {reason}"
    )


def check_down(engine: Engine, file: Path) -> str:
    compose(engine, file, "down", "--volumes", "--remove-orphans", "--timeout", "30")
    label = f"label=com.docker.compose.project={PROJECT}"
    left = {
        "containers": project_containers(all_states=True),
        "networks": output(["docker", "network", "ls", "-q", "--filter", label]).split(),
        "volumes": output(["docker", "volume", "ls", "-q", "--filter", label]).split(),
    }
    if any(left.values()):
        raise Failed(f"left after down: {left}")
    return "no container, network or volume of the project left"


# -- the run -------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--up-timeout", type=float, default=600, help="seconds for the stack to be healthy"
    )
    parser.add_argument(
        "--keep", action="store_true", help="leave the stack running after the checks"
    )
    options = parser.parse_args(argv)

    started = time.monotonic()
    record: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "checks": {},
    }
    engine: Engine | None = None
    file = COMPOSE
    up = False
    failure: str | None = None
    with tempfile.TemporaryDirectory(prefix="compose-test-") as workdir:
        try:
            say("1/5 the engine")
            offline = not registry_answers()
            engine = Engine(ensure_tools(need_debootstrap=offline))
            engine.started_dockerd = ensure_daemon()
            record["engine"] = output(["docker", "version", "--format", "{{.Server.Version}}"])
            record["compose"] = " ".join(engine.compose)
            record["registry"] = not offline
            source = "no registry: debootstrap" if offline else "from the registry"
            say(f"2/5 base images ({source})")
            if offline:
                record["stand_ins"] = ensure_stand_ins()
            say("3/5 build and start")
            build_images(offline)
            file = compose_file(engine, Path(workdir))
            port = free_port()
            key = "tf-" + secrets.token_urlsafe(24)
            # One generation thread on a machine of two cores or fewer: llama-server's
            # threads wait for each other when anything else runs (docker/compose.yaml).
            threads = os.environ.get("LLAMA_ARG_THREADS") or (
                "1" if (os.cpu_count() or 1) <= 2 else "-1"
            )
            record["llama_threads"] = threads
            env = {"API_KEYS": key, "LB_PORT": str(port), "LLAMA_ARG_THREADS": threads}
            os.environ.update(env)  # every compose call below sees the same stack
            # Left over from an interrupted run: start clean.
            compose(
                engine, file, "down", "--volumes", "--remove-orphans", capture=True, check=False
            )
            compose(engine, file, "up", "-d", "--no-build")
            up = True
            wait_healthy(["llama-server", "redis", *GATEWAYS, "lb"], options.up_timeout)
            record["ready_s"] = round(time.monotonic() - started)
            say(f"4/5 checks through nginx on 127.0.0.1:{port}")
            checks: list[tuple[str, Callable[[int, str], str]]] = [
                ("keys required", check_keys),
                ("web UI", check_ui),
                ("demo stream", check_demo),
                ("resume after docker stop", check_resume_after_stop),
            ]
            for name, check in checks:
                say(f"check: {name}")
                record["checks"][name] = check(port, key)
                say(f"  ok: {record['checks'][name]}")
            if not options.keep:
                say("check: compose down")
                record["checks"]["down leaves nothing"] = check_down(engine, file)
                up = False
                say(f"  ok: {record['checks']['down leaves nothing']}")
        except Failed as exc:
            failure = str(exc)
        except Exception as exc:  # a bug here: still recorded, and the stack taken down
            failure = f"{type(exc).__name__}: {exc}"
        finally:
            if up and engine is not None and (failure is not None or not options.keep):
                logs = CACHE / "compose-test" / "last-logs.txt"
                logs.parent.mkdir(parents=True, exist_ok=True)
                with logs.open("wb") as out:
                    out.write(
                        compose(
                            engine, file, "logs", "--no-color", capture=True, check=False
                        ).stdout
                    )
                say(f"the stack's logs: {logs}")
                compose(engine, file, "down", "--volumes", "--remove-orphans", check=False)
    record["seconds"] = round(time.monotonic() - started)
    record["result"] = "passed" if failure is None else "failed"
    if failure is not None:
        record["failure"] = failure
    RUNS.parent.mkdir(parents=True, exist_ok=True)
    with RUNS.open("a", encoding="utf-8") as out:
        out.write(json.dumps(record) + "\n")
    say(f"5/5 {record['result']} in {record['seconds']} s (recorded in {RUNS})")
    print(json.dumps(record, indent=2))
    return 0 if failure is None else 1


if __name__ == "__main__":
    sys.exit(main())
