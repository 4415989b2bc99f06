"""The forward pass of a step: every head's objective, one code path (`ForwardPass`).

Each objective's loss sees its prediction from the outputs it reads; the objective
whose gradient a head's optimizer takes is weight x loss (x the loss weighting's
factor, for aggregated heads), plus the regularization of what it trains, scaled by
the head's loss scale under float16 (`Forward.objectives`).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import keras
import tensorflow as tf

from multihead.model.model_view import HeadsModel
from multihead.objectives.objective import present_labels, split_weighted
from multihead.step.loss_scales import LossScales
from multihead.step.trunk_rule import StepObjective, LossFactors, TrunkRule, scale_gradient

__all__ = ["Forward", "ForwardPass", "regularization"]


def regularization(layer: keras.layers.Layer) -> tf.Tensor | float:
    """The sum of `layer`'s regularization losses, or 0.0 if it has none."""
    losses = layer.losses
    return tf.add_n(losses) if losses else 0.0


class Forward(NamedTuple):
    """One forward pass of some heads, recorded on the caller's tape.

    Attributes:
        features: the trunk output (with own batches: head -> the trunk output on
            the head's batch).
        losses: head -> unweighted loss (float32 scalar).
        objectives: head -> what the head's gradient is taken of: weight x loss
            (x the loss weighting's factor, for aggregated heads), plus the head's
            regularization, plus the trunk's when the head's optimizer updates the trunk.
        trunk_reg: the trunk's regularization (0.0 when it has none).
        loss_factors: what the trunk rule's loss weighting computed in the pass.
        counts: head -> its rows with a present label (float32), for the heads with a
            missing-label marker (`StepObjective.missing_label`).
    """

    features: Any
    losses: dict[str, tf.Tensor]
    objectives: dict[str, tf.Tensor]
    trunk_reg: tf.Tensor | float
    loss_factors: LossFactors
    counts: dict[str, tf.Tensor]


class ForwardPass:
    """The forward pass of the heads of a step, recorded on the caller's tape.

    Args:
        model: the built model.
        rule: the trunk rule (its loss weighting scales the losses; whether the heads'
            optimizers update the trunk decides where the trunk's regularization goes).
        strategy: a `tf.distribute` strategy, or None.
        loss_scales: each head's dynamic loss scale (float16), or None.
    """

    def __init__(self, model: HeadsModel, rule: TrunkRule,
                 strategy: tf.distribute.Strategy | None = None,
                 loss_scales: LossScales | None = None) -> None:
        self._model = model
        self._rule = rule
        self._strategy = strategy
        self._loss_scales = loss_scales

    def _head_loss(self, head: StepObjective, inputs: Any, targets: Any, output: Any) -> tf.Tensor:
        loss = tf.convert_to_tensor(head.loss(inputs, targets, output, training=True))
        if loss.shape.rank != 0:
            raise ValueError(
                f"the loss of {head.label} must be a scalar, got shape {loss.shape}; "
                "reduce it (e.g. tf.reduce_mean) inside the loss function"
            )
        if self._strategy is not None and getattr(head.loss, "elementwise", False):
            # A Keras Loss object in replica context already divides its batch mean by the
            # number of replicas; undo it: `distribute.replica_share` does the scaling.
            loss = loss * tf.cast(self._strategy.num_replicas_in_sync, loss.dtype)
        return tf.cast(loss, tf.float32)

    def __call__(self, inputs: Any, targets: Any, heads: Sequence[StepObjective], step: tf.Tensor,
                 own_batches: bool = False) -> Forward:
        """One forward pass of `heads` (inside the caller's tape).

        Each objective's loss sees its prediction from the outputs it reads
        (`StepObjective.prediction`). A head read by an objective that does not train the
        trunk reads the trunk output through `stop_gradient` (a trunk that routes heads:
        see `MultiHeadModel.stop_shared`); with a `trunk_scale`, through an identity
        whose gradient is scaled. Each head runs once per way it is read.
        With `own_batches`, `inputs` and `targets` are dicts objective -> its own
        batch: the trunk runs once per objective, on its batch, and
        `Forward.features` is the dict objective -> trunk output.
        """
        model = self._model
        taps = {"taps": [r for h in heads for r in h.reads if r.startswith("trunk/")]}
        taps = taps if taps["taps"] else {}  # trunk taps an objective reads (`trunk/<block>`)
        if own_batches:
            features = {h.name: model.features(inputs[h.name], training=True, **taps) for h in heads}
        else:
            features = model.features(inputs, training=True, **taps)
        cache: dict[tuple[Any, ...], Any] = {}

        def read(head: StepObjective, name: str, seen: Any, how: Any) -> Any:
            if name == "trunk" or name.startswith("trunk/"):  # with taps, `seen` holds several
                return model.tap_output(seen, name) if hasattr(model, "tap_output") else seen
            key = (name, how, head.name if own_batches else None)
            if key not in cache:
                cache[key] = model.head_output(name, seen, training=True)
            return cache[key]

        losses, weighted, counts = {}, {}, {}
        for head in heads:
            x, y = inputs, targets
            plain = features[head.name] if own_batches else features
            if own_batches:
                x, y = x[head.name], y[head.name]
            if not head.trains_trunk:
                seen, how = model.stop_shared(plain), "stopped"
            elif head.trunk_scale is None:
                seen, how = plain, "plain"
            else:
                seen, how = scale_gradient(plain, head.trunk_scale(step)), head.name
            outputs = {name: read(head, name, seen, how) for name in head.reads}
            losses[head.name] = self._head_loss(head, x, y, head.prediction(outputs, x))
            weighted[head.name] = head.weight(step) * losses[head.name]
            if head.missing_label is not None:
                present, _ = present_labels(split_weighted(y[head.name])[0], head.missing_label)
                counts[head.name] = tf.reduce_sum(tf.cast(present, tf.float32))
        # A routing trunk's per-head layers (gates) regularize their own head's objective.
        shared_losses, owned_losses = model.trunk_losses()
        trunk_reg = tf.add_n(shared_losses) if shared_losses else 0.0
        factors = self._rule.loss_factors(weighted)
        objectives = {}
        for head in heads:
            objective = weighted[head.name]
            if head.name in factors.factors:
                objective = objective * factors.factors[head.name]
            for trained in head.trained_heads:
                objective = objective + regularization(model.heads[trained])
                if owned_losses.get(trained):
                    objective = objective + tf.add_n(owned_losses[trained])
            if head.trains_trunk and self._rule.heads_update_trunk:
                objective = objective + trunk_reg
            if self._loss_scales is not None:  # float16: the applier unscales the gradient
                objective = self._loss_scales.scale(head.name, objective)
            objectives[head.name] = objective
        return Forward(features, losses, objectives, trunk_reg, factors, counts)
