"""Keras' `compile` / `fit` / `evaluate` on a `MultiHeadModel` run multihead's per-head step.

References are independent of the adapter: `Trainer.fit` on the same batches (bitwise),
numpy on the model's predictions, the trainer's own per-step losses, the event files
Keras' TensorBoard callback wrote.
"""

from __future__ import annotations

import functools
import os
from types import SimpleNamespace

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import multihead as mh
from multihead import _keras_internals as internals

HEADS = ("a", "b")
BATCH = 8


def _model(seed: int = 0) -> mh.MultiHeadModel:
    keras.utils.set_random_seed(seed)
    model = mh.MultiHeadModel(keras.Sequential([keras.layers.Dense(8, activation="tanh")]),
                              {"a": keras.layers.Dense(1), "b": keras.layers.Dense(3)})
    model.build((None, 4))
    return model


def _data(rows: int, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, 4)).astype("float32")
    y = {"a": (x @ np.array([1.0, -2.0, 0.5, 1.0], "float32"))[:, None],
         "b": (x[:, 0] > 0).astype("int32") + (x[:, 1] > 0).astype("int32")}
    return x, y


TRAIN, VAL = _data(40, seed=1), _data(24, seed=2)  # 40 rows: 5 batches of 8 per epoch
LOSSES = {"a": "mse", "b": keras.losses.SparseCategoricalCrossentropy(from_logits=True)}


def _optimizers():
    return {"a": keras.optimizers.Adam(0.01), "b": keras.optimizers.SGD(0.1, momentum=0.9)}


def _objectives(optimizers, weights=None):
    weights = weights or {}
    return {h: mh.Objective(LOSSES[h], optimizers[h], weight=weights.get(h, 1.0)) for h in HEADS}


def _compiled(seed: int = 0, **compile_args) -> mh.MultiHeadModel:
    model = _model(seed)
    args = {"optimizer": _optimizers(), "loss": LOSSES, "metrics": {"b": ["accuracy"]}}
    model.compile(**{**args, **compile_args})
    return model


@functools.lru_cache(maxsize=None)
def _trainer_fit(steps: int, weight_a: float = 1.0, sample_weights=None) -> tuple[np.ndarray, ...]:
    """The reference: the weights after `Trainer.fit` on the same batches, in order
    (`sample_weights`: a key of `SAMPLE_WEIGHTS`, batches `(x, y, {head: weights})`)."""
    model = _model()
    trainer = mh.Trainer(model, _objectives(_optimizers(), {"a": weight_a}))
    data = TRAIN if sample_weights is None else (*TRAIN, SAMPLE_WEIGHTS[sample_weights])
    trainer.fit(mh.as_dataset(data, BATCH, shuffle=False), steps, verbose=False)
    return tuple(model.get_weights())


_RNG = np.random.default_rng(3)
#: Sample weights of TRAIN's rows: per head, for one head, and what class weights imply.
SAMPLE_WEIGHTS = {
    "both": {"a": _RNG.uniform(0, 2, 40).astype("float32"),
             "b": _RNG.uniform(0, 2, 40).astype("float32")},
    "b only": {"b": np.where(np.arange(40) % 3 == 0, 0.0, 1.5).astype("float32")},
}
CLASS_WEIGHT_B = {0: 0.5, 1: 2.0}  # class 2 unlisted: weight 1
SAMPLE_WEIGHTS["class b"] = {"b": np.array([CLASS_WEIGHT_B.get(int(c), 1.0) for c in TRAIN[1]["b"]],
                                           "float32")}
SAMPLE_WEIGHTS["class b x both"] = {"a": SAMPLE_WEIGHTS["both"]["a"],
                                    "b": SAMPLE_WEIGHTS["both"]["b"] * SAMPLE_WEIGHTS["class b"]["b"]}


def _assert_same_weights(left, right) -> None:
    for x, y in zip(left, right, strict=True):
        np.testing.assert_array_equal(x, y)


