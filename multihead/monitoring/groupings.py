"""Task groupings from inter-task affinities: which heads should share a trunk.

Fifty et al. (NeurIPS 2021, "Efficiently Identifying Task Groupings for Multi-Task
Learning", TAG) average the inter-task affinity `Z_{i->j}` over training (the running
mean a run logs, `multihead report`'s affinity matrix) and choose the groups of tasks,
one network each, that maximise the total affinity:

* the affinity onto head j in a group G is the mean of `Z_{i->j}` over the other members
  i of G: how much, on average, their updates of a shared trunk lower j's loss;
* a group's score is the mean of that over its members;
* a split's total is the sum over all heads of the affinity onto each in its group (TAG
  maximises the mean over tasks, the same split).

A head alone in its group gets 0: no other head moves its trunk, so no other head
changes its loss. Groups here partition the heads, each head in exactly one group (one
run per group); TAG's network selection also considers overlapping groups, a head then
served by the group that scores best for it. A head that never moved the trunk
(`trains_trunk=False`: no row in the matrix) has 0 affinity onto the others.

Search (`task_groupings`): exact up to `EXACT_MAX_HEADS` heads, by dynamic programming
over subsets (the best split of a set into at most n groups is its best group holding
its first head plus the best split of the rest into at most n - 1): `O(3^K)` subset
pairs, half a second at 12 heads on one core. Above that (or with `method="local"`), an
approximation: start from every head alone, merge the two groups whose merge gains
the most while that gains (or while there are more than `max_groups`), then move single
heads between groups (or into a new group while there are fewer than `max_groups`) as
long as a move gains; a local optimum, not guaranteed to be the best split.

Example:
    >>> z = {"a": {"b": 0.3, "c": -0.2}, "b": {"a": 0.2, "c": -0.1}, "c": {"a": -0.1, "b": 0.0}}
    >>> grouping = task_groupings(z, 2)
    >>> [g.heads for g in grouping.groups], round(grouping.total, 3)
    ([('a', 'b'), ('c',)], 0.5)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Sequence

#: Up to this many heads the search is exact; above, the local search approximates it.
EXACT_MAX_HEADS = 12

Affinity = Mapping[str, Mapping[str, "float | None"]]


@dataclasses.dataclass(frozen=True)
class Group:
    """One group of a split.

    Attributes:
        heads: its heads, in the matrix's order.
        onto: head -> the mean affinity of the group's other heads onto it (0 alone).
        score: the mean of `onto` over the group's heads.
    """

    heads: tuple[str, ...]
    onto: dict[str, float]
    score: float


@dataclasses.dataclass(frozen=True)
class Grouping:
    """A split of the heads into groups.

    Attributes:
        groups: the groups, ordered by their first head.
        total: the sum over all heads of the affinity onto each in its group.
        exact: whether the search was exhaustive (else the local search's split).
    """

    groups: tuple[Group, ...]
    total: float
    exact: bool


def heads_of(affinity: Affinity) -> list[str]:
    """The heads of an affinity matrix: its rows and columns, rows first, in order."""
    heads = list(affinity)
    for row in affinity.values():
        heads += [h for h in row if h not in heads]
    return heads


def _matrix(affinity: Affinity, heads: Sequence[str]) -> list[list[float]]:
    """`z[i][j]` = Z_{i->j}; 0 where not logged (a head that never moved the trunk)."""
    z = []
    for i in heads:
        row = affinity.get(i, {})
        values = []
        for j in heads:
            value = row.get(j)
            if value is not None and not math.isfinite(value):
                raise ValueError(f"affinity of {i!r} onto {j!r} is {value!r}; give finite values "
                                 "(None for one never logged)")
            values.append(0.0 if value is None else float(value))
        z.append(values)
    return z


def group(heads: Sequence[str], affinity: Affinity) -> Group:
    """The scores of the group `heads` (see the module docstring)."""
    z = _matrix(affinity, heads)
    k = len(heads)
    onto = {h: (sum(z[i][j] for i in range(k) if i != j) / (k - 1) if k > 1 else 0.0)
            for j, h in enumerate(heads)}
    return Group(tuple(heads), onto, sum(onto.values()) / k)


def split_total(groups: Sequence[Sequence[str]], affinity: Affinity) -> float:
    """The total of a split: the sum over its heads of the affinity onto each in its group."""
    return sum(sum(group(g, affinity).onto.values()) for g in groups)


def task_groupings(affinity: Affinity, max_groups: int, method: str = "auto") -> Grouping:
    """The split of the heads into at most `max_groups` groups with the largest total affinity.

    Args:
        affinity: `affinity[i][j]` = the mean Z_{i->j} (`RunReport.affinity`); None or a
            missing entry: 0. Its heads are its rows and columns.
        max_groups: at most this many groups (>= 1).
        method: `"exact"`, `"local"` (the approximation) or `"auto"`: exact up to
            `EXACT_MAX_HEADS` heads.

    Raises:
        ValueError: no heads, `max_groups` < 1, a non-finite affinity, or an unknown method.
    """
    heads = heads_of(affinity)
    if not heads:
        raise ValueError("the affinity matrix has no heads: was the run logged with "
                         "log.affinity_every (Trainer(affinity_every=...))?")
    if isinstance(max_groups, bool) or not isinstance(max_groups, int) or max_groups < 1:
        raise ValueError(f"max_groups: must be an integer >= 1, got {max_groups!r}")
    if method not in ("auto", "exact", "local"):
        raise ValueError(f"method: must be one of ['auto', 'exact', 'local'], got {method!r}")
    z = _matrix(affinity, heads)
    exact = method == "exact" or (method == "auto" and len(heads) <= EXACT_MAX_HEADS)
    split = _exact(z, max_groups) if exact else _local(z, max_groups)
    groups = sorted(([heads[i] for i in sorted(members)] for members in split),
                    key=lambda g: heads.index(g[0]))
    return Grouping(tuple(group(g, affinity) for g in groups), split_total(groups, affinity), exact)


def _gain(z: list[list[float]], members: Sequence[int]) -> float:
    """The sum over `members` of the mean affinity of the others onto each."""
    k = len(members)
    if k < 2:
        return 0.0
    return sum(z[i][j] for j in members for i in members if i != j) / (k - 1)


def _exact(z: list[list[float]], max_groups: int) -> list[list[int]]:
    """The best split, by dynamic programming over subsets (bit masks of the heads):
    `levels[n][mask]` = (the best total of `mask` in at most n groups, its group holding
    the lowest head of `mask`)."""
    k = len(z)
    full = (1 << k) - 1
    value = [_gain(z, [i for i in range(k) if mask >> i & 1]) for mask in range(full + 1)]
    levels: list[list[tuple[float, int]]] = [[(0.0, 0)] + [(-math.inf, 0)] * full]
    for _ in range(min(max_groups, k)):
        prev = levels[-1]
        level = [(0.0, 0)] * (full + 1)
        for mask in range(1, full + 1):
            low = mask & -mask
            rest = mask ^ low
            top, choice, sub = -math.inf, 0, rest
            while True:  # every group holding the lowest head: it and a subset of the rest
                members = sub | low
                total = value[members] + prev[mask ^ members][0]
                if total > top:
                    top, choice = total, members
                if sub == 0:
                    break
                sub = (sub - 1) & rest
            level[mask] = (top, choice)
        levels.append(level)
    split, mask, n = [], full, len(levels) - 1
    while mask:
        members = levels[n][mask][1]
        split.append([i for i in range(k) if members >> i & 1])
        mask ^= members
        n -= 1
    return split


def _local(z: list[list[float]], max_groups: int) -> list[list[int]]:
    """The approximation (see the module docstring): greedy merges, then single-head moves."""
    groups: list[list[int]] = [[i] for i in range(len(z))]
    while len(groups) > 1:
        gains = [(_gain(z, a + b) - _gain(z, a) - _gain(z, b), x, y)
                 for x, a in enumerate(groups) for y, b in enumerate(groups) if x < y]
        gain, x, y = max(gains, key=lambda t: t[0])
        if gain <= 0 and len(groups) <= max_groups:
            break
        groups[x] = sorted(groups[x] + groups[y])
        del groups[y]
    improved = True
    while improved:
        improved = False
        for head in range(len(z)):
            source = next(g for g in groups if head in g)
            rest = [i for i in source if i != head]
            base = _gain(z, source) - _gain(z, rest)
            targets = [g for g in groups if g is not source]
            if rest and len(groups) < max_groups:
                targets.append([])
            best, where = 0.0, None
            for target in targets:
                gain = _gain(z, target + [head]) - _gain(z, target) - base
                if gain > best + 1e-12:
                    best, where = gain, target
            if where is None:
                continue
            source.remove(head)
            if not where:
                groups.append(where)
            where.append(head)
            where.sort()
            groups = [g for g in groups if g]
            improved = True
    return groups


def format_grouping(grouping: Grouping, max_groups: int) -> str:
    """The groups, each with its score and the affinity onto each of its heads, and the total."""
    how = ("exact search over every split" if grouping.exact else
           f"approximate: greedy merges and single-head moves, above {EXACT_MAX_HEADS} heads")
    lines = [f"task groupings: at most {max_groups} group{'s' * (max_groups != 1)} with the "
             f"largest total affinity ({how})"]
    rows = [("group", "heads", "score", "affinity onto each head from the others of its group")]
    for n, g in enumerate(grouping.groups, 1):
        rows.append((str(n), ", ".join(g.heads), f"{g.score:+.3g}",
                     "alone: 0" if len(g.heads) == 1 else
                     ", ".join(f"{h} {v:+.3g}" for h, v in g.onto.items())))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    lines.append(f"total affinity {grouping.total:+.3g}: the sum over the heads of the affinity "
                 "onto each")
    return "\n".join(lines)


def grouping_to_dict(grouping: Grouping) -> dict[str, object]:
    """The grouping as JSON-ready data."""
    return {"groups": [{"heads": list(g.heads), "score": g.score, "onto": dict(g.onto)}
                       for g in grouping.groups],
            "total": grouping.total, "exact": grouping.exact}
