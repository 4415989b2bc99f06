"""A loss weighting composes with a gradient aggregator: the weighting scales the losses, then the
aggregator combines the weighted heads' trunk gradients. Uncertainty weighting under PCGrad, three
SGD steps, against the same steps computed by hand in numpy (gradients from a GradientTape of a
twin model, everything else numpy)."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf
from conftest import make_batch, make_model

import multihead as mh

HEADS = ("a", "b")
LR = 0.1


def _pcgrad(g: np.ndarray) -> np.ndarray:
    """Yu et al. 2020, two heads (the projection order plays no role at K = 2)."""
    out = []
    for i in range(len(g)):
        gi = g[i].copy()
        for j in range(len(g)):
            if j != i and gi @ g[j] < 0:
                gi = gi - (gi @ g[j]) / (g[j] @ g[j]) * g[j]
        out.append(gi)
    return np.sum(out, axis=0)


def _hand_written(model, batches, log_vars):
    """Returns how many steps had conflicting weighted gradients (PCGrad projected)."""
    trunk_vars = model.trunk_variables
    conflicts = 0
    for x, y in batches:
        with tf.GradientTape(persistent=True) as tape:
            feats = model.trunk(x, training=True)
            losses = {h: tf.reduce_mean(tf.square(y[h] - model.heads[h](feats, training=True)))
                      for h in HEADS}
        lam = 0.5 * np.exp(-log_vars)                       # Kendall et al.: 1 / (2 sigma^2)
        rows = []
        for k, h in enumerate(HEADS):
            grads = tape.gradient(losses[h], trunk_vars)
            rows.append(lam[k] * np.concatenate([g.numpy().ravel() for g in grads]).astype(np.float64))
            for v, g in zip(model.head_variables(h), tape.gradient(losses[h], model.head_variables(h))):
                v.assign(v.numpy() - LR * lam[k] * g.numpy())
        g = np.stack(rows)
        conflicts += int(g[0] @ g[1] < 0)
        d = _pcgrad(g)
        i = 0
        for v in trunk_vars:
            n = int(np.prod(v.shape))
            v.assign(v.numpy() - LR * d[i:i + n].reshape(v.shape).astype(np.float32))
            i += n
        task = np.array([losses[h].numpy() for h in HEADS], np.float64)
        # d/ds_k of sum_k exp(-s_k) L_k / 2 + s_k / 2 (the losses held constant)
        log_vars = log_vars - LR * (0.5 - 0.5 * np.exp(-log_vars) * task)
        del tape
    return conflicts, log_vars


def _conflicting(seed: int) -> bool:
    """Whether the heads' trunk gradients conflict on the first batch of `seed`."""
    model, (x, y) = make_model(HEADS, seed=seed), make_batch(HEADS, seed=seed)
    with tf.GradientTape(persistent=True) as tape:
        feats = model.trunk(x, training=True)
        losses = [tf.reduce_mean(tf.square(y[h] - model.heads[h](feats, training=True))) for h in HEADS]
    a, b = (np.concatenate([g.numpy().ravel() for g in tape.gradient(loss, model.trunk_variables)])
            for loss in losses)
    return bool(a @ b < 0)


def test_uncertainty_under_pcgrad_equals_the_hand_computation_over_three_steps():
    seed = next(s for s in range(50) if _conflicting(s))   # PCGrad must project on step 1
    batches = [make_batch(HEADS, seed=s) for s in (seed, seed + 100, seed + 200)]
    ours, ref = make_model(HEADS, seed=seed), make_model(HEADS, seed=seed)
    trainer = mh.Trainer(ours, {h: mh.Objective("mse", keras.optimizers.SGD(LR)) for h in HEADS},
                         trunk=mh.TrunkPolicy(keras.optimizers.SGD(LR), aggregator="pcgrad",
                                              loss_weighting="uncertainty"))
    for batch in batches:
        trainer.step(batch)
    conflicts, log_vars = _hand_written(ref, batches, np.full(2, -0.5))
    assert conflicts >= 1, "no step had conflicting gradients: the test would not test PCGrad"
    for a, b in zip(ours.trainable_variables, ref.trainable_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0, atol=2e-6, err_msg=a.path)
    np.testing.assert_allclose(trainer.trunk_update.weighting.log_vars.numpy(), log_vars,
                               rtol=0, atol=2e-6)
    assert np.abs(log_vars + 0.5).max() > 1e-3   # the weights moved


def test_a_loss_weighting_and_the_legacy_aggregator_form_are_one_policy():
    legacy = mh.TrunkPolicy(aggregator="uncertainty", options={"initial_log_var": 0.0})
    assert legacy.aggregator == "sum" and legacy.loss_weighting == "uncertainty"
    assert dict(legacy.loss_weighting_options) == {"initial_log_var": 0.0}
