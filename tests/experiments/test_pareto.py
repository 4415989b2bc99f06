"""Pareto marks and hypervolume against independent computations: brute-force dominance and
inclusion-exclusion over boxes (exact), on fixed and random points with ties and mixed
directions."""

import itertools
import math

import numpy as np
import pytest

from multihead.experiments.results.pareto import hypervolume, non_dominated, simplex_preferences


def _dominates(a, b, directions):
    better = [x < y if d == "min" else x > y for x, y, d in zip(a, b, directions)]
    no_worse = [x <= y if d == "min" else x >= y for x, y, d in zip(a, b, directions)]
    return all(no_worse) and any(better)


def _front_by_hand(points, directions):
    return [not any(_dominates(q, p, directions) for q in points) for p in points]


def _hv_inclusion_exclusion(points, reference, directions):
    """Union of the boxes [p, ref] (minimisation after flipping max objectives), by
    inclusion-exclusion: sum over non-empty subsets of (-1)^(|S|+1) * vol(intersection)."""
    sign = np.array([1.0 if d == "min" else -1.0 for d in directions])
    pts = [np.asarray(p) * sign for p in points]
    ref = np.asarray(reference) * sign
    pts = [p for p in pts if np.all(p < ref)]
    total = 0.0
    for k in range(1, len(pts) + 1):
        for subset in itertools.combinations(pts, k):
            corner = np.max(subset, axis=0)
            total += (-1) ** (k + 1) * float(np.prod(np.clip(ref - corner, 0, None)))
    return total


def test_two_heads_by_hand():
    # losses (min): (1,3) and (2,2) are on the front, (3,3) is dominated by (2,2);
    # the boxes to (4,4): 3*1 + 2*2 - 2*1 (overlap [2,4]x[3,4]) = 5.
    points = [[1.0, 3.0], [2.0, 2.0], [3.0, 3.0]]
    assert non_dominated(points, ["min", "min"]).tolist() == [True, True, False]
    assert hypervolume(points, [4.0, 4.0], ["min", "min"]) == 5.0


def test_mixed_directions_and_ties():
    # accuracy (max), loss (min): two equal points both stay on the front
    points = [[0.9, 0.3], [0.9, 0.3], [0.8, 0.2], [0.7, 0.4]]
    mask = non_dominated(points, ["max", "min"])
    assert mask.tolist() == [True, True, True, False]
    # reference (0.5 accuracy, 0.5 loss): union of [0.5,0.9]x[0.3,0.5] and [0.5,0.8]x[0.2,0.5]
    # = 0.4*0.2 + 0.3*0.3 - 0.3*0.2 = 0.08 + 0.09 - 0.06 = 0.11
    assert hypervolume(points, [0.5, 0.5], ["max", "min"]) == pytest.approx(0.11, abs=1e-12)


@pytest.mark.parametrize("objectives", [2, 3, 4])
def test_random_points_match_brute_force_and_inclusion_exclusion(objectives):
    rng = np.random.default_rng(objectives)
    for trial in range(20):
        n = int(rng.integers(1, 8))
        points = np.round(rng.uniform(0, 1, size=(n, objectives)), 1)   # rounding makes ties
        directions = list(rng.choice(["min", "max"], size=objectives))
        reference = [1.1 if d == "min" else -0.1 for d in directions]
        assert non_dominated(points, directions).tolist() == _front_by_hand(points.tolist(), directions)
        assert hypervolume(points, reference, directions) == pytest.approx(
            _hv_inclusion_exclusion(points, reference, directions), rel=1e-12, abs=1e-12)


def test_points_behind_the_reference_add_nothing():
    assert hypervolume([[5.0, 1.0]], [4.0, 4.0], ["min", "min"]) == 0.0
    assert hypervolume([[5.0, 1.0], [1.0, 1.0]], [4.0, 4.0], ["min", "min"]) == 9.0


def test_nan_is_refused_naming_the_run():
    with pytest.raises(ValueError, match="run-b: objective 1 is nan"):
        non_dominated([[1.0, 2.0], [1.0, float("nan")]], ["min", "min"], labels=["run-a", "run-b"])
    with pytest.raises(ValueError, match="reference: objective 0 is inf"):
        hypervolume([[1.0, 2.0]], [float("inf"), 3.0], ["min", "min"])


def test_simplex_preferences():
    two = simplex_preferences(["a", "b"], 5)
    assert [v["a"] for v in two] == [1.0, 0.75, 0.5, 0.25, 0.0]
    three = simplex_preferences(["a", "b", "c"], 4)
    assert len(three) == math.comb(3 + 2, 2) == 10
    assert all(abs(sum(v.values()) - 1.0) < 1e-12 for v in three)
    assert len({tuple(v.values()) for v in three}) == 10
    with pytest.raises(ValueError, match="at least two heads"):
        simplex_preferences(["a"], 3)
    with pytest.raises(ValueError, match="expected an integer >= 2"):
        simplex_preferences(["a", "b"], 1)
