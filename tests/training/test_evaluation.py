"""The compiled `Evaluator` against an independent numpy computation, and metric resolution
and checks (`resolve_metric` with the head's loss, `check_metrics`)."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import multihead as mh
from multihead.training.evaluation import Evaluator, accepts_training, check_metrics
from multihead.objectives.objective import resolve_loss, resolve_metric

N, IN, WIDTH = 50, 5, 8  # 50 rows in batches of 16: 16, 16, 16 and a last batch of 2
BATCH = 16


def _model(heads: dict[str, tuple[int, str | None]], seed: int = 0) -> mh.MultiHeadModel:
    """Trunk Dense(WIDTH, tanh); head name -> (units, activation) of one Dense layer."""
    keras.utils.set_random_seed(seed)
    model = mh.MultiHeadModel(
        keras.layers.Dense(WIDTH, activation="tanh"),
        {h: keras.layers.Dense(units, activation=act) for h, (units, act) in heads.items()})
    model.build((None, IN))
    return model


def _numpy_outputs(model: mh.MultiHeadModel, x: np.ndarray) -> dict[str, np.ndarray]:
    """The model's outputs computed in float64 numpy from its weights."""
    trunk = model.trunk
    feats = np.tanh(x @ trunk.kernel.numpy().astype(np.float64) + trunk.bias.numpy())
    outputs = {}
    for head, layer in model.heads.items():
        z = feats @ layer.kernel.numpy().astype(np.float64) + layer.bias.numpy()
        activation = layer.get_config()["activation"]
        if activation == "softmax":
            z = np.exp(z - z.max(-1, keepdims=True))
            z = z / z.sum(-1, keepdims=True)
        elif activation == "sigmoid":
            z = 1.0 / (1.0 + np.exp(-z))
        outputs[head] = z
    return outputs


def _example_weighted(per_batch_mean, n: int = N, batch: int = BATCH) -> float:
    """sum over batches of (batch mean * batch size) / n, the evaluation loss's definition."""
    sizes = [min(batch, n - s) for s in range(0, n, batch)]
    return sum(per_batch_mean(slice(s, s + k)) * k for s, k in zip(range(0, n, batch), sizes)) / n


def _data(seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, IN)).astype("float32")
    classes = rng.integers(0, 4, N)
    y = {
        "reg": rng.standard_normal((N, 1)).astype("float32"),
        "sparse": classes.astype("int32"),
        "onehot": np.eye(4, dtype="float32")[rng.integers(0, 4, N)],
        "binary": rng.integers(0, 2, (N, 1)).astype("float32"),
        "binprob": rng.integers(0, 2, (N, 1)).astype("float32"),
    }
    return x, y


HEADS = {"reg": (1, None), "sparse": (4, None), "onehot": (4, "softmax"), "binary": (1, None),
         "binprob": (1, "sigmoid")}
LOSSES = {
    "reg": "mse",
    "sparse": keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    "onehot": "categorical_crossentropy",
    "binary": {"class_name": "BinaryCrossentropy", "config": {"from_logits": True}},
    "binprob": "binary_crossentropy",
}
METRICS = {"reg": ["mae"], "sparse": ["accuracy", "crossentropy"], "onehot": ["acc"],
           "binary": ["accuracy"], "binprob": ["accuracy"]}


def _evaluator(model: mh.MultiHeadModel, metrics=None) -> Evaluator:
    return Evaluator(model, {h: resolve_loss(s, h) for h, s in LOSSES.items()},
                     metrics=METRICS if metrics is None else metrics, loss_specs=LOSSES)


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def _expected(model: mh.MultiHeadModel, x, y) -> dict[str, dict[str, float]]:
    """Every head's loss and metrics in numpy, with the loss's batch-weighted definition."""
    p = _numpy_outputs(model, x)
    eps = 1e-7  # Keras clips probabilities to [eps, 1 - eps]

    def log_softmax(z):
        z = z - z.max(-1, keepdims=True)
        return z - np.log(np.exp(z).sum(-1, keepdims=True))

    sparse_ce = -log_softmax(p["sparse"])[np.arange(N), y["sparse"]]
    onehot_ce = -(y["onehot"] * np.log(np.clip(p["onehot"], eps, 1 - eps))).sum(-1)
    z, t = p["binary"], y["binary"]
    binary_ce = (np.maximum(z, 0) - z * t + np.log1p(np.exp(-np.abs(z))))[:, 0]
    q = np.clip(p["binprob"], eps, 1 - eps)
    binprob_ce = -(y["binprob"] * np.log(q) + (1 - y["binprob"]) * np.log(1 - q))[:, 0]
    squared = ((p["reg"] - y["reg"]) ** 2)[:, 0]
    return {
        "reg": {"loss": _example_weighted(lambda s: squared[s].mean()),
                "mean_absolute_error": np.abs(p["reg"] - y["reg"]).mean()},
        "sparse": {"loss": _example_weighted(lambda s: sparse_ce[s].mean()),
                   "accuracy": (p["sparse"].argmax(-1) == y["sparse"]).mean(),
                   "crossentropy": sparse_ce.mean()},
        "onehot": {"loss": _example_weighted(lambda s: onehot_ce[s].mean()),
                   "acc": (p["onehot"].argmax(-1) == y["onehot"].argmax(-1)).mean()},
        # logits: a logit > 0 is a probability > 0.5
        "binary": {"loss": _example_weighted(lambda s: binary_ce[s].mean()),
                   "accuracy": ((p["binary"] > 0) == (y["binary"] > 0.5)).mean()},
        "binprob": {"loss": _example_weighted(lambda s: binprob_ce[s].mean()),
                    "accuracy": ((p["binprob"] > 0.5) == (y["binprob"] > 0.5)).mean()},
    }


