"""MoCo, DB-MTL and ExcessMTL (the aggregators with a running K x D buffer of the heads'
gradients) against numpy implementations written from LibMTL's code, carrying their state
over several steps: `mh.aggregate` on explicit matrices, then the compiled train step on a
real model against per-head trunk gradients computed by hand, subset steps, and the
checkpoint keys of the buffers."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import multihead as mh
from conftest import make_batch, make_model
from test_aggregation_reference import KS, MATRICES_PER_K, TOL, _degenerate, _random

STEPS = 3
METHODS = ("moco", "db_mtl", "excess_mtl")


# -- references, from LibMTL's MoCo, DB_MTL and ExcessMTL (on the K x D matrix) -----------------


def ref_moco(seq, losses, beta=0.5, beta_sigma=0.5, gamma=0.1, gamma_sigma=0.5, rho=0.0):
    k, d = seq[0].shape
    y, lambd, out = np.zeros((k, d)), np.full(k, 1.0 / k), []
    for t, (g, loss) in enumerate(zip(seq, losses), start=1):
        g = g / (np.linalg.norm(g, axis=1, keepdims=True) + 1e-8) * loss[:, None]
        y = y - beta / t**beta_sigma * (y - g)
        z = lambd - gamma / t**gamma_sigma * (y @ y.T + rho * np.eye(k)) @ lambd
        lambd = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
        out.append(y.T @ lambd)
    return out


def ref_db_mtl(seq, losses, beta=0.9, beta_sigma=0.0):
    buf, out = np.zeros_like(seq[0]), []
    for t, (g, loss) in enumerate(zip(seq, losses), start=1):
        g = g / (loss[:, None] + 1e-8)    # the gradient of log(L + 1e-8)
        buf = g + beta / t**beta_sigma * (buf - g)
        norms = np.linalg.norm(buf, axis=1)
        out.append((norms.max() / (norms + 1e-8)) @ buf)
    return out


def ref_excess_mtl(seq, losses, robust_step_size=1e-2):
    """LibMTL's loop (multiplicative update, then renormalised to sum K). A head's initial
    w is its first positive one (LibMTL: the first step's, where a zero gradient divides
    by 0); until then its ratio is 0."""
    del losses
    k = len(seq[0])
    grad_sum, loss_weight, initial, out = np.zeros_like(seq[0]), np.ones(k), np.zeros(k), []
    for g in seq:
        grad_sum = grad_sum + g**2
        w = (g**2 / np.sqrt(grad_sum + 1e-7)).sum(axis=1)
        ready = initial > 0
        ratio = np.where(ready, w / np.where(ready, initial, 1.0), 0.0)
        initial = np.where(ready, initial, w)
        loss_weight = loss_weight * np.exp(robust_step_size * ratio)
        loss_weight = loss_weight / loss_weight.sum() * k
        out.append(loss_weight @ g)
    return out


REFERENCES = {"moco": ref_moco, "db_mtl": ref_db_mtl, "excess_mtl": ref_excess_mtl}


def _ours(name, seq, losses, dtype, **options):
    state, out = None, []
    for g, loss in zip(seq, losses):
        result = mh.aggregate(g.astype(dtype), name, dtype=dtype, state=state,
                              losses=loss.astype(dtype), **options)
        state = result.state
        direction = result.direction.numpy().astype(np.float64)
        assert np.all(np.isfinite(direction)), (name, direction)
        for value in state.values():
            assert np.all(np.isfinite(value.numpy())), (name, state)
        out.append(direction)
    return out


def _sequence(k, seed):
    """STEPS gradient matrices around one random matrix, and positive losses."""
    g = _random(k, seed)
    rng = np.random.default_rng(seed + 77)
    seq = [g + 0.3 * s * rng.standard_normal(g.shape) for s in range(STEPS)]
    return seq, [rng.uniform(0.1, 3.0, k) for _ in range(STEPS)]


def _check(name, seq, losses, dtype, tol, **options):
    # At float32 the reference gets the float32 input, so only our arithmetic is compared.
    seq = [g.astype(dtype).astype(np.float64) for g in seq]
    losses = [v.astype(dtype).astype(np.float64) for v in losses]
    want = REFERENCES[name](seq, losses, **options)
    got = _ours(name, seq, losses, dtype, **options)
    for step, (a, b) in enumerate(zip(got, want)):
        # Floor: directions that are 0 by definition (all-zero gradients) compare absolutely.
        err = np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-6)
        assert err <= tol, f"{name} {dtype} K={len(seq[0])} step {step}: {err:.2e} > {tol:.0e}"


OPTIONS = {"moco": {"beta": 0.3, "beta_sigma": 0.2, "gamma": 0.5, "gamma_sigma": 0.1, "rho": 0.2},
           "db_mtl": {"beta": 0.5, "beta_sigma": 0.5}, "excess_mtl": {"robust_step_size": 0.5}}


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name", METHODS)
def test_equals_reference_along_sequences(name, dtype):
    """20 random matrices per K = 2..8 (half with a strong conflict), each over STEPS steps
    with the state carried, at the defaults; and at other options on a few."""
    for k in KS:
        for seed in range(MATRICES_PER_K):
            seq, losses = _sequence(k, seed)
            _check(name, seq, losses, dtype, TOL[dtype])
            if seed < 2:
                _check(name, seq, losses, dtype, TOL[dtype], **OPTIONS[name])


@pytest.mark.parametrize("name", METHODS)
def test_degenerate_gradients_give_the_defined_answer(name):
    """Zero rows, duplicate rows, collinear rows, more heads than dimensions, all zero:
    finite everywhere, and the reference's answer at float64."""
    for k in KS:
        for case, g in _degenerate(k).items():
            seq = [g, 0.5 * g, g]
            losses = [np.linspace(0.5, 2.0, k)] * 3
            _check(name, seq, losses, "float64", 10 * TOL["float64"])
            _ours(name, seq, losses, "float32")   # asserts finite directions and state


