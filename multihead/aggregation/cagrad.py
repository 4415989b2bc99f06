"""CAGrad (Liu et al., "Conflict-Averse Gradient Descent for Multi-task Learning", NeurIPS 2021)."""

from __future__ import annotations


import numpy as np
import tensorflow as tf

from multihead.aggregation._numerics import _as_gram, _feasibility_tol, _k, _no_projection, _quadratic_forms, _ridge
from multihead.aggregation.base import GramianWeighting, Weighting, check_number, check_one_of
from multihead.aggregation.solvers import UPGRAD_MAX_HEADS, _face_systems, _faces, _project_simplex

def _cagrad_exact(g: tf.Tensor, b: tf.Tensor, radius: tf.Tensor) -> tf.Tensor:
    """`argmin_{w in simplex} b.w + radius sqrt(w^T g w)` by enumerating the simplex's faces.

    Where `g_w != 0` the objective is smooth and, on the support S of the optimum,
    `b_S + (radius / t) g_SS w_S = mu 1` with `t = |g_w|` and `1.w = 1`. With
    `a = g_SS^-1 1`, `c = g_SS^-1 b_S`, `A = 1.a`, `C = 1.c`, `B = b_S.c` this gives
    `w = (mu a - c) / sqrt(D)`, `D = C^2 - A (B - radius^2)`, `mu = (C + sqrt(D)) / A`.
    Where `g_w = 0` (0 in the hull), every such w is optimal (F = 0), the min-norm
    point among them; the faces' min-norm candidates `a / 1.a` (as in `simplex_qp`)
    cover it. The best feasible candidate of all is the optimum.
    """
    k = _k(g)
    dtype = g.dtype
    masks = _faces(k, dtype)                                               # (S, K)
    rhs = tf.stack([masks, masks * b[None, :]], axis=2)                    # (S, K, 2)
    sol = tf.linalg.solve(_face_systems(g + _ridge(dtype, k) * tf.eye(k, dtype=dtype), masks), rhs)
    a, c = sol[:, :, 0], sol[:, :, 1]
    a_sum, c_sum = tf.reduce_sum(a, 1), tf.reduce_sum(c, 1)
    b_c = tf.reduce_sum(masks * b[None, :] * c, 1)
    disc = c_sum**2 - a_sum * (b_c - radius**2)
    root = tf.sqrt(tf.maximum(disc, 1e-30))
    mu = (c_sum + root) / a_sum
    # Smooth KKT points, then the min-norm candidates (from the same solve).
    w = tf.concat([(mu[:, None] * a - c) / root[:, None], a / a_sum[:, None]], axis=0)
    feasible = (tf.reduce_all(tf.math.is_finite(w), axis=1)
                & tf.reduce_all(w >= -_feasibility_tol(dtype), axis=1))
    feasible &= tf.concat([disc > 0, tf.ones_like(disc > 0)], axis=0)
    w = tf.where(feasible[:, None], tf.maximum(w, 0.0), tf.constant(1.0 / k, dtype))
    norms = tf.sqrt(tf.maximum(_quadratic_forms(w, g), 0.0))
    objective = tf.where(feasible, tf.reduce_sum(w * b, axis=1) + radius * norms,
                         tf.constant(np.inf, dtype))
    return tf.gather(w, tf.argmin(objective, output_type=tf.int32))


def _cagrad_pgd(g: tf.Tensor, b: tf.Tensor, radius: tf.Tensor, max_iter: int,
                tol: float) -> tf.Tensor:
    """The same problem by projected gradient descent on the simplex (any K)."""
    k = _k(g)
    dtype = g.dtype
    lipschitz = tf.reduce_max(tf.linalg.eigvalsh(g)) + 1e-12
    eps = 1e-10

    def body(i: tf.Tensor, w: tf.Tensor, change: tf.Tensor):
        gw = tf.linalg.matvec(g, w)
        norm = tf.sqrt(tf.maximum(tf.tensordot(w, gw, 1), 0.0) + eps)
        grad = b + radius * gw / norm
        # 1/L for the smooth part; the sqrt term's curvature is at most radius * L / norm.
        step = 1.0 / (lipschitz * (1.0 + radius / norm))
        new = _project_simplex(w - step * grad)
        return i + 1, new, tf.reduce_sum(tf.abs(new - w))

    _, w, _ = tf.while_loop(
        lambda i, w, change: tf.logical_and(i < max_iter, change >= tol),
        body, (tf.constant(0), tf.fill([k], tf.constant(1.0 / k, dtype)),
               tf.constant(np.inf, dtype)),
    )
    return w


