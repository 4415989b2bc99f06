"""Checks that a batch's labels fit the heads they train, before anything is traced.

Labels that do not fit a head's output would broadcast inside the loss and train on
a wrong number without an error; these checks refuse them at the first batch of each
structure, naming the head.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import keras
import numpy as np
import tensorflow as tf

from multihead.model.model_view import HeadsModel
from multihead.objectives.objective import Objective, Weighted, needs_own_targets, split_weighted
from multihead.model.taps import with_trunk_reads


def split_batch(batch: Any) -> tuple[Any, Any, Any]:
    """`(inputs, targets, sample_weight)` of a batch given to `Trainer.step`: a pair
    `(inputs, targets)` (weights None) or Keras' triple `(inputs, targets, sample_weight)`."""
    if isinstance(batch, (tuple, list)) and len(batch) in (2, 3):
        return batch[0], batch[1], batch[2] if len(batch) == 3 else None
    raise TypeError(
        "a batch must be a pair (inputs, targets) with targets a dict head -> labels, or a "
        f"triple (inputs, targets, sample_weight), got {type(batch).__name__}"
    )


def _is_sparse(loss: Any) -> bool:
    """Whether a Keras loss spec takes class indices as labels (one value per example)."""
    name = loss if isinstance(loss, str) else (
        loss.get("class_name", "") if isinstance(loss, Mapping) else type(loss).__name__)
    return "sparse" in str(name).lower()


def check_label_shape(head: str, loss: Any, label: tf.TensorShape, output: tf.TensorShape,
                      batch: int | None) -> None:
    """Raises unless labels of shape `label` fit the output of `head` for its Keras loss:
    the output's shape (a `(batch,)` label also fits a `(batch, 1)` output), or, for a
    sparse loss, the output's shape without its class axis. Custom loss callables are not
    checked: they define their own shapes."""
    if not (isinstance(loss, (str, Mapping)) or isinstance(loss, keras.losses.Loss)):
        return
    out = output.as_list()
    expected = [out[:-1], out[:-1] + [1]] if _is_sparse(loss) else [out]
    if not _is_sparse(loss) and out[-1:] == [1]:
        expected.append(out[:-1])
    dims = label.as_list() if label.rank is not None else None

    def fits(shape: list[int | None]) -> bool:
        return dims is not None and len(dims) == len(shape) and all(
            a is None or b is None or a == b for a, b in zip(dims, shape))

    matched = any(fits(e) for e in expected)
    if matched and dims and batch is not None and dims[0] is not None and dims[0] != batch:
        matched = False
    if not matched:
        got = tuple(dims) if dims is not None else "unknown"
        raise ValueError(
            f"head {head!r}: labels of shape {got} do not fit its output of shape "
            f"{tuple(out[:1] and [batch] + out[1:])} for loss {loss!r} (they would broadcast); "
            "give one label row per example, shaped like the output")


