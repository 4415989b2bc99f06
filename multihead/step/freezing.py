"""`FrozenHeads`: which heads sit out the train step, as one variable the step reads.

A frozen head is never due: its optimizer does not update (its iterations and slots
stay as they are) and none of its gradient reaches the
trunk (under `trunk="per_head"` its update, trunk part included, is not applied;
under trunk aggregation it is dropped from the aggregate as the non-finite guard
drops a head, see `multihead.step.trunk_update`). `StepResult` and the history
list it neither as updated nor as skipped.

The flags are a non-trainable variable read inside the compiled step, so freezing
and unfreezing do not retrace it; a checkpoint saves them as the part `frozen`. The
one exception: under trunk aggregation with two or more frozen heads the step runs
the variant compiled for the other heads (`TrunkRule.step_heads`), traced once per
distinct frozen set.
"""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from multihead.step.applier import write_state


class FrozenHeads(tf.Module):
    """One bool flag per head, in head order: True while the head is frozen.

    Create it inside a `tf.distribute` strategy's scope when training under one.

    Args:
        heads: the head names, in order.
    """

    def __init__(self, heads: Sequence[str]) -> None:
        super().__init__(name="frozen_heads")
        self._heads = tuple(heads)
        self.flags = tf.Variable(tf.zeros([len(self._heads)], tf.bool), trainable=False,
                                 name="flags")

    @property
    def names(self) -> tuple[str, ...]:
        """The frozen heads, in head order."""
        # The raw op: read on every step call, cheaper in Python than `Variable.numpy()`; a
        # mirrored variable (tf.distribute) has no one handle to read.
        flags = (self.flags.numpy() if isinstance(self.flags, tf.distribute.DistributedValues)
                 else tf.raw_ops.ReadVariableOp(resource=self.flags.handle, dtype=tf.bool).numpy())
        return tuple(h for h, frozen in zip(self._heads, flags) if frozen)

    def set(self, head: str, frozen: bool) -> None:
        """Freezes (`frozen=True`) or unfreezes `head` (a head name, checked by the caller)."""
        flags = self.flags.numpy().copy()
        flags[self._heads.index(head)] = frozen
        write_state([(self.flags, flags)])

    def unfrozen(self) -> dict[str, tf.Tensor]:
        """In the graph: head -> bool scalar, whether the head is not frozen."""
        flags = self.flags.read_value()
        return {h: tf.logical_not(flags[i]) for i, h in enumerate(self._heads)}
