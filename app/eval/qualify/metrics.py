"""One run's record and the numbers of a cell (scenario × model × mode × ablation).

Pure arithmetic over :class:`RunResult` values, so reports are functions of the JSONL alone
and every number in them can be recomputed from it. Definitions (docs/eval.md):

* **score** = correct / total: the primary number. A run is *correct* when it reached a
  terminal tool and the scenario's grader accepted the terminal arguments.
* **completeness** = completed / total: runs that reached a terminal tool.
* **accuracy** = correct / completed: of the runs that finished, how many got it right
  (``None`` when none finished).
* **efficiency** = mean of ideal ÷ actual iterations over *correct* runs (1.0 = the ideal
  path; ``None`` when none was correct). Over correct runs only: a run that called the
  terminal tool at once with made-up arguments is fast, not efficient.
* **wasted calls** = mean of max(0, calls − ideal) over all runs.
* **latency** p50/p95 of wall-clock seconds per run (nearest-rank percentiles).
* **Wilson 95 % interval** on the score: honest for small N, never outside [0, 1].
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Final

__all__ = [
    "ALL_SCENARIOS",
    "CellKey",
    "CellMetrics",
    "RunResult",
    "aggregate",
    "percentile",
    "wilson",
]

Z95 = 1.959963984540054


@dataclass(frozen=True, slots=True, kw_only=True)
class RunResult:
    """One run of one scenario: a line of ``results.jsonl``."""

    scenario: str
    model: str
    mode: str
    ablation: str
    run: int
    completed: bool
    correct: bool
    iterations: int
    ideal_iterations: int
    tool_calls: int
    latency_s: float
    prompt_tokens: int = 0
    completion_tokens: int = 0
    nudges: Mapping[str, int] = field(default_factory=dict)  # tier "1".."3", "retry", "unknown"
    rescues: int = 0
    retries: int = 0
    compactions: Mapping[str, int] = field(default_factory=dict)  # phase "1".."3" -> count
    repaired: int = 0
    degraded: int = 0
    tool_errors: int = 0
    error_code: str | None = None
    error_message: str | None = None  # the error frame's message, cut to 300 characters
    terminal: str | None = None
    config: Mapping[str, Any] = field(default_factory=dict)
    # The run's calls in order, as [tool, args, error]: error is None for a call that
    # succeeded, else the tool's message cut to 160 characters. Why a run failed, readable
    # from the JSONL alone.
    trace: Sequence[Sequence[Any]] = ()

    def key(self) -> tuple[str, str, str, str, int]:
        """What makes a run unique in a batch: a resumed batch skips keys it has."""
        return (self.scenario, self.model, self.mode, self.ablation, self.run)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunResult:
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in names})


CellKey = tuple[str, str, str, str]
"""(scenario, model, mode, ablation)."""


@dataclass(frozen=True, slots=True)
class CellMetrics:
    """The aggregate of one cell's runs."""

    scenario: str
    model: str
    mode: str
    ablation: str
    runs: int
    correct: int
    completed: int
    score: float
    score_low: float
    score_high: float
    completeness: float
    accuracy: float | None
    efficiency: float | None
    wasted_calls: float
    latency_p50: float
    latency_p95: float
    prompt_tokens: float
    completion_tokens: float
    nudges: Mapping[str, int]
    rescues: int
    retries: int
    compactions: Mapping[str, int]
    repaired: int
    degraded: int
    errors: Mapping[str, int]

    @property
    def key(self) -> CellKey:
        return (self.scenario, self.model, self.mode, self.ablation)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def wilson(successes: int, total: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval for ``successes`` of ``total`` (``(0, 1)`` when empty)."""
    if total <= 0:
        return (0.0, 1.0)
    if not 0 <= successes <= total:
        raise ValueError(f"successes {successes} outside 0..{total}")
    p = successes / total
    denom = 1 + z * z / total
    centre = (p + z * z / (2 * total)) / denom
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / denom
    # At p = 0 or 1 the bound is exactly 0 or 1; floating point would say 0.9999999.
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == total else min(1.0, centre + half)
    return (low, high)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of ``values``; 0.0 when empty."""
    if not values:
        return 0.0
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} outside 0..100")
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def _sum_counts(maps: Iterable[Mapping[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for m in maps:
        for k, v in m.items():
            out[k] = out.get(k, 0) + int(v)
    return dict(sorted(out.items()))


def _cell(key: CellKey, runs: Sequence[RunResult]) -> CellMetrics:
    total = len(runs)
    correct = sum(r.correct for r in runs)
    completed = [r for r in runs if r.completed]
    right = [r for r in runs if r.correct]
    low, high = wilson(correct, total)
    errors: dict[str, int] = {}
    for r in runs:
        if r.error_code:
            errors[r.error_code] = errors.get(r.error_code, 0) + 1
    return CellMetrics(
        *key,
        runs=total,
        correct=correct,
        completed=len(completed),
        score=correct / total,
        score_low=low,
        score_high=high,
        completeness=len(completed) / total,
        accuracy=(correct / len(completed)) if completed else None,
        efficiency=(
            sum(r.ideal_iterations / max(r.iterations, 1) for r in right) / len(right)
            if right
            else None
        ),
        wasted_calls=sum(max(0, r.tool_calls - r.ideal_iterations) for r in runs) / total,
        latency_p50=percentile([r.latency_s for r in runs], 50),
        latency_p95=percentile([r.latency_s for r in runs], 95),
        prompt_tokens=sum(r.prompt_tokens for r in runs) / total,
        completion_tokens=sum(r.completion_tokens for r in runs) / total,
        nudges=_sum_counts(r.nudges for r in runs),
        rescues=sum(r.rescues for r in runs),
        retries=sum(r.retries for r in runs),
        compactions=_sum_counts(r.compactions for r in runs),
        repaired=sum(r.repaired for r in runs),
        degraded=sum(r.degraded for r in runs),
        errors=dict(sorted(errors.items())),
    )


# The scenario of an overall cell: every scenario's runs together.
ALL_SCENARIOS: Final = "(all)"


def aggregate(results: Iterable[RunResult], *, overall: bool = False) -> list[CellMetrics]:
    """Every cell's metrics, in a stable order (scenario, model, mode, ablation). A run
    recorded twice (a resumed batch that overlapped) counts once: the last line wins.
    ``overall``: one cell per (model, mode, ablation) over every scenario's runs, its
    scenario :data:`ALL_SCENARIOS` (the Wilson interval then covers all of them)."""
    latest: dict[tuple[str, str, str, str, int], RunResult] = {}
    for r in results:
        latest[r.key()] = r
    cells: dict[CellKey, list[RunResult]] = {}
    for r in latest.values():
        scenario = ALL_SCENARIOS if overall else r.scenario
        cells.setdefault((scenario, r.model, r.mode, r.ablation), []).append(r)
    return [
        _cell(k, sorted(v, key=lambda r: (r.scenario, r.run))) for k, v in sorted(cells.items())
    ]
