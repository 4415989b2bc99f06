"""The size of a `MultiHeadModel` by part: the trunk and each head, trainable and not.

A part's trainable parameters are its variables in the model's partition
(`MultiHeadModel.partition`): the trunk's shared ones, and a head's own plus those a
routing trunk owns for it (its gate). Its non-trainable parameters (BatchNorm
statistics, frozen layers) are those of the same layers. The parts add up to
`model.count_params()`.

Example:
    >>> import keras, multihead as mh
    >>> model = mh.MultiHeadModel(keras.layers.Dense(8), {"y1": keras.layers.Dense(1),
    ...                                                    "y2": keras.layers.Dense(2)})
    >>> model.build((None, 4))
    >>> counts = model.parameter_counts()   # trunk 4*8 + 8; y1 8*1 + 1; y2 8*2 + 2
    >>> counts.trunk.trainable, counts.heads["y2"].trainable, counts.total
    (40, 18, 67)
    >>> print(counts.table())
    part     trainable  non-trainable
    trunk           40              0
    head y1          9              0
    head y2         18              0
    total           67              0
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Sequence

import numpy as np

if TYPE_CHECKING:  # annotation only
    import keras


class PartSize(NamedTuple):
    """The parameters of one part of a model (scalars: numbers of floats, not variables)."""

    trainable: int
    non_trainable: int


class ParameterCounts(NamedTuple):
    """The parameters of the trunk and of each head, in head order.

    Attributes:
        trunk: the shared trunk's.
        heads: head name -> its part's.
    """

    trunk: PartSize
    heads: dict[str, PartSize]

    @property
    def total(self) -> int:
        """Every parameter of the model, trainable or not (`model.count_params()`)."""
        parts = [self.trunk, *self.heads.values()]
        return sum(p.trainable + p.non_trainable for p in parts)

    def table(self) -> str:
        """A plain-text table: one row per part, then the totals."""
        rows = [("part", "trainable", "non-trainable"), ("trunk", *map(str, self.trunk))]
        rows += [(f"head {h}", *map(str, size)) for h, size in self.heads.items()]
        parts = [self.trunk, *self.heads.values()]
        rows.append(("total", str(sum(p.trainable for p in parts)),
                     str(sum(p.non_trainable for p in parts))))
        widths = [max(len(row[i]) for row in rows) for i in range(3)]
        return "\n".join(f"{row[0].ljust(widths[0])}  {row[1].rjust(widths[1])}  "
                         f"{row[2].rjust(widths[2])}" for row in rows)


def _size(variables: Sequence[keras.Variable]) -> int:
    return int(sum(int(np.prod(v.shape)) for v in variables))


def count_parameters(model: keras.Model) -> ParameterCounts:
    """The `ParameterCounts` of a built `MultiHeadModel` (see the module docstring); the model
    module calls this, so this module does not import it."""
    partition = model.partition  # raises a clear error for a model without variables
    owned = model.trunk.head_owned_layers() if model.routes_heads else {}
    frozen_owned = {h: [v for layer in layers for v in layer.non_trainable_variables]
                    for h, layers in owned.items()}
    owned_ids = {id(v) for vs in frozen_owned.values() for v in vs}
    trunk = PartSize(_size(partition.trunk), _size(
        [v for v in model.trunk.non_trainable_variables if id(v) not in owned_ids]))
    heads = {h: PartSize(_size(partition.heads[h]), _size(
        list(model.heads[h].non_trainable_variables) + frozen_owned.get(h, [])))
        for h in model.head_names}
    return ParameterCounts(trunk, heads)
