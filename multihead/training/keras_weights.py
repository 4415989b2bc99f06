"""Keras' `sample_weight` and `class_weight` for a `MultiHeadModel`, as `Trainer.fit` takes them.

`Trainer.fit` weighs a head's examples when its labels are `Weighted(labels, sample_weight)`
(see `multihead.objectives.objective.with_sample_weights`). The Keras adapter turns Keras'
arguments into exactly that: per head, one finite weight >= 0 per example, folded into `y`
before Keras' data adapter slices it, so Keras' batches carry the same structure
`Trainer.fit`'s do and the step is the same compiled step.

- `sample_weight`: a dict head -> one weight per example, or one array for every head
  that has labels. A head without an entry is unweighted.
- `class_weight`: a dict head -> `{class index: weight}` (a one-head model may give the
  inner dict alone). A row's weight is its class's (1 for a class not listed), the class
  being the label itself (integer labels, or float labels holding whole numbers) or the
  argmax of a one-hot row, as Keras' `class_weight` reads labels. Missing labels (NaN)
  get weight 1: the loss masks those rows anyway.
- Both for one head: the product, row by row (the weight of a row of class c is
  `sample_weight * class_weight[c]`), as tf.keras 2 combined them.
"""

from __future__ import annotations

import numbers
from typing import Any, Mapping, Sequence

import numpy as np

from multihead.objectives.objective import with_sample_weights


def _head_names(value: Mapping[Any, Any], what: str, heads: Sequence[str]) -> None:
    for head in value:
        if head not in heads:
            raise ValueError(f"{what} names head {head!r}, but the model's heads are {list(heads)}")


def _weights(value: Any, what: str, rows: int) -> np.ndarray:
    """One float32 weight per example, shape `(rows,)`: finite and >= 0."""
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{what}: expected one number per example, got "
                         f"{type(value).__name__}") from None
    if array.ndim == 2 and array.shape[1] == 1:
        array = array[:, 0]
    if array.ndim != 1:
        raise ValueError(f"{what}: shape {array.shape}; give one weight per example, shape "
                         f"({rows},)")
    if len(array) != rows:
        raise ValueError(f"{what}: {len(array)} weights for {rows} examples; give one weight "
                         "per example")
    bad = ~np.isfinite(array) | (array < 0)
    if bad.any():
        first = int(np.argmax(bad))
        raise ValueError(f"{what}: {array[first]} at row {first} ({int(bad.sum())} of {rows} rows "
                         "bad); sample weights must be finite and >= 0")
    return array.astype(np.float32)


def _class_indices(labels: Any, what: str) -> tuple[np.ndarray, np.ndarray]:
    """Each row's class index, and which rows have a label (a NaN label has none)."""
    array = np.asarray(labels)
    if array.ndim == 2 and array.shape[1] > 1:  # one-hot rows (or class probabilities)
        floats = array.dtype.kind == "f"
        present = ~np.isnan(array).any(axis=1) if floats else np.ones(len(array), bool)
        return np.argmax(np.nan_to_num(array, nan=-np.inf) if floats else array, axis=1), present
    if array.ndim == 2 and array.shape[1] == 1:
        array = array[:, 0]
    if array.ndim != 1 or array.dtype.kind not in "iubf":
        raise ValueError(f"{what}: the head's labels (shape {array.shape}, {array.dtype}) are not "
                         "class indices or one-hot rows; class_weight is for classification heads")
    present = ~np.isnan(array) if array.dtype.kind == "f" else np.ones(len(array), bool)
    values = np.where(present, array, 0)
    if array.dtype.kind == "f" and (values != np.round(values)).any():
        row = int(np.argmax(values != np.round(values)))
        raise ValueError(f"{what}: the head's label {array[row]} at row {row} is not a class "
                         "index; class_weight is for classification heads (class indices or "
                         "one-hot labels)")
    return values.astype(np.int64), present


def _class_weights(table: Any, labels: Any, what: str) -> np.ndarray:
    """The weight of each row's class, from `{class index: weight}` (1 for other classes)."""
    if not isinstance(table, Mapping):
        raise ValueError(f"{what}: expected a dict class index -> weight, got "
                         f"{type(table).__name__}")
    for key, weight in table.items():
        if isinstance(key, bool) or not isinstance(key, numbers.Integral):
            raise ValueError(f"{what}: class {key!r} is not an integer class index")
        if isinstance(weight, bool) or not isinstance(weight, numbers.Real) or \
                not np.isfinite(weight) or weight < 0:
            raise ValueError(f"{what}[{key}]: {weight!r}; a class weight must be a finite "
                             "number >= 0")
    classes, present = _class_indices(labels, what)
    lookup = {int(k): float(w) for k, w in table.items()}
    return np.array([lookup.get(int(c), 1.0) if p else 1.0 for c, p in zip(classes, present)],
                    np.float32)


def keras_weights(heads: Sequence[str], y: Mapping[str, Any], rows: int, sample_weight: Any,
                  class_weight: Any, where: str) -> dict[str, np.ndarray]:
    """Keras' `sample_weight` / `class_weight` as a dict head -> float32 weights `(rows,)`.

    Args:
        heads: the model's heads.
        y: the labels, a dict head -> labels (the heads that have labels).
        rows: the number of examples.
        sample_weight: None, a dict head -> weights, or one array for every head in `y`.
        class_weight: None, a dict head -> {class index: weight}, or, for a one-head model,
            the inner dict.
        where: the call, for messages (`fit`, `evaluate`, `train_on_batch`).

    Raises:
        ValueError: a head the model does not have or `y` has no labels for, a wrong number
            of weights, a negative or non-finite weight, a class weight for labels that are
            not class indices.
    """
    out: dict[str, np.ndarray] = {}
    if sample_weight is not None:
        what = f"{where}(sample_weight=...)"
        if isinstance(sample_weight, Mapping):
            _head_names(sample_weight, what, heads)
            given = dict(sample_weight)
        else:
            given = {h: sample_weight for h in y}
        for head, value in given.items():
            if head not in y:
                raise ValueError(f"{what} names head {head!r}, but y has no labels for it (it "
                                 f"has {list(y)})")
            out[head] = _weights(value, f"{what}[{head!r}]" if isinstance(sample_weight, Mapping)
                                 else what, rows)
    if class_weight is not None:
        what = f"{where}(class_weight=...)"
        if not isinstance(class_weight, Mapping):
            raise ValueError(f"{what}: expected a dict head -> {{class index: weight}}, got "
                             f"{type(class_weight).__name__}")
        if len(heads) == 1 and class_weight and not any(isinstance(v, Mapping)
                                                        for v in class_weight.values()):
            class_weight = {heads[0]: class_weight}
        _head_names(class_weight, what, heads)
        for head, table in class_weight.items():
            if head not in y:
                raise ValueError(f"{what} names head {head!r}, but y has no labels for it (it "
                                 f"has {list(y)})")
            weights = _class_weights(table, y[head], f"{what}[{head!r}]")
            out[head] = out[head] * weights if head in out else weights
    return out


def weighted_labels(y: Mapping[str, Any], weights: Mapping[str, np.ndarray]) -> Any:
    """`y` with each weighted head's labels as `Weighted(labels, weights)`, the structure
    `Trainer.fit` gives the step for batches `(x, y, sample_weight)`."""
    return with_sample_weights(y, weights) if weights else y
