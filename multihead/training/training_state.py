"""`TrainingState`: what a checkpoint holds of a `Trainer`, as `io/` reads it."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import keras
import tensorflow as tf

from multihead.datasets.multitask import DataPosition


@dataclasses.dataclass(frozen=True)
class TrainingState:
    """The trainer's state a checkpoint saves and restores, and what saving needs to know.

    Get it from `Trainer.checkpoint_state()` (which builds the optimizers first, so
    their slots exist).

    Attributes:
        optimizers: head -> its optimizer, in head order.
        trunk_update: the aggregated trunk update's trackable state (trunk optimizer,
            loss weighting, buffers), or None for `trunk="per_head"`.
        step: the step counter variable.
        data_position: where `fit` is in its data stream(s).
        frozen: the heads' freeze flags (`multihead.step.freezing.FrozenHeads`).
        log_dir: the TensorBoard log directory, or None when not logging.
        is_chief: False on the non-chief workers of a multi-worker run (they write
            checkpoints to a scratch directory only).
        flush_logs: writes pending TensorBoard events (before a checkpoint is saved,
            so the events up to its step are on disk).
        loss_scales: the heads' dynamic loss scales (float16), or None.
    """

    optimizers: Mapping[str, keras.optimizers.Optimizer]
    trunk_update: Any | None
    step: tf.Variable
    data_position: DataPosition
    frozen: Any
    log_dir: str | None
    is_chief: bool
    flush_logs: Callable[[], None]
    loss_scales: Any | None = None

    @property
    def global_step(self) -> int:
        """The steps taken so far."""
        return int(self.step.numpy())

    def parts(self) -> dict[str, Any]:
        """Checkpoint part name -> trackable object: `optimizers/<head>`, `trunk_update`
        (under trunk aggregation), `step`, `data`, `frozen`, `loss_scales` (float16); in
        this order."""
        parts: dict[str, Any] = {f"optimizers/{h}": opt for h, opt in self.optimizers.items()}
        if self.trunk_update is not None:
            parts["trunk_update"] = self.trunk_update
        parts["step"] = self.step
        parts["data"] = self.data_position
        parts["frozen"] = self.frozen
        if self.loss_scales is not None:
            parts["loss_scales"] = self.loss_scales
        return parts

    def mark_restored(self) -> None:
        """Says the data position was restored: the next `fit` continues from it."""
        self.data_position.mark_restored()
