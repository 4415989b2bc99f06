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
from multihead import aggregation as agg
from multihead.aggregation import coordinatewise, solvers

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


def test_mgda_active_set_solver_agrees_with_the_exact_qp_to_1e_6_at_any_k():
    """Above 8 heads MGDA's exact solve is Wolfe's active-set method (the face enumeration's
    2^K systems cost more there); it is checked at small K too, called directly."""
    for k in (3, 8, 9, 16):
        for seed in range(4):
            g = _random(k, seed)
            if seed >= 2:  # a 1e4x spread of the gradient norms
                g = g * np.logspace(0, 4, k)[np.random.default_rng(seed).permutation(k)][:, None]
            if k <= 8:
                w = solvers.simplex_qp_active_set(tf.constant(g @ g.T)).numpy()
            else:
                w = mh.aggregate(g, "mgda", dtype="float64").weights.numpy()
            got, want = w @ g, ref_mgda(g) @ g
            assert np.all(w >= 0) and abs(w.sum() - 1) < 1e-12
            assert np.linalg.norm(got - want) <= 1e-6 * np.linalg.norm(want), (k, seed)
    for k in (5, 13):
        for case, g in _degenerate(k).items():
            if k <= 8:
                weights = solvers.simplex_qp_active_set(tf.constant(g @ g.T)).numpy()
            else:
                weights = mh.aggregate(g, "mgda", dtype="float64", solver="exact").weights.numpy()
            assert np.all(np.isfinite(weights)), (k, case)
            got, want = weights @ g, ref_mgda(g) @ g
            floor = 1e-3 * np.linalg.norm(g, axis=1).max() if np.any(g) else 1.0
            assert np.linalg.norm(got - want) <= 1e-5 * max(np.linalg.norm(want), floor), (k, case)
    # float32 in the step: as exact as the float32 Gramian allows (the module's rule).
    g32 = _random(16, 1).astype(np.float32).astype(np.float64)
    got = mh.aggregate(g32, "mgda").direction.numpy()
    sv = np.linalg.svd(g32, compute_uv=False)
    want = ref_mgda(g32) @ g32
    tol = TOL["float32"] * max(1.0, (sv[0] / sv[-1]) ** 2 / 300)
    assert np.linalg.norm(got - want) <= tol * np.linalg.norm(want)


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


# -- stateful, random and coordinate-wise aggregators --------------------------------------------
#
# Each reference carries its own state from step to step; the aggregator's state goes in and out
# as tensors. A sequence of STEPS gradient matrices (the same matrix perturbed) is checked step by
# step, so a state carried wrongly shows at the second step.

STEPS = 3


def _bargaining_ref(g, alpha):
    """Navon et al. 2022 (alpha = 1) / Ban & Ji 2024: w > 0 with (G G^T w)_i = w_i^(-1/alpha), by
    SciPy's least_squares as the FairGrad authors (tight tolerances), on the nonzero rows."""
    norms = np.linalg.norm(g, axis=1)
    keep = norms > np.finfo(float).eps * max(norms.max(), 1e-300)
    w = np.zeros(len(g))
    if not keep.any():
        return w
    gram = g[keep] @ g[keep].T
    start = np.diag(gram) ** (-0.5 * alpha / (1 + alpha) - 0.5 / (1 + alpha))  # orthogonal case
    res = scipy.optimize.least_squares(lambda x: gram @ x - x ** (-1.0 / alpha), start,
                                       bounds=(0, np.inf), xtol=1e-15, ftol=1e-15, gtol=1e-15,
                                       x_scale="jac", max_nfev=10000)
    w[keep] = res.x
    return w


def ref_nash_mtl(g, state, update_weights_every=1, max_norm=1.0):
    step, alpha = state
    if step % update_weights_every == 0:
        alpha = _bargaining_ref(g, 1.0)
    d = alpha @ g
    norm = np.linalg.norm(d)
    scale = max_norm / (norm + 1e-6) if max_norm > 0 and max_norm / (norm + 1e-6) < 1 else 1.0
    return scale * d, (step + 1, alpha)


