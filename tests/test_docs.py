"""The repository explains itself: nothing in it cites a document a clone does not have, and
every relative link in the README and docs/ leads to a file that exists.

Whoever clones the repository has the code, the docs and nothing else: a comment that points
at section 4 of a brief or at a ticket sends them to a page they cannot open. The contract is
stated in docs/ (docs/README.md is the index), and code cites those files. The environment
variables and the README's performance table are generated (``make docs``) and checked here.
"""

from __future__ import annotations

import collections
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Citations of documents outside the repository. The words are split so that this file
# does not match itself.
_EXTERNAL: dict[str, re.Pattern[str]] = {
    "the team's spec": re.compile(r"\b" + "SP" + r"EC\b(?!IAL)"),
    "the house style": re.compile(r"\b" + "ST" + r"YLE(?:\.md|\s+conventions?\b|:)"),
    "a seed": re.compile(r"\b[Ss]" + r"eeds? 00\d\b|\b[Ss]" + "eed document"),
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


# -- links --------------------------------------------------------------------------------

_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$")


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation out, spaces to ``-``."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    found, in_code = set(), False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and (m := _HEADING.match(line)):
            found.add(_anchor(m.group(1)))
    return found


def markdown_pages() -> list[Path]:
    """The README, the repository's other top-level pages and every page under docs/."""
    return sorted(
        [
            *ROOT.glob("*.md"),
            *(ROOT / "docs").rglob("*.md"),
            *(ROOT / "clients").glob("*/README.md"),
        ]
    )


def broken_links(page: Path) -> list[str]:
    """Every relative link of ``page`` whose file (or heading anchor) does not exist."""
    problems, in_code = [], False
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        if line.startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            continue
        for m in _LINK.finditer(re.sub(r"`[^`]*`", "", line)):
            target = m.group(1) or m.group(2)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("//"):
                continue  # http:, https:, mailto:: not ours to check offline
            file_part, _, fragment = target.partition("#")
            dest = (page.parent / file_part).resolve() if file_part else page
            if not dest.exists():
                problems.append(f"{page.relative_to(ROOT)}:{number}: {target} (no such file)")
            elif fragment and dest.suffix == ".md" and fragment not in _anchors(dest):
                problems.append(f"{page.relative_to(ROOT)}:{number}: {target} (no such heading)")
    return problems


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    (tmp_path / "there.md").write_text("# Here it is\n", encoding="utf-8")
    page.write_text(
        "[ok](there.md) [ok](there.md#here-it-is) [web](https://example.com/x)\n"
        "`[not a link](nowhere.md)`\n```\n[in code](nowhere.md)\n```\n"
        "[gone](missing.md) [bad anchor](there.md#elsewhere)\n",
        encoding="utf-8",
    )
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        found = broken_links(page)
    finally:
        ROOT = saved
    assert found == [
        "page.md:6: missing.md (no such file)",
        "page.md:6: there.md#elsewhere (no such heading)",
    ]


def test_every_relative_link_in_the_readme_and_docs_resolves() -> None:
    pages = markdown_pages()
    assert ROOT / "README.md" in pages and ROOT / "docs" / "README.md" in pages
    problems = [p for page in pages for p in broken_links(page)]
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_the_docs_index_lists_every_page() -> None:
    index = (ROOT / "docs" / "README.md").read_text(encoding="utf-8")
    missing = [
        p.name
        for p in (ROOT / "docs").glob("*.md")
        if p.name != "README.md" and f"]({p.name})" not in index
    ]
    assert not missing, f"docs/README.md does not list {missing}"


# -- generated docs: the environment variables and the performance table ------------------

# A documented variable: an all-caps name in backticks in the first cell of a row of a
# table whose first column is headed "variable" (error codes have tables of their own).
_DOC_VARIABLE = re.compile(r"`([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)`")


def documented_variables(text: str) -> set[str]:
    names: set[str] = set()
    lines = text.splitlines()
    in_table = False
    for i, line in enumerate(lines):
        if not line.startswith("|"):
            in_table = False
        elif i + 1 < len(lines) and lines[i + 1].startswith("|---"):
            in_table = line.split("|")[1].strip().lower() == "variable"
        elif in_table and not line.startswith("|---"):
            names |= set(_DOC_VARIABLE.findall(line.split("|")[1]))
    return names


def test_the_generated_docs_are_up_to_date() -> None:
    from toolforge.tools import gen_docs

    stale = [str(p.relative_to(ROOT)) for p in gen_docs.check()]
    assert not stale, f"{stale} differ from their sources: run make docs"


def test_every_setting_is_documented_and_every_documented_variable_exists() -> None:
    from toolforge.tools import gen_docs

    settings = gen_docs.settings_variables()
    configuration = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert settings <= documented_variables(configuration)
    known = settings | set(gen_docs.EXTERNAL_VARIABLES)
    unknown = {}
    for page in markdown_pages():
        for name in documented_variables(page.read_text(encoding="utf-8")) - known:
            unknown.setdefault(name, []).append(str(page.relative_to(ROOT)))
    assert not unknown, f"documented variables that nothing reads: {unknown}"


def test_a_setting_without_a_reason_fails_the_generator(monkeypatch: pytest.MonkeyPatch) -> None:
    from toolforge.tools import gen_docs

    monkeypatch.setattr(gen_docs, "_NOTES", {})
    with pytest.raises(ValueError, match="has no reason comment"):
        gen_docs.settings_rows()


def test_the_readme_shows_every_target_of_the_latest_runs_as_recorded() -> None:
    from toolforge.tools import gen_docs

    results = (ROOT / "bench" / "RESULTS.md").read_text(encoding="utf-8")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    rows = gen_docs.performance_rows(results)
    assert len(rows) >= 10
    for _, what, verdict in rows:
        assert f"| {what.replace('|', chr(92) + '|')} | **{verdict}** |" in readme, what
    # A figure changed in RESULTS.md makes the README stale.
    changed = results.replace(rows[0][1], rows[0][1].replace("ms", "ms (re-run)"), 1)
    assert gen_docs.render_readme(readme, changed) != readme


def test_the_conformance_page_counts_the_cases_there_are() -> None:
    cases = [
        json.loads(p.read_text(encoding="utf-8"))
        for p in (ROOT / "tests" / "conformance" / "cases").glob("*.json")
    ]
    page = (ROOT / "docs" / "conformance.md").read_text(encoding="utf-8")
    real = sum(1 for case in cases if case.get("upstream") == "real")
    assert f"{len(cases)} cases in nine categories, {real} of them on a real llama-server" in page
    for category, count in collections.Counter(case["category"] for case in cases).items():
        assert f"| `{category}` | {count} |" in page, category


def test_every_variable_toolforge_help_names_exists() -> None:
    from toolforge.tools import gen_docs

    known = gen_docs.settings_variables() | set(gen_docs.EXTERNAL_VARIABLES)
    named = set()
    for command in ("serve", "obtain"):
        done = subprocess.run(
            [sys.executable, "-c", "from toolforge.cli import main; main()", command, "--help"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert "docs/configuration.md" in done.stdout or command != "serve"
        named |= set(re.findall(r"\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b", done.stdout))
    assert named and not named - known, f"named in --help but read by nothing: {named - known}"
