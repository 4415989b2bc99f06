"""`StepRunner`: the compiled step run on checked batches, for `Trainer.step` and
`Trainer.run_steps`.

The step is assembled on first use (`multihead.step.assemble.StepAssembly.build`;
an unbuilt model is built first by a call on the batch), the labels are checked
per batch or element spec, and the objectives' loss weights are synced before
each compiled call.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import tensorflow as tf

from multihead.monitoring.monitor import Monitor
from multihead.objectives.labels import LabelCheck, split_batch
from multihead.objectives.loss_weights import sync_weights
from multihead.objectives.objective import with_sample_weights
from multihead.step import distribute
from multihead.step.assemble import StepAssembly
from multihead.step.train_step import TrainStep
from multihead.training.results import StepResult, step_result
from multihead.training.streams import zeros_for_spec

__all__ = ["StepRunner"]


class StepRunner:
    """The compiled step on checked batches.

    Args:
        assembly: what the step is made of.
        labels: the label checks of the objectives.

    Attributes:
        monitor: the TensorBoard monitor the step is built with, or None (set before the
            first step).
        train_step: the compiled step, None until first used.
    """

    def __init__(self, assembly: StepAssembly, labels: LabelCheck) -> None:
        self._assembly = assembly
        self._labels = labels
        self._names = tuple(assembly.objectives)
        self.monitor: Monitor | None = None
        self.train_step: TrainStep | None = None

    def ensure_built(self, inputs: Any) -> TrainStep:
        """The compiled step, assembled on first use: each optimizer built eagerly on its
        var_list (an unbuilt model is built first by a call on `inputs`)."""
        if self.train_step is None:
            model = self._assembly.model
            if not model.built:
                with distribute.scope(self._assembly.strategy):
                    model(inputs)  # eager call creates the variables before any trace
            self.train_step = self._assembly.build(self.monitor)
        return self.train_step

    def sync_weights(self) -> None:
        """Copies each objective's loss weight (a number the user may change) to the step."""
        sync_weights(self._assembly.weights, self._assembly.objectives)

    def step(self, batch: Any, heads: Sequence[str] | None) -> StepResult:
        """One compiled update on `batch = (inputs, targets[, sample_weight])` (see
        `Trainer.step`)."""
        inputs, targets, sample_weight = split_batch(batch)
        targets = self._labels.as_dict(targets)
        if sample_weight is not None:
            targets = with_sample_weights(targets, self._labels.as_dict(sample_weight))
        if tf.nest.flatten(inputs) and np.shape(tf.nest.flatten(inputs)[0])[:1] == (0,):
            raise ValueError("the batch is empty (its inputs have 0 examples); give a batch "
                             "with at least one example")
        train_step = self.ensure_built(inputs)
        self._labels(targets, heads, inputs)
        self.sync_weights()
        output = train_step(inputs, targets, heads)
        return step_result(self._names, int(output.step), output.losses.numpy(),
                           output.updated.numpy(), output.skipped.numpy())

    def run(self, iterator: Any, max_steps: int) -> list[StepResult]:
        """Up to `max_steps` compiled steps on `iterator`'s batches (see `Trainer.run_steps`)."""
        inputs_spec, targets_spec = iterator.element_spec
        zeros = tf.nest.map_structure(zeros_for_spec, inputs_spec)
        train_step = self.ensure_built(zeros)
        self._labels(targets_spec, None, zeros)
        self.sync_weights()
        out = train_step.run(iterator, max_steps)
        first, losses, updated, skipped = (int(out.first_step), out.losses.numpy(),
                                           out.updated.numpy(), out.skipped.numpy())
        return [step_result(self._names, first + i, losses[i], updated[i], skipped[i])
                for i in range(int(out.count))]
