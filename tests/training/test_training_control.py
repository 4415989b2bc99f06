"""Training control from scripts: continuing fit, loss-weight schedules, partial steps,
in-step target updates, the training flag, and per-head non-finite isolation."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import multihead as mh

N, D = 96, 5


def _data(seed=0, n=N):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, D)).astype("float32")
    return x, {"a": (x[:, :1] * 2.0).astype("float32"), "b": (x[:, 1:2] - x[:, 2:3]).astype("float32")}


def _model(dropout=False, seed=1):
    keras.utils.set_random_seed(seed)
    layers = [keras.layers.Dense(8, activation="relu")]
    if dropout:
        layers.append(keras.layers.Dropout(0.3, seed=seed))
    model = mh.MultiHeadModel(keras.Sequential(layers), {"a": keras.layers.Dense(1),
                                                          "b": keras.layers.Dense(1)})
    model.build((None, D))
    return model


def _trainer(model, **kwargs):
    objectives = {"a": mh.Objective("mse", optimizer=keras.optimizers.Adam(1e-2)),
                  "b": mh.Objective("mse", optimizer=keras.optimizers.Adam(1e-2),
                                    every=kwargs.pop("every_b", 1))}
    for head, changes in kwargs.pop("changes", {}).items():
        for field, value in changes.items():
            setattr(objectives[head], field, value)
    return mh.Trainer(model, objectives, **kwargs)


def _weights(model):
    return [v.numpy().copy() for v in model.weights]


def _slots(optimizer):
    return [v.numpy().copy() for v in optimizer.variables]


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("closed", [False, True], ids=["open", "closed_between"])
@pytest.mark.parametrize("source", ["arrays", "dataset"])
def test_two_fits_continue_the_stream_and_equal_one_fit_bitwise(source, closed):
    """`close()` between the fits ends the first fit's iterators; the second continues from
    the data position, as after a restore (a dataset is then built anew, as a resumed run
    builds it: a reused dataset object has drawn its reshuffle seeds already)."""
    data = _data()

    def run(calls):
        trainer = _trainer(_model(dropout=True), every_b=2)
        feed = data if source == "arrays" else \
            tf.data.Dataset.from_tensor_slices(data).shuffle(N, seed=3).batch(16)
        train = []
        for steps in calls:
            if closed and source == "dataset":
                feed = tf.data.Dataset.from_tensor_slices(data).shuffle(N, seed=3).batch(16)
            history = trainer.fit(feed, steps=steps, batch_size=16, verbose=False)
            train.append(history.train)
            if closed:
                trainer.close()
        return trainer, train

    split, split_history = run([20, 20])
    whole, whole_history = run([40])
    _same(_weights(split.model), _weights(whole.model))
    for head in ("a", "b"):
        joined = split_history[0][head] + split_history[1][head]
        assert joined == whole_history[0][head]  # same steps, bitwise the same losses


def test_other_data_starts_from_its_beginning():
    data, other = _data(0), _data(1)
    trainer = _trainer(_model())
    trainer.fit(data, steps=3, batch_size=16, verbose=False)
    trainer.fit(other, steps=2, batch_size=16, verbose=False)
    assert int(trainer.data_position.batch.numpy()) == 2  # the new data's first two batches


def test_a_weight_schedule_equals_a_hand_written_loop():
    x, y = _data()
    schedule = keras.optimizers.schedules.PolynomialDecay(2.0, 50, end_learning_rate=0.1)
    model, reference = _model(), _model()  # same seed: same initial weights
    trainer = _trainer(model, changes={"b": {"weight": schedule}})
    opt_a, opt_b = keras.optimizers.Adam(1e-2), keras.optimizers.Adam(1e-2)
    opt_a.build(reference.var_list("a"))
    opt_b.build(reference.var_list("b"))
    for step in range(50):
        batch = slice((step * 16) % N, (step * 16) % N + 16)
        trainer.step((x[batch], {h: v[batch] for h, v in y.items()}))
        with tf.GradientTape(persistent=True) as tape:
            out = reference(x[batch], training=True)
            loss_a = tf.reduce_mean(tf.square(y["a"][batch] - out["a"]))
            loss_b = float(schedule(step)) * tf.reduce_mean(tf.square(y["b"][batch] - out["b"]))
        grads_a = tape.gradient(loss_a, reference.var_list("a"))
        grads_b = tape.gradient(loss_b, reference.var_list("b"))
        opt_a.apply_gradients(zip(grads_a, reference.var_list("a")))
        opt_b.apply_gradients(zip(grads_b, reference.var_list("b")))
    for ours, theirs in zip(model.weights, reference.weights):
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-6, atol=1e-6)


def test_a_new_number_takes_effect_and_a_new_schedule_is_refused():
    x, y = _data()
    batch = (x[:16], {h: v[:16] for h, v in y.items()})
    trainer = _trainer(_model(), changes={"a": {"optimizer": keras.optimizers.SGD(0.1)}})
    trainer.step(batch)
    before = _weights(trainer.model)
    trainer.objectives["a"].weight = 0.0  # head a's step now moves nothing of head a
    trainer.step(batch)
    head_a = [i for i, v in enumerate(trainer.model.weights)
              if any(v is w for w in trainer.model.head_variables("a"))]
    for i in head_a:
        np.testing.assert_array_equal(trainer.model.weights[i].numpy(), before[i])
    trainer.objectives["a"].weight = keras.optimizers.schedules.ExponentialDecay(1.0, 10, 0.5)
    with pytest.raises(ValueError, match=r"objectives\['a'\].weight changed"):
        trainer.step(batch)


def test_a_constant_weight_barely_changes_a_per_head_adam():
    """Adam divides by the root of the gradient's second moment: a constant factor on a
    head's loss cancels (up to epsilon), so weights are not a lever with per-head Adam."""
    x, y = _data()

    def train(weight):
        trainer = _trainer(_model(), changes={"b": {"weight": weight}})
        trainer.fit((x, y), steps=30, batch_size=16, verbose=False)
        return _weights(trainer.model)

    for a, b in zip(train(1.0), train(10.0)):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4)


