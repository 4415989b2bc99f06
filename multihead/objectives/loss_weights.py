"""A head's loss weight as the compiled step reads it, kept in step with its `Objective`."""

from __future__ import annotations

from typing import Any, Mapping

import tensorflow as tf

from multihead._autograph import converted
from multihead.objectives.objective import Objective, check_weight


class LossWeight:
    """A head's loss weight as the compiled step reads it: a variable for a number, so
    a new number assigned to the objective takes effect on the next step without a
    retrace; the schedule (or callable of the step) itself otherwise.

    Args:
        head: the head's name (for messages).
        spec: the objective's weight: a number, or a callable of the step.
    """

    def __init__(self, head: str, spec: Any) -> None:
        self.head = head
        self._name = f"objectives[{head!r}].weight"
        self.spec = spec
        self.variable = None if callable(spec) else tf.Variable(
            check_weight(spec, self._name), dtype=tf.float32, trainable=False, name="loss_weight")

    def __call__(self, step: tf.Tensor) -> tf.Tensor:
        if self.variable is not None:
            return self.variable.read_value()
        return tf.cast(converted(self.spec)(step), tf.float32)

    def sync(self, spec: Any) -> None:
        """Takes the objective's current weight; raises if the step cannot."""
        if spec is self.spec or (not callable(spec) and not callable(self.spec) and spec == self.spec):
            return
        if self.variable is None or callable(spec):
            raise ValueError(
                f"{self._name} changed from {self.spec!r} to {spec!r} after the "
                "step was built: a number can be replaced by another number, a schedule not at "
                "all; build a new Trainer for that")
        self.variable.assign(check_weight(spec, self._name))
        self.spec = spec


def sync_weights(weights: Mapping[str, LossWeight], objectives: Mapping[str, Objective]) -> None:
    """Every head's `LossWeight` takes its objective's current weight."""
    for head, weight in weights.items():
        weight.sync(objectives[head].weight)
