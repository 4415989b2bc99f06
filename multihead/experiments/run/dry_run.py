"""`validate` is `train` without the training: every head's forward pass, loss, gradient and
metrics on a tiny batch of the run's own data, eagerly (nothing traced), before anything is
written.

What it catches that building alone does not: a layer that cannot be called (`class_name:
Layer`), a head that no gradient reaches (an integer dtype), a loss that cannot compare the
labels with the output, a metric that cannot be computed, a non-finite loss at the initial
weights. Nothing is changed: no optimizer is applied, no random state is drawn (the model
runs with `training=False`), metric objects are fresh.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from multihead.objectives.objective import resolve_loss, resolve_metric
from multihead.objectives.parts import prediction_fn, resolve_parts
from multihead.experiments.config.schema import ConfigError

#: Examples in the tiny batch.
BATCH = 2


def _first(tree: Any, n: int) -> Any:
    return tf.nest.map_structure(lambda a: np.asarray(a)[:n], dict(tree) if isinstance(tree, dict) else tree)


def _line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _is_sparse_crossentropy(loss: Any) -> bool:
    name = loss if isinstance(loss, str) else (
        loss.get("class_name") if isinstance(loss, dict) else
        type(loss).__name__ if isinstance(loss, keras.losses.Loss) else getattr(loss, "__name__", ""))
    return str(name).replace("_", "").lower() in ("sparsecategoricalcrossentropy",
                                                 "sparsecategoricalfocalcrossentropy")


def _check_label_kind(loss: Any, labels: np.ndarray, head: str) -> None:
    """A sparse cross-entropy reads labels as class indices: float labels with a fraction
    (regression targets) would be truncated to classes without a word. All the training
    labels are checked, not only the batch."""
    labels = np.asarray(labels)
    if _is_sparse_crossentropy(loss) and np.issubdtype(labels.dtype, np.floating) and \
            labels.size and not np.all(np.mod(labels[np.isfinite(labels)], 1) == 0):
        raise ConfigError(f"model.heads.{head}.loss: a sparse cross-entropy takes integer class "
                          f"labels, but the labels of head {head!r} are {labels.dtype} values with a "
                          "fraction (regression targets); use a regression loss such as mse, or "
                          "give class indices (data.dtypes: int32)")


def _path(model: Any, name: str) -> str:
    """The config key of objective `name`'s settings."""
    return f"model.heads.{name}" if name in model.head_names else f"objectives.{name}"


def dry_run(runner: Any) -> None:
    """Checks a prepared supervised runner (`data`, `model`, `objectives`) on `BATCH` examples.

    Raises:
        ConfigError: naming the head's config key and what failed.
    """
    data, model, objectives = runner.data, runner.model, runner.objectives
    if isinstance(data, dict):  # per-head data (same input layout): each head's own labels
        n = min(BATCH, *(len(d.y_train[h]) for h, d in data.items()))
        x = _first(next(iter(data.values())).x_train, n)
        y = {head: np.asarray(d.y_train[head])[:n] for head, d in data.items()}
    else:
        x = _first(data.x_train, BATCH)
        y = {head: np.asarray(labels)[:BATCH] for head, labels in data.y_train.items()}
    for head, objective in objectives.items():
        train = data[head] if isinstance(data, dict) else data
        _check_label_kind(objective.loss, train.y_train[head], head)
    try:
        with tf.GradientTape(persistent=True) as tape:
            outputs = model(x, training=False)
            outputs = {n: prediction_fn(model, n, o)(outputs, x) for n, o in objectives.items()}
            losses = {}
            for head, objective in objectives.items():
                path = _path(model, head)
                try:
                    loss = resolve_loss(objective.loss, head, objective.missing_label)(
                        x, y, outputs[head])
                    losses[head] = loss
                except Exception as err:  # noqa: BLE001 - any failure here fails train too
                    raise ConfigError(f"{path}.loss: cannot compute it on a batch of the data "
                                      f"(output {tuple(outputs[head].shape)}, labels "
                                      f"{tuple(np.shape(y.get(head)))}): {_line(err)}") from None
    except ConfigError:
        raise
    except Exception as err:  # noqa: BLE001 - the forward pass of the built model
        raise ConfigError(f"model: the model cannot run on a batch of the data: {_line(err)}") from None
    try:
        parts = resolve_parts(model, objectives)
    except ValueError as err:
        name = str(err).split("'")[1]
        raise ConfigError(f"{_path(model, name)}: {err}") from None
    try:
        for head, objective in objectives.items():
            path = _path(model, head)
            variables = parts[head].var_list
            grads = tape.gradient(losses[head], variables)
            missing = [v.path for v, g in zip(variables, grads) if g is None]
            if missing and len(missing) == len(variables):
                raise ConfigError(f"{path}: no gradient reaches any of the head's variables "
                                  f"({missing[0]}, ...); check the layers' dtype and that the "
                                  "output depends on them")
            for i, spec in enumerate(objective.metrics):
                try:
                    metric = resolve_metric(spec, head, objective.loss)
                    metric.update_state(y[head], outputs[head])
                    float(np.asarray(metric.result()).reshape(-1)[0])
                except Exception as err:  # noqa: BLE001 - evaluation would fail the same way
                    raise ConfigError(f"{path}.metrics[{i}]: cannot compute it on a batch of "
                                      f"the data: {_line(err)}") from None
    finally:
        del tape