class LabelCheck:
    """Checks the targets of batches against the heads, once per batch structure.

    Args:
        model: the model whose heads' outputs the labels must fit.
        objectives: name -> its objective (the loss says which labels fit).
        loss_fns: name -> the resolved loss (says whether it reads `targets[name]`).
        predictions: name -> what its loss compares with the labels, from the model's
            outputs (`multihead.objectives.parts.Prediction`); None: the output of the head
            of that name.
    """

    def __init__(self, model: HeadsModel, objectives: Mapping[str, Objective],
                 loss_fns: Mapping[str, Any], predictions: Mapping[str, Any] | None = None,
                 ) -> None:
        self._model = model
        self._objectives = objectives
        self._predictions = predictions
        self._needs_targets = {h: needs_own_targets(loss) for h, loss in loss_fns.items()}
        self._checked: tuple[Any, ...] | None = None

    def as_dict(self, targets: Any) -> Any:
        """A single-head model's bare labels as `{head: labels}`; anything else as is."""
        if not isinstance(targets, Mapping) and len(self._objectives) == 1:
            return {next(iter(self._objectives)): targets}
        return targets

    def __call__(self, targets: Any, heads: Sequence[str] | None, inputs: Any) -> None:
        """Raises a clear error if the targets do not match the heads: missing or extra
        keys, or labels whose shape does not fit the head's output (they would broadcast).

        Args:
            targets: the batch's targets (arrays, tensors or `tf.TensorSpec`s).
            heads: the heads this batch trains (None: all).
            inputs: the batch's inputs (one example is run to learn the output shapes).
        """
        keys = frozenset(targets) if isinstance(targets, Mapping) else None
        shapes = (tuple(tf.TensorShape(np.shape(v) if not hasattr(v, "shape") else v.shape))
                  for v in tf.nest.flatten(targets))
        key = (keys, heads, tuple(shapes), tuple(np.shape(x)[:1] for x in tf.nest.flatten(inputs)))
        if key == self._checked:
            return  # this batch structure was validated already: keep the per-step path lean
        needs = self._needs_targets
        check_targets(targets, list(self._objectives), needs, strict=all(needs.values()),
                      required=heads)
        outputs = self._output_shapes(inputs)
        batch = np.shape(tf.nest.flatten(inputs)[0])[0] if tf.nest.flatten(inputs) else None
        for head in heads or self._objectives:
            if isinstance(targets, Mapping) and isinstance(targets.get(head), Weighted) \
                    and not needs[head]:
                raise ValueError(f"head {head!r}: sample weights need a Keras loss or a "
                                 "(y_true, y_pred) callable; a research loss reads its batch "
                                 "itself: weigh inside it")
            if needs[head] and isinstance(targets, Mapping):
                label = split_weighted(targets[head])[0]
                label_shape = tf.TensorShape(label.shape if hasattr(label, "shape") else np.shape(label))
                check_label_shape(head, self._objectives[head].loss, label_shape, outputs[head], batch)
        self._checked = key

    def _output_shapes(self, inputs: Any) -> dict[str, tf.TensorShape]:
        """Each objective's prediction shape (batch dimension unknown), from one example;
        checks that each combination depends on every output it reads."""
        one = tf.nest.map_structure(lambda x: tf.zeros([1] + list(np.shape(x))[1:], x.dtype)
                                    if hasattr(x, "dtype") else x, inputs)
        outputs = self._model(one, training=False)
        if self._predictions is None:
            return {h: tf.TensorShape([None] + list(outputs[h].shape[1:])) for h in self._objectives}
        outputs = with_trunk_reads(self._model, one, outputs, [
            r for p in self._predictions.values() for r in p.reads], training=False)
        shapes = {}
        for name in self._objectives:
            prediction = self._predictions[name]
            prediction.check(outputs, one)
            shapes[name] = tf.TensorShape([None] + list(prediction(outputs, one).shape[1:]))
        return shapes


def check_targets(
    targets: Any, heads: Sequence[str], needs_targets: Mapping[str, bool], strict: bool,
    required: Sequence[str] | None = None,
) -> None:
    """Raises a clear error if the batch's targets do not match the heads.

    Args:
        targets: the batch's targets structure (a dict head -> labels).
        heads: the trained heads.
        needs_targets: head -> whether its loss reads `targets[head]`.
        strict: if True, a target key that is not a head is an error (no research
            loss could be reading it).
        required: the heads this batch trains (None: all of `heads`).
    """
    if not isinstance(targets, Mapping):
        raise TypeError(
            f"targets must be a dict of head name -> labels, got {type(targets).__name__}"
        )
    for head in heads if required is None else required:
        if needs_targets[head] and head not in targets:
            raise ValueError(
                f"the data has no targets for head {head!r} (its keys are {sorted(targets)})"
            )
    if strict:
        extra = sorted(k for k in targets if k not in heads)
        if extra:
            raise ValueError(
                f"the data has targets for {extra[0]!r}, but the model has no head "
                f"{extra[0]!r}; its heads are {list(heads)}"
            )
