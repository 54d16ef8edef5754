"""bench/RESULTS.md: each benchmark owns one ``## `` section and rewrites only that one."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["RESULTS", "load_average", "write_section"]

RESULTS = Path(__file__).with_name("RESULTS.md")

_PREAMBLE = (
    "# Benchmark results\n\n"
    "Reproduce with `make bench` (runs every benchmark in `bench/`); each section "
    "names its command and the machine it ran on. Figures are one run on that machine: "
    "indicative, re-measure on yours.\n\n"
)


def load_average() -> str:
    """The 1/5/15-minute load: more than the bench's own ~1 means shared cores."""
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def section_text(heading: str) -> str:
    """The current text of ``heading``'s section ("" when there is none)."""
    text = RESULTS.read_text(encoding="utf-8") if RESULTS.exists() else ""
    start = text.find(heading)
    if start < 0:
        return ""
    nxt = text.find("\n## ", start + len(heading))
    return text[start : nxt if nxt >= 0 else len(text)]


def write_section(heading: str, lines: list[str]) -> None:
    """Replace (or append) the section under ``heading`` with ``lines``."""
    section = "\n".join([heading, *lines]).rstrip() + "\n"
    if not RESULTS.exists():
        RESULTS.write_text(_PREAMBLE + section, encoding="utf-8")
        return
    text = RESULTS.read_text(encoding="utf-8")
    start = text.find(heading)
    if start < 0:
        text = text.rstrip() + "\n\n" + section
    else:
        nxt = text.find("\n## ", start + len(heading))
        text = text[:start] + section + ("" if nxt < 0 else text[nxt:])
    RESULTS.write_text(text, encoding="utf-8")
