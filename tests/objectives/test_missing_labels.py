"""Missing labels (`Objective(missing_label=...)`): a masked row gives nothing to its head's
loss, gradient or metrics; a batch without any label of a head gives that head no update."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import multihead as mh
from conftest import make_batch, make_model, weights
from multihead.objectives.objective import resolve_loss

NAN = float("nan")
HEADS = ("a", "b", "c")


def _objectives(lr=0.1, optimizer=keras.optimizers.SGD, **b):
    return {h: mh.Objective("mse", optimizer(lr), metrics=["mae"], **(b if h == "b" else {}))
            for h in HEADS}


def _masked_batch(n=24, seed=0):
    x, y = make_batch(HEADS, n=n, seed=seed)
    y["b"][np.arange(n) % 3 == 1] = NAN
    return x, y


def test_a_masked_heads_loss_gradient_and_metrics_equal_numpy_over_the_present_rows():
    model = make_model(heads=HEADS)
    trainer = mh.Trainer(model, _objectives(missing_label=NAN))
    x, y = _masked_batch()
    present = ~np.isnan(y["b"][:, 0])
    # By hand: head b = Dense(4, tanh) -> Dense(1); MSE over the present rows only.
    hidden = model.heads["b"].layers[0](model.features(x)).numpy()
    error = (hidden @ model.heads["b"].layers[1].kernel.numpy()
             + model.heads["b"].layers[1].bias.numpy())[:, 0] - y["b"][:, 0]
    loss = np.mean(error[present] ** 2)
    grad_kernel = 2 * hidden[present].T @ error[present][:, None] / present.sum()
    grad_bias = 2 * error[present].sum() / present.sum()
    kernel, bias = weights(model.heads["b"].layers[1].weights)

    result = trainer.step((x, y))
    assert result.updated == HEADS
    np.testing.assert_allclose(result.losses["b"], loss, rtol=1e-6)
    # SGD(0.1): the update is -0.1 x the gradient
    np.testing.assert_allclose(model.heads["b"].layers[1].kernel.numpy(), kernel - 0.1 * grad_kernel,
                               rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(model.heads["b"].layers[1].bias.numpy(), bias - 0.1 * grad_bias,
                               rtol=1e-5, atol=1e-7)

    # Evaluation, in batches of 10 (a short last one): numpy over the present rows.
    pred = model(x, training=False)["b"].numpy()[:, 0]
    ev = trainer.evaluate((x, y), batch_size=10)["b"]
    np.testing.assert_allclose(ev["loss"], np.mean((pred - y["b"][:, 0])[present] ** 2), rtol=1e-6)
    np.testing.assert_allclose(ev["mean_absolute_error"],
                               np.mean(np.abs(pred - y["b"][:, 0])[present]), rtol=1e-6)


def test_a_marker_number_masks_class_labels():
    loss = resolve_loss("sparse_categorical_crossentropy", "k", missing_label=-1)
    labels = np.array([0, -1, 2, -1], "int64")
    logits = np.random.default_rng(0).standard_normal((4, 3)).astype("float32")
    expected = keras.losses.SparseCategoricalCrossentropy(from_logits=False)(
        labels[[0, 2]], keras.ops.softmax(logits[[0, 2]]))
    got = loss(None, {"k": labels}, keras.ops.softmax(logits))
    np.testing.assert_allclose(float(got), float(expected), rtol=1e-6)


@pytest.mark.parametrize("schedule,trunk", [
    ("simultaneous", "per_head"), ("sequential", "per_head"),
    ("simultaneous", {"optimizer": "adam", "aggregator": "mgda"})])
def test_a_batch_without_labels_for_a_head_leaves_it_unchanged_and_the_rest_as_without_it(
        schedule, trunk):
    adam = keras.optimizers.Adam
    with_b = mh.Trainer(make_model(heads=HEADS), _objectives(1e-2, adam, missing_label=NAN),
                        schedule=schedule, trunk=trunk)
    without_b = mh.Trainer(make_model(heads=("a", "c")),
                           {h: mh.Objective("mse", adam(1e-2)) for h in ("a", "c")},
                           schedule=schedule, trunk=trunk)
    without_b.model.trunk.set_weights(with_b.model.trunk.get_weights())
    for h in ("a", "c"):
        without_b.model.heads[h].set_weights(with_b.model.heads[h].get_weights())
    b_before = weights(with_b.model.heads["b"].weights + with_b.optimizers["b"].variables)
    for seed in range(3):
        x, y = make_batch(HEADS, seed=seed)
        y["b"][:] = NAN
        result = with_b.step((x, y))
        assert result.updated == ("a", "c")
        without_b.step((x, {h: y[h] for h in ("a", "c")}))
    for before, after in zip(b_before, weights(with_b.model.heads["b"].weights
                                               + with_b.optimizers["b"].variables)):
        np.testing.assert_array_equal(before, after)
    # Bitwise: b's plan is not applied (per_head) / b is dropped from the aggregate (mgda).
    for x, y in zip(weights(with_b.model.trunk.weights), weights(without_b.model.trunk.weights)):
        np.testing.assert_array_equal(x, y)
    for h in ("a", "c"):
        for x, y in zip(weights(with_b.model.heads[h].weights), weights(without_b.model.heads[h].weights)):
            np.testing.assert_array_equal(x, y)
    assert with_b._runner.train_step.missing_label_skips.numpy().tolist() == [0, 3, 0]


def test_skipped_batches_are_counted_and_logged(tmp_path):
    from test_monitor import read_events  # noqa: PLC0415 - the shared event reader

    trainer = mh.Trainer(make_model(heads=HEADS), _objectives(missing_label=NAN),
                         log_dir=str(tmp_path), log_every=1, histograms_every=0)
    for seed in range(3):
        x, y = _masked_batch(seed=seed)
        if seed != 1:
            y["b"][:] = NAN
        trainer.step((x, y))
    trainer.close()
    logged = read_events(str(tmp_path / "train"))["missing_label_skips/b"]
    assert [logged[s] for s in sorted(logged)] == [1, 1, 2]


def test_missing_label_is_refused_for_a_research_loss_and_a_non_number():
    with pytest.raises(ValueError, match="head 'b': missing_label needs a Keras loss"):
        mh.Trainer(make_model(), {"a": mh.Objective("mse"),
                                  "b": mh.Objective(lambda i, t, o: o, missing_label=NAN)})
    with pytest.raises(TypeError, match="Objective.missing_label: expected a number"):
        mh.Objective("mse", missing_label="nan")


# -- sample weights: Keras' (x, y, sample_weight) with a dict head -> weights ---------------


def test_sample_weights_equal_keras_sample_weight_in_the_step_and_in_evaluation():
    x, y = make_batch(HEADS, n=30)
    w = {"b": np.random.default_rng(1).random(30).astype("float32")}
    model = make_model(heads=HEADS)
    trainer = mh.Trainer(model, _objectives())
    expected = keras.losses.MeanSquaredError()(y["b"], model(x)["b"], sample_weight=w["b"])
    result = trainer.step((x, y, w))
    np.testing.assert_allclose(result.losses["b"], float(expected), rtol=1e-6)

    trainer.fit((x, y, w), 3, batch_size=8, verbose=False)  # array triples through fit
    pred = model(x, training=False)["b"].numpy()
    ev = trainer.evaluate((x, y, w), batch_size=10)["b"]
    # loss: Keras' sum(w l) / n; metrics: Keras' weighted mean sum(w m) / sum(w)
    np.testing.assert_allclose(ev["loss"], float(keras.losses.MeanSquaredError()(
        y["b"], pred, sample_weight=w["b"])), rtol=1e-6)
    np.testing.assert_allclose(ev["mean_absolute_error"],
                               np.sum(w["b"] * np.abs(pred - y["b"])[:, 0]) / np.sum(w["b"]),
                               rtol=1e-6)


def test_sample_weights_and_a_mask_combine_as_keras_masked_weighted_loss():
    x, y = _masked_batch(n=24)
    w = {"b": np.random.default_rng(2).random(24).astype("float32")}
    model = make_model(heads=HEADS)
    trainer = mh.Trainer(model, _objectives(missing_label=NAN))
    present = ~np.isnan(y["b"][:, 0])
    error = model(x)["b"].numpy()[:, 0] - y["b"][:, 0]
    expected = np.sum((w["b"] * error ** 2)[present]) / present.sum()  # sum_i p w l / sum_i p
    np.testing.assert_allclose(trainer.step((x, y, w)).losses["b"], expected, rtol=1e-6)


def test_sample_weights_for_an_unknown_head_are_refused():
    trainer = mh.Trainer(make_model(), {h: mh.Objective("mse") for h in "ab"})
    x, y = make_batch()
    with pytest.raises(ValueError, match="sample_weight names head 'z'"):
        trainer.step((x, y, {"z": np.ones(16, "float32")}))
