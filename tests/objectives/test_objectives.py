"""Objective validation and the resolution of loss / optimizer / metric specs."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import multihead as mh
from multihead.objectives.objective import needs_own_targets, resolve_loss, resolve_metric, resolve_optimizer


def test_elementwise_loss_matches_label_rank_to_output():
    # (n,) labels against (n, 1) outputs must not broadcast to (n, n):
    # labels [0, 2], outputs [[1], [1]] -> squared errors 1 and 1 -> mse 1.
    loss = resolve_loss("mse", "a")
    value = loss(None, {"a": np.array([0.0, 2.0], "float32")}, tf.constant([[1.0], [1.0]]))
    assert float(value) == pytest.approx(1.0)


def test_keras_serialization_dict_and_two_argument_callable():
    huber = resolve_loss({"class_name": "Huber", "config": {"delta": 1.0}}, "a")
    # |error| = 3 > delta: 1 * (3 - 0.5) = 2.5
    assert float(huber(None, {"a": tf.constant([[3.0]])}, tf.constant([[0.0]]))) == pytest.approx(2.5)
    absolute = resolve_loss(lambda t, p: tf.abs(t - p), "a")
    assert float(absolute(None, {"a": tf.constant([[1.0], [3.0]])}, tf.zeros((2, 1)))) == 2.0
    assert needs_own_targets(absolute)


def test_research_loss_receives_inputs_targets_outputs():
    seen = {}

    def research(inputs, targets, outputs):
        seen.update(inputs=inputs, targets=targets, outputs=outputs)
        return tf.constant(0.0)

    loss = resolve_loss(research, "a")
    loss("x", {"k": 1}, "o")
    assert seen == {"inputs": "x", "targets": {"k": 1}, "outputs": "o"}
    assert not needs_own_targets(loss)


@pytest.mark.parametrize("resolve,spec,match", [
    (resolve_loss, "msee", "unknown loss 'msee'"),
    (resolve_optimizer, "adamm", "unknown optimizer 'adamm'"),
    (resolve_metric, "accuracyy", "unknown metric 'accuracyy'"),
])
def test_unknown_names_are_clear_errors(resolve, spec, match):
    with pytest.raises(ValueError, match=f"head 'h': {match}"):
        resolve(spec, "h")


def test_bad_callable_arity():
    with pytest.raises(TypeError, match="takes 1"):
        resolve_loss(lambda y: y, "h")


def test_optimizer_from_serialization_dict():
    opt = resolve_optimizer({"class_name": "Adam", "config": {"learning_rate": 3e-4}}, "h")
    assert isinstance(opt, keras.optimizers.Adam)
    assert float(opt.learning_rate) == pytest.approx(3e-4)


@pytest.mark.parametrize("kwargs,match", [
    ({"every": 0}, r"^Objective.every: must be >= 1, got 0$"),
    ({"every": 1.5}, r"^Objective.every: expected an integer, got 1.5 \(float\)$"),
    ({"weight": -1.0}, r"^Objective.weight: must be >= 0, got -1.0; a weight may also be"),
    ({"trains_trunk": "yes"}, r"^Objective.trains_trunk: must be one of \[True, False\], got 'yes'$"),
])
def test_objective_validates_its_arguments(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        mh.Objective("mse", **kwargs)
