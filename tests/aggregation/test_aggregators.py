"""Each aggregator against a direct numpy implementation of its paper's formula."""

import itertools

import numpy as np
import pytest
import scipy.optimize

import multihead as mh
from multihead import aggregation as agg
from multihead.aggregation import solvers


def _np(x):
    return np.asarray(x.numpy() if hasattr(x, "numpy") else x, np.float64)


def _random_grads(k, d, seed, conflict=True):
    rng = np.random.default_rng(seed)
    g = rng.standard_normal((k, d))
    if conflict:  # make some pairs conflict strongly
        g[1] = -0.8 * g[0] + 0.3 * rng.standard_normal(d)
    return g.astype(np.float32)


# -- PCGrad ----------------------------------------------------------------------------


def pcgrad_reference(g, order):
    """Yu et al. 2020, Algorithm 1, literally: vectors, not Gramians."""
    g = g.astype(np.float64)
    out, count = [], 0
    for i in range(len(g)):
        gi = g[i].copy()
        for j in order[i]:
            if j == i:
                continue
            dot = gi @ g[j]
            if dot < 0:
                gi -= dot / (g[j] @ g[j]) * g[j]
                count += 1
        out.append(gi)
    return np.sum(out, axis=0), count


def test_pcgrad_removes_exactly_the_conflicting_component_2d():
    g = np.array([[1.0, 0.0], [-1.0, 1.0]], np.float32)
    # g1.g2 = -1 < 0: g1' = g1 - (-1 / |g2|^2) g2 = (1, 0) + 0.5 (-1, 1) = (0.5, 0.5)
    #                 g2' = g2 - (-1 / |g1|^2) g1 = (-1, 1) + (1, 0)      = (0, 1)
    # d = g1' + g2' = (0.5, 1.5); g1'.g2 = -0.5 + 0.5 = 0 and g2'.g1 = 0: no conflict left.
    result = mh.aggregate(g, "pcgrad")
    np.testing.assert_allclose(_np(result.direction), [0.5, 1.5], atol=1e-6)
    np.testing.assert_allclose(_np(result.weights), [2.0, 1.5], atol=1e-6)  # d = 2 g1 + 1.5 g2
    assert int(result.projections) == 2


def test_pcgrad_leaves_non_conflicting_gradients_alone():
    g = np.array([[1.0, 0.0], [1.0, 1.0]], np.float32)  # g1.g2 = 1 > 0: d = g1 + g2 = (2, 1)
    result = mh.aggregate(g, "pcgrad")
    np.testing.assert_allclose(_np(result.direction), [2.0, 1.0], atol=1e-6)
    assert int(result.projections) == 0


@pytest.mark.parametrize("k,seed", [(3, 0), (4, 1), (6, 2)])
def test_pcgrad_equals_reference_for_any_order(k, seed):
    g = _random_grads(k, 12, seed)
    rng = np.random.default_rng(seed)
    order = np.stack([rng.permutation(k) for _ in range(k)]).astype(np.int32)
    expected, count = pcgrad_reference(g, order)
    result = mh.aggregate(g, "pcgrad", order=order)
    np.testing.assert_allclose(_np(result.direction), expected, rtol=1e-4, atol=1e-5)
    assert int(result.projections) == count > 0


# -- MGDA ------------------------------------------------------------------------------


def min_norm_reference(g):
    """min |w @ G|^2 over the simplex, by SciPy's SLSQP from every vertex and the centre."""
    gram = g.astype(np.float64) @ g.T.astype(np.float64)
    k = len(g)
    best = None
    for start in [np.full(k, 1 / k)] + list(np.eye(k)):
        res = scipy.optimize.minimize(
            lambda w: w @ gram @ w, start, jac=lambda w: 2 * gram @ w, method="SLSQP",
            bounds=[(0, 1)] * k, constraints=[{"type": "eq", "fun": lambda w: w.sum() - 1}],
            options={"ftol": 1e-14, "maxiter": 1000})
        if best is None or res.fun < best.fun:
            best = res
    return best.x @ g.astype(np.float64)


def test_mgda_2d_min_norm_point_of_the_segment():
    g = np.array([[1.0, 0.0], [0.0, 2.0]], np.float32)
    # |w g1 + (1-w) g2|^2 = w^2 + 4 (1-w)^2, derivative 2w - 8(1-w) = 0 -> w = 0.8:
    # d = 0.8 (1, 0) + 0.2 (0, 2) = (0.8, 0.4)
    result = mh.aggregate(g, "mgda")
    np.testing.assert_allclose(_np(result.weights), [0.8, 0.2], atol=1e-6)
    np.testing.assert_allclose(_np(result.direction), [0.8, 0.4], atol=1e-6)