def _numpy_results(model, x, y, weight_a: float = 1.0) -> dict[str, float]:
    """Keras' evaluation logs, computed in numpy from the model's predictions."""
    out = model.predict(x)
    logits = out["b"].astype("float64")
    log_softmax = logits - logits.max(1, keepdims=True)
    log_softmax -= np.log(np.exp(log_softmax).sum(1, keepdims=True))
    a_loss = float(np.mean((out["a"][:, 0].astype("float64") - y["a"][:, 0]) ** 2))
    b_loss = float(-np.mean(log_softmax[np.arange(len(x)), y["b"]]))
    return {"a_loss": a_loss, "b_loss": b_loss, "b_accuracy": float(np.mean(logits.argmax(1) == y["b"])),
            "loss": weight_a * a_loss + b_loss}


# -- a plain Keras script ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def script(tmp_path_factory):
    """`compile` with dicts, then `fit` with validation data and Keras' EarlyStopping,
    ModelCheckpoint and TensorBoard; numpy's evaluation of the model at each epoch end."""
    tmp = tmp_path_factory.mktemp("keras_script")
    model = _model()
    model.compile(optimizer={"a": keras.optimizers.Adam(0.01),
                             "b": keras.optimizers.SGD(0.1, momentum=0.9)},
                  loss={"a": "mse", "b": keras.losses.SparseCategoricalCrossentropy(from_logits=True)},
                  loss_weights={"a": 0.5}, metrics={"b": ["accuracy"]})
    # min_delta=10 in min mode: only the first epoch improves, so patience=1 stops after two.
    stop = keras.callbacks.EarlyStopping(monitor="val_loss", patience=1, min_delta=10)
    at_epoch_end = []
    record = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: at_epoch_end.append(_numpy_results(model, *VAL, 0.5)))
    history = model.fit(TRAIN[0], TRAIN[1], batch_size=BATCH, epochs=6, shuffle=False, verbose=0,
                        validation_data=VAL,
                        callbacks=[stop, keras.callbacks.ModelCheckpoint(str(tmp / "model.keras")),
                                   keras.callbacks.TensorBoard(str(tmp / "tb"), write_graph=False),
                                   record])
    return SimpleNamespace(model=model, history=history, stop=stop, dir=tmp, evaluated=at_epoch_end)


def test_a_plain_keras_script_trains_as_trainer_fit_bitwise(script):
    assert script.history.epoch == [0, 1] and script.stop.stopped_epoch == 1
    _assert_same_weights(script.model.get_weights(), _trainer_fit(steps=2 * 5, weight_a=0.5))


def test_model_checkpoint_writes_a_file_that_loads_back_to_the_weights(script):
    # ModelCheckpoint saved the model after the last epoch.
    loaded = keras.models.load_model(str(script.dir / "model.keras"))
    assert isinstance(loaded, mh.MultiHeadModel) and loaded.trainer is None
    _assert_same_weights(loaded.get_weights(), script.model.get_weights())


def test_history_holds_each_head_s_mean_step_loss_per_epoch(script):
    # The same steps again, one at a time through Trainer.step: the per-step losses.
    reference = mh.Trainer(_model(), _objectives(_optimizers(), {"a": 0.5}))
    batches = list(mh.as_dataset(TRAIN, BATCH, shuffle=False))
    steps = [reference.step(batch).losses for _ in range(2) for batch in batches]
    history = script.history.history
    for epoch in range(2):
        rows = steps[5 * epoch:5 * (epoch + 1)]
        means = {h: np.mean([r[h] for r in rows]) for h in HEADS}
        for head in HEADS:
            assert history[f"{head}_loss"][epoch] == pytest.approx(means[head], rel=1e-12)
        assert history["loss"][epoch] == pytest.approx(0.5 * means["a"] + means["b"], rel=1e-12)
    assert set(history) == {"loss", "a_loss", "b_loss", "val_loss", "val_a_loss", "val_b_loss",
                            "val_b_accuracy"}


def test_validation_logs_equal_numpy_on_the_model_s_predictions(script):
    assert len(script.evaluated) == 2
    for epoch, expected in enumerate(script.evaluated):
        for key, value in expected.items():
            assert script.history.history[f"val_{key}"][epoch] == pytest.approx(value, rel=1e-5)