def cagrad_weighting(gram: tf.Tensor, c: float = 0.4, rescale: int = 1, solver: str = "auto",
                     max_iter: int = 200, tol: float = 1e-7) -> Weighting:
    """CAGrad (Liu et al., NeurIPS 2021): the best worst-case improvement near the mean.

    With `g0 = mean_k g_k` and `phi = c^2 |g0|^2`, solve the dual
    `min_{w in simplex} F(w) = g_w . g0 + sqrt(phi) |g_w|`, `g_w = w @ G`, and
    return `d = g0 + (sqrt(phi) / |g_w|) g_w`, divided by `1 + c^2` when
    `rescale == 1` or by `1 + c` when `rescale == 2` (the authors' code, default 1).
    The authors solve the dual with SciPy's SLSQP; here `solver="exact"` solves
    its KKT conditions on every face of the simplex in one batched solve
    (K <= UPGRAD_MAX_HEADS), `"pgd"` runs projected gradient descent (any K,
    `max_iter` steps at most, stopping when a step moves `w` by less than
    `tol`), and `"auto"` picks exact when it can.

    Args:
        gram: `K x K` Gramian.
        c: the conflict-aversion radius, in `[0, 1)`; 0 gives the mean.
        rescale: 0, 1 or 2 as above.
        solver: `"auto"`, `"exact"` or `"pgd"`.
        max_iter, tol: of the `"pgd"` solver.
    """
    k = _k(gram)
    gram = _as_gram(gram)
    dtype = gram.dtype
    mean = tf.fill([k], tf.constant(1.0 / k, dtype))
    if c == 0:
        return Weighting(mean, _no_projection())
    scale = tf.reduce_max(tf.linalg.diag_part(gram))
    g = tf.math.divide_no_nan(gram, scale)             # argmin is scale invariant
    b = tf.reduce_mean(g, axis=1)                       # G g0 in Gramian form
    g0_norm = tf.sqrt(tf.maximum(tf.reduce_mean(b), 0.0) + 1e-24)
    radius = c * g0_norm
    if solver == "exact" or (solver == "auto" and k <= UPGRAD_MAX_HEADS):
        w = _cagrad_exact(g, b, radius)
    else:
        w = _cagrad_pgd(g, b, radius, max_iter, tol)
    gw_norm = tf.sqrt(tf.maximum(tf.tensordot(w, tf.linalg.matvec(g, w), 1), 0.0))
    weights = mean + tf.math.divide_no_nan(radius, gw_norm) * w
    if rescale == 1:
        weights /= 1.0 + c**2
    elif rescale == 2:
        weights /= 1.0 + c
    return Weighting(weights, _no_projection())


class CAGrad(GramianWeighting):
    """CAGrad: the best worst-case improvement within `c |g0|` of the mean `g0`
    (`cagrad_weighting`).

    Args:
        c: the conflict-aversion radius, in `[0, 1)`; 0 gives the mean. Default 0.5,
            LibMTL's `calpha` (the authors' code takes it per experiment).
        rescale: 0, 1 or 2 (divide by 1, `1 + c^2` or `1 + c`).
        solver: `"auto"`, `"exact"` or `"pgd"`.
        max_iter, tol: of the `"pgd"` solver.
    """

    name = "cagrad"
    citation = "Liu et al., NeurIPS 2021"

    def __init__(self, c: float = 0.5, rescale: int = 1, solver: str = "auto",
                 max_iter: int = 200, tol: float = 1e-7) -> None:
        check_number("cagrad", "c", c, 0.0, 1.0, closed_high=False)
        if rescale not in (0, 1, 2) or isinstance(rescale, bool):
            raise ValueError(f"aggregator 'cagrad': rescale must be 0, 1 or 2, got {rescale!r}")
        check_one_of("cagrad", "solver", solver, ("auto", "exact", "pgd"))
        check_number("cagrad", "max_iter", max_iter, 1, integer=True)
        check_number("cagrad", "tol", tol, 0.0)
        self._options = {"c": c, "rescale": rescale, "solver": solver, "max_iter": max_iter,
                         "tol": tol}

    def weigh(self, gram: tf.Tensor, **draws: tf.Tensor) -> Weighting:
        return cagrad_weighting(gram, **self._options)
