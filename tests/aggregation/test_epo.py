"""EPO (Mahapatra & Rajan, ICML 2020) against an independent reference: the authors' `EPO_LP`
(github dbmptr/EPOSearch, multiMNIST/epo_lp.py) written again here with scipy's `linprog` in
place of cvxpy + GLPK, on fixed gradients, losses and preferences; then in the train step."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import scipy.optimize
import tensorflow as tf

import multihead as mh
from multihead.aggregation import EPO
from conftest import make_batch, make_model


def reference(grads: np.ndarray, losses: np.ndarray, r: np.ndarray, eps: float = 1e-4):
    """`EPO_LP.get_alpha(l, G)` as the authors wrote it, then `K alpha` as their training loop
    uses it; with the branch taken (`"bal"` / `"dom"`) and whether some `Ca_j > 0`."""
    m = len(losses)
    c = grads @ grads.T
    rl = r * losses                                       # adjustments(l, r)
    l_hat = rl / rl.sum()
    kept = l_hat[l_hat > np.finfo(l_hat.dtype).eps]       # mu(l_hat, normed=True)
    mu = np.sum(kept * np.log(kept * m))
    a = r * (np.log(l_hat * m) - mu)
    ca = c @ a
    bounds = [(0, None)] * m                              # alpha >= 0, sum(alpha) == 1
    if mu > eps:                                          # balance
        ascent = ca > 0
        if ascent.any():
            rhs = ca.copy()
            rhs[ascent] = -np.inf
            rhs[rl == np.max(rl)] = 0
        else:
            rhs = np.zeros_like(ca)
        rows = np.isfinite(rhs)                           # C alpha >= rhs
        res = scipy.optimize.linprog(-ca, A_ub=-c[rows], b_ub=-rhs[rows], A_eq=np.ones((1, m)),
                                     b_eq=[1.0], bounds=bounds, method="highs")
        branch = "bal"
    else:                                                 # dominance, restricted
        a_ub = np.vstack([-c, -ca[None]])                 # C alpha >= 0, alpha.Ca >= -neg(max Ca)
        b_ub = np.concatenate([np.zeros(m), [-min(ca.max(), 0.0)]])
        res = scipy.optimize.linprog(-c.sum(0), A_ub=a_ub, b_ub=b_ub, A_eq=np.ones((1, m)),
                                     b_eq=[1.0], bounds=bounds, method="highs")
        branch = "dom"
    alpha = res.x if res.status == 0 else r / r.sum()    # the loop's fallback
    return m * alpha, branch, bool((ca > 0).any())


def _case(seed: int, k: int, near_ray: bool):
    """Gradients of full row rank (D = 12 >= K: the LP's optimum is unique), positive losses;
    `near_ray`: losses within ~0.5% of the preference ray (`r_k L_k` nearly equal)."""
    rng = np.random.default_rng(seed)
    grads = rng.standard_normal((k, 12))
    r = rng.uniform(0.5, 3.0, k)
    losses = (1.3 / r * (1.0 + 0.005 * rng.standard_normal(k)) if near_ray
              else rng.uniform(0.2, 2.0, k))
    return grads, losses, r


CASES = [(seed, k, near) for seed in range(3) for k in (2, 3, 5, 8, 12) for near in (False, True)]


@pytest.mark.parametrize("seed,k,near_ray", CASES)
def test_epo_weights_equal_the_reference_lp(seed, k, near_ray):
    grads, losses, r = _case(seed, k, near_ray)
    expected, branch, _ = reference(grads, losses, r)
    assert branch == ("dom" if near_ray else "bal")
    method = EPO(list(r))
    result = mh.aggregate(grads, method, dtype="float64", losses=losses)
    np.testing.assert_allclose(result.weights.numpy(), expected, rtol=0, atol=1e-9)
    np.testing.assert_allclose(result.direction.numpy(), expected @ grads, rtol=0, atol=1e-9)
    # float32 in, as in the step: the LP is still solved in float64, on the rounded Gramian
    single = mh.aggregate(grads.astype("float32"), method, losses=losses.astype("float32"))
    np.testing.assert_allclose(single.weights.numpy(), expected, rtol=0, atol=1e-4)


def test_the_cases_reach_every_branch_of_the_reference():
    """The balance LP with and without an ascent head (`Ca_j > 0`) and the dominance LP."""
    seen = set()
    for seed, k, near in CASES:
        _, branch, ascent = reference(*_case(seed, k, near))
        seen.add((branch, ascent))
    # No ascent head, built by hand: losses (2, 1), r = 1 give a = (0.231, -0.462) (to 3
    # digits); unit gradients at cosine 0.8 give Ca = (0.231 - 0.8 * 0.462, 0.8 * 0.231 - 0.462)
    # = (-0.139, -0.277), both <= 0.
    grads = np.array([[1.0, 0.0], [0.8, 0.6]])
    losses, r = np.array([2.0, 1.0]), np.array([1.0, 1.0])
    expected, branch, ascent = reference(grads, losses, r)
    assert (branch, ascent) == ("bal", False)
    result = mh.aggregate(grads, EPO([1.0, 1.0]), dtype="float64", losses=losses)
    np.testing.assert_allclose(result.weights.numpy(), expected, rtol=0, atol=1e-9)
    assert ("bal", True) in seen and any(branch == "dom" for branch, _ in seen)


def test_an_empty_polytope_falls_back_to_the_normalised_preference():
    # On the ray with gradients in conflict, no convex combination keeps alpha.Ca >= min(max
    # Ca, 0) and C alpha >= 0 together: the authors' loop then takes r / sum(r).
    found = 0
    for seed in range(40):
        rng = np.random.default_rng(seed)
        grads = rng.standard_normal((3, 2))
        r = rng.uniform(0.5, 3.0, 3)
        losses = 1.3 / r * (1.0 + 0.005 * rng.standard_normal(3))
        expected, branch, _ = reference(grads, losses, r)
        if branch == "dom" and np.allclose(expected, 3 * r / r.sum()):
            got = mh.aggregate(grads, EPO(list(r)), dtype="float64", losses=losses)
            np.testing.assert_allclose(got.weights.numpy(), expected, rtol=0, atol=1e-9)
            found += 1
    assert found, "no case of an empty polytope among the seeds"


def test_a_trunk_step_applies_the_reference_weights_to_the_heads_gradients():
    heads = ("a", "b", "c")
    r = [1.0, 2.0, 4.0]
    model, ref = make_model(heads, seed=3), make_model(heads, seed=3)
    trainer = mh.Trainer(model, {h: mh.Objective("mse", keras.optimizers.SGD(0.1)) for h in heads},
                         trunk=mh.TrunkPolicy(keras.optimizers.SGD(0.1), "epo",
                                              {"preference": r}))
    x, y = make_batch(heads, seed=5)
    # by hand: one tape, each head's loss and trunk gradient, the reference LP, one SGD step
    with tf.GradientTape(persistent=True) as tape:
        out = ref(x, training=True)
        losses = {h: tf.reduce_mean(tf.square(y[h] - out[h])) for h in heads}
    trunk = ref.trunk_variables
    per_head = [tape.gradient(losses[h], trunk) for h in heads]
    flat = np.stack([np.concatenate([g.numpy().ravel() for g in gs]) for gs in per_head])
    w, _, _ = reference(flat.astype(np.float64), np.array([float(losses[h]) for h in heads]),
                        np.array(r))
    expected = [v.numpy() - 0.1 * sum(wk * gs[i].numpy() for wk, gs in zip(w, per_head))
                for i, v in enumerate(trunk)]
    trainer.step((x, y))
    for got, want in zip(model.trunk_variables, expected):
        np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=2e-6)


def test_one_head_gets_weight_one_and_a_dropped_head_leaves_the_others_to_epo():
    one = mh.aggregate(np.array([[1.0, 2.0]]), EPO([3.0]), dtype="float64", losses=[0.5])
    assert one.weights.numpy().tolist() == [1.0]       # K alpha, alpha on the 1-simplex
    heads = ("a", "b")
    trainer = mh.Trainer(make_model(heads, seed=1), {h: mh.Objective("mse") for h in heads},
                         trunk=mh.TrunkPolicy("sgd", "epo", {"preference": [1.0, 2.0]}))
    x, y = make_batch(heads)
    result = trainer.step((x, dict(y, b=np.full_like(y["b"], np.nan))))
    assert result.skipped == ("b",) and result.updated == ("a",)
    assert all(np.isfinite(v.numpy()).all() for v in trainer.model.trunk_variables)


@pytest.mark.parametrize("options,match", [
    ({}, r"aggregator 'epo' needs preference=\[r_1, ..., r_K\]"),
    ({"preference": [1.0, 0.0, 2.0]}, "one positive number per head"),
    ({"preference": [1.0, 2.0]}, "preference has 2 entries but 3 heads"),
    ({"preference": [1.0, 2.0, 3.0], "eps": -1.0}, "eps must be a number"),
])
def test_bad_options_are_refused_naming_the_option(options, match):
    with pytest.raises(ValueError, match=match):
        mh.Trainer(make_model(("a", "b", "c")), {h: mh.Objective("mse") for h in "abc"},
                   trunk={"aggregator": "epo", "options": options})


def test_missing_losses_are_refused():
    with pytest.raises(ValueError, match=r"needs losses=\[L_1, ..., L_K\]"):
        mh.aggregate(np.eye(2), EPO([1.0, 1.0]))
