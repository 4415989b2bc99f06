"""A stateful aggregator's state as variables, read and written by the positions of the heads a
step aggregates (all of them, or all but a head dropped as non-finite, known in the graph)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence, Union

import tensorflow as tf

from multihead.aggregation.base import Aggregator


class AggregatorState(tf.Module):
    """A stateful aggregator's state, as variables (checkpointed as `trunk_update/aggregator_state`).

    Per-head entries have the heads on their leading axes, in the trunk update's head
    order; a step of a subset of the heads (a head dropped as non-finite) reads and
    writes that subset's entries only, so each head keeps its own history.
    Shared entries (a step counter) advance on every step.
    """

    def __init__(self, aggregator: Aggregator, num_heads: int, dtype: str) -> None:
        super().__init__(name="aggregator_state")
        self._head_axes = self._no_dependency(
            {key: spec.head_axes for key, spec in aggregator.state_spec().items()})
        for key, value in aggregator.initial_state(num_heads).items():
            value = value.astype(dtype) if value.dtype.kind == "f" else value
            setattr(self, key, tf.Variable(value, trainable=False, name=key))
        self._num_heads = num_heads
        self._dtype = dtype
        self._buffers = self._no_dependency(tuple(aggregator.buffers))

    def build_buffers(self, trunk_variables: Sequence[Any]) -> None:
        """Creates a buffered aggregator's `K x D` buffers (MoCo's `y`, ...), zero: for each
        buffer a list with one `(K,) + shape` variable per trunk variable, in the order of
        `trunk_variables` (checkpointed as `<buffer>/<index of the trunk variable>`)."""
        for key in self._buffers:
            shapes = [(self._num_heads,) + tuple(v.shape) for v in trunk_variables]
            if hasattr(self, key):  # built already: the same trunk
                if [tuple(b.shape) for b in getattr(self, key)] != shapes:
                    raise ValueError(f"aggregator buffer {key!r} was built for other trunk variables")
                continue
            setattr(self, key, [tf.Variable(tf.zeros(shape, self._dtype), trainable=False,
                                            name=f"{key}_{i}") for i, shape in enumerate(shapes)])

    def _every(self, indices: Indices) -> bool:
        return not isinstance(indices, tf.Tensor) and list(indices) == list(range(self._num_heads))

    def read_buffers(self, indices: Indices) -> dict[str, list[tf.Tensor]]:
        """The buffers' rows of the heads `indices`, as `K' x n` blocks per trunk variable."""
        out = {}
        for key in self._buffers:
            blocks = []
            for var in getattr(self, key):
                value = tf.convert_to_tensor(var)
                if not self._every(indices):
                    value = tf.gather(value, indices)
                blocks.append(tf.reshape(value, [_count(indices), -1]))
            out[key] = blocks
        return out

    def updated_buffers(self, indices: Indices, new: Mapping[str, Sequence[tf.Tensor]],
                        ) -> dict[str, list[tf.Tensor]]:
        """The buffers' whole new values, with the rows of the heads `indices` replaced by
        `new` (`K' x n` blocks); for `assign`."""
        every = self._every(indices)
        rows = None if every else _row_indices(indices)
        out = {}
        for key in self._buffers:
            values = []
            for var, block in zip(getattr(self, key), new[key]):
                value = tf.reshape(tf.cast(block, var.dtype), [_count(indices)] + list(var.shape[1:]))
                values.append(value if every else
                              tf.tensor_scatter_nd_update(tf.convert_to_tensor(var), rows, value))
            out[key] = values
        return out

    def read(self, indices: Indices) -> dict[str, tf.Tensor]:
        """The state of the heads `indices` (positions in the trunk update's heads)."""
        out = {}
        for key, axes in self._head_axes.items():
            value = tf.convert_to_tensor(getattr(self, key))
            for axis in range(axes):
                value = tf.gather(value, indices, axis=axis)
            out[key] = value
        return out

    def updated(self, indices: Indices, new: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        """The state's whole new values, with the entries of the heads `indices` replaced by
        `new`; for `assign`."""
        out = {}
        for key, axes in self._head_axes.items():
            var = getattr(self, key)
            value = tf.cast(new[key], var.dtype)
            if axes == 0 or self._every(indices):
                out[key] = value
            elif axes == 1:
                out[key] = tf.tensor_scatter_nd_update(tf.convert_to_tensor(var),
                                                       _row_indices(indices), value)
            else:
                if isinstance(indices, tf.Tensor):
                    grid = tf.stack(tf.meshgrid(indices, indices, indexing="ij"), axis=-1)
                else:
                    grid = tf.constant([[[i, j] for j in indices] for i in indices])
                out[key] = tf.tensor_scatter_nd_update(tf.convert_to_tensor(var), grid, value)
        return out

    def writes(self, values: Mapping[str, Any]) -> list[tuple[tf.Variable, Any]]:
        """Whole new values (`updated`, `updated_buffers`) as (variable, value) pairs for the
        applier: one `assign` per variable, which a mirrored variable (tf.distribute)
        supports, unlike a scatter."""
        pairs = []
        for key, value in values.items():
            if key in self._buffers:
                pairs += list(zip(getattr(self, key), value))
            else:
                pairs.append((getattr(self, key), value))
        return pairs


#: Positions of heads in the trunk update's order: a list, or an int32 vector known in the graph.
Indices = Union[Sequence[int], tf.Tensor]


def _count(indices: Indices) -> int:
    return int(indices.shape[0]) if isinstance(indices, tf.Tensor) else len(indices)


def _row_indices(indices: Indices) -> tf.Tensor:
    """`indices` as `(K', 1)` scatter indices."""
    if isinstance(indices, tf.Tensor):
        return tf.expand_dims(indices, 1)
    return tf.constant([[i] for i in indices])
