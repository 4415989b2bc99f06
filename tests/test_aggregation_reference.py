"""Every gradient aggregator against a numpy/SciPy implementation written from its paper.

Each reference works on the K x D gradient matrix itself (vectors, not Gramians) and, for
the methods defined by a quadratic program, solves it with SciPy's exact NNLS (Lawson &
Hanson's active-set algorithm). The error is relative to the reference direction's norm
(floored at 1e-3 of the largest gradient's, for directions that are 0 by definition):
1e-5 at float64; 1e-4 at float32 (the reference then runs at float64 on the float32 input)
times `max(1, cond(G)^2 / 300)`: the step hands the aggregator a float32 Gramian, whose
rounding (~6e-8 relative) moves the answer of a Gramian-based solve by up to cond(G)^2
times as much, whatever the solver. Degenerate inputs (cond = inf) are compared at float64
and checked finite at float32.
"""

import functools

import numpy as np
import pytest
import scipy.optimize
import tensorflow as tf

import multihead as mh
from multihead.aggregation import aggregators as agg

KS = range(2, 9)
MATRICES_PER_K = 20
TOL = {"float64": 1e-5, "float32": 1e-4}


# -- references, from the papers -------------------------------------------------------------


def ref_mgda(g):
    """Min-norm point of the convex hull of the rows (Sener & Koltun 2018), exactly: the dual of
    the least-distance program min |z| s.t. G z >= 1 is the NNLS min_{u >= 0} |[G^T; 1^T] u - e|
    (Lawson & Hanson 1974, ch. 23); the hull's min-norm point is proportional to G^T u."""
    k, d = g.shape
    norms = np.linalg.norm(g, axis=1)
    if np.any(norms <= np.finfo(float).eps * max(norms.max(), 1e-300)):
        zero = norms <= np.finfo(float).eps * max(norms.max(), 1e-300)
        return zero / zero.sum()
    scale = norms.max()
    e = np.zeros(d + 1)
    e[-1] = 1.0
    u, _ = scipy.optimize.nnls(np.vstack([g.T / scale, np.ones((1, k))]), e, maxiter=50 * k)
    return u / u.sum()


def _project(g, reg, lower):
    """argmin_{v >= lower} v^T Q v, Q = G G^T / tr + reg I = A A^T with A = [G / sqrt(tr), sqrt(reg) I]:
    v = lower + y, y = NNLS min_{y >= 0} |A^T y + A^T lower| (exact)."""
    k = len(g)
    tr = np.sum(g * g)
    a = np.hstack([g / np.sqrt(tr) if tr >= 1e-4 else np.zeros_like(g), np.sqrt(reg) * np.eye(k)])
    y, _ = scipy.optimize.nnls(a.T, -a.T @ lower, maxiter=50 * k)
    return lower + y


def ref_upgrad(g, reg=1e-4):
    """Quinton & Rey 2024: the mean over i of argmin_{v >= e_i} v^T Q v (torchjd's normalisation)."""
    return np.mean([_project(g, reg, np.eye(len(g))[i]) for i in range(len(g))], axis=0)


def ref_dualproj(g, reg=1e-4):
    """torchjd's DualProj: the mean weights 1/K projected, argmin_{v >= 1/K} v^T Q v."""
    return _project(g, reg, np.full(len(g), 1.0 / len(g)))


def ref_imtl(g):
    """Liu et al. 2021, IMTL-G closed form on the nonzero rows: alpha_{2..} = g_1 U^T (D U^T)^-1."""
    norms = np.linalg.norm(g, axis=1)
    keep = norms > np.finfo(float).eps * norms.max()
    alpha = np.zeros(len(g))
    if keep.sum() == 0:
        return np.full(len(g), 1.0 / len(g))
    h = g[keep]
    u = h / np.linalg.norm(h, axis=1, keepdims=True)
    if len(h) == 1:
        a = np.ones(1)
    else:
        rest = h[0] @ (u[0] - u[1:]).T @ np.linalg.inv((h[0] - h[1:]) @ (u[0] - u[1:]).T)
        a = np.concatenate([[1 - rest.sum()], rest])
    alpha[keep] = a
    return alpha