def _assert_close(actual, expected, rel=1e-6):
    assert actual.keys() == expected.keys()
    for head in expected:
        assert actual[head].keys() == expected[head].keys(), head
        for key, value in expected[head].items():
            assert actual[head][key] == pytest.approx(value, rel=rel, abs=1e-7), (head, key)


def test_losses_and_metrics_equal_numpy_with_a_partial_last_batch():
    model = _model(HEADS)
    x, y = _data()
    result = _evaluator(model).evaluate(mh.as_dataset((x, y), BATCH, shuffle=False))
    _assert_close(result, _expected(model, x, y))


def _eager_loop(model, losses, metrics, dataset):
    """The evaluation's definition, eagerly: per batch, float(loss) * batch size summed,
    divided by the number of examples; Keras metrics updated on each batch."""
    metrics = {h: [resolve_metric(s, h, LOSSES[h]) for s in specs] for h, specs in metrics.items()}
    totals, count = {h: 0.0 for h in losses}, 0
    for inputs, targets in dataset:
        outputs = model(inputs, training=False)
        n = int(inputs.shape[0])
        count += n
        for head, loss in losses.items():
            totals[head] += float(loss(inputs, targets, outputs[head])) * n
            for metric in metrics[head]:
                metric.update_state(targets[head], outputs[head])
    return {h: {"loss": totals[h] / count, **{m.name: float(m.result()) for m in metrics[h]}}
            for h in losses}


def test_equals_the_eager_per_batch_loop():
    model = _model(HEADS)
    dataset = mh.as_dataset(_data(), BATCH, shuffle=False)
    losses = {h: resolve_loss(s, h) for h, s in LOSSES.items()}
    _assert_close(_evaluator(model).evaluate(dataset), _eager_loop(model, losses, METRICS, dataset),
                  rel=1e-7)


def test_one_trace_per_element_spec_and_the_same_numbers_twice():
    model = _model(HEADS)
    evaluator = _evaluator(model)
    x, y = _data()
    first = evaluator.evaluate(mh.as_dataset((x, y), BATCH, shuffle=False))
    # Metric state is reset by each evaluation: other data in between changes nothing.
    evaluator.evaluate(mh.as_dataset(_data(seed=1), 7, shuffle=False))
    again = evaluator.evaluate(mh.as_dataset((x, y), BATCH, shuffle=False))
    assert again == first
    assert evaluator.trace_count == 1  # 4 + 8 + 4 batches, batch sizes 16, 2 and 7: one trace
    static = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH, drop_remainder=True)
    evaluator.evaluate(static)  # a static batch dimension fits the trace for any batch size
    assert evaluator.trace_count == 1


def test_evaluators_never_share_metric_state():
    model = _model({"reg": (1, None)})
    shared = keras.metrics.MeanAbsoluteError()
    losses = {"reg": resolve_loss("mse", "reg")}
    a = Evaluator(model, losses, metrics={"reg": [shared]})
    b = Evaluator(model, losses, metrics={"reg": [shared]})
    assert a.metrics["reg"][0] is not b.metrics["reg"][0] is not shared
    x, y = _data()
    p = _numpy_outputs(model, x)["reg"]
    assert a.evaluate(mh.as_dataset((x[:20], {"reg": y["reg"][:20]}), 8, shuffle=False))[
        "reg"]["mean_absolute_error"] == pytest.approx(np.abs(p[:20] - y["reg"][:20]).mean(), rel=1e-6)
    assert b.evaluate(mh.as_dataset((x[20:], {"reg": y["reg"][20:]}), 8, shuffle=False))[
        "reg"]["mean_absolute_error"] == pytest.approx(np.abs(p[20:] - y["reg"][20:]).mean(), rel=1e-6)


@pytest.mark.filterwarnings("ignore:The object being serialized includes a `lambda`")
def test_a_metric_object_that_cannot_be_copied_is_refused_at_construction():
    model = _model({"reg": (1, None)})
    unnamed = keras.metrics.MeanMetricWrapper(lambda t, p: tf.abs(t - p), name="abs")
    with pytest.raises(ValueError, match="head 'reg': the metric object 'abs' cannot be copied"):
        Evaluator(model, {"reg": resolve_loss("mse", "reg")}, metrics={"reg": [unnamed]})


