"""Task groupings (`multihead.monitoring.groupings`) against brute force over every set
partition, scored by a formula written here from TAG's definition."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from multihead.monitoring.groupings import EXACT_MAX_HEADS, heads_of, task_groupings


def _partitions(items):
    """Every set partition of `items` (recursively: the first item joins a block of a
    partition of the rest, or a block of its own)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for partition in _partitions(rest):
        for k in range(len(partition)):
            yield partition[:k] + [[first] + partition[k]] + partition[k + 1:]
        yield [[first]] + partition


def _total(partition, z):
    """Sum over heads j of the mean of Z[i][j] over the other members i of j's block
    (0 for a head alone)."""
    total = 0.0
    for block in partition:
        for j in block:
            others = [z[i][j] for i in block if i != j]
            total += float(np.mean(others)) if others else 0.0
    return total


def _matrix(k, seed):
    rng = np.random.default_rng(seed)
    z = rng.normal(0.0, 1.0, (k, k))
    heads = [f"h{i}" for i in range(k)]
    return heads, z, {a: {b: float(z[i, j]) for j, b in enumerate(heads)}
                      for i, a in enumerate(heads)}


def test_partition_counts_are_bell_numbers():  # the reference enumerates every partition once
    assert [sum(1 for _ in _partitions(list(range(k)))) for k in range(1, 7)] == [1, 2, 5, 15, 52, 203]


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5, 6])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_exact_search_equals_brute_force_over_every_partition(k, seed):
    heads, z, affinity = _matrix(k, seed)
    for max_groups in range(1, k + 1):
        best = max(_total(p, z) for p in _partitions(list(range(k))) if len(p) <= max_groups)
        grouping = task_groupings(affinity, max_groups)
        assert grouping.exact
        assert len(grouping.groups) <= max_groups
        assert sorted(h for g in grouping.groups for h in g.heads) == sorted(heads)
        chosen = [[heads.index(h) for h in g.heads] for g in grouping.groups]
        assert grouping.total == pytest.approx(best, abs=1e-12)
        assert _total(chosen, z) == pytest.approx(best, abs=1e-12)
        for g in grouping.groups:  # a group's score: the mean over its members
            assert g.score == pytest.approx(_total([[heads.index(h) for h in g.heads]], z)
                                            / len(g.heads), abs=1e-12)


def test_a_head_alone_scores_zero_and_negative_affinity_splits_heads():
    # a hurts b and b hurts a: together they score -1 + -1; apart 0 + 0
    z = {"a": {"b": -1.0}, "b": {"a": -1.0}}
    grouping = task_groupings(z, 2)
    assert [g.heads for g in grouping.groups] == [("a",), ("b",)]
    assert grouping.total == 0.0 and grouping.groups[0].onto == {"a": 0.0}
    assert [g.heads for g in task_groupings(z, 1).groups] == [("a", "b")]  # at most one group


def test_missing_affinities_count_as_zero():
    # c never moved the trunk (trains_trunk=False): no row; its column is read
    z = {"a": {"b": 0.5, "c": 0.2}, "b": {"a": 0.5, "c": -0.3}}
    assert heads_of(z) == ["a", "b", "c"]
    grouping = task_groupings(z, 3)
    # {a, b}, {c}: 0.5 onto a + 0.5 onto b; all three: (0.5 + 0) / 2 onto a and onto b,
    # (0.2 - 0.3) / 2 onto c, 0.45 in all
    assert [g.heads for g in grouping.groups] == [("a", "b"), ("c",)]
    assert grouping.total == pytest.approx(1.0)


@pytest.mark.parametrize("seed", range(4))
def test_local_search_is_a_valid_split_no_better_than_the_exact_one(seed):
    heads, z, affinity = _matrix(8, seed)
    exact, local = task_groupings(affinity, 3, "exact"), task_groupings(affinity, 3, "local")
    assert not local.exact and len(local.groups) <= 3
    assert sorted(h for g in local.groups for h in g.heads) == sorted(heads)
    assert local.total <= exact.total + 1e-12
    assert local.total == pytest.approx(_total([[heads.index(h) for h in g.heads]
                                                for g in local.groups], z), abs=1e-12)


def test_above_the_exact_bound_the_local_search_recovers_planted_clusters():
    k = EXACT_MAX_HEADS + 4
    rng = np.random.default_rng(0)
    clusters = [list(range(0, 5)), list(range(5, 11)), list(range(11, k))]
    z = rng.normal(0.0, 0.02, (k, k))
    for members in clusters:
        z[np.ix_(members, members)] += 0.1
    heads = [f"h{i}" for i in range(k)]
    affinity = {a: {b: float(z[i, j]) for j, b in enumerate(heads)} for i, a in enumerate(heads)}
    grouping = task_groupings(affinity, 3)
    assert not grouping.exact
    assert [list(g.heads) for g in grouping.groups] == [[heads[i] for i in c] for c in clusters]


def test_bad_input_is_refused_in_one_line():
    with pytest.raises(ValueError, match="max_groups: must be an integer >= 1, got 0"):
        task_groupings({"a": {"b": 1.0}}, 0)
    with pytest.raises(ValueError, match="has no heads: was the run logged with log.affinity_every"):
        task_groupings({}, 2)
    with pytest.raises(ValueError, match="affinity of 'a' onto 'b' is nan"):
        task_groupings({"a": {"b": float("nan")}}, 2)
    with pytest.raises(ValueError, match=r"method: must be one of \['auto', 'exact', 'local'\]"):
        task_groupings({"a": {"b": 1.0}}, 2, "greedy")


def test_every_small_split_is_reachable():  # sanity of the reference itself at K = 3
    seen = {tuple(sorted(tuple(sorted(b)) for b in p)) for p in _partitions([0, 1, 2])}
    expected = set()
    for labels in itertools.product(range(3), repeat=3):
        blocks = {}
        for item, label in enumerate(labels):
            blocks.setdefault(label, []).append(item)
        expected.add(tuple(sorted(tuple(b) for b in blocks.values())))
    assert seen == expected
