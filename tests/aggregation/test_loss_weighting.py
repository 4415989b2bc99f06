"""Loss-weighting schemes against numpy implementations of the papers' formulas."""

import numpy as np
import pytest
import tensorflow as tf

from multihead.aggregation import loss_weighting as lw
from multihead.aggregation.registry import check_loss_weighting_options, make_loss_weighting
from multihead.step.applier import write_state  # what the step does with the new state


def test_uncertainty_weights_and_log_variance_gradient():
    # Kendall et al.: L = sum_k exp(-s_k) L_k / 2 + s_k / 2, so dL/ds_k = (1 - exp(-s_k) L_k) / 2.
    # s = (0, log 2), L = (3, 1): weights (1/2, 1/4); dL/ds = ((1 - 3)/2, (1 - 1/2)/2) = (-1, 1/4).
    scheme = lw.UncertaintyWeighting(num_heads=2)
    scheme.log_vars.assign([0.0, np.log(2.0)])
    losses = tf.constant([3.0, 1.0])
    np.testing.assert_allclose(scheme.weights(losses).numpy(), [0.5, 0.25], rtol=1e-6)
    with tf.GradientTape() as tape:
        objective = scheme.objective(losses)
    np.testing.assert_allclose(tape.gradient(objective, scheme.log_vars).numpy(), [-1.0, 0.25],
                               rtol=1e-6)
    assert scheme.trainable_variables == (scheme.log_vars,)


def test_dwa_weights_formula():
    # r = L(t-1) / L(t-2) = (1/2, 2/1) = (0.5, 2); T = 2:
    # lambda = 2 * softmax(r / T) = 2 * (e^0.25, e^1) / (e^0.25 + e^1)
    got = lw.dwa_weights(tf.constant([1.0, 2.0]), tf.constant([2.0, 1.0]), 2.0).numpy()
    e = np.exp([0.25, 1.0])
    np.testing.assert_allclose(got, 2 * e / e.sum(), rtol=1e-6)
    assert got.sum() == pytest.approx(2.0)


