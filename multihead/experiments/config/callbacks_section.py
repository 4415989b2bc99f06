"""The `callbacks:` section of a config: early stopping, best checkpoints and learning-rate
reductions, acting on the evaluations of a supervised run. The schema checks the section
against the rest of the config (monitors name heads and their metrics)."""

from __future__ import annotations

import dataclasses
from typing import Any, Union

from multihead.experiments.config.fields import field as _field
from multihead.monitoring.metric_key import FORMS, MEAN_LOSS


_MODES = ("auto", "min", "max")
_MONITOR_DOC = f"{FORMS} (<metric>: loss or one of the head's metrics)"


@dataclasses.dataclass
class EarlyStoppingConfig:
    """`callbacks.early_stopping:` stop when an evaluation metric stops improving."""

    monitor: str = _field(MEAN_LOSS, doc=_MONITOR_DOC)
    patience: int = _field(3, minimum=1, doc="evaluations in a row without improvement")
    min_delta: float = _field(0.0, minimum=0, doc="the amount an evaluation must beat the best by")
    mode: str = _field("auto", choices=_MODES, doc="auto: min for losses, max for accuracies")
    restore_best: Union[bool, None] = _field(
        None, doc="end the run with the weights of the best evaluation; default true, false "
                  "with per_head")
    per_head: bool = _field(False, doc="freeze each head whose eval/<head>/loss stops improving "
                                       "while the others train on; stop when all are frozen")


@dataclasses.dataclass
class BestCheckpointConfig:
    """`callbacks.best_checkpoint:` keep the checkpoint of the best evaluation in `RUN_DIR/best/`."""

    monitor: str = _field(MEAN_LOSS, doc=_MONITOR_DOC)
    mode: str = _field("auto", choices=_MODES)
    min_delta: float = _field(0.0, minimum=0)
    per_head: bool = _field(False, doc="one best checkpoint per head, RUN_DIR/best/<head>/: the "
                                       "whole model at that head's best eval/<head>/loss")
    restore_heads: bool = _field(
        False, doc="with per_head: end the run with each head's own layers from its best "
                   "checkpoint, the trunk as the run left it (metrics.json's eval is then of "
                   "that model)")


@dataclasses.dataclass
class ReduceLROnPlateauConfig:
    """One entry of `callbacks.reduce_lr_on_plateau:`: scale one head's learning rate down."""

    head: str = _field(doc="the head whose optimizer's learning rate is reduced")
    monitor: Union[str, None] = _field(None, doc="default eval/<head>/loss; " + _MONITOR_DOC)
    factor: float = _field(0.1, doc="multiplies the rate, in (0, 1)")
    patience: int = _field(2, minimum=1)
    min_delta: float = _field(1e-4, minimum=0)
    min_lr: float = _field(0.0, minimum=0)
    cooldown: int = _field(0, minimum=0, doc="evaluations after a reduction before waiting again")
    mode: str = _field("auto", choices=_MODES)


@dataclasses.dataclass
class CallbacksConfig:
    """`callbacks:` what acts on the evaluations of a supervised run (`train.eval_every`)."""

    early_stopping: Union[EarlyStoppingConfig, None] = _field(None)
    best_checkpoint: Union[BestCheckpointConfig, None] = _field(None)
    reduce_lr_on_plateau: Any = _field(
        [], doc="a list of {head: ..., factor: ...}, or a mapping head -> {factor: ...}",
        section=ReduceLROnPlateauConfig, each="[i]")
