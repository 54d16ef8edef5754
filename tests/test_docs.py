"""The repository explains itself: nothing in it cites a document a clone does not have, and
every relative link in the README and docs/ leads to a file that exists.

Whoever clones the repository has the code, the docs and nothing else: a comment that says
"see the spec, section 4" or "issue 17" points at a page they cannot open. The contract is
stated in docs/ (docs/README.md is the index), and code cites those files.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Citations of documents outside the repository. The words are split so that this file
# does not match itself.
_EXTERNAL: dict[str, re.Pattern[str]] = {
    "the team's spec": re.compile(r"\b" + "SP" + r"EC\b(?!IAL)"),
    "the house style": re.compile(r"\b" + "ST" + r"YLE(?:\.md|\s+conventions?\b|:)"),
    "a seed document": re.compile(r"\b[Ss]" + r"eeds? 00\d\b|\b[Ss]eed document"),
    "an issue number": re.compile(r"\b[Ii]" + r"ssues? #?\d+\b"),
    "a research note": re.compile(r"\b" + "research" + r" doc\b|\bshared/(?:seeds|research)\b"),
}
# Sampling seeds ("50 seeds at temperature 0.8") and other projects' trackers cited by the
# project's name ("llama.cpp #15457") are not citations; the tests below pin that down.
_SKIP_SUFFIXES = (".png", ".jpg", ".gguf", ".ico", ".woff", ".woff2", ".gz", ".zip")


def tracked_files() -> list[Path]:
    """The files git tracks (the repository as a clone has it); every file under the
    root but the usual local state when git is not there."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", ".venv", "node_modules", "dist", "__pycache__", "artifacts"}
        return [
            p for p in ROOT.rglob("*") if p.is_file() and not skip & set(p.relative_to(ROOT).parts)
        ]
    return [ROOT / name for name in out.decode().split("\0") if name]


def external_citations(text: str) -> list[tuple[int, str, str]]:
    """``(line number, what it cites, the line)`` for every citation of an outside
    document in ``text``."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for what, pattern in _EXTERNAL.items():
            if pattern.search(line):
                found.append((number, what, line.strip()[:160]))
    return found


@pytest.mark.parametrize(
    "line",
    [
        "# the frame limit (" + "SP" + "EC §3)",
        '"""Workflows (' + "SP" + 'EC §7, docs/workflows.md)."""',
        "as the " + "SP" + "EC says",
        "(" + "ST" + "YLE convention 8)",
        "the adapter is thin (" + "ST" + "YLE.md)",
        "(" + "se" + "ed 001's three phases)",
        "## Turn engine (" + "is" + "sue 15)",
        "constrained mode (" + "is" + "sue #5)",
        "(" + "research" + " doc §2: RST)",
        "../" + "shared/" + "research/anchors.md",
    ],
)
def test_each_kind_of_outside_citation_is_caught(line: str) -> None:
    assert external_citations(line), line


@pytest.mark.parametrize(
    "line",
    [
        "_BODY_" + "SP" + "ECIAL_IN_STRING = re.compile(...)",
        "_" + "ST" + "YLES: Final = {}",
        "50 seeds at temperature 0.8",
        "llama.cpp #15457 (the upstream's bug)",
        "docs/protocol.md §6",
    ],
)
def test_what_is_not_a_citation_is_left_alone(line: str) -> None:
    assert not external_citations(line), line


def test_nothing_in_the_repository_cites_a_document_outside_it() -> None:
    problems = []
    for path in tracked_files():
        if path.suffix in _SKIP_SUFFIXES or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        rel = path.relative_to(ROOT).as_posix()
        problems += [f"{rel}:{n}: {what}: {line}" for n, what, line in external_citations(text)]
    assert not problems, (
        "cite the project's own docs (docs/README.md lists them) instead of:\n"
        + "\n".join(problems)
    )