def test_dwa_state_averages_periods_and_waits_two_of_them():
    scheme = lw.DWAWeighting(num_heads=3, temperature=2.0, period=2)
    rng = np.random.default_rng(0)
    steps = rng.uniform(0.5, 2.0, (9, 3)).astype(np.float32)
    for t, losses in enumerate(steps):
        # Reference: epoch e = mean of steps 2e, 2e+1; weights from the last two complete epochs.
        epochs = [steps[i:i + 2].mean(axis=0) for i in range(0, 2 * (t // 2), 2)]
        if len(epochs) >= 2:
            r = epochs[-1] / epochs[-2]
            expected = 3 * np.exp(r / 2) / np.exp(r / 2).sum()
        else:
            expected = np.ones(3)
        np.testing.assert_allclose(scheme.weights(tf.constant(losses)).numpy(), expected, rtol=1e-5)
        write_state(scheme.update(tf.constant(losses), None))
    assert int(scheme.periods) == 4


def gradnorm_reference(w, norms, losses, initial, alpha, lr):
    """Chen et al. 2018: G_k = w_k |g_k|, r_k = L~_k / mean L~, target mean(G) r_k^alpha (constant),
    gradient of sum |G_k - target_k| in w_k is sign(G_k - target_k) |g_k|; renormalise to sum K."""
    g = w * norms
    inverse = losses / initial
    r = inverse / inverse.mean()
    target = g.mean() * r**alpha
    new = np.maximum(w - lr * np.sign(g - target) * norms, 0)
    return len(w) * new / new.sum()


def test_gradnorm_update_2d_by_hand():
    # w = (1, 1), |g| = (2, 1), L/L0 = (1, 0.5) -> r = (4/3, 2/3); G = (2, 1), mean 1.5;
    # alpha = 1: target = (2, 1): G - target = (0, 0) -> no change.
    got = lw.gradnorm_update(tf.ones(2), tf.constant([2.0, 1.0]), tf.constant([1.0, 0.5]),
                             tf.ones(2), 1.0, 0.1).numpy()
    np.testing.assert_allclose(got, [1.0, 1.0], atol=1e-6)
    # alpha = 0: target = (1.5, 1.5): sign(G - target) = (+1, -1):
    # w = (1 - 0.1*2, 1 + 0.1*1) = (0.8, 1.1), renormalised: 2 (0.8, 1.1) / 1.9.
    got = lw.gradnorm_update(tf.ones(2), tf.constant([2.0, 1.0]), tf.constant([1.0, 0.5]),
                             tf.ones(2), 0.0, 0.1).numpy()
    np.testing.assert_allclose(got, [1.6 / 1.9, 2.2 / 1.9], rtol=1e-6)


def test_gradnorm_state_equals_reference_over_steps():
    scheme = lw.GradNormWeighting(num_heads=4, alpha=1.5, learning_rate=0.05)
    rng = np.random.default_rng(1)
    w, initial = np.ones(4), None
    for _ in range(6):
        losses = rng.uniform(0.2, 2.0, 4).astype(np.float32)
        norms = rng.uniform(0.1, 3.0, 4).astype(np.float32)
        np.testing.assert_allclose(scheme.weights(tf.constant(losses)).numpy(), w, rtol=1e-5)
        write_state(scheme.update(tf.constant(losses), tf.constant(norms)))
        initial = losses if initial is None else initial   # L(0): the first step's losses
        w = gradnorm_reference(w, norms, losses, initial, 1.5, 0.05)
    np.testing.assert_allclose(scheme.loss_weights.numpy(), w, rtol=1e-5)
    np.testing.assert_allclose(scheme.initial_losses.numpy(), initial)


@pytest.mark.parametrize("name,options,match", [
    ("uncertanty", {}, "unknown loss weighting 'uncertanty'"),
    ("dwa", {"temperature": 0}, "temperature must be a positive number, got 0"),
    ("dwa", {"period": 1.5}, "period must be a positive integer"),
    ("gradnorm", {"beta": 1}, "has no option 'beta'"),
])
def test_bad_scheme_or_option_is_a_clear_error(name, options, match):
    with pytest.raises(ValueError, match=match):
        make_loss_weighting(name, 2, **options)


def test_state_is_in_checkpointed_variables(tmp_path):
    scheme = lw.DWAWeighting(num_heads=2, period=1)
    for losses in ([1.0, 2.0], [2.0, 1.0], [0.5, 0.5]):
        write_state(scheme.update(tf.constant(losses), None))
    path = tf.train.Checkpoint(w=scheme).write(str(tmp_path / "dwa"))
    fresh = lw.DWAWeighting(num_heads=2, period=1)
    tf.train.Checkpoint(w=fresh).read(path).assert_consumed()
    np.testing.assert_array_equal(fresh.weights(tf.ones(2)).numpy(),
                                  scheme.weights(tf.ones(2)).numpy())
    assert int(fresh.periods) == 3


# -- GLS, STCH, IMTL-L, FAMO, RLW --------------------------------------------------------------


def test_gls_weights_are_the_gradient_of_the_geometric_mean():
    # L = (1, 4): GM = 2; d GM / d L_k = GM / (K L_k) = (2/2, 2/8) = (1, 0.25)
    np.testing.assert_allclose(lw.gls_weights(tf.constant([1.0, 4.0])).numpy(), [1.0, 0.25],
                               rtol=1e-6)


def test_stch_warmup_then_smooth_tchebycheff_against_numpy():
    scheme = lw.STCHWeighting(num_heads=3, mu=0.5, warmup_steps=2)
    rng = np.random.default_rng(1)
    steps = rng.uniform(0.2, 3.0, (5, 3)).astype(np.float32)
    for t, losses in enumerate(steps):
        if t < 2:
            expected = 1.0 / losses                       # d/dL sum log L
        else:
            nadir = steps[:2].mean(axis=0)
            # d/dL of K mu log sum exp(log(L/n)/mu) = K softmax(log(L/n)/mu) / L
            a = np.log(losses / nadir) / 0.5
            expected = 3 * np.exp(a - a.max()) / np.exp(a - a.max()).sum() / losses
        np.testing.assert_allclose(scheme.weights(tf.constant(losses)).numpy(), expected, rtol=1e-5)
        write_state(scheme.update(tf.constant(losses), None))


def test_imtl_l_weights_and_scale_gradient():
    # objective sum exp(s) L - s: weights exp(s); d/ds = exp(s) L - 1.
    scheme = lw.IMTLLWeighting(num_heads=2)
    scheme.loss_scale.assign([0.0, np.log(2.0)])
    losses = tf.constant([3.0, 0.25])
    np.testing.assert_allclose(scheme.weights(losses).numpy(), [1.0, 2.0], rtol=1e-6)
    with tf.GradientTape() as tape:
        objective = scheme.objective(losses)
    np.testing.assert_allclose(tape.gradient(objective, scheme.loss_scale).numpy(), [2.0, -0.5],
                               rtol=1e-6)


def famo_reference(steps, w_lr=0.025, gamma=1e-5):
    """Liu et al. 2023 / the authors' FAMO with torch's Adam, updated with the next step's
    losses: weights z / (c D) with z = softmax(w), D = L + 1e-8, c = sum z / D."""
    k = steps.shape[1]
    w, m, v, t, prev, out = np.zeros(k), np.zeros(k), np.zeros(k), 0, None, []
    for losses in steps.astype(np.float64):
        z = np.exp(w - w.max()) / np.exp(w - w.max()).sum()
        d = losses + 1e-8
        out.append(z / ((z / d).sum() * d))
        if prev is not None:
            delta = np.log(prev + 1e-8) - np.log(losses + 1e-8)
            jac = np.diag(z) - np.outer(z, z)               # softmax Jacobian
            g = jac.T @ delta + gamma * w
            t += 1
            m = 0.9 * m + 0.1 * g
            v = 0.999 * v + 0.001 * g**2
            w = w - w_lr * (m / (1 - 0.9**t)) / (np.sqrt(v / (1 - 0.999**t)) + 1e-8)
        prev = losses
    return np.array(out)


def test_famo_weights_over_steps_equal_the_authors_update():
    rng = np.random.default_rng(2)
    steps = rng.uniform(0.2, 3.0, (8, 3)).astype(np.float32)
    steps[4:, 0] *= 0.1   # one task's loss drops fast: its weight must fall
    scheme = lw.FAMOWeighting(num_heads=3, w_lr=0.3, gamma=1e-3)
    got = []
    for losses in steps:
        got.append(scheme.weights(tf.constant(losses)).numpy())
        write_state(scheme.update(tf.constant(losses), None))
    np.testing.assert_allclose(np.array(got), famo_reference(steps, 0.3, 1e-3), rtol=1e-4)


def test_rlw_weights_are_a_softmax_of_normal_draws_from_its_own_generator():
    scheme = lw.RLWWeighting(num_heads=4, seed=7)
    rng = tf.random.Generator.from_seed(7)
    for _ in range(3):
        z = rng.normal([4]).numpy()
        np.testing.assert_allclose(scheme.weights(tf.ones([4])).numpy(),
                                   np.exp(z) / np.exp(z).sum(), rtol=1e-6)


@pytest.mark.parametrize("name,options", [
    ("stch", {"mu": 0.0}), ("stch", {"warmup_steps": 0}), ("famo", {"gamma": -1.0}),
    ("famo", {"lr": 0.1}),
])
def test_bad_new_scheme_options_are_refused(name, options):
    with pytest.raises(ValueError, match=f"loss weighting {name!r}"):
        check_loss_weighting_options(name, **options)
