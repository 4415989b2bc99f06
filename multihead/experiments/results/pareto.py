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

import dataclasses
import itertools
import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from multihead.experiments.results.figures import legend_below

__all__ = ["ParetoFront", "front_of", "hypervolume", "non_dominated", "pareto_figure", "simplex_preferences"]


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


@dataclasses.dataclass(frozen=True)
class ParetoFront:
    """The front of a comparison's groups (`compare(..., pareto=True)`).

    Attributes:
        pairs: the `head/metric` objectives, in order.
        directions: `min` or `max` per pair.
        points: group label -> its mean final value per pair.
        front: the labels of the non-dominated groups, in the comparison's order.
        reference: the reference point of the hypervolume, per pair.
        reference_from: `"baselines"` (the single-task baselines' means) or `"worst values"`
            (per pair, the worst group mean: a group that is worst in a pair adds nothing).
        hypervolume: of the groups' points against `reference` (see `hypervolume`).
    """

    pairs: list[str]
    directions: list[str]
    points: dict[str, list[float]]
    front: list[str]
    reference: list[float]
    reference_from: str
    hypervolume: float

    def format(self) -> str:
        """The lines `multihead compare --pareto` prints after the tables."""
        arrows = ", ".join(f"{p} ({'lower' if d == 'min' else 'higher'} is better)"
                           for p, d in zip(self.pairs, self.directions))
        ref = ", ".join(f"{v:.4g}" for v in self.reference)
        return "\n".join([f"Pareto front over {arrows}: {len(self.front)} of {len(self.points)} groups",
                          *(f"  * {label}" for label in self.front),
                          f"hypervolume {self.hypervolume:.6g} against the {self.reference_from} ({ref})"])


def front_of(means: Mapping[str, Mapping[str, Mapping[str, float]]],
             baseline: Mapping[str, Mapping[str, float]], direction: Callable[[str], str | None],
             metrics: Sequence[str] = ("loss",)) -> ParetoFront:
    """The Pareto front of groups given by their mean final metrics.

    Args:
        means: group label -> {head: {metric: value}}.
        baseline: {head: {metric: value}} of the single-task baselines, or empty.
        direction: metric name -> `min`, `max` or None (unknown: refused).
        metrics: the metric names whose (head, metric) pairs are the objectives; every
            group must report each pair.

    Raises:
        ValueError: fewer than two pairs, a pair some group lacks, an unknown direction,
            or a non-finite value (naming the group).
    """
    labels = list(means)
    heads = list(dict.fromkeys(h for tree in means.values() for h in tree))
    pairs = [(h, m) for m in metrics for h in heads if any(m in means[g].get(h, {}) for g in labels)]
    pairs.sort(key=lambda p: heads.index(p[0]))
    if len(pairs) < 2:
        raise ValueError(f"a Pareto front needs at least two head/metric pairs; metrics {list(metrics)} "
                         f"give {[f'{h}/{m}' for h, m in pairs]}")
    for head, metric in pairs:
        missing = [g for g in labels if metric not in means[g].get(head, {})]
        if missing:
            raise ValueError(f"{head}/{metric}: not reported by group {missing[0]!r}; choose metrics "
                             "every group reports")
    directions = []
    for head, metric in pairs:
        d = direction(metric)
        if d is None:
            raise ValueError(f"{head}/{metric}: direction unknown; give it (directions={{{metric!r}: "
                             "'min' or 'max'}})")
        directions.append(d)
    points = [[means[g][h][m] for h, m in pairs] for g in labels]
    mask = non_dominated(points, directions, labels)
    if all(m in baseline.get(h, {}) for h, m in pairs):
        reference, source = [baseline[h][m] for h, m in pairs], "baselines"
    else:
        columns = np.asarray(points).T
        reference = [float(c.max() if d == "min" else c.min()) for c, d in zip(columns, directions)]
        source = "worst values"
    return ParetoFront(
        pairs=[f"{h}/{m}" for h, m in pairs], directions=directions,
        points={g: [float(v) for v in p] for g, p in zip(labels, points)},
        front=[g for g, on in zip(labels, mask) if on], reference=[float(r) for r in reference],
        reference_from=source, hypervolume=hypervolume(points, reference, directions, labels))


def pareto_figure(front: ParetoFront) -> Any:
    """The matplotlib `Figure` of a front (needs matplotlib): for two pairs one panel, for
    more one panel per pair of objectives; front groups filled and joined, the others
    hollow, the reference point as a cross; the legend below the panels."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    n = len(front.pairs)
    panels = list(itertools.combinations(range(n), 2))
    cols = min(len(panels), 3)
    rows = math.ceil(len(panels) / cols)
    fig = Figure(figsize=(4.5 * cols, 4 * rows + 0.6), layout="constrained")
    labels = list(front.points)
    for k, (i, j) in enumerate(panels):
        ax = fig.add_subplot(rows, cols, k + 1)
        for label in labels:
            x, y = front.points[label][i], front.points[label][j]
            on = label in front.front
            ax.scatter([x], [y], s=40, label=label, marker="o",
                       facecolors=None if on else "none", edgecolors=None if on else "C0")
        ordered = sorted((front.points[g][i], front.points[g][j]) for g in front.front)
        if len(ordered) > 1:
            ax.plot(*zip(*ordered), color="gray", linewidth=1, zorder=0)
        ax.scatter([front.reference[i]], [front.reference[j]], marker="x", color="black",
                   label=f"reference ({front.reference_from})")
        ax.set_xlabel(front.pairs[i] + (" ↓" if front.directions[i] == "min" else " ↑"))
        ax.set_ylabel(front.pairs[j] + (" ↓" if front.directions[j] == "min" else " ↑"))
    handles, names = fig.axes[0].get_legend_handles_labels()
    legend_below(fig, handles, names)
    return fig