def test_keras_tensorboard_writes_the_per_head_epoch_logs(script):
    for run, prefix in (("train", ""), ("validation", "val_")):
        events = EventAccumulator(os.path.join(script.dir, "tb", run), size_guidance={"tensors": 0})
        events.Reload()
        for head in HEADS:
            written = [(e.step, float(tf.make_ndarray(e.tensor_proto)))
                       for e in events.Tensors(f"epoch_{head}_loss")]
            assert [s for s, _ in written] == [0, 1]
            assert [v for _, v in written] == pytest.approx(
                script.history.history[f"{prefix}{head}_loss"], rel=1e-6)


# -- fit trains with the per-head step ---------------------------------------------------------


def test_restore_best_weights_rewinds_to_the_trainer_s_first_epoch():
    model = _compiled()
    stop = keras.callbacks.EarlyStopping(monitor="val_loss", patience=1, min_delta=10,
                                         restore_best_weights=True)
    model.fit(*TRAIN, batch_size=BATCH, epochs=6, shuffle=False, verbose=0, validation_data=VAL,
              callbacks=[stop])
    _assert_same_weights(model.get_weights(), _trainer_fit(steps=5))


def test_steps_per_execution_runs_the_same_steps():
    model = _compiled(steps_per_execution=2)  # 5 batches an epoch: calls of 2, 2 and 1 steps
    model.fit(*TRAIN, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    _assert_same_weights(model.get_weights(), _trainer_fit(steps=10))


def test_the_compiled_optimizers_step_each_on_its_head_s_var_list():
    optimizers = _optimizers()
    model = _model()
    model.compile(optimizer=optimizers, loss=LOSSES)
    model.fit(*TRAIN, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    for head, optimizer in optimizers.items():
        assert int(optimizer.iterations) == 5
        assert [id(v) for v in internals.built_variables(optimizer)] == \
            [id(v) for v in model.var_list(head)]
    assert model.optimizer is None and model.trainer.optimizers == optimizers


def test_head_a_s_optimizer_never_touches_head_b():
    # AdamW decays every variable it was built on, gradient or not; head b's optimizer has
    # a zero learning rate. Head b's variables move only if a's optimizer reaches them.
    model = _model()
    before = {h: [v.numpy().copy() for v in model.heads[h].weights] for h in HEADS}
    trunk_before = [v.numpy().copy() for v in model.trunk.weights]
    model.compile(optimizer={"a": keras.optimizers.AdamW(0.01, weight_decay=0.5),
                             "b": keras.optimizers.SGD(0.0)}, loss=LOSSES)
    model.fit(*TRAIN, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    _assert_same_weights([v.numpy() for v in model.heads["b"].weights], before["b"])
    assert all(not np.array_equal(v.numpy(), old) for v, old in zip(model.heads["a"].weights, before["a"]))
    assert all(not np.array_equal(v.numpy(), old) for v, old in zip(model.trunk.weights, trunk_before))


def test_a_non_finite_head_is_skipped_then_stops_fit_as_in_trainer_fit():
    model = _compiled(max_nonfinite_steps=3)
    head_a = [v.numpy().copy() for v in model.heads["a"].weights]
    labels = {"a": np.full_like(TRAIN[1]["a"], np.nan), "b": TRAIN[1]["b"]}
    with pytest.raises(FloatingPointError) as error:
        model.fit(TRAIN[0], labels, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    assert "head 'a' became nan at step 0" in _one_line(error) and "3 consecutive" in str(error.value)
    # Its updates were dropped meanwhile (Keras' own step would have applied NaN), b trained.
    _assert_same_weights([v.numpy() for v in model.heads["a"].weights], head_a)
    assert int(model.trainer.optimizers["b"].iterations) == 3


# -- evaluate and the other Keras entry points -------------------------------------------


def test_evaluate_gives_per_head_losses_and_metrics_equal_to_numpy():
    model = _compiled(loss_weights={"a": 0.5})
    model.fit(*TRAIN, batch_size=BATCH, epochs=1, verbose=0)
    expected = _numpy_results(model, *VAL, weight_a=0.5)
    got = model.evaluate(*VAL, batch_size=5, return_dict=True)  # 24 rows: a short last batch
    assert got == pytest.approx(expected, rel=1e-5)
    assert model.evaluate(*VAL) == pytest.approx([got["loss"], got["a_loss"], got["b_loss"],
                                                  got["b_accuracy"]], rel=1e-6)
    dataset = tf.data.Dataset.from_tensor_slices(VAL).batch(7)
    assert model.evaluate(dataset, return_dict=True) == pytest.approx(expected, rel=1e-5)


def test_train_on_batch_is_one_trainer_step():
    model = _compiled()
    batch = next(iter(mh.as_dataset(TRAIN, BATCH, shuffle=False)))
    logs = model.train_on_batch(batch[0], batch[1], return_dict=True)
    reference = mh.Trainer(_model(), _objectives(_optimizers()))
    losses = reference.step(batch).losses
    assert logs == pytest.approx({"a_loss": losses["a"], "b_loss": losses["b"],
                                  "loss": losses["a"] + losses["b"]}, rel=1e-12)
    _assert_same_weights(model.get_weights(), reference.model.get_weights())


# -- sample and class weights ------------------------------------------------------------------


@pytest.mark.parametrize("fit_args, reference", [
    ({"sample_weight": SAMPLE_WEIGHTS["both"]}, "both"),
    ({"sample_weight": SAMPLE_WEIGHTS["b only"]}, "b only"),
    ({"class_weight": {"b": CLASS_WEIGHT_B}}, "class b"),
    ({"class_weight": {"b": CLASS_WEIGHT_B}, "sample_weight": SAMPLE_WEIGHTS["both"]},
     "class b x both"),
])
def test_fit_with_weights_trains_as_trainer_fit_with_the_same_weights_bitwise(fit_args, reference):
    model = _compiled()
    model.fit(*TRAIN, batch_size=BATCH, epochs=2, shuffle=False, verbose=0, **fit_args)
    _assert_same_weights(model.get_weights(), _trainer_fit(steps=10, sample_weights=reference))
    # The weights change the training: the same fit without them ends elsewhere.
    assert not np.array_equal(model.get_weights()[-1], _trainer_fit(steps=10)[-1])


def test_one_sample_weight_array_weighs_every_head_and_a_dataset_may_carry_them():
    weights = SAMPLE_WEIGHTS["both"]["a"]
    model = _compiled()
    model.fit(*TRAIN, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, sample_weight=weights)
    model_ds = _compiled()
    dataset = tf.data.Dataset.from_tensor_slices((*TRAIN, {"a": weights, "b": weights})).batch(BATCH)
    model_ds.fit(dataset, epochs=1, shuffle=False, verbose=0)
    model_trainer = _model()
    trainer = mh.Trainer(model_trainer, _objectives(_optimizers()))
    trainer.fit(mh.as_dataset((*TRAIN, {"a": weights, "b": weights}), BATCH, shuffle=False), 5,
                verbose=False)
    _assert_same_weights(model.get_weights(), model_trainer.get_weights())
    _assert_same_weights(model_ds.get_weights(), model_trainer.get_weights())


def test_train_on_batch_and_evaluate_weigh_as_the_trainer_does():
    weights = SAMPLE_WEIGHTS["both"]
    model = _compiled()
    x, y = TRAIN[0][:BATCH], {h: v[:BATCH] for h, v in TRAIN[1].items()}
    w = {h: v[:BATCH] for h, v in weights.items()}
    model.train_on_batch(x, y, sample_weight=w)
    objectives = _objectives(_optimizers())
    objectives["b"].metrics = ["accuracy"]
    reference = mh.Trainer(_model(), objectives)
    reference.step((x, y, w))
    _assert_same_weights(model.get_weights(), reference.model.get_weights())
    got = model.evaluate(*TRAIN, sample_weight=weights, batch_size=BATCH, return_dict=True)
    expected = reference.evaluate(mh.as_dataset((*TRAIN, weights), BATCH, shuffle=False))
    assert got == pytest.approx({"loss": expected["a"]["loss"] + expected["b"]["loss"],
                                 **{f"{h}_{k}": v for h, r in expected.items() for k, v in r.items()}},
                                rel=1e-12)
    # Weighted accuracy against numpy: sum of the weights of the right rows / sum of weights.
    right = model.predict(TRAIN[0], verbose=0)["b"].argmax(1) == TRAIN[1]["b"]
    assert got["b_accuracy"] == pytest.approx(np.sum(weights["b"] * right) / np.sum(weights["b"]),
                                              rel=1e-6)
    # validation_data=(x, y, weights) reports what evaluate(sample_weight=...) gives.
    history = model.fit(TRAIN[0][:BATCH], y, batch_size=BATCH, verbose=0,
                        validation_data=(*TRAIN, weights))
    got = model.evaluate(*TRAIN, sample_weight=weights, batch_size=BATCH, return_dict=True)
    assert history.history["val_a_loss"][0] == pytest.approx(got["a_loss"], rel=1e-6)


def test_a_one_head_model_takes_keras_plain_class_weight():
    keras.utils.set_random_seed(0)
    labels = TRAIN[1]["b"]

    def trained(**fit_args):
        keras.utils.set_random_seed(0)
        model = mh.MultiHeadModel(keras.layers.Dense(4), {"y": keras.layers.Dense(3)})
        model.compile(optimizer="sgd", loss=LOSSES["b"])
        model.fit(TRAIN[0], labels, batch_size=BATCH, shuffle=False, verbose=0, **fit_args)
        return model.get_weights()

    _assert_same_weights(trained(class_weight=CLASS_WEIGHT_B),
                         trained(sample_weight=SAMPLE_WEIGHTS["class b"]["b"]))


def test_a_one_head_model_takes_one_optimizer_and_bare_labels():
    keras.utils.set_random_seed(0)
    model = mh.MultiHeadModel(keras.layers.Dense(4), {"y": keras.layers.Dense(1)})
    model.compile(optimizer="sgd", loss="mse")
    x, y = TRAIN[0], TRAIN[1]["a"]
    history = model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, validation_data=(x, y))
    assert set(history.history) == {"loss", "y_loss", "val_loss", "val_y_loss"}
    expected = float(np.mean((model.predict(x)["y"] - y) ** 2))
    assert model.evaluate(x, y, return_dict=True)["y_loss"] == pytest.approx(expected, rel=1e-5)


def test_predict_takes_keras_verbose_and_returns_the_same_outputs():
    model = _model()
    x = TRAIN[0]
    quiet, plain = model.predict(x, verbose=0), model.predict(x)
    assert quiet.keys() == plain.keys()
    for head in plain:
        np.testing.assert_array_equal(quiet[head], plain[head])


# -- refused with one line ---------------------------------------------------------------------


def _one_line(error: pytest.ExceptionInfo) -> str:
    text = str(error.value)
    assert "\n" not in text, text
    return text


def test_a_single_optimizer_object_for_two_heads_is_refused():
    model = _model()
    with pytest.raises(ValueError) as error:
        model.compile(optimizer=keras.optimizers.Adam(), loss=LOSSES)
    assert "compile(optimizer=...)" in _one_line(error) and "per-head" in str(error.value)
    shared = keras.optimizers.Adam()
    with pytest.raises(ValueError) as error:
        model.compile(optimizer={"a": shared, "b": shared}, loss=LOSSES)
    assert "same optimizer object" in _one_line(error)


@pytest.mark.parametrize("compile_args, message", [
    ({"optimizer": "adam"}, "compile(optimizer=...): one value for the heads"),
    ({"loss": {"a": "mse"}}, "compile(loss=...) has no entry for head 'b'"),
    ({"loss": {"a": "mse", "b": "mse", "c": "mse"}}, "compile(loss=...) names head 'c'"),
    ({"loss": None}, "compile(loss=...) is required"),
    ({"metrics": ["mae"]}, "compile(metrics=...): one value for the heads"),
    ({"loss_weights": {"z": 1.0}}, "compile(loss_weights=...) names head 'z'"),
    ({"loss_weights": {"a": -1.0}}, "compile(loss_weights)['a']"),
    ({"weighted_metrics": ["mae"]}, "compile(weighted_metrics=...)"),
    ({"run_eagerly": True}, "compile(run_eagerly=True)"),
    ({"steps_per_execution": 0}, "compile(steps_per_execution=...)"),
    ({"jit_compile": "yes"}, "compile(jit_compile=...)"),
])
def test_compile_refuses_what_has_no_per_head_meaning(compile_args, message):
    args = {"optimizer": _optimizers(), "loss": LOSSES, **compile_args}
    with pytest.raises(ValueError) as error:
        _model().compile(**args)
    assert message in _one_line(error)


@pytest.mark.parametrize("fit_args, message", [
    ({"callbacks": [keras.callbacks.ReduceLROnPlateau()]}, "fit(callbacks[0]): ReduceLROnPlateau"),
    ({"callbacks": [keras.callbacks.TensorBoard(write_steps_per_second=True)]},
     "TensorBoard(write_steps_per_second=True)"),
    ({"y": TRAIN[1]["a"]}, "fit: y must be a dict head -> labels"),
])
def test_fit_refuses_what_has_no_per_head_meaning(fit_args, message):
    model = _compiled()
    with pytest.raises(ValueError) as error:
        model.fit(**{"x": TRAIN[0], "y": TRAIN[1], "batch_size": BATCH, "verbose": 0, **fit_args})
    assert message in _one_line(error)


@pytest.mark.parametrize("fit_args, message", [
    ({"sample_weight": {"c": np.ones(40)}}, "fit(sample_weight=...) names head 'c', but the model's heads"),
    ({"sample_weight": {"a": np.ones(39)}}, "fit(sample_weight=...)['a']: 39 weights for 40 examples"),
    ({"sample_weight": np.ones((40, 2))}, "fit(sample_weight=...): shape (40, 2)"),
    ({"sample_weight": {"b": np.r_[np.ones(39), -1.0]}}, "fit(sample_weight=...)['b']: -1.0 at row 39"),
    ({"sample_weight": {"b": np.r_[np.nan, np.ones(39)]}}, "fit(sample_weight=...)['b']: nan at row 0"),
    ({"class_weight": {"z": {0: 1.0}}}, "fit(class_weight=...) names head 'z'"),
    ({"class_weight": {0: 1.0}}, "fit(class_weight=...) names head 0"),
    ({"class_weight": {"b": {0: -2.0}}}, "fit(class_weight=...)['b'][0]: -2.0"),
    ({"class_weight": {"b": {"x": 2.0}}}, "class 'x' is not an integer class index"),
    ({"class_weight": {"a": {0: 2.0}}}, "is not a class index; class_weight is for classification"),
    ({"x": tf.data.Dataset.from_tensor_slices(TRAIN).batch(8), "y": None,
      "sample_weight": np.ones(40)}, "fit(sample_weight=/class_weight=...) takes array data"),
])
def test_wrong_weights_are_refused_with_one_line(fit_args, message):
    model = _compiled()
    with pytest.raises(ValueError) as error:
        model.fit(**{"x": TRAIN[0], "y": TRAIN[1], "batch_size": BATCH, "verbose": 0, **fit_args})
    assert message in _one_line(error)


def test_fit_before_compile_says_to_compile():
    with pytest.raises(ValueError) as error:
        _model().fit(*TRAIN, verbose=0)
    assert "compile the model first" in _one_line(error)


def test_a_second_compile_with_the_same_optimizers_continues_their_state():
    optimizers = _optimizers()
    model = _model()
    model.compile(optimizer=optimizers, loss=LOSSES)
    model.fit(*TRAIN, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    model.compile(optimizer=optimizers, loss=LOSSES)
    model.fit(*TRAIN, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    _assert_same_weights(model.get_weights(), _trainer_fit(steps=10))