@pytest.mark.parametrize("loss,expected", [
    ("sparse_categorical_crossentropy", ("SparseCategoricalAccuracy", None)),
    (keras.losses.SparseCategoricalCrossentropy(from_logits=True), ("SparseCategoricalAccuracy", None)),
    ({"class_name": "CategoricalCrossentropy", "config": {"from_logits": True}},
     ("CategoricalAccuracy", None)),
    ("categorical_crossentropy", ("CategoricalAccuracy", None)),
    ("binary_crossentropy", ("BinaryAccuracy", 0.5)),
    (keras.losses.BinaryCrossentropy(from_logits=True), ("BinaryAccuracy", 0.0)),
    (keras.losses.BinaryFocalCrossentropy(from_logits=True), ("BinaryAccuracy", 0.0)),
    ("mse", ("Accuracy", None)),
    (None, ("Accuracy", None)),
    (lambda t, p: tf.abs(t - p), ("Accuracy", None)),
])
def test_accuracy_resolves_against_the_loss(loss, expected):
    metric = resolve_metric("accuracy", "h", loss)
    assert (type(metric).__name__, getattr(metric, "threshold", None)) == expected
    assert metric.name == "accuracy"


def test_crossentropy_metric_follows_the_loss_and_needs_one():
    metric = resolve_metric("ce", "h", keras.losses.CategoricalCrossentropy(from_logits=True))
    assert isinstance(metric, keras.metrics.CategoricalCrossentropy)
    assert metric.get_config()["from_logits"] is True
    with pytest.raises(ValueError, match="head 'h': metric 'crossentropy' .* not a crossentropy"):
        resolve_metric("crossentropy", "h", "mse")


def test_other_metrics_resolve_as_before():
    assert resolve_metric("mae", "h", "mse").name == "mean_absolute_error"
    assert type(resolve_metric("accuracy", "h")).__name__ == "Accuracy"  # the old call


def test_a_metric_that_cannot_be_computed_fails_in_the_check_naming_the_head():
    # "accuracy" with an mse loss is Keras' exact-match Accuracy: (16, 4) outputs against
    # (16, 3) labels do not broadcast.
    model = _model({"y": (4, None)})
    evaluator = Evaluator(model, {"y": resolve_loss("mse", "y")}, metrics={"y": ["accuracy"]},
                          loss_specs={"y": "mse"})
    x = np.zeros((16, IN), "float32")
    batch = (x, {"y": np.zeros((16, 3), "float32")})
    pattern = (r"metric 'accuracy' of head 'y' cannot be computed on its outputs "
               r"\(shape \(16, 4\)\) and labels \(shape \(16, 3\)\): .*Incompatible shapes")
    with pytest.raises(ValueError, match=pattern):
        evaluator.check(batch)
    data = tf.data.Dataset.from_tensors(batch)
    for check in (evaluator.check_dataset, evaluator.evaluate):  # evaluate checks before its loop
        with pytest.raises(ValueError, match=pattern):
            check(data)
    assert evaluator.trace_count == 0


def test_check_metrics_resets_state_and_requires_labels():
    metric = keras.metrics.MeanAbsoluteError()
    outputs = {"y": tf.ones((4, 1))}
    check_metrics(outputs, {"y": tf.zeros((4, 1))}, {"y": [metric]})
    assert float(metric.count) == 0.0
    with pytest.raises(ValueError, match="head 'y' has metrics \\['mean_absolute_error'\\].*no labels"):
        check_metrics(outputs, {"other": tf.zeros((4, 1))}, {"y": [metric]})


def test_a_loss_with_a_training_argument_is_called_with_training_false():
    model = _model({"y": (1, None)})
    seen = []

    def research(inputs, targets, output, training=None):
        seen.append(training)
        return tf.reduce_mean(output)

    assert accepts_training(research) and not accepts_training(lambda i, t, o: 0.0)
    x = np.ones((6, IN), "float32")
    result = Evaluator(model, {"y": research}).evaluate(tf.data.Dataset.from_tensors((x, {})))
    assert seen and set(seen) == {False}
    assert result["y"]["loss"] == pytest.approx(_numpy_outputs(model, x)["y"].mean(), rel=1e-6)


def test_empty_data_is_an_error():
    model = _model({"y": (1, None)})
    evaluator = Evaluator(model, {"y": resolve_loss("mse", "y")})
    empty = tf.data.Dataset.from_tensor_slices(
        (np.zeros((0, IN), "float32"), {"y": np.zeros((0, 1), "float32")})).batch(4)
    with pytest.raises(ValueError, match="yielded no batch"):
        evaluator.evaluate(empty)