def test_a_partial_step_leaves_the_other_heads_variables_and_slots_bitwise():
    x, y = _data()
    batch = (x[:16], {h: v[:16] for h, v in y.items()})
    trainer = _trainer(_model())
    trainer.step(batch)
    head_b = [v.numpy().copy() for v in trainer.model.head_variables("b")]
    slots_b = _slots(trainer.optimizers["b"])
    trunk = [v.numpy().copy() for v in trainer.model.trunk_variables]
    for _ in range(3):
        result = trainer.step(batch, heads=["a"])
        assert result.updated == ("a",)
    _same([v.numpy() for v in trainer.model.head_variables("b")], head_b)
    _same(_slots(trainer.optimizers["b"]), slots_b)
    assert any(not np.array_equal(v.numpy(), t) for v, t in zip(trainer.model.trunk_variables, trunk))
    traces = trainer.trace_count
    trainer.step(batch, heads=["a"])
    trainer.step(batch, heads=["b"])
    trainer.step(batch, heads=["b"])
    trainer.step(batch)
    assert trainer.trace_count == traces + 1  # one more subset, {b}; {a} and all were traced


def test_a_partial_step_names_an_unknown_head():
    x, y = _data()
    trainer = _trainer(_model())
    with pytest.raises(ValueError, match="'c'"):
        trainer.step((x[:8], {h: v[:8] for h, v in y.items()}), heads=["c"])


