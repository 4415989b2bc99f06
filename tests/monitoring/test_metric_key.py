"""`eval/<head>/<metric>` names: one reader and writer, and every place that takes such a name
(callbacks' monitor, config checks, the sweep objective) accepts and refuses the same ones."""

from __future__ import annotations

import pytest

from multihead.experiments.config.schema import ConfigError
from multihead.experiments.sweep.sweep import SweepObjective, check_objective
from multihead.monitoring.metric_key import MEAN_LOSS, MetricKey, metric_direction

GOOD = ["eval/mean_loss", "eval/y1/loss", "eval/y1/accuracy", "eval/head_2/mean_absolute_error"]
BAD = ["val_loss", "eval/y1", "eval//loss", "eval/y1/", "train/y1/loss", "eval/y1/loss/x", "eval", ""]


@pytest.mark.parametrize("text", GOOD)
def test_parse_then_print_gives_the_name_back(text):
    key = MetricKey.parse(text)
    assert str(key) == text
    assert MetricKey.parse(str(key)) == key


def test_the_parts_of_a_name():
    assert MetricKey.parse("eval/y1/accuracy") == MetricKey("y1", "accuracy")
    mean = MetricKey.parse(MEAN_LOSS)
    assert mean.is_mean_loss and mean.head is None and mean.metric == "loss"
    assert MetricKey("y1", "mae").tag == "mae/y1"  # the eval event tag: <metric>/<head>
    with pytest.raises(ValueError, match="no TensorBoard tag"):
        _ = mean.tag


@pytest.mark.parametrize("text", BAD)
def test_a_malformed_name_is_refused_with_its_value(text):
    with pytest.raises(ValueError, match="must be eval/<head>/<metric> or eval/mean_loss, got " + repr(text)):
        MetricKey.parse(text)


@pytest.mark.parametrize(("metric", "direction"), [
    ("loss", "min"), ("mean_absolute_error", "min"), ("mse", "min"), ("binary_crossentropy", "min"),
    ("log_cosh", "min"), ("huber", "min"), ("accuracy", "max"), ("sparse_categorical_accuracy", "max"),
    ("acc", "max"), ("auc", "max"), ("precision", "max"), ("recall", "max"), ("r2_score", "max"),
    ("weird", None),
])
def test_direction_from_the_metric_name(metric, direction):
    assert metric_direction(metric) == direction
    assert MetricKey("y1", metric).direction == direction


def test_callbacks_config_and_sweep_accept_and_refuse_the_same_names():
    pytest.importorskip("keras")
    from multihead.training.callbacks import MonitoredQuantity

    for text in GOOD:
        quantity = MonitoredQuantity(text, "min", owner="EarlyStopping")
        assert quantity.key == MetricKey.parse(text)
        assert check_objective(text, "minimize", ["y1", "head_2"]).name == text
    for text in BAD:
        with pytest.raises(ValueError, match="EarlyStopping: monitor must be"):
            MonitoredQuantity(text, "min", owner="EarlyStopping")
        with pytest.raises(ConfigError, match="--objective"):
            check_objective(text, "minimize", ["y1"])


def test_the_sweep_objective_reads_the_named_number():
    evaluation = {"y1": {"loss": 0.5, "accuracy": 0.75}, "y2": {"loss": 1.5}}
    assert SweepObjective("eval/y1/accuracy", "maximize").value(evaluation) == 0.75
    assert SweepObjective(MEAN_LOSS).value(evaluation) == (0.5 + 1.5) / 2
    assert SweepObjective("eval/y2/accuracy").value(evaluation) is None