def ref_pcgrad(g):
    """Yu et al. 2020, Algorithm 1 in the fixed order 0..K-1, on vectors."""
    out = []
    for i in range(len(g)):
        gi = g[i].copy()
        for j in range(len(g)):
            if j != i and gi @ g[j] < 0:
                gi -= (gi @ g[j]) / (g[j] @ g[j]) * g[j]
        out.append(gi)
    return np.sum(out, axis=0)


def ref_cagrad(g, c=0.4):
    """Liu et al. 2021, the authors' code: SLSQP on the dual, then rescale=1."""
    k = len(g)
    gram = g @ g.T
    g0 = g.mean(axis=0)
    sqrt_phi = c * np.linalg.norm(g0)
    b = gram.mean(axis=1)
    res = min((scipy.optimize.minimize(
        lambda w: w @ b + sqrt_phi * np.sqrt(w @ gram @ w + 1e-30), x0, method="SLSQP",
        bounds=[(0, 1)] * k, constraints=[{"type": "eq", "fun": lambda w: w.sum() - 1}],
        options={"ftol": 1e-16, "maxiter": 2000}) for x0 in [np.full(k, 1 / k)] + list(np.eye(k))),
        key=lambda r: r.fun)
    gw = res.x @ g
    return (g0 + sqrt_phi / np.linalg.norm(gw) * gw) / (1 + c**2)