def test_in_step_target_updates_equal_a_loop_and_evaluate_never_moves_them():
    x, y = _data()

    def run(in_step):
        model = _model()
        target = mh.TargetNetwork(model, every=3)
        trainer = _trainer(model, target_networks=[target] if in_step else [])
        for step in range(8):
            batch = slice(step * 8, step * 8 + 8)
            trainer.step((x[batch], {h: v[batch] for h, v in y.items()}))
            if not in_step:
                target.update()
        return trainer, target

    ours, target = run(True)
    _, reference = run(False)
    _same([v.numpy() for v in target.variables], [v.numpy() for v in reference.variables])
    counters = [v.numpy().copy() for v in target.variables if tf.as_dtype(v.dtype).is_integer]
    snapshot = [v.numpy().copy() for v in target.variables]
    ours.evaluate((x, y))
    _same([v.numpy() for v in target.variables if tf.as_dtype(v.dtype).is_integer], counters)
    _same([v.numpy() for v in target.variables], snapshot)


def test_research_losses_see_the_training_flag():
    seen = []

    def loss(inputs, targets, outputs, training=None):
        seen.append(training)  # Python side effect: once per trace
        return tf.reduce_mean(tf.square(targets["a"] - outputs))

    x, y = _data()
    model = _model()
    trainer = mh.Trainer(model, {"a": mh.Objective(loss), "b": mh.Objective("mse")})
    trainer.step((x[:8], {h: v[:8] for h, v in y.items()}))
    trainer.evaluate((x, y))
    assert True in seen and False in seen


def _poisoned(step_list, x, y):
    """Batches of 16 where head b's labels are NaN at the given steps."""
    batches = []
    for step in range(10):
        batch = slice((step * 16) % N, (step * 16) % N + 16)
        labels = {h: v[batch].copy() for h, v in y.items()}
        if step in step_list:
            labels["b"][0] = np.nan
        batches.append((x[batch], labels))
    return batches


@pytest.mark.parametrize("trunk", ["per_head", {"aggregator": "pcgrad"}, {"aggregator": "mgda"}])
def test_nan_labels_of_one_head_are_isolated(trunk):
    x, y = _data()
    bad = [3, 7]
    batches = _poisoned(bad, x, y)
    trainer = _trainer(_model(), trunk=trunk)
    skips = 0
    for batch in batches:
        skips += "b" in trainer.step(batch).skipped
    assert skips == 2
    for v in trainer.model.weights + trainer.optimizers["a"].variables + trainer.optimizers["b"].variables:
        assert np.all(np.isfinite(v.numpy()))
    reference = _trainer(_model(), trunk=trunk)
    for step, batch in enumerate(batches):
        reference.step(batch, heads=["a"] if step in bad else None)
    for ours, theirs in zip(trainer.model.weights, reference.model.weights):
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-6, atol=1e-6)


def test_skips_are_counted_in_fit_and_a_persistent_head_stops_it():
    x, y = _data()
    y_bad = dict(y, b=np.full_like(y["b"], np.nan))
    trainer = _trainer(_model(), max_nonfinite_steps=5)
    seen = []
    callback = mh.Callback()
    callback.on_step_end = lambda step, result: seen.append(result.skipped)
    with pytest.raises(FloatingPointError, match="head 'b'.*5 consecutive steps"):
        trainer.fit((x, y_bad), steps=20, batch_size=16, verbose=False, callbacks=[callback])
    assert seen == [("b",)] * 5
    assert all(np.all(np.isfinite(v.numpy())) for v in trainer.model.weights)


def test_the_logged_skip_count_equals_the_skipped_steps(tmp_path):
    from test_monitor import read_events

    x, y = _data()
    bad = {1, 2, 5}
    trainer = _trainer(_model(), log_dir=str(tmp_path), log_every=3, histograms_every=0)
    for step, batch in enumerate(_poisoned(bad, x, y)[:7]):
        trainer.step(batch)
    trainer.close()
    logged = read_events(str(tmp_path / "train"))["nonfinite_skips/b"]
    # Logged after updates 1, 3 and 6 (the step axis counts the updates done): the count of
    # skipped updates among them (batch i is update i + 1).
    expected = {s: sum(1 for b in bad if b < s) for s in (1, 3, 6)}
    assert {s: int(v) for s, v in logged.items()} == expected
    assert {int(v) for v in read_events(str(tmp_path / "train"))["nonfinite_skips/a"].values()} == {0}