def ref_gradvac(g, rho_t, beta=0.5):
    """LibMTL's current GradVac (whole model, after its commit d2d84fa: the goal moves for
    every visited pair), heads in the fixed order 0..K-1."""
    k = len(g)
    rho_t = rho_t.copy()
    pc = g.copy()
    for i in range(k):
        for j in range(k):
            if j == i:
                continue
            rho = pc[i] @ g[j] / (np.linalg.norm(pc[i]) * np.linalg.norm(g[j]) + 1e-8)
            if rho < rho_t[i, j]:
                w = (np.linalg.norm(pc[i]) * (rho_t[i, j] * np.sqrt(1 - rho**2)
                                              - rho * np.sqrt(1 - rho_t[i, j] ** 2))
                     / (np.linalg.norm(g[j]) * np.sqrt(1 - rho_t[i, j] ** 2) + 1e-8))
                pc[i] = pc[i] + w * g[j]
            rho_t[i, j] = (1 - beta) * rho_t[i, j] + beta * rho
    return pc.sum(axis=0), rho_t


def _simplex_projection(v):
    u = np.sort(v)[::-1]
    css = np.cumsum(u)
    rho = np.nonzero(u * np.arange(1, len(v) + 1) > css - 1)[0][-1]
    return np.maximum(v - (css[rho] - 1) / (rho + 1), 0)


def ref_sdmgrad(g, w, lmbda=0.3, niter=20, gram=None):
    """LibMTL's SDMGrad with one batch for its three gradient samples (`gram`: G G^T as given)."""
    gg = g @ g.T if gram is None else gram
    scale = np.mean(np.sqrt(np.maximum(np.diag(gg), 0)))
    gg = gg / (scale**2 + 1e-8)
    gg_mean = gg.mean(axis=1)
    buf = None
    for _ in range(niter):
        grad = gg @ w + lmbda * gg_mean
        buf = grad if buf is None else 0.5 * buf + grad
        w = _simplex_projection(w - 5 * buf)
    return (w @ g + lmbda * g.mean(axis=0)) / (1 + lmbda), w


def ref_graddrop(g, u, leak=0.0):
    """Chen et al. 2020, per coordinate: purity P, keep the sign that wins the draw U."""
    p = 0.5 * (1 + g.sum(0) / (np.abs(g).sum(0) + 1e-7))
    keep = ((p > u) & (g > 0)) | ((p < u) & (g < 0))
    return ((leak + (1 - leak) * keep) * g).sum(0)


def ref_trimmed_mean(g, t):
    return np.sort(g, axis=0)[t:len(g) - t].mean(axis=0)


def _sequence(k, seed):
    g = _random(k, seed)
    rng = np.random.default_rng(seed)
    return [g + 0.3 * s * rng.standard_normal(g.shape) for s in range(STEPS)]


@functools.lru_cache(maxsize=None)
def _stateful_fn(name, k, dtype, options):
    aggregator = agg.get_aggregator(name, num_heads=k, **dict(options))
    if not aggregator.state_spec():   # stateless (FairGrad): the same harness, no state
        return tf.function(lambda gram, state: aggregator(gram)._replace(state={})), aggregator
    return tf.function(lambda gram, state: aggregator(gram, state=state)), aggregator


def _run_stateful(name, options, seq, dtype):
    """Our directions along a sequence, the state carried as tensors."""
    fn, aggregator = _stateful_fn(name, len(seq[0]), dtype, tuple(sorted(options.items())))
    state = {key: tf.cast(v, dtype) if v.dtype.kind == "f" else tf.constant(v)
             for key, v in aggregator.initial_state(len(seq[0])).items()}
    out = []
    for g in seq:
        g = g.astype(dtype)
        result = fn(tf.matmul(g, g, transpose_b=True), state)
        state = result.state
        w = result.weights.numpy().astype(np.float64)
        assert np.all(np.isfinite(w)), (name, w)
        out.append(w @ g.astype(np.float64))
    return out


def _run_reference(name, options, seq):
    k = len(seq[0])
    out = []
    if name == "nash_mtl":
        state = (0, np.ones(k))
        for g in seq:
            d, state = ref_nash_mtl(g, state, **options)
            out.append(d)
    elif name == "fairgrad":
        out = [_bargaining_ref(g, options.get("alpha", 1.0)) @ g for g in seq]
    elif name == "gradvac":
        rho_t = np.zeros((k, k))
        for g in seq:
            d, rho_t = ref_gradvac(g, rho_t, **options)
            out.append(d)
    elif name == "sdmgrad":
        w = np.full(k, 1.0 / k)
        for g in seq:
            d, w = ref_sdmgrad(g, w, **options)
            out.append(d)
    return out