# Frank-Wolfe converges sublinearly; with K > D (min-norm point near 0) it needs far more steps,
# so it is only checked where the min-norm point is away from 0.
@pytest.mark.parametrize("k,d,seed,solver", [
    (3, 8, 0, "frank_wolfe"), (4, 8, 1, "frank_wolfe"), (5, 12, 2, "frank_wolfe"),
    (8, 20, 3, "frank_wolfe"), (3, 8, 0, "exact"), (5, 3, 2, "exact"), (8, 20, 3, "exact"),
    (10, 4, 4, "exact"),
])
def test_mgda_is_the_min_norm_point_of_the_convex_hull(k, d, seed, solver):
    g = _random_grads(k, d, seed)
    expected = min_norm_reference(g)
    result = mh.aggregate(g, "mgda", solver=solver, max_iter=2000, tol=1e-9)
    direction = _np(result.direction)
    weights = _np(result.weights)
    assert np.all(weights >= -1e-7) and abs(weights.sum() - 1) < 1e-5   # in the hull
    scale = float(np.abs(g).max()) ** 2
    assert direction @ direction == pytest.approx(expected @ expected, abs=1e-4 * scale)
    # Optimality of the min-norm point d*: d*.g_k >= |d*|^2 for every vertex g_k.
    assert np.all(g.astype(np.float64) @ direction >= direction @ direction - 1e-3 * scale)


@pytest.mark.parametrize("solver", ["auto", "frank_wolfe"])
def test_mgda_default_settings_reach_the_min_norm_point(solver):
    g = _random_grads(4, 16, 7)
    expected = min_norm_reference(g)
    direction = _np(mh.aggregate(g, "mgda", solver=solver).direction)
    assert direction @ direction == pytest.approx(expected @ expected, rel=1e-2, abs=1e-4)


def test_mgda_2d_solvers_agree_with_the_closed_form():
    g = np.array([[1.0, 0.0], [0.0, 2.0]], np.float32)   # w = 0.8 by hand (test above)
    for solver in ("exact", "frank_wolfe"):
        np.testing.assert_allclose(_np(mh.aggregate(g, "mgda", solver=solver).weights),
                                   [0.8, 0.2], atol=1e-5)


@pytest.mark.parametrize("case", ["zero", "duplicate", "collinear"])
def test_mgda_exact_solver_on_degenerate_gradients(case):
    # Singular Gramians: each face's system gram_SS + reg I must stay regular and the
    # selection must still return a point of the simplex that is the min-norm point.
    rng = np.random.default_rng(3)
    v, u = rng.standard_normal(6), rng.standard_normal(6)
    g = {"zero": np.zeros((3, 6)),                       # every point is the min-norm point
         "duplicate": np.stack([v, v, u, u]),            # the hull of {v, u}
         "collinear": np.stack([v, -2.0 * v, 3.0 * v]),  # 0 is in the hull: d* = 0
         }[case].astype(np.float32)
    result = mh.aggregate(g, "mgda", solver="exact")
    weights, direction = _np(result.weights), _np(result.direction)
    assert np.all(np.isfinite(weights)) and np.all(weights >= 0) and abs(weights.sum() - 1) < 1e-5
    expected = min_norm_reference(g)
    assert direction @ direction == pytest.approx(expected @ expected, abs=1e-5)


# -- CAGrad ----------------------------------------------------------------------------


def cagrad_reference(g, c, rescale=1):
    """Liu et al. 2021, the authors' code: SLSQP on the dual over the simplex."""
    g = g.astype(np.float64)
    k = len(g)
    gram = g @ g.T
    g0 = g.mean(axis=0)
    sqrt_phi = c * np.linalg.norm(g0)
    b = gram @ np.full(k, 1 / k)
    res = scipy.optimize.minimize(
        lambda w: w @ b + sqrt_phi * np.sqrt(w @ gram @ w + 1e-12), np.full(k, 1 / k),
        method="SLSQP", bounds=[(0, 1)] * k,
        constraints=[{"type": "eq", "fun": lambda w: w.sum() - 1}], options={"ftol": 1e-14})
    gw = res.x @ g
    d = g0 + sqrt_phi / np.linalg.norm(gw) * gw
    return d / {0: 1.0, 1: 1 + c**2, 2: 1 + c}[rescale]


