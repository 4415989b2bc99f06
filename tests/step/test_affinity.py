"""Inter-task affinity (`multihead.step.affinity`) against a hand-written lookahead.

The reference takes each head's gradient with a GradientTape, writes its optimizer's
update by hand (numpy, from the optimizer's slots), puts the looked-ahead trunk into a
copy of the model and reads every head's loss there: Z_{i->j} = 1 - L_j(after) / L_j(before).
"""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import multihead as mh
from multihead import _keras_internals as internals
from multihead.monitoring import tags
from multihead.monitoring.report import read_scalars
from conftest import make_batch

HEADS = ("a", "b", "c")
WEIGHTS = {"a": 1.0, "b": 0.5, "c": 2.0}


def _model(seed=0, dropout=0.0, batch_norm=False):
    keras.utils.set_random_seed(seed)
    layers = [keras.layers.Dense(8, activation="tanh",
                                 kernel_regularizer=keras.regularizers.L2(1e-2))]
    if batch_norm:
        layers.append(keras.layers.BatchNormalization())
    if dropout:
        layers.append(keras.layers.Dropout(dropout))
    layers.append(keras.layers.Dense(6, activation="tanh"))
    model = mh.MultiHeadModel(keras.Sequential(layers),
                              {h: keras.layers.Dense(1) for h in HEADS})
    model.build((None, 5))
    return model


def _mse(y, pred):
    return float(np.mean((np.asarray(y, np.float64) - np.asarray(pred, np.float64)) ** 2))


def _losses(model, trunk_values, x, y):
    """Every head's loss with the trunk set to `trunk_values` (restored after)."""
    saved = [v.numpy() for v in model.trunk_variables]
    for v, value in zip(model.trunk_variables, trunk_values):
        v.assign(value)
    out = model(x, training=True)
    for v, value in zip(model.trunk_variables, saved):
        v.assign(value)
    return {h: _mse(y[h], out[h]) for h in HEADS}


def _trunk_gradient(model, head, x, y):
    """d(weight x loss + trunk regularization)/d trunk: head's gradient into the trunk."""
    with tf.GradientTape() as tape:
        out = model(x, training=True)
        objective = WEIGHTS[head] * tf.reduce_mean(tf.square(y[head] - out[head]))
        objective += tf.add_n(model.trunk.losses)
    return [g.numpy().astype(np.float64) for g in tape.gradient(objective, model.trunk_variables)]


def _adam(optimizer, variables, grads):
    """Keras' Adam update of `variables` by hand, from the optimizer's slots."""
    t = int(optimizer.iterations.numpy()) + 1
    lr = float(optimizer.learning_rate.numpy())
    b1, b2, eps = optimizer.beta_1, optimizer.beta_2, optimizer.epsilon
    alpha = lr * np.sqrt(1 - b2 ** t) / (1 - b1 ** t)
    out = []
    for v, g in zip(variables, grads):
        m, s, _ = (None if x is None else x.numpy().astype(np.float64)
                   for x in internals.adam_slots(optimizer, v))
        m = m + (g - m) * (1 - b1)
        s = s + (g * g - s) * (1 - b2)
        out.append(v.numpy() - m * alpha / (np.sqrt(s) + eps))
    return out


def _momentum(optimizer, variables, grads):
    """Keras' SGD-with-momentum update by hand, from the momentum slots."""
    lr, mu = float(optimizer.learning_rate.numpy()), optimizer.momentum
    out = []
    for v, g in zip(variables, grads):
        m = internals.sgd_momentum(optimizer, v).numpy().astype(np.float64)
        out.append(v.numpy() + (m * mu - g * lr))
    return out


def _reference(model, lookahead, x, y, movers, optimizer_of):
    """Z_{i->j} for every mover i and head j, written by hand."""
    before = _losses(model, [v.numpy() for v in model.trunk_variables], x, y)
    out = {}
    for i in movers:
        grads = _trunk_gradient(model, i, x, y)
        optimizer = optimizer_of(i)
        if lookahead == "sgd":
            lr = float(optimizer.learning_rate.numpy())
            moved = [v.numpy() - lr * g for v, g in zip(model.trunk_variables, grads)]
        elif isinstance(optimizer, keras.optimizers.Adam):
            moved = _adam(optimizer, model.trunk_variables, grads)
        else:
            moved = _momentum(optimizer, model.trunk_variables, grads)
        after = _losses(model, [m.astype(np.float32) for m in moved], x, y)
        out.update({tags.affinity(i, j): 1 - after[j] / before[j] for j in HEADS})
    return out


def _logged(log_dir, step):
    scalars = read_scalars(os.path.join(log_dir, "train"))
    return {t: float(s.values[list(s.steps).index(step)])
            for t, s in scalars.items() if t.startswith("affinity/") and step in s.steps}


def _check_against_reference(trainer, model, lookahead, movers, optimizer_of, log_dir):
    # Adam's first steps are sign steps, whose value at a gradient element near 0 turns on
    # its last bits (float32 rounding of the loss): the comparison starts after two steps.
    for n in range(2):
        trainer.step(make_batch(HEADS, seed=100 + n))
    for n in range(2, 5):
        x, y = make_batch(HEADS, seed=n)
        expected = _reference(model, lookahead, x, y, movers, optimizer_of)
        trainer.step((x, y))
        trainer.monitor.flush()
        logged = _logged(log_dir, n + 1)
        assert sorted(logged) == sorted(expected)
        for tag, value in expected.items():
            assert logged[tag] == pytest.approx(value, abs=1e-6), tag


