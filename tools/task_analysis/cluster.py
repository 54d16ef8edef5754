"""Hierarchical clustering of tasks by cosine similarity (average linkage), pure numpy.

Start with every task alone; repeatedly merge the two clusters whose average pairwise
similarity is highest, while it is at least ``threshold``. The merges are the hierarchy
(each with the similarity it happened at); what is left are the clusters. O(n³) on the
requested tasks, which the tool caps at 200.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Clustering", "cluster"]


@dataclass(frozen=True, slots=True)
class Clustering:
    clusters: list[list[str]]  # biggest first; members in input order
    merges: list[tuple[list[str], list[str], float]]  # (a, b, similarity) in merge order


def cluster(ids: Sequence[str], vectors: np.ndarray[Any, Any], threshold: float) -> Clustering:
    n = len(ids)
    if n == 0:
        return Clustering([], [])
    sim = vectors @ vectors.T
    groups: list[list[int]] = [[i] for i in range(n)]
    # Sum of similarities between each pair of current groups (average = sum / (|a|·|b|)).
    sums = sim.astype(np.float64).copy()
    merges: list[tuple[list[str], list[str], float]] = []
    alive = list(range(n))
    while len(alive) > 1:
        best, pair = -np.inf, (0, 0)
        for x, a in enumerate(alive):
            for b in alive[x + 1 :]:
                avg = sums[a, b] / (len(groups[a]) * len(groups[b]))
                if avg > best:
                    best, pair = avg, (a, b)
        if best < threshold:
            break
        a, b = pair
        merges.append(([ids[i] for i in groups[a]], [ids[i] for i in groups[b]], float(best)))
        groups[a] = sorted(groups[a] + groups[b])
        sums[a, :] += sums[b, :]
        sums[:, a] += sums[:, b]
        alive.remove(b)
    clusters = sorted(
        ([ids[i] for i in groups[g]] for g in alive), key=lambda c: (-len(c), ids.index(c[0]))
    )
    return Clustering(clusters, merges)