def test_cagrad_with_zero_radius_is_the_mean():
    g = _random_grads(3, 5, 0)
    np.testing.assert_allclose(_np(mh.aggregate(g, "cagrad", c=0.0).direction), g.mean(axis=0),
                               atol=1e-6)


@pytest.mark.parametrize("k,d,c,rescale,seed,solver", [
    (2, 10, 0.4, 1, 0, "exact"), (3, 10, 0.5, 0, 1, "exact"), (5, 10, 0.8, 2, 2, "exact"),
    (8, 20, 0.4, 1, 3, "exact"), (6, 3, 0.6, 1, 4, "exact"),
    (2, 10, 0.4, 1, 0, "pgd"), (5, 10, 0.8, 2, 2, "pgd"),
])
def test_cagrad_equals_reference(k, d, c, rescale, seed, solver):
    g = _random_grads(k, d, seed)
    expected = cagrad_reference(g, c, rescale)
    result = _np(mh.aggregate(g, "cagrad", c=c, rescale=rescale, solver=solver, max_iter=5000,
                              tol=0.0).direction)
    np.testing.assert_allclose(result, expected, atol=2e-3 * np.abs(expected).max())


# -- UPGrad ----------------------------------------------------------------------------


def upgrad_reference(g, reg):
    """Quinton & Rey: (1/K) sum_i argmin_{v >= e_i} v^T Q v, Q the Gramian normalised by its
    trace and regularised, as torchjd's UPGrad."""
    gram = g.astype(np.float64) @ g.T.astype(np.float64)
    q = gram / gram.trace() + reg * np.eye(len(g))
    ws = []
    for i in range(len(g)):
        lower = np.eye(len(g))[i]
        res = scipy.optimize.minimize(lambda v: v @ q @ v, lower + 0.1, jac=lambda v: 2 * q @ v,
                                      method="L-BFGS-B", bounds=[(lo, None) for lo in lower],
                                      options={"ftol": 1e-15, "gtol": 1e-12})
        ws.append(res.x)
    return np.mean(ws, axis=0)


def test_upgrad_2d_projections_onto_the_dual_cone():
    g = np.array([[1.0, 0.0], [-1.0, 1.0]], np.float32)
    # Dual cone {x : x.g1 >= 0, x.g2 >= 0}. g1.g2 = -1 < 0, so g1 leaves the cone through the
    # face x.g2 = 0: pi(g1) = g1 - (g1.g2/|g2|^2) g2 = (0.5, 0.5), and pi(g1).g1 = 0.5 >= 0.
    # Likewise pi(g2) = g2 - (g2.g1/|g1|^2) g1 = (0, 1). Mean: (0.25, 0.75).
    result = mh.aggregate(g, "upgrad", reg=0.0)
    np.testing.assert_allclose(_np(result.direction), [0.25, 0.75], atol=1e-6)


@pytest.mark.parametrize("k,d,seed", [(3, 6, 0), (4, 10, 1), (6, 4, 2), (8, 30, 3)])
def test_upgrad_equals_reference_and_conflicts_with_no_head(k, d, seed):
    g = _random_grads(k, d, seed)
    result = mh.aggregate(g, "upgrad")
    np.testing.assert_allclose(_np(result.weights), upgrad_reference(g, 1e-4), rtol=1e-3, atol=1e-4)
    inner = g.astype(np.float64) @ _np(result.direction)
    # reg = 1e-4 on the normalised Gramian allows inner products down to -1e-4 max|g_k|^2 w_k.
    assert np.all(inner >= -1e-4 * (np.linalg.norm(g, axis=1) ** 2).max())


def test_box_qp_equals_brute_force_over_active_sets():
    rng = np.random.default_rng(5)
    a = rng.standard_normal((4, 4))
    q = (a @ a.T + 0.1 * np.eye(4)).astype(np.float32)
    lower = rng.standard_normal((3, 4)).astype(np.float32)
    got = _np(solvers.box_qp(q, lower))
    for p in range(3):
        best = None
        for free in itertools.product([0, 1], repeat=4):  # KKT candidates, checked by hand
            f = np.array(free, bool)
            w = lower[p].astype(np.float64).copy()
            if f.any():
                w[f] = np.linalg.solve(q[np.ix_(f, f)], -q[np.ix_(f, ~f)] @ w[~f])
            if np.all(w >= lower[p] - 1e-9) and (best is None or w @ q @ w < best @ q @ best):
                best = w
        np.testing.assert_allclose(got[p], best, rtol=1e-4, atol=1e-5)


# -- IMTL-G ----------------------------------------------------------------------------


