"""The prerequisite check: each missing piece named with the package that provides it,
before anything is downloaded. Missing pieces are simulated through PATH, CXX and
PYTHONPATH, and the check runs the way the Makefile runs it: as a script, in a fresh
interpreter, with nothing of toolforge importable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from toolforge.runtime import prereqs
from toolforge.runtime.prereqs import build_needed, build_problems, install_problems

SCRIPT = Path(prereqs.__file__)


def _script(
    *args: str, env: dict[str, str], cwd: Path, python: str = sys.executable
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [python, str(SCRIPT), *args], env=env, cwd=cwd, capture_output=True, text=True
    )


def _bare_path(tmp_path: Path) -> str:
    """A PATH with python3 and nothing else: no compiler, no cmake."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    return str(bin_dir)


def _clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    drop = {"UPSTREAM_BASE_URL", "GROQ_BASE_URL", "LLAMA_SERVER_BIN", "CXX", "PYTHONPATH"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["TOOLFORGE_CACHE_DIR"] = str(tmp_path / "cache")  # nothing built yet
    env.update(extra)
    return env


def test_an_old_python_is_named_with_its_install_commands() -> None:
    (problem,) = [p for p in install_problems((3, 10, 12)) if "Python" in p.what]
    assert "3.10.12" in problem.what and ">= 3.11" in problem.what
    assert "python3.11-venv" in problem.debian and "brew install python" in problem.macos
    assert problem.fatal
    assert not [p for p in install_problems((3, 11, 0)) if "Python" in p.what]


def test_a_missing_venv_module_names_python3_venv(tmp_path: Path) -> None:
    # Debian's python3 without python3-venv: `import ensurepip` fails.
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "ensurepip.py").write_text("raise ImportError('No module named ensurepip')\n")
    out = _script(env=_clean_env(tmp_path, PYTHONPATH=str(shadow)), cwd=tmp_path)
    assert out.returncode == 1
    assert "python3-venv" in out.stderr and "apt install python3-venv" in out.stderr
    assert "install what is missing above" in out.stderr


def test_the_install_check_passes_on_this_machine(tmp_path: Path) -> None:
    out = _script(env=_clean_env(tmp_path), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""


def test_no_compiler_on_path_fails_the_build_check(tmp_path: Path) -> None:
    env = _clean_env(tmp_path, PATH=_bare_path(tmp_path))
    out = _script("--build", env=env, cwd=tmp_path)
    assert out.returncode == 1
    assert "missing: a C++ compiler" in out.stderr
    assert "sudo apt install g++" in out.stderr and "xcode-select --install" in out.stderr
    # cmake is fetched from PyPI when absent: a note naming the package, not a failure.
    assert "note: cmake" in out.stderr and "apt install cmake" in out.stderr
    assert not (tmp_path / "cache").exists()  # nothing created, nothing downloaded


def test_a_cxx_that_is_not_there_is_named(tmp_path: Path) -> None:
    env = _clean_env(tmp_path, CXX="clang++-99")
    (problem,) = [p for p in build_problems(env) if p.fatal]
    assert "CXX=clang++-99" in problem.what


def test_no_build_no_compiler_needed(tmp_path: Path) -> None:
    bare = _bare_path(tmp_path)
    for extra in (
        {"UPSTREAM_BASE_URL": "http://127.0.0.1:9/v1"},
        {"LLAMA_SERVER_BIN": "/opt/llama-server"},
    ):
        env = _clean_env(tmp_path, PATH=bare, **extra)
        assert not build_needed(env)
        assert _script("--build", env=env, cwd=tmp_path).returncode == 0
    env = _clean_env(tmp_path, PATH=bare)
    assert build_needed(env)
    cached = tmp_path / "cache" / "llama.cpp" / "11434.0.0" / "bin" / "llama-server"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"\x7fELF")
    assert not build_needed(env)  # already built: nothing to compile


@pytest.mark.parametrize("target", ["install", "run"])
def test_the_makefile_checks_before_it_downloads(target: str) -> None:
    """`make -n` prints the recipe: the check comes before venv/pip (install) and before
    `toolforge obtain` (run)."""
    root = SCRIPT.parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}
    out = subprocess.run(
        ["make", "-n", "-B", target], cwd=root, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    check = next(i for i, line in enumerate(lines) if "prereqs.py" in line)
    first_download = next(
        i for i, line in enumerate(lines) if "pip install" in line or "obtain" in line
    )
    assert check < first_download


def test_make_test_obtains_first_and_test_fast_skips_the_real_tier() -> None:
    root = SCRIPT.parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}

    def recipe(target: str) -> list[str]:
        out = subprocess.run(
            ["make", "-n", target], cwd=root, env=env, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        return out.stdout.splitlines()

    full = recipe("test")
    obtain = next(i for i, line in enumerate(full) if "toolforge obtain --why" in line)
    pytest_line = next(i for i, line in enumerate(full) if "-m pytest" in line)
    assert obtain < pytest_line and "-m" not in full[pytest_line].split("pytest", 1)[1]
    fast = recipe("test-fast")
    assert not any("obtain" in line for line in fast)
    assert any('-m pytest -q -m "not real"' in line for line in fast)
