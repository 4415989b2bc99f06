"""The Pareto front of a set of runs and its hypervolume, direction-aware.

A point is one run's (or group's) final evaluation of several (head, metric) pairs; each
pair has a direction, `min` (lower is better) or `max`. Point `a` dominates `b` when it is
at least as good in every pair and better in one; the front is the points no other point
dominates (equal points do not dominate each other, so ties stay on the front together).

The hypervolume of a set is the measure of the region its points dominate, bounded by a
reference point that every counted point must beat in every pair (points that do not are
left out, as in pymoo's `HV`). Higher is better. It is computed exactly, by slicing along
one objective at a time (Fonseca et al., "An improved dimension-sweep algorithm for the
hypervolume indicator", 2006, without the tree): O(n^(m-1) log n) for n points in m
objectives, fine for the tens of runs a sweep gives and up to 4-5 heads.

Example:
    >>> non_dominated([[1.0, 3.0], [2.0, 2.0], [3.0, 3.0]], ["min", "min"]).tolist()
    [True, True, False]
    >>> hypervolume([[1.0, 3.0], [2.0, 2.0]], reference=[4.0, 4.0], directions=["min", "min"])
    5.0
"""

from __future__ import annotations

import itertools
import math
from typing import Sequence

import numpy as np

__all__ = ["hypervolume", "non_dominated", "simplex_preferences"]


def _as_minimized(points: Sequence[Sequence[float]], directions: Sequence[str],
                  labels: Sequence[str] | None = None) -> np.ndarray:
    array = np.asarray(points, dtype=float)
    if array.ndim != 2 or array.shape[1] != len(directions):
        raise ValueError(f"points: expected shape (runs, {len(directions)}) for {len(directions)} "
                         f"directions, got {array.shape}")
    bad = [d for d in directions if d not in ("min", "max")]
    if bad:
        raise ValueError(f"directions: each must be 'min' or 'max', got {bad[0]!r}")
    rows, cols = np.nonzero(~np.isfinite(array))
    if rows.size:
        who = labels[rows[0]] if labels is not None else f"point {rows[0]}"
        raise ValueError(f"{who}: objective {cols[0]} is {array[rows[0], cols[0]]}; a Pareto front "
                         "needs finite values (leave the run out or fix it)")
    signs = np.array([1.0 if d == "min" else -1.0 for d in directions])
    return array * signs


def non_dominated(points: Sequence[Sequence[float]], directions: Sequence[str],
                  labels: Sequence[str] | None = None) -> np.ndarray:
    """A boolean mask: True for each point that no other point dominates.

    Args:
        points: (runs, objectives) values.
        directions: per objective, `"min"` or `"max"`.
        labels: per run, the name an error gives (a non-finite value is refused).
    """
    x = _as_minimized(points, directions, labels)
    no_worse = np.all(x[:, None, :] <= x[None, :, :], axis=2)   # [i, j]: i no worse than j
    better = np.any(x[:, None, :] < x[None, :, :], axis=2)
    dominated = np.any(no_worse & better, axis=0)
    return ~dominated


def _volume(x: np.ndarray, ref: np.ndarray) -> float:
    """The measure dominated by the rows of `x` (minimisation, all strictly below `ref`)."""
    if x.shape[0] == 0:
        return 0.0
    if x.shape[1] == 1:
        return float(ref[0] - x[:, 0].min())
    order = np.argsort(x[:, -1], kind="stable")
    x = x[order]
    total = 0.0
    for i in range(x.shape[0]):
        top = x[i + 1, -1] if i + 1 < x.shape[0] else ref[-1]
        depth = top - x[i, -1]
        if depth > 0:
            total += depth * _volume(x[: i + 1, :-1], ref[:-1])
    return total


def hypervolume(points: Sequence[Sequence[float]], reference: Sequence[float],
                directions: Sequence[str], labels: Sequence[str] | None = None) -> float:
    """The hypervolume the points dominate, up to `reference` (see the module docstring).

    Points that do not beat the reference in every objective add nothing.
    """
    x = _as_minimized(points, directions, labels)
    ref = _as_minimized([reference], directions, ["reference"])[0]
    inside = np.all(x < ref, axis=1)
    return _volume(x[inside], ref)


def simplex_preferences(heads: Sequence[str], per_edge: int) -> list[dict[str, float]]:
    """Preference vectors on the simplex over `heads`: the Das-Dennis lattice with
    `per_edge` points along each edge (`per_edge - 1` divisions), weights summing to 1.

    Two heads give `per_edge` vectors, evenly spaced from (1, 0) to (0, 1); K heads give
    C(per_edge + K - 2, K - 1).
    """
    if len(heads) < 2:
        raise ValueError(f"a preference simplex needs at least two heads, got {list(heads)}")
    if isinstance(per_edge, bool) or not isinstance(per_edge, int) or per_edge < 2:
        raise ValueError(f"simplex: expected an integer >= 2 (points per edge), got {per_edge!r}")
    divisions = per_edge - 1
    vectors = []
    for cuts in itertools.combinations(range(divisions + len(heads) - 1), len(heads) - 1):
        parts = np.diff([-1, *cuts, divisions + len(heads) - 1]) - 1   # stars and bars
        vectors.append({h: float(p) / divisions for h, p in zip(heads, parts)})
    vectors.sort(key=lambda v: [-v[h] for h in heads])
    assert len(vectors) == math.comb(divisions + len(heads) - 1, len(heads) - 1)
    return vectors