def imtl_reference(g):
    """Liu et al. 2021 (IMTL-G), eq. in section 3.2, with explicit D and U matrices."""
    g = g.astype(np.float64)
    u = g / np.linalg.norm(g, axis=1, keepdims=True)
    d_mat = g[0] - g[1:]
    u_mat = u[0] - u[1:]
    alpha_rest = g[0] @ u_mat.T @ np.linalg.inv(d_mat @ u_mat.T)
    alpha = np.concatenate([[1 - alpha_rest.sum()], alpha_rest])
    return alpha @ g


def test_imtl_2d_equal_projections_on_unit_gradients():
    g = np.array([[2.0, 0.0], [0.0, 1.0]], np.float32)
    # u1 = (1, 0), u2 = (0, 1); D = g1 - g2 = (2, -1), U = u1 - u2 = (1, -1):
    # alpha2 = (g1.U) / (D.U) = 2 / 3, alpha1 = 1/3 -> d = (2/3, 2/3): d.u1 = d.u2 = 2/3.
    result = mh.aggregate(g, "imtl")
    np.testing.assert_allclose(_np(result.direction), [2 / 3, 2 / 3], atol=1e-6)


@pytest.mark.parametrize("k,seed", [(3, 0), (5, 1)])
def test_imtl_equals_reference(k, seed):
    g = _random_grads(k, 9, seed)
    direction = _np(mh.aggregate(g, "imtl").direction)
    np.testing.assert_allclose(direction, imtl_reference(g), rtol=1e-3, atol=1e-4)
    unit = g / np.linalg.norm(g, axis=1, keepdims=True)
    projections = unit @ direction
    np.testing.assert_allclose(projections, projections[0], rtol=1e-3, atol=1e-4)


# -- constant weights and validation ---------------------------------------------------


def test_sum_mean_and_fixed_weights():
    g = np.array([[1.0, 2.0], [3.0, -1.0]], np.float32)
    np.testing.assert_allclose(_np(mh.aggregate(g, "sum").direction), [4.0, 1.0])
    np.testing.assert_allclose(_np(mh.aggregate(g, "mean").direction), [2.0, 0.5])
    # 0.5 (1, 2) + 2 (3, -1) = (6.5, -1)
    np.testing.assert_allclose(_np(mh.aggregate(g, "weights", weights=[0.5, 2.0]).direction),
                               [6.5, -1.0])


@pytest.mark.parametrize("name,options,match", [
    ("pcgard", {}, "unknown aggregator 'pcgard' \\(did you mean 'pcgrad'\\?\\)"),
    ("mgda", {"c": 1}, "aggregator 'mgda' has no option 'c'"),
    ("weights", {}, "needs weights="),
    ("weights", {"weights": [1.0]}, "1 entries but 2 heads"),
    ("cagrad", {"c": 1.0}, "c must be a number in \\[0.0, 1.0\\), got 1.0"),
    ("cagrad", {"rescale": 3}, "rescale must be 0, 1 or 2"),
    ("cagrad", {"solver": "slsqp"}, "solver must be 'auto', 'exact' or 'pgd'"),
    ("mgda", {"max_iter": 0}, "max_iter must be an integer"),
    ("mgda", {"solver": "fw"}, "solver must be 'auto', 'exact' or 'frank_wolfe'"),
])
def test_bad_aggregator_or_option_is_a_clear_error(name, options, match):
    with pytest.raises(ValueError, match=match):
        agg.get_aggregator(name, num_heads=2, **options)


def test_upgrad_head_limit_is_checked_early():
    with pytest.raises(ValueError, match="at most 12 heads"):
        agg.get_aggregator("upgrad", num_heads=13)


@pytest.mark.parametrize("g", [
    np.array([[1.0, 2.0, 0.0], [1.0, 2.0, 0.0], [0.0, 1.0, 1.0]], np.float32),   # duplicate heads
    np.array([[1.0, 0.0], [2.0, 0.0], [0.0, 1.0]], np.float32),                  # parallel heads
    np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, 2.0]], np.float32),     # K > dimensions
])
def test_imtl_on_singular_systems_still_gives_equal_projections(g):
    """D U^T is singular here (IMTL-G's closed form has no inverse); the aggregate is the
    least-squares solution: finite, and with equal projections on every unit gradient
    wherever such a direction exists (all three cases have one)."""
    direction = _np(mh.aggregate(g, "imtl").direction)
    assert np.all(np.isfinite(direction))
    unit = g / np.linalg.norm(g, axis=1, keepdims=True)
    projections = unit @ direction
    np.testing.assert_allclose(projections, projections[0], rtol=1e-4, atol=1e-5)
