"""Keras callbacks in `fit`: `KerasCallbackAdapter` drives a `keras.callbacks.Callback` that
reads `logs` and sets `stop_training`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import keras
import numpy as np

from multihead.training.callbacks.base import Callback, Metrics, record_stop
from multihead.training.callbacks.lambda_callback import LambdaCallback

if TYPE_CHECKING:  # annotations only
    from multihead.training.results import StepResult


def adapted(callback: Any, index: int) -> Any:
    """A `keras.callbacks.Callback` wrapped so `fit` can drive it; others as they are."""
    if isinstance(callback, keras.callbacks.Callback):
        return KerasCallbackAdapter(callback)
    missing = [h for h in LambdaCallback._HOOKS + ("set_trainer",) if not hasattr(callback, h)]
    if missing:
        raise TypeError(f"callbacks[{index}] must be a multihead.Callback or a keras.callbacks."
                        f"Callback, got {type(callback).__name__} (it lacks {missing[0]})")
    return callback


class _ModelProxy:
    """What a Keras callback sees as `self.model`: `stop_training` (setting it True stops
    `fit`) and the `MultiHeadModel`'s weights; nothing else."""

    metrics: list[Any] = []  # Keras' mode="auto" reads it; there are no compiled metrics

    def __init__(self, adapter: KerasCallbackAdapter) -> None:
        self._adapter = adapter

    @property
    def stop_training(self) -> bool:
        return bool(self._adapter.trainer.stop_training)

    @stop_training.setter
    def stop_training(self, value: bool) -> None:
        if value:  # never cancels another callback's stop
            adapter = self._adapter
            record_stop(adapter.trainer, f"{type(adapter.callback).__name__} (Keras) set "
                                         f"stop_training at step {adapter.last_step}")

    @property
    def weights(self) -> list[Any]:
        return self._adapter.trainer.model.weights

    def get_weights(self) -> list[np.ndarray]:
        return self._adapter.trainer.model.get_weights()

    def set_weights(self, weights: Sequence[Any]) -> None:
        self._adapter.trainer.model.set_weights(weights)

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(
            f"a Keras callback in Trainer.fit sees a model with only stop_training, weights, "
            f"get_weights and set_weights, not {name!r}; use a multihead callback for this "
            "(e.g. multihead.ReduceLROnPlateau, multihead.BestCheckpoint)")


class KerasCallbackAdapter(Callback):
    """Drives a `keras.callbacks.Callback` that reads `logs` and sets `stop_training`
    (`EarlyStopping`, `CSVLogger`, `TerminateOnNaN`, `LambdaCallback`, ...).

    `CallbackList` wraps Keras callbacks in it; there is no need to do it by hand.
    An evaluation is a Keras epoch. The hooks map as:

    * `on_step_end(step, result)` -> `on_train_batch_end(step - 1, logs)` with
      `logs = {"<head>_loss": v, "loss": sum of them}` (the heads updated at that step);
    * `on_eval_end(step, metrics)` -> `on_epoch_end(i, logs)` for the `i`-th evaluation
      of the `fit` (then `on_epoch_begin(i + 1)`), with `logs` holding
      `"val_<head>_<metric>"` for every eval metric (`"val_<head>_loss"` included),
      `"val_loss"` (the sum of the heads' eval losses, as `"loss"` sums their training
      losses), each head's latest training loss `"<head>_loss"`, their sum `"loss"`,
      and `"step"`;
    * `on_train_begin` / `on_train_end` -> the same with the latest logs.

    The callback's `model` is a proxy: setting `model.stop_training = True` sets
    `trainer.stop_training`; `get_weights` / `set_weights` are the `MultiHeadModel`'s
    (so `restore_best_weights` works). With Keras' `mode="auto"`, only `"val_loss"` and
    `"loss"` have a known direction; give `mode="min"` for per-head keys.

    Args:
        callback: the Keras callback.
    """

    def __init__(self, callback: keras.callbacks.Callback) -> None:
        self.callback = callback
        self.last_step = 0

    def on_train_begin(self) -> None:
        self._epoch = 0
        self._latest: dict[str, float] = {}
        self._logs: dict[str, float] = {}
        self.callback.set_model(_ModelProxy(self))
        self.callback.set_params({"verbose": 0, "epochs": None, "steps": None})
        self.callback.on_train_begin(logs={})
        self.callback.on_epoch_begin(self._epoch, logs={})

    def on_step_end(self, step: int, result: StepResult) -> None:
        self.last_step = step
        logs = {f"{head}_loss": loss for head, loss in result.losses.items()}
        logs["loss"] = float(sum(result.losses.values()))
        self._latest.update(result.losses)
        self._logs = logs
        self.callback.on_train_batch_end(result.step, logs=logs)

    def on_eval_end(self, step: int, metrics: Metrics) -> None:
        self.last_step = step
        logs: dict[str, float] = {f"{head}_loss": loss for head, loss in self._latest.items()}
        if self._latest:
            logs["loss"] = float(sum(self._latest.values()))
        for head, values in metrics.items():
            logs.update({f"val_{head}_{name}": float(v) for name, v in values.items()})
        logs["val_loss"] = float(sum(values["loss"] for values in metrics.values()))
        logs["step"] = step
        self._logs = logs
        self.callback.on_epoch_end(self._epoch, logs=logs)
        self._epoch += 1
        self.callback.on_epoch_begin(self._epoch, logs={})

    def on_train_end(self) -> None:
        self.callback.on_train_end(logs=self._logs)