def test_all_zero_gradients_give_a_zero_direction_and_keep_the_weights():
    g = np.zeros((3, 4))
    for name in METHODS:
        result = mh.aggregate(g, name, losses=[1.0, 2.0, 3.0], dtype="float64")
        np.testing.assert_array_equal(result.direction.numpy(), 0.0)
    excess = mh.aggregate(g, "excess_mtl", dtype="float64")
    np.testing.assert_array_equal(excess.weights.numpy(), 1.0)
    np.testing.assert_array_equal(excess.state["initial_w"].numpy(), 0.0)


def test_aggregate_needs_losses_for_moco_and_db_mtl_and_checks_the_state():
    g = np.eye(2)
    for name in ("moco", "db_mtl"):
        with pytest.raises(ValueError, match=f"aggregator '{name}' needs losses="):
            mh.aggregate(g, name)
    mh.aggregate(g, "excess_mtl")   # reads no losses
    with pytest.raises(ValueError, match="one entry per row"):
        mh.aggregate(g, "moco", losses=[1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match=r"has the entries \['lambd', 'step', 'y'\]"):
        mh.aggregate(g, "moco", losses=[1.0, 2.0], state={"lambd": [0.5, 0.5]})


@pytest.mark.parametrize("name,options,match", [
    ("moco", {"beta": 0.0}, "beta must be in"), ("moco", {"beta": 1.5}, "beta must be"),
    ("moco", {"gamma": -0.1}, "gamma must be"), ("moco", {"rho": float("nan")}, "rho must be"),
    ("moco", {"gamma_sigma": -1}, "gamma_sigma must be"), ("moco", {"lr": 0.1}, "no option 'lr'"),
    ("db_mtl", {"beta": 1.0}, "beta must be"), ("db_mtl", {"beta_sigma": -0.5}, "beta_sigma must"),
    ("excess_mtl", {"robust_step_size": -1e-3}, "robust_step_size must be"),
])
def test_bad_options_are_refused_when_the_policy_is_built(name, options, match):
    with pytest.raises(ValueError, match=f"aggregator '{name}': {match}|'{name}' has {match}"):
        mh.TrunkPolicy(aggregator=name, options=options)


@pytest.mark.parametrize("name", METHODS)
def test_rep_grad_is_refused_naming_the_method(name):
    with pytest.raises(ValueError, match=f"trunk aggregator '{name}' cannot use rep_grad=True") as err:
        mh.TrunkPolicy(aggregator=name, rep_grad=True)
    assert "\n" not in str(err.value)


# -- in the train step, on a real model ---------------------------------------------------------

HEADS = ("a", "b", "c")
LR = 0.1


def _flat(grads, variables):
    return np.concatenate([np.reshape(g.numpy() if g is not None else np.zeros(v.shape), -1)
                           for g, v in zip(grads, variables)]).astype(np.float64)


def _hand_written_run(model, name, batches):
    """SGD by hand: each head's trunk gradient flattened into a K x D float64 matrix, the
    numpy reference over the whole sequence (it carries its own state), the trunk moved by
    -LR x its direction; each head's variables by -LR x its own gradient (of log(L + 1e-8)
    for DB-MTL, whose heads descend the log losses)."""
    trunk_vars = model.trunk_variables
    seq, losses = [], []
    for x, y in batches:
        with tf.GradientTape(persistent=True) as tape:
            feats = model.trunk(x, training=True)
            loss = {h: tf.reduce_mean(tf.square(y[h] - model.heads[h](feats, training=True)))
                    for h in HEADS}
        seq.append(np.stack([_flat(tape.gradient(loss[h], trunk_vars), trunk_vars) for h in HEADS]))
        losses.append(np.array([float(loss[h]) for h in HEADS]))
        direction = REFERENCES[name](seq, losses)[-1]
        for h in HEADS:
            head_vars = model.head_variables(h)
            scale = 1.0 / (losses[-1][HEADS.index(h)] + 1e-8) if name == "db_mtl" else 1.0
            for v, g in zip(head_vars, tape.gradient(loss[h], head_vars)):
                v.assign(v.numpy() - LR * scale * g.numpy())
        i = 0
        for v in trunk_vars:
            n = int(np.prod(v.shape))
            v.assign(v.numpy() - LR * direction[i:i + n].reshape(v.shape).astype(np.float32))
            i += n
        del tape


def _trainer(model, name, **policy):
    return mh.Trainer(model, {h: mh.Objective("mse", keras.optimizers.SGD(LR)) for h in HEADS},
                      trunk=mh.TrunkPolicy(keras.optimizers.SGD(LR), name, **policy))


@pytest.mark.parametrize("name", METHODS)
def test_train_step_equals_the_reference_on_hand_computed_gradients(name):
    batches = [make_batch(HEADS, seed=s) for s in range(3)]
    ours, ref = make_model(HEADS, seed=4), make_model(HEADS, seed=4)
    trainer = _trainer(ours, name)
    for batch in batches:
        trainer.step(batch)
    _hand_written_run(ref, name, batches)
    for a, b in zip(ours.trainable_variables, ref.trainable_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0, atol=2e-6, err_msg=a.path)
    assert trainer.trace_count == 1
    state = trainer.trunk_update.aggregator_state
    buffer = {"moco": "y", "db_mtl": "grad_buffer", "excess_mtl": "grad_sum"}[name]
    assert len(getattr(state, buffer)) == len(ours.trunk_variables)
    assert all(np.any(b.numpy() != 0) for b in getattr(state, buffer))


def test_float64_policy_keeps_float64_buffers_and_trains():
    trainer = _trainer(make_model(HEADS, seed=4), "moco", dtype="float64")
    trainer.step(make_batch(HEADS, seed=0))
    state = trainer.trunk_update.aggregator_state
    assert {b.dtype for b in state.y} == {tf.float64} and state.lambd.dtype == tf.float64
    assert all(np.all(np.isfinite(v.numpy())) for v in trainer.model.trainable_variables)


# ~12 s each on 2 loaded cores (three subsets traced): the mechanism is shared, one runs fast.
@pytest.mark.parametrize("name", ["moco", pytest.param("db_mtl", marks=pytest.mark.slow),
                                  pytest.param("excess_mtl", marks=pytest.mark.slow)])
def test_a_step_without_one_head_reads_and_writes_only_the_others_rows(name):
    """Head c's labels are NaN at step 1: c is dropped, the trunk steps on a and b alone
    (as an explicit partial step), and c's rows of the buffers and state stay as they were."""
    batches = [make_batch(HEADS, seed=s) for s in range(3)]
    bad = (batches[1][0], dict(batches[1][1], c=np.full_like(batches[1][1]["c"], np.nan)))
    ours, ref = _trainer(make_model(HEADS, seed=4), name), _trainer(make_model(HEADS, seed=4), name)
    state = ours.trunk_update.aggregator_state
    ours.step(batches[0])
    before = {v.name: v.numpy().copy() for v in state.variables}
    assert "c" in ours.step(bad).skipped
    for v in state.variables:
        if v.shape.rank and v.shape[0] == len(HEADS):     # per-head rows
            np.testing.assert_array_equal(v.numpy()[2], before[v.name][2], err_msg=v.name)
            if not v.name.startswith("initial_w"):   # set once, at a head's first step
                assert np.any(v.numpy()[:2] != before[v.name][:2]), v.name
    ours.step(batches[2])
    ref.step(batches[0])
    ref.step(batches[1], heads=["a", "b"])
    ref.step(batches[2])
    for a, b in zip(ours.model.trainable_variables, ref.model.trainable_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0, atol=1e-6)
    for a, b in zip(state.variables, ref.trunk_update.aggregator_state.variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0, atol=1e-6, err_msg=a.name)


def test_buffers_are_checkpointed_under_trunk_update_by_trunk_variable_index(tmp_path):
    trainer = _trainer(make_model(HEADS, seed=4), "moco")
    trainer.step(make_batch(HEADS, seed=0))
    path = tf.train.Checkpoint(trunk_update=trainer.trunk_update).write(str(tmp_path / "ckpt"))
    keys = {k for k, _ in tf.train.list_variables(path)}
    n = len(trainer.model.trunk_variables)
    for i, v in enumerate(trainer.model.trunk_variables):
        key = f"trunk_update/aggregator_state/y/{i}/.ATTRIBUTES/VARIABLE_VALUE"
        assert key in keys
        assert tuple(tf.train.load_checkpoint(path).get_variable_to_shape_map()[key]) == (3,) + tuple(v.shape)
    assert not any(k.startswith(f"trunk_update/aggregator_state/y/{n}/") for k in keys)
    fresh = _trainer(make_model(HEADS, seed=9), "moco")
    fresh.build_optimizers()
    tf.train.Checkpoint(trunk_update=fresh.trunk_update).read(path).assert_existing_objects_matched()
    for a, b in zip(trainer.trunk_update.aggregator_state.variables,
                    fresh.trunk_update.aggregator_state.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_logged_agg_weight_of_moco_is_its_lambda_computed_by_hand(tmp_path):
    from test_trunk_policy import _scalars
    x, y = make_batch(HEADS, seed=0)
    model = make_model(HEADS, seed=4)
    with tf.GradientTape(persistent=True) as tape:
        feats = model.trunk(x, training=True)
        loss = {h: tf.reduce_mean(tf.square(y[h] - model.heads[h](feats, training=True)))
                for h in HEADS}
    g = np.stack([_flat(tape.gradient(loss[h], model.trunk_variables), model.trunk_variables)
                  for h in HEADS])
    losses = np.array([float(loss[h]) for h in HEADS])
    # MoCo's first step (t = 1, y = 0, lambda = 1/K): y = beta * normalised g x loss.
    y_buf = 0.5 * g / (np.linalg.norm(g, axis=1, keepdims=True) + 1e-8) * losses[:, None]
    lambd = np.full(len(HEADS), 1.0 / len(HEADS))
    z = lambd - 0.1 * (y_buf @ y_buf.T) @ lambd
    expected = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    trainer = mh.Trainer(model, {h: mh.Objective("mse", keras.optimizers.SGD(LR)) for h in HEADS},
                         trunk=mh.TrunkPolicy(keras.optimizers.SGD(LR), "moco"),
                         log_dir=str(tmp_path), log_every=1)
    trainer.step((x, y))
    trainer.close()
    logged = _scalars(str(tmp_path))
    assert [logged[f"agg_weight/{h}"][1] for h in HEADS] == pytest.approx(expected, rel=1e-4)
