"""Ablation presets (docs/eval.md): which guardrails a run keeps.

Each preset turns features off in the workflow a scenario runs (docs/eval.md's workflow fields)
and, for ``no_grammar``, in how the model is asked: constrained decoding off, so the model
writes sentinel frames with no GBNF behind them. ``reforged`` is everything on; ``bare`` is
everything off. The offline tests prove each preset really removes its feature, with a
scripted model that needs it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

__all__ = ["PRESETS", "Ablation", "preset"]


@dataclass(frozen=True, slots=True)
class Ablation:
    name: str
    rescue: bool = True  # rescue of tool calls written as text
    nudges: bool = True  # retry and unknown-tool nudges (max_retries_per_step > 0)
    steps: bool = True  # required steps and prerequisites enforced
    recovery: bool = True  # tool errors fed back for self-correction (max_tool_errors > 0)
    compaction: bool = True  # context compaction
    grammar: bool = True  # constrained decoding (GBNF) where the mode has it
    provenance: bool = True  # arguments held to where their values come from ("narrow")

    def apply(self, workflow: Mapping[str, Any]) -> dict[str, Any]:
        """``workflow`` with this preset's features turned off."""
        out = dict(workflow)
        if not self.rescue:
            out["rescue"] = False
        if not self.nudges:
            out["max_retries_per_step"] = 0
        if not self.steps:
            out["required_steps"] = []
            out["prerequisites"] = {}
            out.pop("min_calls", None)  # a count of a required step's calls: no steps, none
        if not self.recovery:
            out["max_tool_errors"] = 0
        if not self.compaction:
            out["compaction"] = "none"
        if not self.provenance:
            out["narrow"] = False
        return out

    def mode(self, mode: str) -> str:
        """The mode a run asks for: ``no_grammar`` turns constrained into sentinel (the same
        frames, no grammar behind them)."""
        return "sentinel" if mode == "constrained" and not self.grammar else mode


PRESETS: Final[Mapping[str, Ablation]] = {
    a.name: a
    for a in (
        Ablation("reforged"),
        Ablation("no_rescue", rescue=False),
        Ablation("no_nudge", nudges=False),
        Ablation("no_steps", steps=False),
        Ablation("no_recovery", recovery=False),
        Ablation("no_compact", compaction=False),
        Ablation("no_grammar", grammar=False),
        Ablation("no_provenance", provenance=False),
        Ablation(
            "bare",
            rescue=False,
            nudges=False,
            steps=False,
            recovery=False,
            compaction=False,
            grammar=False,
            provenance=False,
        ),
    )
}


def preset(name: str) -> Ablation:
    try:
        return PRESETS[name]
    except KeyError:
        raise KeyError(f"no ablation preset {name!r}; known: {', '.join(PRESETS)}") from None