def ref_aligned_mtl(g, scale_mode="min"):
    """Senushkin et al. 2023 (the authors' ProcrustesSolver): B = sqrt(sigma) V L^-1/2 V^T on the
    Gramian's rank, update = sum of the aligned gradients."""
    gram = g @ g.T
    lam, v = np.linalg.eigh(gram)
    kept = lam > lam.max() * len(g) * np.finfo(float).eps
    if not kept.any():
        return np.zeros(len(g))
    lam, v = lam[kept], v[:, kept]
    sigma = {"min": lam.min(), "median": np.sort(lam)[(len(lam) - 1) // 2],
             "rmse": lam.mean()}[scale_mode]
    b = np.sqrt(sigma) * (v / np.sqrt(lam)) @ v.T
    return b.sum(axis=1)


def ref_config(g):
    """Liu et al. 2025 / torchjd ConFIG: x = pinv(units) 1, d = (sum_k g_k . x / |x|^2) x."""
    norms = np.linalg.norm(g, axis=1, keepdims=True)
    units = np.where(norms > 0, g / np.where(norms > 0, norms, 1), 0)
    x = np.linalg.pinv(units, rcond=1e-10) @ np.ones(len(g))
    return (np.sum(g @ x) / (x @ x)) * x if x @ x > 0 else np.zeros(g.shape[1])


def ref_krum(g, f=1, m=2):
    """Blanchard et al. 2017: score_i = sum of squared distances to the K - f - 2 nearest others;
    mean of the m lowest scores."""
    k = len(g)
    dist = ((g[:, None, :] - g[None, :, :]) ** 2).sum(-1)
    scores = [np.sort(np.delete(dist[i], i))[:max(k - f - 2, 1)].sum() for i in range(k)]
    chosen = np.argsort(scores, kind="stable")[:min(m, k)]
    return np.mean(g[chosen], axis=0)


# method -> (options, reference returning weights (w) or a direction (d))
METHODS = {
    "mean": ({}, "w", lambda g: np.full(len(g), 1 / len(g))),
    "pcgrad": ({}, "d", ref_pcgrad),
    "mgda": ({"solver": "exact"}, "w", ref_mgda),
    "cagrad": ({"c": 0.4, "solver": "exact"}, "d", ref_cagrad),
    "upgrad": ({}, "w", ref_upgrad),
    "upgrad_reg0": ({"reg": 0.0}, "w", functools.partial(ref_upgrad, reg=0.0)),
    "dualproj": ({}, "w", ref_dualproj),
    "imtl": ({}, "w", ref_imtl),
    "aligned_mtl": ({"scale_mode": "min"}, "w", ref_aligned_mtl),
    "aligned_mtl_median": ({"scale_mode": "median"}, "w",
                           functools.partial(ref_aligned_mtl, scale_mode="median")),
    "aligned_mtl_rmse": ({"scale_mode": "rmse"}, "w",
                         functools.partial(ref_aligned_mtl, scale_mode="rmse")),
    "config": ({}, "d", ref_config),
    "krum": ({"n_byzantine": 1, "n_selected": 2}, "d", ref_krum),
}


@functools.lru_cache(maxsize=None)
def _compiled(method, k, dtype):
    options, _, _ = METHODS[method]
    name = method.split("_reg0")[0]
    name = name if name in agg.AGGREGATORS else name.rsplit("_", 1)[0]
    aggregator = agg.get_aggregator(name, num_heads=k, **options)
    sig = [tf.TensorSpec([k, k], getattr(tf, dtype))]
    return tf.function(lambda gram: aggregator(gram).weights, input_signature=sig)


def _direction(method, g, dtype):
    g = g.astype(dtype)
    gram = tf.constant(g @ g.T if dtype == "float64" else (tf.matmul(g, g, transpose_b=True)))
    w = _compiled(method, len(g), dtype)(gram).numpy().astype(np.float64)
    assert np.all(np.isfinite(w)), (method, w)
    return w @ g.astype(np.float64)


def _reference(method, g):
    _, kind, ref = METHODS[method]
    out = ref(g.astype(np.float64))
    return out @ g if kind == "w" else out


def _check(method, g, dtype, tol=None):
    g = g.astype(dtype).astype(np.float64)
    if tol is None:
        tol = TOL[dtype]
        if dtype == "float32":
            sv = np.linalg.svd(g, compute_uv=False)
            tol *= max(1.0, (sv[0] / sv[-1]) ** 2 / 300)
    got = _direction(method, g, dtype)
    want = _reference(method, g)
    floor = 1e-3 * np.linalg.norm(g, axis=1).max() if np.any(g) else 1.0
    err = np.linalg.norm(got - want) / max(np.linalg.norm(want), floor)
    assert err <= tol, f"{method} {dtype} K={len(g)}: relative error {err:.2e} > {tol:.1e}"


def _random(k, seed):
    rng = np.random.default_rng(1000 * k + seed)
    d = int(rng.integers(k, 3 * k + 1))
    g = rng.standard_normal((k, d))
    if seed % 2:  # strong conflicts
        g[1] = -0.8 * g[0] + 0.3 * rng.standard_normal(d)
    return g


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("method", list(METHODS))
def test_equals_reference_on_random_gradients(method, dtype):
    for k in KS:
        if method == "krum" and k < 4:
            continue
        for seed in range(MATRICES_PER_K):
            _check(method, _random(k, seed), dtype)


def _degenerate(k):
    rng = np.random.default_rng(k)
    v, u = rng.standard_normal(6), rng.standard_normal(6)
    g = rng.standard_normal((k, 6))
    zero_row = g.copy()
    zero_row[k // 2] = 0.0
    duplicate = g.copy()
    duplicate[-1] = duplicate[0]
    collinear = np.stack([(-2.0) ** i * v for i in range(k)])
    wide = rng.standard_normal((k, max(k - 2, 1)))          # more heads than dimensions
    return {"zero_row": zero_row, "duplicate": duplicate, "collinear": collinear,
            "wide": wide, "all_zero": np.zeros((k, 6)), "two_directions": np.stack(
                [v if i % 2 else u for i in range(k)])}


# Degenerate inputs where the method's answer is unique (the aggregate direction).
UNIQUE = {
    "mgda": ["zero_row", "duplicate", "collinear", "wide", "all_zero", "two_directions"],
    "upgrad": ["zero_row", "duplicate", "collinear", "wide", "all_zero", "two_directions"],
    "upgrad_reg0": ["zero_row", "duplicate", "collinear", "wide", "all_zero", "two_directions"],
    "dualproj": ["zero_row", "duplicate", "collinear", "wide", "all_zero", "two_directions"],
    "imtl": ["zero_row", "all_zero"],
    "pcgrad": ["zero_row", "duplicate", "collinear", "wide", "all_zero", "two_directions"],
    "aligned_mtl": ["zero_row", "duplicate", "collinear", "wide", "all_zero", "two_directions"],
    # Opposite unit gradients: pinv(U) 1 = 0 and d = (sum g.x / |x|^2) x is 0/0.
    "config": ["zero_row", "duplicate", "all_zero", "two_directions"],
    "krum": ["zero_row", "duplicate", "collinear", "wide", "all_zero"],
}


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("method", list(METHODS))
def test_degenerate_gradients_never_raise_or_give_nan(method, dtype):
    for k in KS:
        if method == "krum" and k < 4:
            continue
        for case, g in _degenerate(k).items():
            got = _direction(method, g, dtype)   # asserts finite weights
            assert np.all(np.isfinite(got)), (method, case, k)
            if dtype == "float64" and case in UNIQUE.get(method, []):
                _check(method, g, dtype, tol=10 * TOL[dtype])


@pytest.mark.parametrize("method", ["mgda", "upgrad_reg0", "upgrad", "dualproj", "imtl"])
def test_exact_at_a_1e4_spread_of_gradient_norms(method):
    for k in KS:
        for seed in range(5):
            g = _random(k, seed)
            g *= np.logspace(0, 4, k)[np.random.default_rng(seed).permutation(k)][:, None]
            _check(method, g, "float64")


def test_mgda_at_a_1e4_spread_agrees_with_the_exact_qp_to_1e_6():
    for k in (2, 3, 5, 8):
        for seed in range(5):
            g = _random(k, seed) * np.logspace(0, 4, k)[:, None]
            w = mh.aggregate(g, "mgda", dtype="float64").weights.numpy()
            expected = ref_mgda(g)
            got, want = w @ g, expected @ g
            assert np.linalg.norm(got - want) <= 1e-6 * np.linalg.norm(want)
            # and it is the optimum: d.g_k >= |d|^2 for every k (KKT of the min-norm point)
            assert np.all(g @ got >= (got @ got) * (1 - 1e-6))


def test_mgda_exact_solver_is_exact_at_a_100x_spread():
    """The defect of issue 17: with a fixed ridge after normalising by the largest diagonal
    entry, a 100x spread was off by ~7e-4."""
    rng = np.random.default_rng(0)
    g = rng.standard_normal((3, 10))
    g[0] *= 100.0
    for dtype, tol in (("float64", 1e-10), ("float32", 1e-4)):
        got = mh.aggregate(g, "mgda", dtype=dtype).direction.numpy()
        want = ref_mgda(g) @ g
        assert np.linalg.norm(got - want) <= tol * np.linalg.norm(want)


@pytest.mark.parametrize("k", [2, 3, 5, 8])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_imtl_with_a_zero_row_is_imtl_on_the_other_rows(k, dtype):
    g = _random(k + 1, 3)
    with_zero = np.insert(g, 1, 0.0, axis=0)
    a = mh.aggregate(with_zero, "imtl", dtype=dtype)
    b = mh.aggregate(g, "imtl", dtype=dtype)
    np.testing.assert_allclose(a.direction.numpy(), b.direction.numpy(),
                               rtol=TOL[dtype], atol=TOL[dtype] * np.abs(g).max())
    assert float(a.weights[1]) == 0.0


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_upgrad_with_zero_reg_on_dependent_gradients(dtype):
    """reg=0 used to fail the step with 'Input matrix is not invertible'."""
    v = np.array([1.0, 2.0, -1.0])
    g = np.stack([v, v, 2 * v, np.array([0.0, 1.0, 1.0])])
    d = mh.aggregate(g, "upgrad", reg=0.0, dtype=dtype).direction.numpy()
    assert np.all(np.isfinite(d))
    assert np.all(g @ d >= -1e-5 * np.abs(g).max() ** 2)     # conflicts with no head


def test_float64_is_the_default_float32_computed_more_precisely():
    g = _random(4, 1)
    w32 = mh.aggregate(g, "upgrad").weights
    w64 = mh.aggregate(g, "upgrad", dtype="float64").weights
    assert w32.dtype == tf.float32 and w64.dtype == tf.float64
    np.testing.assert_allclose(w32.numpy(), w64.numpy(), rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="dtype must be 'float32' or 'float64'"):
        mh.aggregate(g, "mean", dtype="int32")
