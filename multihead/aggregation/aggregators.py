"""Trunk gradient aggregators: pure functions of the heads' stacked trunk gradients.

Every aggregator here returns *weights* `w` (one per head) such that the trunk
update direction is `d = w @ G`, where `G` is the `K x D` matrix whose row `k`
is head `k`'s gradient with respect to the trunk. All of them (PCGrad's
projections included) are linear combinations of the rows of `G`, and every
weight depends on `G` only through its Gramian `G G^T` (`K x K`), as in
torchjd's "Gramian-based weightings". So the compiled step never concatenates
the `K x D` matrix: it sums per-variable Gramians, computes `w` on a `K x K`
matrix and combines each trunk variable's K gradients with `w`.

Weightings (`<name>_weighting(gram, ...) -> Weighting`):

* `sum_weighting`, `mean_weighting`, `fixed_weighting`: constant weights.
* `pcgrad_weighting`: Yu et al., "Gradient Surgery for Multi-Task Learning",
  NeurIPS 2020.
* `mgda_weighting`: Sener & Koltun, "Multi-Task Learning as Multi-Objective
  Optimization", NeurIPS 2018 (Frank-Wolfe min-norm point, their Algorithm 2).
* `cagrad_weighting`: Liu et al., "Conflict-Averse Gradient Descent for
  Multi-task Learning", NeurIPS 2021.
* `upgrad_weighting`, `dualproj_weighting`: Quinton & Rey, "Jacobian Descent
  for Multi-Objective Optimization", 2024 (arXiv:2406.16232), as torchjd.
* `imtl_weighting`: Liu et al., "Towards Impartial Multi-task Learning"
  (IMTL-G), ICLR 2021.
* `aligned_mtl_weighting`: Senushkin et al., "Independent Component Alignment
  for Multi-Task Learning", CVPR 2023.
* `config_weighting`: Liu et al., "ConFIG: Towards Conflict-free Training of
  Physics Informed Neural Networks", ICLR 2025.
* `krum_weighting`: Blanchard et al., "Machine Learning with Adversaries:
  Byzantine Tolerant Gradient Descent", NeurIPS 2017.

Three methods keep a running `K x D` copy of the gradients (a *buffer*) besides a
small state, and work on the gradients themselves, split in column blocks (one
per trunk variable in the step): `moco_update` (Fernando et al., ICLR 2023),
`db_mtl_update` (Lin et al., 2023) and `excess_mtl_update` (He et al., ICML 2024).

The weights have the Gramian's dtype: float32 in the step, float64 when the
Gramian is float64 (`aggregate(..., dtype="float64")`, for analysis).

`aggregate(grads, name, **options)` applies one of them to an explicit `K x D`
matrix; `get_aggregator(name, **options)` validates a name and its options once
(for the trainer and configs).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import numpy as np
import tensorflow as tf

#: Largest number of heads `upgrad` (and MGDA's exact solver) accepts: they solve
#: their small QPs exactly by enumerating the 2^K active sets in one batched solve.
UPGRAD_MAX_HEADS = 12


class Weighting(NamedTuple):
    """Result of a Gramian-based weighting.

    Attributes:
        weights: `(K,)`, the Gramian's dtype (float32 in the step, float64 for
            analysis); the aggregate is `weights @ G`.
        projections: int32 scalar, the number of gradient projections made
            (PCGrad's conflicting pairs; 0 for the other aggregators).
    """

    weights: tf.Tensor
    projections: tf.Tensor
    state: dict[str, tf.Tensor] | None = None


class Aggregation(NamedTuple):
    """Result of `aggregate`.

    Attributes:
        direction: `(D,)` the aggregated gradient `weights @ grads`.
        weights: `(K,)` per-head weights.
        projections: number of projections made (PCGrad), else 0.
        state: a stateful aggregator's new state (pass it as `state=` to the
            next call), else None.
    """

    direction: tf.Tensor
    weights: tf.Tensor | None
    projections: tf.Tensor
    state: dict[str, tf.Tensor] | None = None


def gramian(grads: tf.Tensor, dtype: tf.DType | str = tf.float32) -> tf.Tensor:
    """`G G^T` of a `K x D` gradient matrix (inner products of the heads' gradients)."""
    grads = tf.cast(tf.convert_to_tensor(grads), dtype)
    return tf.matmul(grads, grads, transpose_b=True)


def _as_gram(gram: tf.Tensor) -> tf.Tensor:
    """The Gramian as a float tensor: float64 stays float64 (analysis), anything else float32."""
    gram = tf.convert_to_tensor(gram)
    return gram if gram.dtype in (tf.float32, tf.float64) else tf.cast(gram, tf.float32)


def _eps(dtype: tf.DType) -> float:
    return float(np.finfo(dtype.as_numpy_dtype).eps)


def _ridge(dtype: tf.DType, k: int) -> float:
    """Ridge added to a unit-diagonal K x K system so that rounding never makes it indefinite:
    a few times the rounding error of its entries, so it moves a well-posed solution by about
    as much as rounding does (float32 ~2.4e-7 K, float64 ~4.4e-16 K)."""
    return 2.0 * k * _eps(dtype)


def _feasibility_tol(dtype: tf.DType) -> float:
    """How far below its bound an active-set candidate may fall and still count as feasible."""
    return 100.0 * _eps(dtype)


def _diagonal_scaling(gram: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """`(C, s, zero)`: `C = diag(s) gram diag(s)` with `s_i = 1 / |g_i|`, the cosine matrix.

    Solving on `C` instead of `gram` keeps every system's diagonal at 1 whatever the
    spread of the heads' gradient norms (a ridge added after dividing by the largest
    diagonal entry would swamp a head 1e4x smaller than the largest). `zero` flags rows
    whose norm is below rounding of the largest (`|g_i| <= eps |g|_max`, all rows when
    every gradient is 0); `s_i = 0` there, so their rows and columns of `C` are 0.
    """
    d = tf.linalg.diag_part(gram)
    eps = _eps(gram.dtype)
    zero = d <= eps**2 * tf.reduce_max(d)
    s = tf.where(zero, tf.zeros_like(d), tf.math.rsqrt(tf.where(zero, tf.ones_like(d), d)))
    return gram * s[:, None] * s[None, :], s, zero


def _k(gram: tf.Tensor) -> int:
    k = gram.shape[0]
    if k is None:
        raise ValueError("the Gramian needs a static number of heads (rows)")
    return int(k)


def _no_projection() -> tf.Tensor:
    return tf.constant(0, tf.int32)


def _rows_times(w: tf.Tensor, q: tf.Tensor) -> tf.Tensor:
    """`w @ q` for `w` of shape `(..., K)`, as one 2-D matmul (a broadcasting batched matmul
    costs ~70 us on these tiny shapes)."""
    return tf.reshape(tf.matmul(tf.reshape(w, [-1, q.shape[0]]), q), tf.shape(w))


def _quadratic_forms(w: tf.Tensor, q: tf.Tensor) -> tf.Tensor:
    """`w_r^T q w_r` for every row `w_r` of `w` (`(..., K)`), without a 3-operand einsum
    (which runs as two slow einsum kernels on these tiny shapes)."""
    return tf.reduce_sum(_rows_times(w, q) * w, axis=-1)


# -- constant weights ------------------------------------------------------------------


def sum_weighting(gram: tf.Tensor) -> Weighting:
    """`d = sum_k g_k`: what per-head SGD does to the trunk, with one optimizer."""
    return Weighting(tf.ones([_k(gram)], _as_gram(gram).dtype), _no_projection())


def mean_weighting(gram: tf.Tensor) -> Weighting:
    """`d = (1/K) sum_k g_k`."""
    k = _k(gram)
    return Weighting(tf.fill([k], tf.constant(1.0 / k, _as_gram(gram).dtype)), _no_projection())


def fixed_weighting(gram: tf.Tensor, weights: Sequence[float]) -> Weighting:
    """`d = sum_k weights[k] g_k` with fixed user weights."""
    if len(weights) != _k(gram):
        raise ValueError(f"weights has {len(weights)} entries for {_k(gram)} heads")
    return Weighting(tf.constant(weights, _as_gram(gram).dtype), _no_projection())


# -- PCGrad ----------------------------------------------------------------------------


def pcgrad_weighting(gram: tf.Tensor, order: tf.Tensor | None = None) -> Weighting:
    """PCGrad (Yu et al., NeurIPS 2020, Algorithm 1): project away conflicts, then sum.

    For each head i, starting from `g_i' = g_i`, for each other head j in turn
    (row i of `order`): if `g_i' . g_j < 0`, `g_i' -= (g_i' . g_j / |g_j|^2) g_j`
    (projection onto the normal plane of the *original* g_j). The result is
    `sum_i g_i'`. Each `g_i'` is tracked as coefficients `C[i] @ G`, so only the
    Gramian is needed: `g_i' . g_j = C[i] @ gram[:, j]`.

    Args:
        gram: `K x K` Gramian of the heads' gradients.
        order: `K x K` int32, row i a permutation of `0..K-1` giving the order
            in which head i is projected against the others (its own index is
            skipped). The paper shuffles the order at random every step; None
            uses `0, 1, ..., K-1` for every head.

    Returns:
        Weights with `d = weights @ G`, and the number of projections made.
    """
    k = _k(gram)
    gram = _as_gram(gram)
    if order is None:
        order = tf.tile(tf.range(k)[None, :], [k, 1])
    order = tf.cast(order, tf.int32)
    coeffs = tf.eye(k, dtype=gram.dtype)
    rows = tf.range(k)
    projections = tf.constant(0, tf.int32)
    sq_norms = tf.linalg.diag_part(gram)
    for pos in range(k):
        j = order[:, pos]                                    # (K,) the head each row projects on
        rows_j = tf.gather(gram, j)                          # row i: gram[j_i] (= column j_i)
        dots = tf.reduce_sum(coeffs * rows_j, axis=1)        # g_i' . g_{j_i}
        conflict = tf.logical_and(dots < 0.0, tf.not_equal(j, rows))
        scale = tf.where(conflict, tf.math.divide_no_nan(dots, tf.gather(sq_norms, j)), 0.0)
        coeffs -= scale[:, None] * tf.one_hot(j, k, dtype=gram.dtype)
        projections += tf.reduce_sum(tf.cast(conflict, tf.int32))
    return Weighting(tf.reduce_sum(coeffs, axis=0), projections)


# -- MGDA ------------------------------------------------------------------------------


def _min_norm_line(v1v1: tf.Tensor, v1v2: tf.Tensor, v2v2: tf.Tensor) -> tf.Tensor:
    """Sener & Koltun Algorithm 1: gamma minimising |gamma v1 + (1 - gamma) v2|^2 on [0, 1]."""
    one, zero = tf.ones_like(v1v1), tf.zeros_like(v1v1)
    gamma = tf.math.divide_no_nan(v2v2 - v1v2, v1v1 - 2.0 * v1v2 + v2v2)
    gamma = tf.where(v1v2 >= v1v1, one, tf.where(v1v2 >= v2v2, zero, gamma))
    return tf.clip_by_value(gamma, 0.0, 1.0)


def _face_systems(q: tf.Tensor, faces: tf.Tensor) -> tf.Tensor:
    """`(S, K, K)`: `q` restricted to the coordinates of each row of `faces` (0/1 masks),
    the identity on the others.

    Each system is positive definite when `q` is, so one batched solve handles them all.
    """
    k = q.shape[0]
    outer = faces[:, :, None] * faces[:, None, :]
    off_diagonal = tf.eye(k, dtype=q.dtype)[None] * (1.0 - faces)[:, None, :]
    return outer * q[None] + off_diagonal


def _faces(k: int, dtype: tf.DType, empty: bool = False) -> tf.Tensor:
    return tf.constant(_free_masks(k)[0 if empty else 1:], dtype)


def simplex_qp(gram: tf.Tensor, reg: float | None = None) -> tf.Tensor:
    """Solves `min_{w >= 0, sum w = 1} w^T gram w` exactly (the min-norm point's weights).

    The optimum lies in the relative interior of some face S of the simplex, where
    it solves the KKT system `gram_SS w_S = lambda 1, 1^T w_S = 1`. The system is
    solved in the cosine matrix `C = diag(s) gram diag(s)` (`s = 1 / |g_i|`): with
    `w = s * a`, `C_SS a_S = s_S` and `w = s a / (s.a)`, objective `1 / (s.a)`. All
    2^K - 1 faces are solved in one batched solve; the feasible (`w >= 0`) candidate
    with the largest `s.a` is the optimum. `C`'s unit diagonal makes the solve as
    accurate whatever the spread of the gradients' norms; a ridge at rounding level
    (`_ridge`) keeps faces of affinely dependent gradients (duplicates, K > D) regular,
    where the solution of the ridged system tends to the null direction (`|d| = 0`).
    A zero gradient is the min-norm point itself: then `w` is uniform over the zero rows.

    Args:
        gram: `K x K` positive semi-definite matrix (float32 or float64).
        reg: ridge added to `C`; None: `_ridge(dtype, K)`.
    """
    k = _k(gram)
    gram = _as_gram(gram)
    dtype = gram.dtype
    c, s, zero = _diagonal_scaling(gram)
    ridge = _ridge(dtype, k) if reg is None else reg
    faces = _faces(k, dtype)                                              # (S, K), S = 2^K - 1
    a = tf.linalg.solve(_face_systems(c + ridge * tf.eye(k, dtype=dtype), faces),
                        (faces * s[None, :])[:, :, None])[:, :, 0]
    total = tf.reduce_sum(a * s[None, :], axis=1)                         # s.a = 1 / objective
    w = a * s[None, :] / total[:, None]
    # Every vertex (singleton face) is feasible with s.a = 1 / ridge-ish > 0, so some face wins.
    feasible = (tf.reduce_all(w >= -_feasibility_tol(dtype), axis=1)
                & tf.math.is_finite(total) & (total > 0))
    best = tf.argmax(tf.where(feasible, total, tf.constant(-np.inf, dtype)), output_type=tf.int32)
    w = tf.maximum(tf.gather(w, best), 0.0)
    w = w / tf.reduce_sum(w)
    zeros = tf.cast(zero, dtype)
    return tf.where(tf.reduce_any(zero), zeros / tf.reduce_sum(zeros), w)


def simplex_qp_active_set(gram: tf.Tensor, reg: float | None = None) -> tf.Tensor:
    """`simplex_qp`'s problem and answer, by an active-set method instead of enumerating faces.

    Wolfe's min-norm-point algorithm ("Finding the nearest point in a polytope", Math.
    Programming 1976) on the same cosine-scaled, ridged KKT systems as `simplex_qp`, so
    it returns the same point (to rounding) at any K, with one `K x K` solve per step
    where `simplex_qp` solves 2^K - 1 systems at once. It starts from the uniform weights
    on every nonzero row: when the optimum has full support (heads that mostly agree),
    the first solve is the answer. A step solves the KKT system on the current support
    S; if that point is positive on S it is taken, and the vertex that most violates
    optimality (`(gram w)_j < w^T gram w`) joins S, or the method stops when none does;
    otherwise the weights move toward that point until one of them reaches 0, and that
    head leaves S. The objective falls at every step, so no support repeats and the
    method ends, in practice within a few K steps; `10 K + 10` steps at most.

    Args:
        gram: `K x K` positive semi-definite matrix (float32 or float64).
        reg: ridge added to the cosine matrix; None: `_ridge(dtype, K)`.
    """
    k = _k(gram)
    gram = _as_gram(gram)
    dtype = gram.dtype
    c, s, zero = _diagonal_scaling(gram)
    ridge = _ridge(dtype, k) if reg is None else reg
    c = c + ridge * tf.eye(k, dtype=dtype)
    eps = _eps(dtype)
    inf = tf.constant(np.inf, dtype)
    # a = w * |g| (w = s a): the KKT system on support S is c_SS a_S = lambda s_S, s.a = 1.
    nonzero = tf.logical_not(zero)
    count = tf.maximum(tf.reduce_sum(tf.cast(nonzero, dtype)), 1.0)
    a0 = tf.math.divide_no_nan(tf.cast(nonzero, dtype), s * count)

    def body(i: tf.Tensor, a: tf.Tensor, free: tf.Tensor, done: tf.Tensor):
        f = tf.cast(free, dtype)
        v = tf.linalg.solve(_face_systems(c, f[None])[0], (f * s)[:, None])[:, 0]
        v = tf.math.divide_no_nan(v, tf.reduce_sum(v * s))
        corral = tf.reduce_all((v > 0) | ~free)
        # Minor step: from a toward v until the first weight on S reaches 0; it leaves S.
        blocking = free & (v <= 0)
        ratio = tf.where(blocking, a / tf.where(blocking, a - v, tf.ones_like(a)), inf)
        theta = tf.minimum(tf.reduce_min(ratio), 1.0)
        leaving = blocking & (ratio <= theta)
        stepped = tf.where(leaving | ~free, tf.zeros_like(a), tf.maximum(a + theta * (v - a), 0.0))
        a = tf.where(corral, v, stepped)
        free = tf.where(corral, free, free & ~leaving)
        # Major step (at a corral): the vertex g_j with the lowest x.g_j - |x|^2 (x = w @ G)
        # joins S if that is below 0 by more than rounding.
        ca = tf.linalg.matvec(c, a)
        lam = tf.tensordot(a, ca, 1)
        total = tf.reduce_sum(a)
        gap = tf.where(free | zero, inf, ca - lam * s)
        j = tf.argmin(gap, output_type=tf.int32)
        add = corral & (gap[j] < -1e3 * eps * (total + lam * s[j]))
        free = free | (tf.one_hot(j, k, on_value=True, off_value=False) & add)
        return i + 1, a, free, corral & ~add

    _, a, _, _ = tf.while_loop(
        lambda i, a, free, done: (i < 10 * k + 10) & ~done, body,
        (tf.constant(0), a0, nonzero, tf.constant(False)))
    w = tf.maximum(a * s, 0.0)
    w = tf.math.divide_no_nan(w, tf.reduce_sum(w))
    zeros = tf.cast(zero, dtype)
    return tf.where(tf.reduce_any(zero), zeros / tf.reduce_sum(zeros), w)


#: MGDA enumerates the simplex's faces up to this many heads; above, the 2^K solves cost
#: more than the active-set method's few sequential ones (measured: K = 9 and up).
_ENUMERATE_MAX_HEADS = 8


def mgda_weighting(gram: tf.Tensor, solver: str = "auto", max_iter: int = 250,
                   tol: float = 1e-6) -> Weighting:
    """MGDA (Sener & Koltun, NeurIPS 2018): the min-norm point of the convex hull of the g_k.

    Solves `min_{w in simplex} |w @ G|^2 = w^T gram w`. With
    `solver="frank_wolfe"`, by their Algorithm 2: start at `w = 1/K`; pick the
    vertex `t = argmin_r (gram w)_r`; exact line search between `w @ G` and
    `g_t` (Algorithm 1); stop when the step moves `w` by less than `tol` (L1)
    or after `max_iter` steps (sublinear convergence: many steps when the
    min-norm point is near 0). With `solver="exact"` (or `"auto"`), by
    `simplex_qp` (one batched solve over the 2^K faces) up to 8 heads and by
    `simplex_qp_active_set` (Wolfe's active-set method, one K x K solve per
    step) above, both on the cosine matrix so that they are exact to
    rounding (float32 ~1e-6, float64 ~1e-12 relative) whatever the spread of the
    heads' gradient norms. With a zero gradient (the min-norm point is 0),
    `w` is uniform over the zero rows. With `rep_grad` this is MGDA-UB (the
    gradients are taken at the trunk output).

    Args:
        gram: `K x K` Gramian.
        solver: `"auto"`, `"exact"` or `"frank_wolfe"`.
        max_iter: Frank-Wolfe iterations at most.
        tol: Frank-Wolfe stops when `sum |w_new - w|` falls below this.
    """
    k = _k(gram)
    gram = _as_gram(gram)
    dtype = gram.dtype
    if solver in ("exact", "auto"):
        # The K x K solves run in float64 (negligible cost at this size): the float32 answer
        # is then as exact as the float32 Gramian allows.
        # The ridge is the input's: it must cover the rounding of a float32 Gramian.
        exact = simplex_qp if k <= _ENUMERATE_MAX_HEADS else simplex_qp_active_set
        w = exact(tf.cast(gram, tf.float64), reg=_ridge(dtype, k))
        return Weighting(tf.cast(w, dtype), _no_projection())
    # The weights do not depend on the Gramian's scale: normalise for float32 robustness.
    gram = tf.math.divide_no_nan(gram, tf.reduce_max(tf.linalg.diag_part(gram)))
    w0 = tf.fill([k], tf.constant(1.0 / k, dtype))

    def body(i: tf.Tensor, w: tf.Tensor, change: tf.Tensor):
        gw = tf.linalg.matvec(gram, w)
        t = tf.argmin(gw, output_type=tf.int32)
        gamma = _min_norm_line(gram[t, t], gw[t], tf.tensordot(w, gw, 1))
        new = (1.0 - gamma) * w + gamma * tf.one_hot(t, k, dtype=dtype)
        return i + 1, new, tf.reduce_sum(tf.abs(new - w))

    _, w, _ = tf.while_loop(
        lambda i, w, change: tf.logical_and(i < max_iter, change >= tol),
        body, (tf.constant(0), w0, tf.constant(np.inf, dtype)),
    )
    return Weighting(w, _no_projection())


# -- CAGrad ----------------------------------------------------------------------------


def _project_simplex(v: tf.Tensor) -> tf.Tensor:
    """Euclidean projection onto the probability simplex (Duchi et al., ICML 2008)."""
    k = v.shape[-1]
    u = tf.sort(v, direction="DESCENDING")
    cssv = tf.cumsum(u) - 1.0
    ind = tf.range(1, k + 1, dtype=v.dtype)
    rho = tf.reduce_max(tf.where(u - cssv / ind > 0, tf.range(k), 0))
    theta = cssv[rho] / tf.cast(rho + 1, v.dtype)
    return tf.maximum(v - theta, 0.0)


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


# -- UPGrad and DualProj ---------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _free_masks(k: int) -> np.ndarray:
    """All 2^k subsets of `range(k)` as 0/1 rows (1 = coordinate free, 0 = at its bound)."""
    return np.array(list(itertools.product([0.0, 1.0], repeat=k)), np.float64)


def _box_qp_definite(gram: tf.Tensor, lower: tf.Tensor) -> tf.Tensor:
    """`box_qp` for a positive definite, well-scaled `gram` (the active-set enumeration)."""
    k = _k(gram)
    dtype = gram.dtype
    lower_t = tf.transpose(lower)                                         # (K, P): column p = bound p
    faces = _faces(k, dtype, empty=True)
    masks = faces[:, :, None]                                             # (S, K, 1)
    # Every candidate is laid out (S, K, P), as the batched solve wants it: transposing
    # (S, P, K) tensors or broadcasting batched matmuls cost ~70 us each on these shapes.
    fixed = (1.0 - masks) * lower_t[None]                                 # bound coords at their bound
    # gram @ fixed_s = (gram * bound_s) @ lower_t, for every face in one 2-D matmul.
    bound_cols = (1.0 - faces)[:, None, :]                                # (S, 1, K)
    gram_fixed = tf.reshape(tf.matmul(tf.reshape(gram[None] * bound_cols, [-1, k]), lower_t),
                            tf.shape(fixed))
    # Free coords see the fixed ones: gram_FF w_F = -(gram @ fixed)_F.
    free = tf.linalg.solve(_face_systems(gram, faces), -masks * gram_fixed)
    cand = masks * free + fixed                                           # (S, K, P)
    scale = tf.reduce_max(tf.abs(lower_t)) + 1.0
    feasible = tf.reduce_all(cand >= lower_t[None] - _feasibility_tol(dtype) * scale, axis=1)
    # The solve makes the gradient gram @ cand vanish on the free coordinates, so
    # cand^T gram cand = cand . (gram @ cand) = cand . (gram @ fixed) (gram is symmetric).
    objective = tf.where(feasible, tf.reduce_sum(cand * gram_fixed, axis=1),
                         tf.constant(np.inf, dtype))
    best = tf.argmin(objective, axis=0, output_type=tf.int32)             # (P,)
    # out[p] = cand[best[p], :, p]
    return tf.gather(tf.gather(cand, best), tf.range(tf.shape(best)[0]), axis=2, batch_dims=1)


def box_qp(gram: tf.Tensor, lower: tf.Tensor, reg: float | None = None) -> tf.Tensor:
    """Solves `min_{w >= lower[p]} w^T gram w` exactly, for every row p of `lower`.

    The optimum has some coordinates at their bound and the others solving the
    unconstrained problem restricted to them. All 2^K such candidates are
    computed in one batched solve; the best feasible one is the optimum (the
    all-at-bound candidate is always feasible). The problem is solved in
    `u = w / s` on the cosine matrix (`s_i = 1 / sqrt(gram_ii)`, unit diagonal,
    as in `simplex_qp`) plus a ridge at rounding level, so a singular `gram`
    (linearly dependent rows, K > D) is solved too: its restricted systems are
    consistent, and the ridged solution tends to the minimum-norm one. A zero
    row's coordinate does not change the objective; it is left at `max(bound, 0)`.

    Args:
        gram: `K x K` positive semi-definite matrix.
        lower: `P x K` lower bounds.
        reg: ridge added to the unit-diagonal system; None: `_ridge(dtype, K)`.

    Returns:
        `P x K` minimisers.
    """
    k = _k(gram)
    gram = _as_gram(gram)
    dtype = gram.dtype
    lower = tf.cast(tf.convert_to_tensor(lower), dtype)
    d = tf.linalg.diag_part(gram)
    zero = d <= _eps(dtype) ** 2 * tf.reduce_max(d)
    s = tf.where(zero, tf.ones_like(d), tf.math.rsqrt(tf.where(zero, tf.ones_like(d), d)))
    ridge = _ridge(dtype, k) if reg is None else reg
    c = gram * s[:, None] * s[None, :] + ridge * tf.eye(k, dtype=dtype)
    u = _box_qp_definite(c, lower / s[None, :])
    return u * s[None, :]


def _normalize_trace(gram: tf.Tensor, norm_eps: float, reg: float) -> tf.Tensor:
    """torchjd's `regularize(normalize(gram, norm_eps), reg_eps)`: `gram / trace(gram)`
    (0 when the trace is below `norm_eps`), plus `reg I`."""
    k = _k(gram)
    trace = tf.linalg.trace(gram)
    g = tf.where(trace < norm_eps, tf.zeros_like(gram), tf.math.divide_no_nan(gram, trace))
    return g + reg * tf.eye(k, dtype=gram.dtype)


def upgrad_weighting(gram: tf.Tensor, reg: float = 1e-4, norm_eps: float = 1e-4) -> Weighting:
    """UPGrad (Quinton & Rey 2024, Jacobian descent): mean of each g_i projected onto the dual cone.

    The projection of `g_i` onto the dual cone `{x : G x >= 0}` of the heads'
    gradients is `w_i @ G` with `w_i = argmin_{v >= e_i} v^T gram v` (their
    Proposition 1); the aggregate is `(1/K) sum_i w_i @ G`, so its inner
    product with every `g_j` is non-negative. As torchjd does, the Gramian is
    divided by its trace (replaced by 0 when the trace is below `norm_eps`, an
    absolute threshold: then the weights are the mean's) and `reg * I` is added
    (torchjd's `reg_eps`): with `reg > 0` every small QP is strictly convex and the
    aggregate may conflict with a head by up to `reg` times its weight; `reg = 0`
    is the exact projection (`box_qp` solves singular Gramians too).

    Args:
        gram: `K x K` Gramian, `K <= UPGRAD_MAX_HEADS`.
        reg: ridge added to the normalised Gramian (torchjd's `reg_eps`, default 1e-4).
        norm_eps: torchjd's `norm_eps` (default 1e-4).
    """
    k = _k(gram)
    if k > UPGRAD_MAX_HEADS:
        raise ValueError(f"upgrad supports at most {UPGRAD_MAX_HEADS} heads, got {k}")
    gram = _as_gram(gram)
    q = _normalize_trace(tf.cast(gram, tf.float64), norm_eps, reg)   # solved in float64
    w = box_qp(q, tf.eye(k, dtype=tf.float64), reg=_ridge(gram.dtype, k))
    return Weighting(tf.cast(tf.reduce_mean(w, axis=0), gram.dtype), _no_projection())


def dualproj_weighting(gram: tf.Tensor, reg: float = 1e-4, norm_eps: float = 1e-4) -> Weighting:
    """DualProj (torchjd; Quinton & Rey 2024): the mean projected onto the dual cone.

    `w = argmin_{v >= 1/K} v^T gram v`: the projection of the mean gradient
    `(1/K) sum_k g_k` onto `{x : G x >= 0}`, the projection GEM (Lopez-Paz &
    Ranzato, NeurIPS 2017) makes against its memory's gradients. The Gramian is
    normalised and regularised as in `upgrad_weighting` (torchjd's DualProj).

    Args:
        gram: `K x K` Gramian, `K <= UPGRAD_MAX_HEADS`.
        reg: torchjd's `reg_eps` (default 1e-4).
        norm_eps: torchjd's `norm_eps` (default 1e-4).
    """
    k = _k(gram)
    gram = _as_gram(gram)
    lower = tf.fill([1, k], tf.constant(1.0 / k, tf.float64))
    w = box_qp(_normalize_trace(tf.cast(gram, tf.float64), norm_eps, reg), lower,
               reg=_ridge(gram.dtype, k))[0]
    return Weighting(tf.cast(w, gram.dtype), _no_projection())


# -- IMTL-G ----------------------------------------------------------------------------


def imtl_weighting(gram: tf.Tensor) -> Weighting:
    """IMTL-G (Liu et al., ICLR 2021): the aggregate has equal projections on every unit g_k.

    With `u_k = g_k / |g_k|` the paper's closed form
    `alpha_{2..K} = g_1 U^T (D U^T)^{-1}`, `alpha_1 = 1 - sum alpha_{2..K}`
    (`D = [g_1 - g_k]`, `U = [u_1 - u_k]`) solves `d . u_k = d . u_1` for every k
    and `sum alpha = 1`, with `d = alpha @ G`. Here the same conditions are one
    `(K+1) x (K+1)` system in `beta = alpha * |g|`: `cos @ beta = t 1`,
    `sum beta / |g| = 1` (`cos` the cosine matrix, `t` the common projection),
    well scaled whatever the spread of the norms. A zero gradient has no direction:
    its row is dropped (`alpha_k = 0`, the answer on the other rows); with every
    gradient zero, `alpha = 1/K`. When the system is singular (parallel gradients,
    more heads than gradient dimensions) the least-squares solution is taken,
    where `solve` would fail the step.
    """
    k = _k(gram)
    gram = _as_gram(gram)
    dtype = gram.dtype
    if k == 1:
        return Weighting(tf.ones([1], dtype), _no_projection())
    cos, s, zero = _diagonal_scaling(gram)
    keep = tf.cast(tf.logical_not(zero), dtype)
    # Zero rows: the equation beta_k = 0 in place of a projection condition.
    top = tf.concat([cos + tf.linalg.diag(1.0 - keep), -keep[:, None]], axis=1)      # (K, K+1)
    inv_norm = s / tf.reduce_max(s)                  # the sum condition divided by max 1/|g|
    bottom = tf.concat([inv_norm, tf.zeros([1], dtype)], axis=0)[None, :]            # (1, K+1)
    rhs = tf.concat([tf.zeros([k], dtype), [1.0 / tf.reduce_max(s)]], axis=0)[:, None]
    beta = tf.linalg.lstsq(tf.concat([top, bottom], axis=0), rhs, fast=False)[:k, 0]
    alpha = beta * s * keep
    uniform = tf.fill([k], tf.constant(1.0 / k, dtype))
    return Weighting(tf.where(tf.reduce_all(zero), uniform, alpha), _no_projection())


# -- Aligned-MTL -----------------------------------------------------------------------


def aligned_mtl_weighting(gram: tf.Tensor, scale_mode: str = "min") -> Weighting:
    """Aligned-MTL (Senushkin et al., "Independent Component Alignment for Multi-Task
    Learning", CVPR 2023): align the gradients to an orthogonal, equally scaled system.

    With `gram = V diag(lambda) V^T` restricted to its rank (eigenvalues above
    `max(lambda) K eps`, as the authors' code), `B = sqrt(sigma) V diag(lambda^-1/2) V^T`
    makes the aligned gradients `B^T G` orthogonal with equal norms `sqrt(sigma)`;
    the update is their sum, `w = B @ 1` (the authors' and LibMTL's task weights 1).
    `sigma` is the smallest kept eigenvalue (`scale_mode="min"`, default), their
    lower median (`"median"`) or their mean (`"rmse"`), as the authors'
    `ProcrustesSolver`. With every gradient zero, `w = 0`.

    Args:
        gram: `K x K` Gramian.
        scale_mode: `"min"`, `"median"` or `"rmse"`.
    """
    k = _k(gram)
    gram = _as_gram(gram)
    dtype = gram.dtype
    lam, v = tf.linalg.eigh(gram)                              # ascending
    tol = tf.reduce_max(lam) * k * _eps(dtype)
    kept = lam > tol
    rank = tf.reduce_sum(tf.cast(kept, tf.int32))
    inv_sqrt = tf.where(kept, tf.math.rsqrt(tf.where(kept, lam, tf.ones_like(lam))),
                        tf.zeros_like(lam))
    if scale_mode == "min":
        sigma = tf.reduce_min(tf.where(kept, lam, tf.constant(np.inf, dtype)))
    elif scale_mode == "median":        # torch.median: the lower median of the kept ones
        sigma = tf.gather(lam, tf.maximum(k - rank + (rank - 1) // 2, 0))
    else:
        sigma = tf.math.divide_no_nan(tf.reduce_sum(tf.where(kept, lam, tf.zeros_like(lam))),
                                      tf.cast(rank, dtype))
    sigma = tf.where(rank > 0, sigma, tf.zeros_like(sigma))
    b = tf.sqrt(sigma) * tf.matmul(v * inv_sqrt[None, :], v, transpose_b=True)
    return Weighting(tf.reduce_sum(b, axis=1), _no_projection())


# -- ConFIG ----------------------------------------------------------------------------


def config_weighting(gram: tf.Tensor) -> Weighting:
    """ConFIG (Liu et al., "ConFIG: Towards Conflict-free Training of Physics Informed
    Neural Networks", ICLR 2025): equal positive projection on every unit gradient.

    The direction is `x = pinv(U) 1`, `U` the matrix of unit gradients `u_k`
    (the least-norm x with `u_k . x = 1` for every k), rescaled to length
    `sum_k g_k . x / |x|`: `d = (sum_k g_k . x / |x|^2) x` (the authors' code and
    torchjd's ConFIG with its default weights 1). From the Gramian:
    `x = G^T beta`, `beta = diag(1/|g|) cos^+ 1`, with the pseudo-inverse of the
    cosine matrix taken over its eigenvalues above `K eps` times the largest (torch's
    `pinv(U)` cuts U's singular values at `max(K, D) eps` times the largest instead).
    A zero gradient has no unit vector: it gets weight 0 (torchjd: `nan_to_num`).
    """
    k = _k(gram)
    gram = _as_gram(gram)
    dtype = gram.dtype
    cos, s, _ = _diagonal_scaling(gram)
    lam, v = tf.linalg.eigh(cos)
    kept = lam > tf.reduce_max(lam) * k * _eps(dtype)
    inv = tf.where(kept, 1.0 / tf.where(kept, lam, tf.ones_like(lam)), tf.zeros_like(lam))
    y = tf.linalg.matvec(v, inv * tf.reduce_sum(v, axis=0))     # cos^+ 1
    beta = s * y
    gram_beta = tf.linalg.matvec(gram, beta)
    scale = tf.math.divide_no_nan(tf.reduce_sum(gram_beta), tf.tensordot(beta, gram_beta, 1))
    return Weighting(scale * beta, _no_projection())


# -- Krum ------------------------------------------------------------------------------


def krum_weighting(gram: tf.Tensor, n_byzantine: int = 0, n_selected: int = 1) -> Weighting:
    """Krum / Multi-Krum (Blanchard et al., "Machine Learning with Adversaries: Byzantine
    Tolerant Gradient Descent", NeurIPS 2017): the mean of the most central gradients.

    Each gradient's score is the sum of its squared distances
    `|g_i - g_j|^2 = gram_ii + gram_jj - 2 gram_ij` to its `K - n_byzantine - 2`
    nearest other gradients; the `n_selected` gradients with the lowest scores
    are averaged (ties: lowest index), as torchjd's Krum. With fewer heads than
    `n_byzantine + 3` (a step with a head dropped), each score is the distance to
    the nearest other gradient.

    Args:
        gram: `K x K` Gramian.
        n_byzantine: f, the number of gradients that may be arbitrary.
        n_selected: m, how many of the best-scored gradients are averaged (1: Krum).
    """
    k = _k(gram)
    gram = _as_gram(gram)
    dtype = gram.dtype
    if k == 1:
        return Weighting(tf.ones([1], dtype), _no_projection())
    sq = tf.linalg.diag_part(gram)
    dist = tf.maximum(sq[:, None] + sq[None, :] - 2.0 * gram, 0.0)
    # Self excluded by position rather than as "the smallest": duplicates are also at 0.
    dist = tf.where(tf.eye(k, dtype=tf.bool), tf.constant(np.inf, dtype), dist)
    n_closest = min(max(k - n_byzantine - 2, 1), k - 1)
    nearest = -tf.math.top_k(-dist, k=n_closest).values
    scores = tf.reduce_sum(nearest, axis=1)
    m = min(n_selected, k)
    chosen = tf.math.top_k(-scores, k=m).indices
    weights = tf.reduce_sum(tf.one_hot(chosen, k, dtype=dtype), axis=0) / m
    return Weighting(weights, _no_projection())


# -- stateful and random aggregators ---------------------------------------------------------
#
# A stateful weighting takes its state as tensors (`state=`, a dict) and returns the new
# state in `Weighting.state`; the module that owns the variables assigns it (TrunkUpdate).
# Per-head entries of a state have the heads on their leading axes (`StateSpec.head_axes`),
# so a step of a subset of the heads reads and writes that subset's entries only.


class StateSpec(NamedTuple):
    """One state entry of a stateful aggregator.

    Attributes:
        initial: `K -> ` the initial value as a numpy array, for K heads.
        head_axes: how many leading axes index heads (0: shared, 1: per head,
            2: per pair of heads).
    """

    initial: Callable[[int], np.ndarray]
    head_axes: int


def _pairwise_cosines(coeffs_i: tf.Tensor, gram: tf.Tensor, j: tf.Tensor) -> tuple[tf.Tensor, ...]:
    """For rows `c_i @ G` and `g_{j_i}`: the inner products, `|c_i @ G|` and `|g_{j_i}|`."""
    rows_j = tf.gather(gram, j)
    dots = tf.reduce_sum(coeffs_i * rows_j, axis=1)
    norm_i = tf.sqrt(tf.maximum(_quadratic_forms(coeffs_i, gram), 0.0))
    norm_j = tf.sqrt(tf.maximum(tf.gather(tf.linalg.diag_part(gram), j), 0.0))
    return dots, norm_i, norm_j


def gradvac_weighting(gram: tf.Tensor, state: dict[str, tf.Tensor], beta: float = 0.5,
                      order: tf.Tensor | None = None) -> Weighting:
    """GradVac (Wang et al., "Gradient Vaccine: Investigating and Improving Multi-task
    Optimization in Massively Multilingual Models", ICLR 2021): adaptive similarity goals.

    As PCGrad, each head's gradient `g_i'` is altered against every other head j in turn
    (row i of `order`); where the cosine `rho_ij` of `g_i'` and `g_j` is below the goal
    `rho_T[i, j]`, `g_i' += w g_j` with
    `w = |g_i'| (rho_T sqrt(1 - rho^2) - rho sqrt(1 - rho_T^2)) / (|g_j| sqrt(1 - rho_T^2))`
    (their eq. 4), which sets the cosine to the goal, and the goal, an EMA of the
    observed cosines, moves: `rho_T <- (1 - beta) rho_T + beta rho_ij` (eq. 5). The
    aggregate is `sum_i g_i'`. As LibMTL's `GradVac` (the paper's authors published
    no code) with `group_type=0` (whole trunk): the goal moves only when the cosine
    is below it, the norms in the cosine and in `w` get `+ 1e-8`, and `beta`
    defaults to 0.5. State: `rho_T` (`K x K`, initially 0).

    Args:
        gram: `K x K` Gramian.
        state: `{"rho_T": K x K}`.
        beta: the EMA rate of the goals (LibMTL's `GradVac_beta`).
        order: `K x K` int32 projection order, as `pcgrad_weighting` (random each step).
    """
    k = _k(gram)
    gram = _as_gram(gram)
    dtype = gram.dtype
    rho_t = tf.cast(state["rho_T"], dtype)
    if order is None:
        order = tf.tile(tf.range(k)[None, :], [k, 1])
    order = tf.cast(order, tf.int32)
    coeffs = tf.eye(k, dtype=dtype)
    rows = tf.range(k)
    for pos in range(k):
        j = order[:, pos]
        other = tf.not_equal(j, rows)
        dots, norm_i, norm_j = _pairwise_cosines(coeffs, gram, j)
        rho = dots / (norm_i * norm_j + 1e-8)
        index = tf.stack([rows, j], axis=1)
        goal = tf.gather_nd(rho_t, index)
        root_goal = tf.sqrt(tf.maximum(1.0 - goal**2, 0.0))
        root_rho = tf.sqrt(tf.maximum(1.0 - rho**2, 0.0))
        below = other & (rho < goal)
        w = norm_i * (goal * root_rho - rho * root_goal) / (norm_j * root_goal + 1e-8)
        w = tf.where(below, w, 0.0)
        coeffs += w[:, None] * tf.one_hot(j, k, dtype=dtype)
        rho_t = tf.tensor_scatter_nd_update(
            rho_t, index, tf.where(below, (1.0 - beta) * goal + beta * rho, goal))
    return Weighting(tf.reduce_sum(coeffs, axis=0), _no_projection(),
                     {"rho_T": tf.cast(rho_t, state["rho_T"].dtype)})


def _bargaining(cos: tf.Tensor, coef: tf.Tensor, valid: tf.Tensor, alpha: float,
                start: tf.Tensor, max_iter: int, tol: float) -> tf.Tensor:
    """`b > 0` with `(cos b)_i = coef_i b_i^(-1/alpha)` on the valid rows, by damped Newton.

    It is the minimiser of the strictly convex `0.5 b^T cos b - sum_i coef_i h(b_i)`
    (`h' (b) = b^(-1/alpha)`: `log b` at `alpha = 1`). Newton steps are damped by
    `1 / (1 + lambda)` (`lambda` the Newton decrement) until `lambda < 1/4`, and cut to
    stay inside `b > 0`; the loop stops when `lambda^2 <= tol` or after `max_iter` steps.
    Invalid rows (zero gradients) are held at 0.
    """
    k = _k(cos)
    dtype = cos.dtype
    mask = tf.cast(valid, dtype)
    q = cos * mask[:, None] * mask[None, :] + tf.linalg.diag(1.0 - mask)
    b0 = tf.where(valid, start, tf.ones_like(start))

    def body(i, b, decrement):
        power = b ** (-1.0 / alpha)
        grad = (tf.linalg.matvec(q, b) - coef * power - (1.0 - mask) * (b - 1.0)) * mask
        hess = q + tf.linalg.diag(mask * coef * power / (alpha * b))
        # A rounding-level ridge: where no positive solution exists the iterates grow and
        # the barrier term vanishes, leaving a singular cosine matrix.
        hess += _ridge(dtype, k) * tf.reduce_max(tf.linalg.diag_part(hess)) * tf.eye(k, dtype=dtype)
        step = -tf.linalg.solve(hess, grad[:, None])[:, 0]
        lam2 = tf.maximum(-tf.tensordot(grad, step, 1), 0.0)
        lam = tf.sqrt(lam2)
        t = tf.where(lam < 0.25, tf.ones_like(lam), 1.0 / (1.0 + lam))
        # Stay strictly positive: at most 99% of the way to the boundary b_i = 0.
        ratio = tf.where(step < 0, -b / tf.where(step < 0, step, -tf.ones_like(step)),
                         tf.constant(np.inf, dtype))
        t = tf.minimum(t, 0.99 * tf.reduce_min(ratio))
        return i + 1, b + t * step, lam2

    _, b, _ = tf.while_loop(lambda i, b, d: (i < max_iter) & (d > tol), body,
                            (tf.constant(0), b0, tf.constant(np.inf, dtype)))
    return b * mask


#: Newton on the bargaining problems stops at this squared decrement (float64): about
#: the squared relative error of the solution, far below float32 rounding.
_NEWTON_TOL = 1e-24


def _bargaining_weights(gram: tf.Tensor, alpha: float, start: tf.Tensor | None,
                        max_iter: int) -> tf.Tensor:
    """`w >= 0` with `(gram w)_i = w_i^(-1/alpha)` for every nonzero gradient (0 for the
    zero ones), solved in float64 on the cosine matrix (`w = s b`, `s = 1 / |g|`)."""
    dtype = gram.dtype
    g64 = tf.cast(gram, tf.float64)
    cos, s, zero = _diagonal_scaling(g64)
    valid = tf.logical_not(zero)
    # (gram s b)_i = (cos b)_i / s_i = (s_i b_i)^(-1/alpha)  <=>  (cos b)_i = s_i^(1-1/alpha) b_i^(-1/alpha)
    coef = tf.where(valid, tf.where(valid, s, tf.ones_like(s)) ** (1.0 - 1.0 / alpha),
                    tf.zeros_like(s))
    if start is None:   # the solution when the gradients are orthogonal
        b0 = tf.where(valid, coef, tf.ones_like(coef)) ** (alpha / (1.0 + alpha))
    else:
        start = tf.cast(start, tf.float64)
        b0 = tf.where(valid & (start > 0), start / tf.where(valid, s, tf.ones_like(s)),
                      tf.ones_like(s))
    b = _bargaining(cos, coef, valid, alpha, b0, max_iter, _NEWTON_TOL)
    return tf.cast(b * s, dtype)


def nash_mtl_weighting(gram: tf.Tensor, state: dict[str, tf.Tensor],
                       update_weights_every: int = 1, optim_niter: int = 20,
                       max_norm: float = 1.0) -> Weighting:
    """Nash-MTL (Navon et al., "Multi-Task Learning as a Bargaining Game", ICML 2022).

    The weights are the Nash bargaining solution: `alpha > 0` with
    `(G G^T alpha)_i = 1 / alpha_i` for every head (their eq. 3, Theorem 5.1). The
    authors approach it by `optim_niter` (20) rounds of a convex-concave procedure,
    each a cvxpy/ECOS solve of a linearised problem; here the same point is solved
    to float64 precision by damped Newton on the strictly convex
    `0.5 b^T C b - sum log b_i` (`C` the cosine matrix, `alpha = b / |g|`), at most
    `optim_niter` Newton steps from `b = 1` (the solution for orthogonal gradients;
    quadratic convergence, typically under 10 steps). The weights are recomputed every
    `update_weights_every` steps and reused in between (the state keeps them and
    the step count); the aggregate `alpha @ G` is clipped to norm `max_norm`
    (0: no clipping) as in the authors' `clip_grad_norm_` on the shared
    parameters, with torch's `1e-6`. A zero gradient gets weight 0 (no positive
    solution exists with it); when no positive solution exists (two exactly
    opposite gradients), the weights are wherever `optim_niter` steps left them.

    Args:
        gram: `K x K` Gramian.
        state: `{"alpha": (K,), "step": ()}` (initially ones, as the authors, and 0).
        update_weights_every: recompute the weights every this many steps.
        optim_niter: Newton steps at most.
        max_norm: clip the aggregate's norm to this (0: off).
    """
    k = _k(gram)
    gram = _as_gram(gram)
    dtype = gram.dtype
    previous = tf.cast(state["alpha"], dtype)
    step = tf.cast(state["step"], tf.int64)
    due = tf.equal(step % update_weights_every, 0)
    # Started where the gradients' cosines are 0 (b = 1), not from the previous weights: a
    # previous step's weights can be far off after the gradients' norms changed.
    alpha = tf.cond(due, lambda: _bargaining_weights(gram, 1.0, None, optim_niter),
                    lambda: previous)
    weights = alpha
    if max_norm > 0:
        norm = tf.sqrt(tf.maximum(tf.tensordot(alpha, tf.linalg.matvec(gram, alpha), 1), 0.0))
        clip = max_norm / (norm + 1e-6)
        weights = tf.where(clip < 1.0, alpha * clip, alpha)
    return Weighting(weights, _no_projection(),
                     {"alpha": tf.cast(alpha, state["alpha"].dtype), "step": step + 1})


def fairgrad_weighting(gram: tf.Tensor, alpha: float = 1.0) -> Weighting:
    """FairGrad (Ban & Ji, "Fair Resource Allocation in Multi-Task Learning", ICML 2024).

    The weights `w > 0` solve `(G G^T w)_i = w_i^(-1/alpha)` (their eq. 9, alpha-fair
    utility; `alpha = 1` is proportional fairness, Nash-MTL's point, and larger alpha
    moves toward max-min fairness). The authors solve it with SciPy's
    `least_squares(G G^T w - w^(-1/alpha), bounds=(0, inf))` from `1/K`; here
    by damped Newton on the equivalent strictly convex problem, to float64
    precision. A zero gradient gets weight 0.

    Args:
        gram: `K x K` Gramian.
        alpha: the fairness parameter (the authors' `--alpha`/LibMTL's `FairGrad_alpha`).
    """
    gram = _as_gram(gram)
    return Weighting(_bargaining_weights(gram, float(alpha), None, 100), _no_projection())


def sdmgrad_weighting(gram: tf.Tensor, state: dict[str, tf.Tensor], lmbda: float = 0.3,
                      niter: int = 20) -> Weighting:
    """SDMGrad (Xiao et al., "Direction-oriented Multi-objective Learning: Simple and
    Provable Stochastic Algorithms", NeurIPS 2023).

    As LibMTL's `SDMGrad` (modified from the authors' code), with one batch for its
    three gradient samples: with the Gramian divided by
    `mean_k sqrt(max(gram_kk, 0))^2 + 1e-8`, the simplex weights `w` (the state,
    initially `1/K`) take `niter` projected SGD steps (learning rate 5, momentum
    0.5, the momentum restarting every call as LibMTL's optimizer built per call)
    along `gram w + lmbda gram 1/K`, each followed by the Euclidean projection on the
    simplex; the direction is `(w @ G + lmbda g0) / (1 + lmbda)`, `g0` the mean
    gradient.

    Args:
        gram: `K x K` Gramian.
        state: `{"w": (K,)}`.
        lmbda: the regularisation towards the mean (LibMTL's `SDMGrad_lamda`,
            default 0.3).
        niter: projected SGD steps per call (LibMTL's `SDMGrad_niter`, default 20).
    """
    k = _k(gram)
    gram = _as_gram(gram)
    dtype = gram.dtype
    # The K x K iteration runs in float64: its learning rate 5 amplifies rounding ~1e4-fold.
    g64 = tf.cast(gram, tf.float64)
    scale = tf.reduce_mean(tf.sqrt(tf.maximum(tf.linalg.diag_part(g64), 0.0)))
    gg = g64 / (scale**2 + 1e-8)
    gg_mean = tf.reduce_mean(gg, axis=1)
    w = tf.cast(state["w"], tf.float64)

    def body(i: tf.Tensor, w: tf.Tensor, buf: tf.Tensor) -> tuple[tf.Tensor, ...]:
        grad = tf.linalg.matvec(gg, w) + lmbda * gg_mean
        buf = tf.where(i == 0, grad, 0.5 * buf + grad)   # torch SGD momentum, restarted
        return i + 1, _project_simplex(w - 5.0 * buf), buf

    _, w, _ = tf.while_loop(lambda i, w, buf: i < niter, body,
                            (tf.constant(0), w, tf.zeros_like(w)))
    weights = tf.cast((w + lmbda / k) / (1.0 + lmbda), dtype)
    return Weighting(weights, _no_projection(), {"w": tf.cast(w, state["w"].dtype)})


def random_weighting(gram: tf.Tensor, noise: tf.Tensor) -> Weighting:
    """Random weighting (Lin et al., "Reasonable Effectiveness of Random Weighting: A
    Litmus Test for Multi-Task Learning", TMLR 2022): `w = softmax(z)`, `z ~ N(0, I)`
    drawn afresh every step (LibMTL's `RLW` with its default normal distribution).

    Args:
        gram: `K x K` Gramian (only its size and dtype are read).
        noise: `(K,)` standard normal draws.
    """
    gram = _as_gram(gram)
    return Weighting(tf.nn.softmax(tf.cast(noise, gram.dtype)), _no_projection())



# -- buffered aggregators: a running K x D copy of the gradients -------------------------------
#
# MoCo, DB-MTL and ExcessMTL keep, besides a small state, a buffer the size of the heads'
# gradients (K x D). They work on the gradients themselves, split in column blocks: one block
# per trunk variable in the step (so the K x D matrix is never concatenated), one block for
# `aggregate`'s explicit matrix. What needs all of D (norms, Gramians) is summed over blocks.
# The buffers have the heads on their first axis, so a step of a subset of the heads reads and
# writes those heads' rows only.


class Buffered(NamedTuple):
    """Result of a buffered aggregator's step.

    Attributes:
        directions: per block, `(n_i,)`: the aggregate's part in that block.
        weights: `(K,)`: the weights of the rows combined, the buffer's rows (MoCo's
            `lambd`, DB-MTL's `alpha`) or the gradients' (ExcessMTL's loss weights).
        buffers: buffer name -> the new `K x n_i` blocks.
        state: the new small state.
        projections: int32 0 (no projections; for the step's logging).
    """

    directions: list[tf.Tensor]
    weights: tf.Tensor
    buffers: dict[str, list[tf.Tensor]]
    state: dict[str, tf.Tensor]
    projections: tf.Tensor | None = None


def _buffered(directions: list[tf.Tensor], weights: tf.Tensor, buffers: dict[str, list[tf.Tensor]],
              state: dict[str, tf.Tensor]) -> Buffered:
    return Buffered(directions, weights, buffers, state, _no_projection())


def _row_squares(blocks: Sequence[tf.Tensor]) -> tf.Tensor:
    """`(K,)` squared norms of the rows of the matrix whose column blocks are `blocks`."""
    return tf.add_n([tf.reduce_sum(tf.square(b), axis=1) for b in blocks])


def _combine_rows(blocks: Sequence[tf.Tensor], weights: tf.Tensor) -> list[tf.Tensor]:
    """`weights @ block` for every column block."""
    return [tf.linalg.matvec(b, weights, transpose_a=True) for b in blocks]


def _decayed(rate: float, sigma: float, t: tf.Tensor) -> tf.Tensor:
    """`rate / t^sigma` (LibMTL's step-size decay; `t` the 1-based step)."""
    return rate / t**sigma


def moco_update(grads: Sequence[tf.Tensor], buffers: Mapping[str, Sequence[tf.Tensor]],
                losses: tf.Tensor, state: Mapping[str, tf.Tensor], beta: float = 0.5,
                beta_sigma: float = 0.5, gamma: float = 0.1, gamma_sigma: float = 0.5,
                rho: float = 0.0) -> Buffered:
    """MoCo (Fernando et al., "Mitigating Gradient Bias in Multi-objective Learning: A
    Provably Convergent Approach", ICLR 2023), as LibMTL's `MoCo` (from the authors' code).

    A tracking variable `y` (`K x D`, the buffer, initially 0) follows the heads'
    gradients, each normalised and scaled by its loss, `g_k / (|g_k| + 1e-8) L_k`:
    `y <- y - beta_t (y - G)`; the weights `lambd` (initially `1/K`) take one step of
    the min-norm problem on `y`, kept on the simplex by a softmax (LibMTL's form; the
    paper projects onto the simplex):
    `lambd <- softmax(lambd - gamma_t (y y^T + rho I) lambd)`; the direction is
    `lambd @ y`. Step sizes decay with the 1-based step `t`: `beta_t = beta / t^beta_sigma`,
    `gamma_t = gamma / t^gamma_sigma`. A zero gradient gives a zero row of `G`.

    Args:
        grads: the `K x D` gradients as column blocks `K x n_i`.
        buffers: `{"y": [K x n_i blocks]}`.
        losses: `(K,)` each head's loss (the loss whose gradient is `g_k`).
        state: `{"lambd": (K,), "step": ()}`.
        beta, beta_sigma: `y`'s step size and its decay (LibMTL's `MoCo_beta`, 0.5,
            and `MoCo_beta_sigma`, 0.5).
        gamma, gamma_sigma: `lambd`'s step size and its decay (`MoCo_gamma`, 0.1, and
            `MoCo_gamma_sigma`, 0.5).
        rho: the l2 regularisation of `lambd`'s update (`MoCo_rho`, 0).
    """
    dtype = grads[0].dtype
    k = _k_rows(grads)
    t = tf.cast(state["step"], tf.int64) + 1
    tt = tf.cast(t, dtype)
    scale = tf.cast(losses, dtype) / (tf.sqrt(_row_squares(grads)) + 1e-8)
    beta_t = _decayed(beta, beta_sigma, tt)
    y = [tf.cast(b, dtype) - beta_t * (tf.cast(b, dtype) - scale[:, None] * g)
         for b, g in zip(buffers["y"], grads)]
    yy = tf.add_n([tf.matmul(b, b, transpose_b=True) for b in y])
    lambd = tf.cast(state["lambd"], dtype)
    lambd = tf.nn.softmax(lambd - _decayed(gamma, gamma_sigma, tt) * tf.linalg.matvec(
        yy + rho * tf.eye(k, dtype=dtype), lambd))
    return _buffered(_combine_rows(y, lambd), lambd, {"y": y}, {"lambd": lambd, "step": t})


def db_mtl_update(grads: Sequence[tf.Tensor], buffers: Mapping[str, Sequence[tf.Tensor]],
                  losses: tf.Tensor | None, state: Mapping[str, tf.Tensor], beta: float = 0.9,
                  beta_sigma: float = 0.0) -> Buffered:
    """DB-MTL (Lin et al., "Dual-Balancing for Multi-Task Learning", arXiv:2308.12029,
    2023), as LibMTL's `DB_MTL` (the authors' library).

    Loss-scale balancing: each head descends `log(L_k + 1e-8)`, whose gradient is
    `g_k / (L_k + 1e-8)`. Gradient-magnitude balancing: an EMA of those gradients
    (`K x D`, the buffer, initially 0), `buf <- G + beta_t (buf - G)` with
    `beta_t = beta / t^beta_sigma` (`t` the 1-based step), is combined with weights
    `alpha_k = max_j |buf_j| / (|buf_k| + 1e-8)`: every head's row scaled to the
    largest row's norm. An all-zero buffer gives a zero direction.

    Args:
        grads: the `K x D` gradients as column blocks `K x n_i`: of the losses
            (`losses` given) or already of the log losses (`losses=None`, as the train
            step, which takes the gradients of `log(L_k + 1e-8)` directly).
        buffers: `{"grad_buffer": [K x n_i blocks]}`.
        losses: `(K,)` each head's loss, or None (see `grads`).
        state: `{"step": ()}`.
        beta: the EMA's weight of the past (LibMTL's `DB_beta`, 0.9).
        beta_sigma: its decay with the step (`DB_beta_sigma`, 0: a constant EMA).
    """
    dtype = grads[0].dtype
    t = tf.cast(state["step"], tf.int64) + 1
    if losses is not None:
        inverse = 1.0 / (tf.cast(losses, dtype) + 1e-8)
        grads = [inverse[:, None] * g for g in grads]
    beta_t = _decayed(beta, beta_sigma, tf.cast(t, dtype))
    buf = [g + beta_t * (tf.cast(b, dtype) - g) for b, g in zip(buffers["grad_buffer"], grads)]
    norms = tf.sqrt(_row_squares(buf))
    alpha = tf.reduce_max(norms) / (norms + 1e-8)
    return _buffered(_combine_rows(buf, alpha), alpha, {"grad_buffer": buf}, {"step": t})


def db_mtl_loss_factor(loss: tf.Tensor) -> tf.Tensor:
    """The factor, held constant, that turns a loss's gradient into that of
    `log(L + 1e-8)`: `1 / (L + 1e-8)` (DB-MTL's loss-scale balancing)."""
    return tf.stop_gradient(1.0 / (loss + 1e-8))


def excess_mtl_update(grads: Sequence[tf.Tensor], buffers: Mapping[str, Sequence[tf.Tensor]],
                      losses: tf.Tensor | None, state: Mapping[str, tf.Tensor],
                      robust_step_size: float = 1e-2) -> Buffered:
    """ExcessMTL (He et al., "Robust Multi-Task Learning with Excess Risks", ICML 2024),
    as LibMTL's `ExcessMTL` (modified from the authors' code).

    Each head's excess risk is estimated from its gradient with a diagonal (AdaGrad)
    approximation: the buffer `S` (`K x D`, initially 0) sums the squared gradients,
    `S += G * G`, and `w_k = sum_j g_kj^2 / sqrt(S_kj + 1e-7)`. The first step that a
    head's `w_k` is positive records it as `initial_w_k` (LibMTL: the first step); after
    that, `w_k / initial_w_k` raises the head's loss weight multiplicatively:
    `loss_weight_k *= exp(robust_step_size w_k / initial_w_k)`, renormalised to sum to K
    (computed as `K softmax(log loss_weight + robust_step_size w / initial_w)`, which
    cannot overflow). The direction is `loss_weight @ G`.

    LibMTL backpropagates the weighted loss `sum_k loss_weight_k L_k` through the whole
    network, so its task-specific layers get `loss_weight_k` times their gradient. Here
    each head has its own optimizer on its own loss: the weights act on the trunk update
    only, as every gradient aggregator's (head k's variables affect loss k only, so the
    factor would only rescale that head's step size from step to step).

    Args:
        grads: the `K x D` gradients as column blocks `K x n_i`.
        buffers: `{"grad_sum": [K x n_i blocks]}`.
        losses: unused (the signature of the buffered aggregators).
        state: `{"loss_weight": (K,), "initial_w": (K,)}` (initially 1 and 0).
        robust_step_size: the step size of the weights (LibMTL's `robust_step_size`, 1e-2).
    """
    del losses
    dtype = grads[0].dtype
    k = _k_rows(grads)
    grad_sum = [tf.cast(s, dtype) + tf.square(g) for s, g in zip(buffers["grad_sum"], grads)]
    w = tf.add_n([tf.reduce_sum(tf.square(g) / tf.sqrt(s + 1e-7), axis=1)
                  for g, s in zip(grads, grad_sum)])
    initial = tf.cast(state["initial_w"], dtype)
    ready = initial > 0
    ratio = tf.where(ready, w / tf.where(ready, initial, tf.ones_like(initial)), tf.zeros_like(w))
    logits = tf.math.log(tf.cast(state["loss_weight"], dtype)) + robust_step_size * ratio
    # Finite logits: an infinite ratio (a first gradient at the underflow limit) would make
    # softmax inf - inf.
    finite = float(np.finfo(dtype.as_numpy_dtype).max)
    loss_weight = k * tf.nn.softmax(tf.clip_by_value(logits, -finite, finite))
    return _buffered(_combine_rows(grads, loss_weight), loss_weight, {"grad_sum": grad_sum},
                     {"loss_weight": loss_weight, "initial_w": tf.where(ready, initial, w)})


def _k_rows(blocks: Sequence[tf.Tensor]) -> int:
    k = blocks[0].shape[0]
    if k is None:
        raise ValueError("the gradients need a static number of heads (rows)")
    return int(k)


# -- coordinate-wise aggregators (on the K x n gradient blocks, not the Gramian) -------------


def graddrop_combine(grads: tf.Tensor, noise: tf.Tensor, leak: float = 0.0) -> tf.Tensor:
    """GradDrop (Chen et al., "Just Pick a Sign: Optimizing Deep Multitask Models with
    Gradient Sign Dropout", NeurIPS 2020), on a `K x n` block of the heads' gradients.

    Per coordinate, the sign purity `P = (1 + sum_k g_k / (sum_k |g_k| + 1e-7)) / 2`
    (LibMTL's 1e-7) and one uniform draw `U` keep the positive gradients where
    `P > U` and the negative ones where `P < U` (mask `M_k`); the result is
    `sum_k (leak + (1 - leak) M_k) g_k` (the paper's leak, default 0 as LibMTL).

    Args:
        grads: `K x n`.
        noise: `(n,)` uniform draws in [0, 1).
        leak: the fraction of every gradient kept whatever its sign.
    """
    purity = 0.5 * (1.0 + tf.reduce_sum(grads, 0) / (tf.reduce_sum(tf.abs(grads), 0) + 1e-7))
    u = tf.cast(noise, grads.dtype)[None, :]
    keep = ((purity[None, :] > u) & (grads > 0)) | ((purity[None, :] < u) & (grads < 0))
    mask = leak + (1.0 - leak) * tf.cast(keep, grads.dtype)
    return tf.reduce_sum(mask * grads, axis=0)


def _column_count(mask: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    """Per column, how many entries of a `K x n` boolean block are true."""
    return tf.reduce_sum(tf.cast(mask, dtype), axis=0)


def trimmed_mean_combine(grads: tf.Tensor, trim_number: int) -> tf.Tensor:
    """Coordinate-wise trimmed mean (Yin et al., "Byzantine-Robust Distributed Learning:
    Towards Optimal Statistical Rates", ICML 2018; torchjd's `TrimmedMean`): per
    coordinate, the mean of the K values without the `trim_number` largest and
    `trim_number` smallest (fewer when fewer heads take part in a step: at most
    `(K - 1) // 2` from each end).

    Trimming one value at each end needs no sort: with `hi` and `lo` the largest and
    smallest value of a coordinate, the kept values are those strictly between them plus
    the copies of `hi` beyond the one dropped (`#{g == hi} - 1`) and likewise of `lo`;
    when `lo == hi` every value is `hi`. The dropped values never enter a sum, so an
    outlier of any size (even inf) costs the kept values no precision, and repeated values
    give the sorted answer exactly. A sort along the K axis costs several times these
    reductions; from two values at each end on, finding each boundary value by reductions
    costs as much as the sort, which then does it.

    Args:
        grads: `K x n`.
        trim_number: values dropped at each end.
    """
    k = grads.shape[0]
    t = min(trim_number, (k - 1) // 2)
    if t == 0:
        return tf.reduce_mean(grads, axis=0)
    if t > 1:
        ordered = tf.sort(grads, axis=0)
        return tf.reduce_mean(ordered[t:k - t], axis=0)
    dtype = grads.dtype
    hi = tf.reduce_max(grads, axis=0)
    lo = tf.reduce_min(grads, axis=0)
    zero = tf.zeros_like(hi)
    between = (grads > lo) & (grads < hi)
    inner = tf.reduce_sum(tf.where(between, grads, tf.zeros_like(grads)), 0)
    # A repeated max or min (with lo < hi) keeps copies of it: counted only when some
    # coordinate has one, as float gradients rarely do (all-equal coordinates have lo == hi).
    repeats = tf.reduce_any((_column_count(between, dtype) < k - 2) & (lo < hi))

    def with_repeats() -> tf.Tensor:
        hi_kept = _column_count(grads >= hi, dtype) - 1.0
        lo_kept = _column_count(grads <= lo, dtype) - 1.0
        # where(): no copy of an infinite hi or lo kept must add 0, not 0 * inf = nan.
        return (inner + tf.where(hi_kept > 0, hi_kept * hi, zero)
                + tf.where(lo_kept > 0, lo_kept * lo, zero))

    total = tf.cond(repeats, with_repeats, lambda: inner)
    return tf.where(lo < hi, total / (k - 2), hi)


# -- registry --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Aggregator:
    """A validated aggregator: a name, its options bound, and where it is valid.

    Attributes:
        name: the config name (`"pcgrad"`).
        weighting: `gram -> Weighting` (for PCGrad also accepts `order=`); for a
            coordinate-wise aggregator, `K x n block -> (n,)` combined block.
        rep_grad: whether combining gradients at the trunk output is valid
            (constant weights: identical; MGDA: the paper's MGDA-UB bound;
            IMTL-G: the paper computes it on the shared features).
        random_order: the step passes a fresh random `order=` every step (PCGrad, GradVac).
        citation: the paper.
        noise: `"normal"`: the step passes `noise=` K standard normal draws
            (Random); `"uniform"`: one uniform draw per coordinate of each block
            (GradDrop); None.
        coordinatewise: combines each `K x n` gradient block coordinate by coordinate
            (GradDrop, TrimmedMean) instead of weighting rows through the Gramian.
        state: the state entries of a stateful aggregator (`state=` in,
            `Weighting.state` out); empty when stateless.
        buffers: names of a buffered aggregator's `K x D` buffers (MoCo's `y`,
            DB-MTL's `grad_buffer`, ExcessMTL's `grad_sum`, initially 0); such an
            aggregator is called as `agg(blocks, buffers=, losses=, state=)` and
            returns `Buffered`.
        needs_losses: `aggregate` needs `losses=` (each head's loss).
        log_losses: the heads descend `log(L_k + 1e-8)` (DB-MTL): the step scales each
            aggregated head's objective by `db_mtl_loss_factor(L_k)`.
    """

    name: str
    weighting: Callable[..., Any]
    rep_grad: bool
    random_order: bool
    citation: str
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    noise: str | None = None
    coordinatewise: bool = False
    state: dict[str, StateSpec] = dataclasses.field(default_factory=dict)
    buffers: tuple[str, ...] = ()
    needs_losses: bool = False
    log_losses: bool = False

    def __call__(self, gram: tf.Tensor, **kwargs: Any) -> Any:
        return self.weighting(gram, **self.options, **kwargs)

    def initial_state(self, k: int) -> dict[str, np.ndarray]:
        """The state of a fresh run with `k` heads (empty when stateless)."""
        return {key: spec.initial(k) for key, spec in self.state.items()}


class _Spec(NamedTuple):
    fn: Callable[..., Any]
    rep_grad: bool
    random_order: bool
    citation: str
    noise: str | None = None
    coordinatewise: bool = False
    state: dict[str, StateSpec] = {}
    buffers: tuple[str, ...] = ()
    needs_losses: bool = False
    log_losses: bool = False


_SPECS: dict[str, _Spec] = {
    "sum": _Spec(sum_weighting, True, False, "sum of the heads' trunk gradients"),
    "mean": _Spec(mean_weighting, True, False, "mean of the heads' trunk gradients"),
    "weights": _Spec(fixed_weighting, True, False, "fixed weighted sum"),
    "pcgrad": _Spec(pcgrad_weighting, False, True, "Yu et al., NeurIPS 2020"),
    "mgda": _Spec(mgda_weighting, True, False, "Sener & Koltun, NeurIPS 2018"),
    "cagrad": _Spec(cagrad_weighting, False, False, "Liu et al., NeurIPS 2021"),
    "upgrad": _Spec(upgrad_weighting, False, False, "Quinton & Rey, arXiv:2406.16232"),
    "dualproj": _Spec(dualproj_weighting, False, False,
                      "Quinton & Rey, arXiv:2406.16232 (torchjd)"),
    "imtl": _Spec(imtl_weighting, True, False, "Liu et al., ICLR 2021 (IMTL-G)"),
    "aligned_mtl": _Spec(aligned_mtl_weighting, True, False, "Senushkin et al., CVPR 2023"),
    "config": _Spec(config_weighting, False, False, "Liu et al., ICLR 2025"),
    "krum": _Spec(krum_weighting, False, False, "Blanchard et al., NeurIPS 2017"),
    "nash_mtl": _Spec(nash_mtl_weighting, False, False, "Navon et al., ICML 2022", state={
        "alpha": StateSpec(lambda k: np.ones(k), 1),
        "step": StateSpec(lambda k: np.zeros((), np.int64), 0)}),
    "gradvac": _Spec(gradvac_weighting, False, True, "Wang et al., ICLR 2021", state={
        "rho_T": StateSpec(lambda k: np.zeros((k, k)), 2)}),
    "fairgrad": _Spec(fairgrad_weighting, False, False, "Ban & Ji, ICML 2024"),
    "sdmgrad": _Spec(sdmgrad_weighting, False, False, "Xiao et al., NeurIPS 2023", state={
        "w": StateSpec(lambda k: np.full(k, 1.0 / k), 1)}),
    "moco": _Spec(moco_update, False, False, "Fernando et al., ICLR 2023", state={
        "lambd": StateSpec(lambda k: np.full(k, 1.0 / k), 1),
        "step": StateSpec(lambda k: np.zeros((), np.int64), 0)},
        buffers=("y",), needs_losses=True),
    "db_mtl": _Spec(db_mtl_update, False, False, "Lin et al., arXiv:2308.12029 (DB-MTL)", state={
        "step": StateSpec(lambda k: np.zeros((), np.int64), 0)},
        buffers=("grad_buffer",), needs_losses=True, log_losses=True),
    "excess_mtl": _Spec(excess_mtl_update, False, False, "He et al., ICML 2024", state={
        "loss_weight": StateSpec(lambda k: np.ones(k), 1),
        "initial_w": StateSpec(lambda k: np.zeros(k), 1)}, buffers=("grad_sum",)),
    "random": _Spec(random_weighting, True, False, "Lin et al., TMLR 2022 (RLW)",
                    noise="normal"),
    "graddrop": _Spec(graddrop_combine, True, False, "Chen et al., NeurIPS 2020",
                      noise="uniform", coordinatewise=True),
    "trimmed_mean": _Spec(trimmed_mean_combine, False, False, "Yin et al., ICML 2018",
                          coordinatewise=True),
}

#: Names accepted by `get_aggregator`.
AGGREGATORS = tuple(_SPECS)
#: Aggregators valid with `rep_grad` (combining at the trunk output).
REP_GRAD_AGGREGATORS = tuple(n for n, spec in _SPECS.items() if spec.rep_grad)
#: Aggregators that keep state from step to step (checkpointed with the trunk update).
STATEFUL_AGGREGATORS = tuple(n for n, spec in _SPECS.items() if spec.state)

_OPTIONS = {
    "sum": {}, "mean": {}, "weights": {"weights": None},
    "pcgrad": {}, "mgda": {"solver": "auto", "max_iter": 250, "tol": 1e-6},
    "cagrad": {"c": 0.4, "rescale": 1, "solver": "auto", "max_iter": 200, "tol": 1e-7},
    "upgrad": {"reg": 1e-4, "norm_eps": 1e-4}, "dualproj": {"reg": 1e-4, "norm_eps": 1e-4},
    "imtl": {}, "aligned_mtl": {"scale_mode": "min"}, "config": {},
    "krum": {"n_byzantine": None, "n_selected": 1},
    "nash_mtl": {"update_weights_every": 1, "optim_niter": 20, "max_norm": 1.0},
    "gradvac": {"beta": 0.5}, "fairgrad": {"alpha": 1.0},
    "moco": {"beta": 0.5, "beta_sigma": 0.5, "gamma": 0.1, "gamma_sigma": 0.5, "rho": 0.0},
    "db_mtl": {"beta": 0.9, "beta_sigma": 0.0}, "excess_mtl": {"robust_step_size": 1e-2},
    "sdmgrad": {"lmbda": 0.3, "niter": 20}, "random": {}, "graddrop": {"leak": 0.0},
    "trimmed_mean": {"trim_number": None},
}


def _number(name: str, key: str, value: Any, low: float, high: float = math.inf,
            integer: bool = False, closed_high: bool = True) -> None:
    ok = not isinstance(value, bool) and isinstance(value, int if integer else (int, float))
    ok = ok and math.isfinite(value) and low <= value and (value <= high if closed_high else value < high)
    if not ok:
        bound = f"[{low}, {high}{']' if closed_high else ')'}"
        kind = "an integer" if integer else "a number"
        raise ValueError(f"aggregator {name!r}: {key} must be {kind} in {bound}, got {value!r}")


def _check_buffered_options(name: str, merged: dict[str, Any]) -> None:
    """The options of MoCo, DB-MTL and ExcessMTL."""
    if name == "moco":
        # beta = 0 never moves y from 0 (a zero direction for ever); beta > 1 overshoots G.
        _number(name, "beta", merged["beta"], 0.0, 1.0)
        if merged["beta"] == 0:
            raise ValueError("aggregator 'moco': beta must be in (0, 1], got 0 (y would stay 0)")
        for key in ("beta_sigma", "gamma", "gamma_sigma", "rho"):
            _number(name, key, merged[key], 0.0)
    if name == "db_mtl":
        # beta = 1 with beta_sigma = 0 keeps the buffer at 0 for ever.
        _number(name, "beta", merged["beta"], 0.0, 1.0, closed_high=False)
        _number(name, "beta_sigma", merged["beta_sigma"], 0.0)
    if name == "excess_mtl":
        _number(name, "robust_step_size", merged["robust_step_size"], 0.0)


def get_aggregator(name: str, num_heads: int | None = None, **options: Any) -> Aggregator:
    """Validates an aggregator name and its options, once, outside any traced code.

    Args:
        name: one of `AGGREGATORS`.
        num_heads: the number of heads it will combine, when known (checks
            `weights` length and `upgrad`'s limit).
        **options: the aggregator's keyword options (`weights=[...]` for
            `weights`; `c`, `rescale` for `cagrad`; `max_iter`, `tol` for `mgda`;
            `reg`, `norm_eps` for `upgrad` and `dualproj`; `scale_mode` for
            `aligned_mtl`; `n_byzantine`, `n_selected` for `krum`; `beta`,
            `beta_sigma`, `gamma`, `gamma_sigma`, `rho` for `moco`; `beta`,
            `beta_sigma` for `db_mtl`; `robust_step_size` for `excess_mtl`).

    Raises:
        ValueError: unknown name or option, or a bad option value.
    """
    if name not in _SPECS:
        from difflib import get_close_matches

        close = get_close_matches(str(name), AGGREGATORS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown aggregator {name!r}{hint}; choose one of {list(AGGREGATORS)}")
    known = _OPTIONS[name]
    for key in options:
        if key not in known:
            raise ValueError(
                f"aggregator {name!r} has no option {key!r}; its options are {sorted(known) or 'none'}"
            )
    merged = {**known, **options}
    _check_buffered_options(name, merged)
    if name == "weights":
        weights = merged["weights"]
        if (not isinstance(weights, (list, tuple)) or not weights
                or not all(isinstance(w, (int, float)) and not isinstance(w, bool)
                           and math.isfinite(w) for w in weights)):
            raise ValueError(
                f"aggregator 'weights' needs weights=[w_1, ..., w_K] (one number per head), got {weights!r}"
            )
        if num_heads is not None and len(weights) != num_heads:
            raise ValueError(
                f"aggregator 'weights': weights has {len(weights)} entries but {num_heads} heads "
                "train the trunk; give one weight per such head, in head order"
            )
        merged["weights"] = [float(w) for w in weights]
    if name == "mgda":
        if merged["solver"] not in ("auto", "exact", "frank_wolfe"):
            raise ValueError(f"aggregator 'mgda': solver must be 'auto', 'exact' or 'frank_wolfe', "
                             f"got {merged['solver']!r}")
        _number(name, "max_iter", merged["max_iter"], 1, integer=True)
        _number(name, "tol", merged["tol"], 0.0)
    if name == "cagrad":
        _number(name, "c", merged["c"], 0.0, 1.0, closed_high=False)
        if merged["rescale"] not in (0, 1, 2) or isinstance(merged["rescale"], bool):
            raise ValueError(f"aggregator 'cagrad': rescale must be 0, 1 or 2, got {merged['rescale']!r}")
        if merged["solver"] not in ("auto", "exact", "pgd"):
            raise ValueError(f"aggregator 'cagrad': solver must be 'auto', 'exact' or 'pgd', "
                             f"got {merged['solver']!r}")
        _number(name, "max_iter", merged["max_iter"], 1, integer=True)
        _number(name, "tol", merged["tol"], 0.0)
    if name in ("upgrad", "dualproj"):
        # reg = 0 is the exact projection (box_qp solves singular Gramians); a negative
        # ridge makes the QP non-convex, an infinite one every weight 0: refused.
        _number(name, "reg", merged["reg"], 0.0)
        _number(name, "norm_eps", merged["norm_eps"], 0.0)
        if num_heads is not None and num_heads > UPGRAD_MAX_HEADS:
            raise ValueError(
                f"aggregator {name!r} supports at most {UPGRAD_MAX_HEADS} heads training the trunk, "
                f"got {num_heads}; use mgda or cagrad for more heads"
            )
    if name == "aligned_mtl" and merged["scale_mode"] not in ("min", "median", "rmse"):
        raise ValueError(f"aggregator 'aligned_mtl': scale_mode must be 'min', 'median' or 'rmse', "
                         f"got {merged['scale_mode']!r}")
    if name == "krum":
        if merged["n_byzantine"] is None:
            raise ValueError("aggregator 'krum' needs n_byzantine=f, the number of heads whose "
                             "gradient may be arbitrary (an integer >= 0)")
        _number(name, "n_byzantine", merged["n_byzantine"], 0, integer=True)
        _number(name, "n_selected", merged["n_selected"], 1, integer=True)
    if name == "nash_mtl":
        _number(name, "update_weights_every", merged["update_weights_every"], 1, integer=True)
        _number(name, "optim_niter", merged["optim_niter"], 1, integer=True)
        _number(name, "max_norm", merged["max_norm"], 0.0)
    if name == "gradvac":
        _number(name, "beta", merged["beta"], 0.0, 1.0)
    if name == "fairgrad":
        # alpha = 0 is utilitarian (the plain sum): w^(-1/alpha) is then undefined.
        if not (isinstance(merged["alpha"], (int, float)) and not isinstance(merged["alpha"], bool)
                and math.isfinite(merged["alpha"]) and merged["alpha"] > 0):
            raise ValueError(f"aggregator 'fairgrad': alpha must be a number > 0 (alpha -> 0 is "
                             f"the sum: use aggregator 'sum'), got {merged['alpha']!r}")
    if name == "sdmgrad":
        _number(name, "lmbda", merged["lmbda"], 0.0)
        _number(name, "niter", merged["niter"], 1, integer=True)
    if name == "graddrop":
        _number(name, "leak", merged["leak"], 0.0, 1.0)
    if name == "trimmed_mean":
        if merged["trim_number"] is None:
            raise ValueError("aggregator 'trimmed_mean' needs trim_number=t, the number of values "
                             "dropped at each end of every coordinate (an integer >= 0)")
        _number(name, "trim_number", merged["trim_number"], 0, integer=True)
        if num_heads is not None and num_heads <= 2 * merged["trim_number"]:
            raise ValueError(f"aggregator 'trimmed_mean': trim_number={merged['trim_number']} "
                             f"drops every value of {num_heads} heads; it must be < K/2")
    spec = _SPECS[name]
    return Aggregator(name, spec.fn, spec.rep_grad, spec.random_order, spec.citation, merged,
                      spec.noise, spec.coordinatewise, dict(spec.state), spec.buffers,
                      spec.needs_losses, spec.log_losses)


def _state_tensor(value: Any, dtype: tf.DType) -> tf.Tensor:
    """A state entry as a tensor, floating entries at the computation's dtype."""
    value = tf.convert_to_tensor(value)
    return tf.cast(value, dtype) if value.dtype.is_floating else value


def aggregate(grads: tf.Tensor, name: str, dtype: tf.DType | str = "float32",
              state: dict[str, Any] | None = None, seed: int = 0, losses: Any = None,
              **options: Any) -> Aggregation:
    """Aggregates the rows of a `K x D` gradient matrix with aggregator `name`.

    Example:
        >>> import numpy as np, multihead as mh
        >>> g = np.array([[1.0, 0.0], [-1.0, 1.0]], np.float32)
        >>> d = mh.aggregate(g, "pcgrad").direction.numpy()   # conflicts removed
        >>> [round(float(x), 6) for x in d]
        [0.5, 1.5]
        >>> mh.aggregate(g, "mgda", dtype="float64").weights.dtype   # for analysis
        tf.float64
        >>> first = mh.aggregate(g, "gradvac")                 # stateful: carry the state
        >>> second = mh.aggregate(g, "gradvac", state=first.state)
        >>> moco = mh.aggregate(g, "moco", losses=[0.5, 2.0])   # MoCo, DB-MTL: the losses too

    Args:
        grads: `K x D` matrix, row k head k's (flattened) trunk gradient.
        name: one of `AGGREGATORS`.
        dtype: `"float32"` (the step's) or `"float64"`: the precision of the
            Gramian, the solve and the result.
        state: a stateful aggregator's state, as returned in `Aggregation.state`
            by the previous call; None: its initial state.
        seed: seed of the draws of a random aggregator (`random`, `graddrop`) when
            `noise=` is not given.
        losses: `(K,)` each head's loss, the one whose gradient is row k: needed by
            `moco` and `db_mtl`, ignored by the others.
        **options: the aggregator's options, plus `order=` for PCGrad and GradVac
            and `noise=` for Random (`(K,)` normal) and GradDrop (`(D,)` uniform).
    """
    dtype = tf.as_dtype(dtype)
    if dtype not in (tf.float32, tf.float64):
        raise ValueError(f"aggregate: dtype must be 'float32' or 'float64', got {dtype.name!r}")
    grads = tf.cast(tf.convert_to_tensor(grads), dtype)
    k, d = int(grads.shape[0]), int(grads.shape[1])
    call_opts = {key: v for key, v in options.items() if key not in ("order", "noise")}
    agg = get_aggregator(name, num_heads=k, **call_opts)
    extra: dict[str, Any] = {}
    if "order" in options:
        extra["order"] = tf.convert_to_tensor(options["order"], tf.int32)
    if agg.noise is not None:
        noise = options.get("noise")
        if noise is None:
            rng = tf.random.Generator.from_seed(seed)
            noise = rng.normal([k]) if agg.noise == "normal" else rng.uniform([d])
        extra["noise"] = tf.cast(tf.convert_to_tensor(noise), dtype)
    if agg.buffers:
        return _aggregate_buffered(agg, grads, dtype, state, losses)
    if agg.coordinatewise:
        direction = tf.function(lambda g: agg(g, **extra))(grads)
        return Aggregation(direction, None, _no_projection())
    if agg.state:
        current = agg.initial_state(k) if state is None else state
        extra["state"] = {key: _state_tensor(v, dtype) for key, v in current.items()}
    # Traced once per call: the solvers' while loops are slow op by op in eager mode.
    result = tf.function(lambda gram: agg(gram, **extra))(gramian(grads, dtype))
    return Aggregation(tf.linalg.matvec(grads, result.weights, transpose_a=True),
                       result.weights, result.projections, result.state)


def _aggregate_buffered(agg: Aggregator, grads: tf.Tensor, dtype: tf.DType,
                        state: dict[str, Any] | None, losses: Any) -> Aggregation:
    """`aggregate` for MoCo, DB-MTL and ExcessMTL: the explicit matrix as one block; the
    state carried between calls holds the `K x D` buffers too."""
    k, d = int(grads.shape[0]), int(grads.shape[1])
    if losses is None:
        if agg.needs_losses:
            raise ValueError(f"aggregate: aggregator {agg.name!r} needs losses=[L_1, ..., L_K], "
                             "each head's loss (the one whose gradient is row k)")
        losses = np.zeros(k)
    losses = tf.cast(tf.convert_to_tensor(losses), dtype)
    if losses.shape != (k,):
        raise ValueError(f"aggregate: losses must have one entry per row of grads ({k}), "
                         f"got shape {tuple(losses.shape)}")
    if state is None:
        state = {**agg.initial_state(k), **{key: np.zeros((k, d)) for key in agg.buffers}}
    expected = set(agg.state) | set(agg.buffers)
    if set(state) != expected:
        raise ValueError(f"aggregate: the state of {agg.name!r} has the entries "
                         f"{sorted(expected)} (pass the previous call's Aggregation.state), "
                         f"got {sorted(state)}")
    small = {key: _state_tensor(state[key], dtype) for key in agg.state}
    buffers = {key: [tf.cast(tf.convert_to_tensor(state[key]), dtype)] for key in agg.buffers}
    # Eager: a few elementwise ops and one K x K product, no solver loop to compile.
    result = agg([grads], buffers=buffers, losses=losses, state=small)
    new_state = {**result.state, **{key: blocks[0] for key, blocks in result.buffers.items()}}
    return Aggregation(result.directions[0], result.weights, result.projections, new_state)
