"""Partition of a model's trainable variables into the shared trunk and the heads.

The partition is computed once, from the layers that own the variables, and
compared by object identity (never by name): Keras auto-names variables, so two
different variables may share a name and a rebuilt network renames them.

A trunk may own variables that belong to one head (a per-head gate in MMoE, a
per-head attention module in MTAN, a task column in cross-stitch): those belong to
that head's part, and the trunk's part holds only what every head shares. A head's
var_list is the shared variables plus everything the head owns.

A head that reads an intermediate block of the trunk (a trunk tap, see
`multihead.model.taps`) trains only the shared variables that block's output
depends on: its var_list is those plus the head's.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import keras

from multihead._checks import variable_label

TRUNK = "trunk"


@dataclasses.dataclass(frozen=True)
class Partition:
    """Trainable variables of a multi-head model, split by owner.

    Attributes:
        trunk: the trunk's shared trainable variables, in Keras' tracking order.
        heads: head name -> that head's trainable variables, in tracking order: its
            head layer's, then those the trunk owns for it (gates, attention, column).
        tapped: head -> the trunk variables its trunk tap depends on, for the heads that
            read a tap (the others read the trunk's output, which depends on all of them).
    """

    trunk: tuple[keras.Variable, ...]
    heads: Mapping[str, tuple[keras.Variable, ...]]
    tapped: Mapping[str, tuple[keras.Variable, ...]] = dataclasses.field(default_factory=dict)

    def var_list(self, head: str, trains_trunk: bool = True) -> list[keras.Variable]:
        """The variables head `head`'s optimizer is built on: the trunk variables it reads
        (all, or those below its tap) + head's (or head's only)."""
        if head not in self.heads:
            raise KeyError(f"no head named {head!r}; heads are {sorted(self.heads)}")
        trunk = list(self.tapped.get(head, self.trunk)) if trains_trunk else []
        return trunk + list(self.heads[head])


def partition_variables(
    trunk: Sequence[keras.Variable],
    heads: Mapping[str, Sequence[keras.Variable]],
    all_trainable: Sequence[keras.Variable],
    trunk_owned: Mapping[str, Sequence[keras.Variable]] | None = None,
    tapped: Mapping[str, Sequence[keras.Variable]] | None = None,
) -> Partition:
    """Validates and returns the partition of `all_trainable` into trunk and heads.

    Every variable of `all_trainable` must be owned by exactly one part.

    Args:
        trunk: variables of the trunk layer (the shared ones and those it owns for heads).
        heads: head name -> variables of that head's layer.
        all_trainable: every trainable variable of the model.
        trunk_owned: head name -> variables of `trunk` that belong to that head (e.g.
            its gate); they move from the trunk's part to the head's.
        tapped: head -> the trunk variables its trunk tap depends on (see `Partition`).

    Returns:
        The validated partition.

    Raises:
        ValueError: a variable is owned by two parts (a layer object used both in
            the trunk and in a head, or in two heads), or by none.
    """
    trunk_owned = dict(trunk_owned or {})
    in_trunk = {id(v) for v in trunk}
    for name, variables in trunk_owned.items():
        if name not in heads:
            raise ValueError(f"the trunk owns variables for head {name!r}, but the model's heads "
                             f"are {list(heads)}")
        for var in variables:
            if id(var) not in in_trunk:
                raise ValueError(f"variable {variable_label(var)!r}, owned by the trunk for head "
                                 f"{name!r}, is not a trainable variable of the trunk")
    owned_by: dict[int, list[str]] = {}
    for name, variables in trunk_owned.items():
        for var in variables:
            names = owned_by.setdefault(id(var), [])
            if name not in names:
                names.append(name)
    shared = [v for v in trunk if id(v) not in owned_by]
    heads = {n: list(heads[n]) + [v for v in trunk_owned.get(n, ()) if id(v) in owned_by]
             for n in heads}
    trunk = shared
    owners: dict[int, list[str]] = {}
    for var_id, names in owned_by.items():
        if len(names) > 1:  # a trunk sub-layer declared for two heads
            owners[var_id] = [f"head {n!r}" for n in names]
    for part, variables in [(TRUNK, trunk)] + [(f"head {n!r}", v) for n, v in heads.items()]:
        for var in variables:
            parts = owners.setdefault(id(var), [])
            if part not in parts:
                parts.append(part)
    by_id = {id(v): v for v in list(trunk) + [v for vs in heads.values() for v in vs]}
    for var_id, parts in owners.items():
        if len(parts) > 1:
            raise ValueError(
                f"variable {variable_label(by_id[var_id])!r} is owned by {' and '.join(parts)}: "
                "a layer object may belong to one part only; put layers that several "
                "heads share into the trunk"
            )
    orphans = [v for v in all_trainable if id(v) not in owners]
    if orphans:
        raise ValueError(
            f"trainable variable {variable_label(orphans[0])!r} belongs neither to the trunk nor "
            "to any head (layers created outside `trunk` and `heads`?); "
            "move its layer into the trunk or a head, or make it non-trainable"
        )
    in_shared = {id(v) for v in trunk}
    for name, variables in (tapped or {}).items():
        for var in variables:
            if id(var) not in in_shared:
                raise ValueError(f"variable {variable_label(var)!r}, below the trunk tap of head "
                                 f"{name!r}, is not a shared trainable variable of the trunk")
    return Partition(trunk=tuple(trunk), heads={n: tuple(v) for n, v in heads.items()},
                     tapped={n: tuple(v) for n, v in (tapped or {}).items()})