def _close(got, want, g, tol):
    floor = 1e-3 * np.linalg.norm(g, axis=1).max() if np.any(g) else 1.0
    err = np.linalg.norm(got - want) / max(np.linalg.norm(want), floor)
    return err <= tol, err


STATEFUL = {
    "nash_mtl": {}, "nash_mtl_every2": {"update_weights_every": 2, "max_norm": 0.0},
    "fairgrad": {"alpha": 1.0}, "fairgrad_alpha2": {"alpha": 2.0},
    "gradvac": {}, "sdmgrad": {},
}


# The full sweep (20 sequences per K) is slow (~4 min on 2 loaded cores); the fast suite runs 2.
SWEEP = [pytest.param(MATRICES_PER_K, marks=pytest.mark.slow), 2]


@pytest.mark.parametrize("count", SWEEP)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("method", list(STATEFUL))
def test_stateful_methods_equal_reference_along_sequences(method, dtype, count):
    name = method.split("_every")[0].split("_alpha")[0]
    options = STATEFUL[method]
    for k in KS:
        for seed in range(count):
            seq = [g.astype(dtype).astype(np.float64) for g in _sequence(k, seed)]
            tol = TOL[dtype]
            if dtype == "float32" and name in ("nash_mtl", "fairgrad"):
                # A float32 Gramian moves a solve's answer by up to cond(G)^2 x its rounding.
                sv = np.linalg.svd(seq[0], compute_uv=False)
                tol *= max(1.0, (sv[0] / sv[-1]) ** 2 / 300)
            if name == "sdmgrad":
                _check_sdmgrad_step_by_step(seq, dtype, k, seed)
                continue
            for step, (got, want) in enumerate(zip(_run_stateful(name, options, seq, dtype),
                                                   _run_reference(name, options, seq))):
                ok, err = _close(got, want, seq[step], tol)
                assert ok, f"{method} {dtype} K={k} seed={seed} step={step}: {err:.2e} > {tol:.1e}"


def _check_sdmgrad_step_by_step(seq, dtype, k, seed):
    """SDMGrad's projected SGD (learning rate 5) amplifies rounding ~1e4-fold per call (a 1e-14
    perturbation of G moves the third step's direction by 4e-4), so each step starts from the
    reference's state; the state we return must be the reference's next state."""
    fn, _ = _stateful_fn("sdmgrad", k, dtype, ())
    w = np.full(k, 1.0 / k)
    for step, g in enumerate(seq):
        g32 = g.astype(dtype)
        gram = tf.matmul(g32, g32, transpose_b=True)
        result = fn(gram, {"w": tf.constant(w, dtype)})
        tol = TOL[dtype]
        # At float32 the reference gets the same float32 Gramian: a rounding of G G^T moves
        # SDMGrad's answer by up to ~1e-2 (its projected steps jump between faces).
        w = w.astype(dtype).astype(np.float64)     # the state as we hold it
        want, w = ref_sdmgrad(g, w, gram=gram.numpy().astype(np.float64))
        got = result.weights.numpy().astype(np.float64) @ g
        ok, err = _close(got, want, g, tol)
        assert ok, f"sdmgrad {dtype} K={k} seed={seed} step={step}: {err:.2e}"
        np.testing.assert_allclose(result.state["w"].numpy(), w, atol=tol)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["nash_mtl", "fairgrad", "gradvac", "sdmgrad"])
def test_stateful_methods_on_degenerate_gradients(method):
    unique = {"nash_mtl": ["zero_row", "duplicate", "all_zero"],
              "fairgrad": ["zero_row", "duplicate", "all_zero"],
              "gradvac": list(_degenerate(2)), "sdmgrad": list(_degenerate(2))}[method]
    options = {"fairgrad": {"alpha": 1.0}}.get(method, {})
    for dtype in ("float64", "float32"):
        for k in KS:
            for case, g in _degenerate(k).items():
                got = _run_stateful(method, options, [g, g], dtype)   # asserts finite weights
                if dtype == "float64" and case in unique:
                    for d, want in zip(got, _run_reference(method, options, [g, g])):
                        ok, err = _close(d, want, g, 10 * TOL[dtype])
                        assert ok, f"{method} {case} K={k}: {err:.2e}"