@pytest.mark.parametrize("lookahead", ["optimizer", "sgd"])
def test_per_head_affinity_equals_a_hand_written_lookahead(tmp_path, lookahead):
    model = _model()
    optimizers = {"a": keras.optimizers.Adam(3e-2), "b": keras.optimizers.SGD(5e-2, momentum=0.9),
                  "c": keras.optimizers.Adam(1e-2)}
    objectives = {h: mh.Objective("mse", optimizers[h], weight=WEIGHTS[h]) for h in HEADS}
    objectives["c"] = mh.Objective("mse", optimizers["c"], weight=WEIGHTS["c"], trains_trunk=False)
    trainer = mh.Trainer(model, objectives, log_dir=str(tmp_path), histograms_every=0,
                         affinity_every=1, affinity_lookahead=lookahead)
    # c does not move the trunk: no row of its own, but a column (a's and b's effect on it)
    _check_against_reference(trainer, model, lookahead, ("a", "b"), optimizers.get, str(tmp_path))


@pytest.mark.parametrize("lookahead", ["optimizer", "sgd"])
def test_aggregated_affinity_is_the_trunk_optimizer_on_the_heads_own_gradient(tmp_path, lookahead):
    # Under an aggregator the lookahead of head i is the trunk update of a step of head i
    # alone: the trunk optimizer (its slots) on i's own trunk gradient + the regularization's.
    model = _model()
    trunk_optimizer = keras.optimizers.Adam(2e-2)
    trainer = mh.Trainer(
        model, {h: mh.Objective("mse", "sgd", weight=WEIGHTS[h]) for h in HEADS},
        trunk=mh.TrunkPolicy(aggregator="pcgrad", optimizer=trunk_optimizer),
        log_dir=str(tmp_path), histograms_every=0, affinity_every=1, affinity_lookahead=lookahead)
    _check_against_reference(trainer, model, lookahead, HEADS, lambda head: trunk_optimizer,
                             str(tmp_path))


def _train(log_dir, affinity_every, trunk, schedule, steps=7):
    model = _model(seed=1, dropout=0.3, batch_norm=True)
    every = {"c": 2} if schedule == "sequential" else {}
    trainer = mh.Trainer(model, {h: mh.Objective("mse", keras.optimizers.Adam(1e-2),
                                                 every=every.get(h, 1)) for h in HEADS},
                         trunk=trunk, schedule=schedule, log_dir=log_dir, log_every=3,
                         histograms_every=0, affinity_every=affinity_every)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((40, 5)).astype("float32")
    y = {h: rng.standard_normal((40, 1)).astype("float32") for h in HEADS}
    trainer.fit((x, y), steps=steps, batch_size=8, verbose=False)
    trainer.close()
    optimizers = [trainer.trunk_optimizer] if trainer.trunk_optimizer else []
    state = model.variables + [v for o in list(trainer.optimizers.values()) + optimizers
                               for v in o.variables]
    return [v.numpy() for v in state]


@pytest.mark.parametrize("trunk, schedule", [("per_head", "simultaneous"), ("per_head", "sequential"),
                                             ({"aggregator": "mgda"}, "simultaneous")])
def test_affinity_logging_leaves_the_training_bitwise_unchanged(tmp_path, trunk, schedule):
    # Dropout and batch normalisation: the affinity passes neither draw masks nor move the
    # statistics, so the run with affinities every step trains exactly as the run without
    # (sequential: head c every 2 steps; its affinity is measured on every step all the same).
    with_affinity = _train(str(tmp_path / "with"), 1, trunk, schedule)
    without = _train(str(tmp_path / "without"), 0, trunk, schedule)
    assert len(with_affinity) == len(without)
    for a, b in zip(with_affinity, without):
        np.testing.assert_array_equal(a, b)
    logged = read_scalars(str(tmp_path / "with" / "train"))
    assert list(logged[tags.affinity("a", "b")].steps) == list(range(1, 8))
    assert not any(t.startswith("affinity/") for t in read_scalars(str(tmp_path / "without" / "train")))


def test_affinity_is_written_at_its_own_cadence(tmp_path):
    model = _model()
    trainer = mh.Trainer(model, {h: mh.Objective("mse") for h in HEADS}, log_dir=str(tmp_path),
                         log_every=100, histograms_every=0, affinity_every=3)
    x, y = make_batch(HEADS, n=8)
    for _ in range(7):
        trainer.step((x, y))
    trainer.close()
    scalars = read_scalars(str(tmp_path / "train"))
    assert list(scalars[tags.affinity("b", "c")].steps) == [1, 3, 6]
    assert list(scalars[tags.loss("a")].steps) == [1]  # the scalars keep theirs


def test_affinity_needs_tensorboard_and_a_known_lookahead(tmp_path):
    model = _model()
    objectives = {h: mh.Objective("mse") for h in HEADS}
    with pytest.raises(ValueError, match=r"^affinity_every: the affinities are written to "
                                         r"TensorBoard, which is off \(log_dir=None\)"):
        mh.Trainer(model, objectives, affinity_every=10)
    with pytest.raises(ValueError, match=r"^affinity_lookahead: must be one of \['optimizer', "
                                         r"'sgd'\], got 'adam'"):
        mh.Trainer(model, objectives, log_dir=str(tmp_path), affinity_every=10,
                   affinity_lookahead="adam")
    with pytest.raises(ValueError, match=r"^affinity_every: must be >= 0, got -1"):
        mh.Trainer(model, objectives, log_dir=str(tmp_path), affinity_every=-1)