@pytest.mark.parametrize("count", SWEEP)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_random_graddrop_and_trimmed_mean_equal_reference(dtype, count):
    cases = list(_degenerate(5).values())
    for k in KS:
        cases += [_random(k, seed) for seed in range(count)]
    for i, g in enumerate(cases):
        g = g.astype(dtype).astype(np.float64)
        rng = np.random.default_rng(i)
        z, u = rng.standard_normal(len(g)), rng.uniform(size=g.shape[1])
        w = mh.aggregate(g, "random", dtype=dtype, noise=z).weights.numpy()
        np.testing.assert_allclose(w, np.exp(z) / np.exp(z).sum(), rtol=TOL[dtype])
        for leak in (0.0, 0.3):
            got = mh.aggregate(g, "graddrop", dtype=dtype, noise=u, leak=leak).direction.numpy()
            want = ref_graddrop(g, u.astype(dtype).astype(np.float64), leak)
            np.testing.assert_allclose(got, want, rtol=TOL[dtype], atol=TOL[dtype] * np.abs(g).max())
        t = (len(g) - 1) // 2
        got = mh.aggregate(g, "trimmed_mean", dtype=dtype, trim_number=t).direction.numpy()
        np.testing.assert_allclose(got, ref_trimmed_mean(g, t), rtol=TOL[dtype],
                                   atol=TOL[dtype] * np.abs(g).max())


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_trimmed_mean_with_repeated_values_and_outliers_equals_sorting(dtype):
    # Values drawn from {-2, ..., 2}: most coordinates hold repeats at the trim boundaries,
    # where dropping "the t largest" must drop exactly t copies (sorting's answer), for every
    # t the sorting-free walk handles and beyond it (the sort fallback).
    for k in range(2, 18):
        g = np.random.default_rng(k).integers(-2, 3, (k, 200)).astype(dtype)
        g[:, 0] = 1.0                                           # every value equal
        for t in range(0, (k + 1) // 2):
            got = coordinatewise.trimmed_mean_combine(tf.constant(g), t).numpy()
            want = ref_trimmed_mean(g.astype(np.float64), min(t, (k - 1) // 2))
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=f"K={k} t={t}")
    # Outliers are dropped without touching the kept values' precision: 1e30 and inf rows
    # (a summed-then-subtracted mean would give 0 or nan here).
    g = np.array([[1e30, -np.inf], [1.0, 2.0], [1.5, 2.5], [2.0, 3.0], [-1e30, np.inf]], dtype)
    np.testing.assert_array_equal(coordinatewise.trimmed_mean_combine(tf.constant(g), 1).numpy(),
                                  np.array([1.5, 2.5], dtype))


def test_nash_mtl_weights_are_the_bargaining_solution_at_a_1e4_spread():
    for k in (2, 3, 5, 8):
        g = _random(k, 2) * np.logspace(0, 4, k)[:, None]
        w = mh.aggregate(g, "nash_mtl", dtype="float64", max_norm=0.0).weights.numpy()
        np.testing.assert_allclose(w * (g @ g.T @ w), 1.0, rtol=1e-8)   # alpha_i (G G^T alpha)_i = 1


@pytest.mark.parametrize("method", ["nash_mtl", "fairgrad", "gradvac", "sdmgrad"])
def test_stateful_methods_on_degenerate_gradients_fast(method):
    """The degenerate set at K = 3 and 6 (all K in the slow test): finite, and the defined
    answer where it is unique."""
    unique = ["zero_row", "all_zero"] + (["duplicate"] if method in ("nash_mtl", "fairgrad")
                                         else list(_degenerate(2)))
    for k in (3, 6):
        for case, g in _degenerate(k).items():
            got = _run_stateful(method, {}, [g, g], "float64")
            _run_stateful(method, {}, [g, g], "float32")
            if case in unique:
                for d, want in zip(got, _run_reference(method, {}, [g, g])):
                    ok, err = _close(d, want, g, 10 * TOL["float64"])
                    assert ok, f"{method} {case} K={k}: {err:.2e}"
