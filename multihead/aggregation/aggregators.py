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
* `upgrad_weighting`: Quinton & Rey, "Jacobian Descent for Multi-Objective
  Optimization", 2024 (arXiv:2406.16232).
* `imtl_weighting`: Liu et al., "Towards Impartial Multi-task Learning"
  (IMTL-G), ICLR 2021.

`aggregate(grads, name, **options)` applies one of them to an explicit `K x D`
matrix; `get_aggregator(name, **options)` validates a name and its options once
(for the trainer and configs).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np
import tensorflow as tf

#: Largest number of heads `upgrad` (and MGDA's exact solver) accepts: they solve
#: their small QPs exactly by enumerating the 2^K active sets in one batched solve.
UPGRAD_MAX_HEADS = 12


class Weighting(NamedTuple):
    """Result of a Gramian-based weighting.

    Attributes:
        weights: `(K,)` float32; the aggregate is `weights @ G`.
        projections: int32 scalar, the number of gradient projections made
            (PCGrad's conflicting pairs; 0 for the other aggregators).
    """

    weights: tf.Tensor
    projections: tf.Tensor


class Aggregation(NamedTuple):
    """Result of `aggregate`.

    Attributes:
        direction: `(D,)` the aggregated gradient `weights @ grads`.
        weights: `(K,)` per-head weights.
        projections: number of projections made (PCGrad), else 0.
    """

    direction: tf.Tensor
    weights: tf.Tensor
    projections: tf.Tensor


def gramian(grads: tf.Tensor) -> tf.Tensor:
    """`G G^T` of a `K x D` gradient matrix (inner products of the heads' gradients)."""
    grads = tf.convert_to_tensor(grads, tf.float32)
    return tf.matmul(grads, grads, transpose_b=True)


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
    return Weighting(tf.ones([_k(gram)], tf.float32), _no_projection())


def mean_weighting(gram: tf.Tensor) -> Weighting:
    """`d = (1/K) sum_k g_k`."""
    k = _k(gram)
    return Weighting(tf.fill([k], 1.0 / k), _no_projection())


def fixed_weighting(gram: tf.Tensor, weights: Sequence[float]) -> Weighting:
    """`d = sum_k weights[k] g_k` with fixed user weights."""
    if len(weights) != _k(gram):
        raise ValueError(f"weights has {len(weights)} entries for {_k(gram)} heads")
    return Weighting(tf.constant(weights, tf.float32), _no_projection())


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
    gram = tf.convert_to_tensor(gram, tf.float32)
    if order is None:
        order = tf.tile(tf.range(k)[None, :], [k, 1])
    order = tf.cast(order, tf.int32)
    coeffs = tf.eye(k)
    rows = tf.range(k)
    projections = tf.constant(0, tf.int32)
    sq_norms = tf.linalg.diag_part(gram)
    for pos in range(k):
        j = order[:, pos]                                    # (K,) the head each row projects on
        rows_j = tf.gather(gram, j)                          # row i: gram[j_i] (= column j_i)
        dots = tf.reduce_sum(coeffs * rows_j, axis=1)        # g_i' . g_{j_i}
        conflict = tf.logical_and(dots < 0.0, tf.not_equal(j, rows))
        scale = tf.where(conflict, tf.math.divide_no_nan(dots, tf.gather(sq_norms, j)), 0.0)
        coeffs -= scale[:, None] * tf.one_hot(j, k)
        projections += tf.reduce_sum(tf.cast(conflict, tf.int32))
    return Weighting(tf.reduce_sum(coeffs, axis=0), projections)


# -- MGDA ------------------------------------------------------------------------------


def _min_norm_line(v1v1: tf.Tensor, v1v2: tf.Tensor, v2v2: tf.Tensor) -> tf.Tensor:
    """Sener & Koltun Algorithm 1: gamma minimising |gamma v1 + (1 - gamma) v2|^2 on [0, 1]."""
    gamma = tf.math.divide_no_nan(v2v2 - v1v2, v1v1 - 2.0 * v1v2 + v2v2)
    gamma = tf.where(v1v2 >= v1v1, 1.0, tf.where(v1v2 >= v2v2, 0.0, gamma))
    return tf.clip_by_value(gamma, 0.0, 1.0)


def _face_systems(q: tf.Tensor, faces: np.ndarray) -> tf.Tensor:
    """`(S, K, K)`: `q` restricted to the coordinates of each row of `faces` (0/1 masks),
    the identity on the others.

    Each system is positive definite when `q` is, so one batched solve handles them all.
    """
    outer = faces[:, :, None] * faces[:, None, :]
    off_diagonal = np.eye(faces.shape[1], dtype=np.float32)[None] * (1.0 - faces)[:, None, :]
    return tf.constant(outer) * q[None] + tf.constant(off_diagonal)


def _min_norm_face(a: tf.Tensor) -> tf.Tensor:
    """The min-norm weights from `a_S = q_SS^-1 1_S` (zero off S), one row per face S.

    On face S the KKT conditions `q_SS w_S = lambda 1, 1.w = 1` give `w = a / 1.a`,
    with objective `w^T q w = 1 / 1.a` (`1.a = a^T q a > 0`). The optimum is the
    feasible (`w >= 0`) candidate with the largest `1.a`.
    """
    total = tf.reduce_sum(a, axis=1)
    w = a / total[:, None]
    # A finite sum has finite terms; a negative one (rounding garbage) never wins: every
    # vertex (singleton face) is feasible with 1.a = 1 / gram_ii > 0.
    feasible = tf.logical_and(tf.reduce_all(w >= -1e-6, axis=1), tf.math.is_finite(total))
    best = tf.argmax(tf.where(feasible, total, -np.inf), output_type=tf.int32)
    return tf.maximum(tf.gather(w, best), 0.0)


def simplex_qp(gram: tf.Tensor, reg: float = 1e-6) -> tf.Tensor:
    """Solves `min_{w >= 0, sum w = 1} w^T gram w` exactly (the min-norm point's weights).

    The optimum lies in the relative interior of some face of the simplex, where
    it solves the KKT system `gram_SS w_S = lambda 1, 1^T w_S = 1` of that face's
    support S, i.e. `w_S` is proportional to `gram_SS^-1 1`. All 2^K - 1 supports
    are solved in one batched `K x K` solve; the best feasible (w >= 0) candidate
    is the optimum (`_min_norm_face`). `reg * I` is added so that affinely
    dependent gradients (K > D, duplicates) keep the systems regular.

    Args:
        gram: `K x K` positive semi-definite matrix, normalised (max diagonal 1).
        reg: ridge added to `gram`.
    """
    k = _k(gram)
    faces = _free_masks(k)[1:]                                            # (S, K), S = 2^K - 1
    a = tf.linalg.solve(_face_systems(gram + reg * tf.eye(k), faces), tf.constant(faces[:, :, None]))
    return _min_norm_face(a[:, :, 0])


def mgda_weighting(gram: tf.Tensor, solver: str = "auto", max_iter: int = 250,
                   tol: float = 1e-6) -> Weighting:
    """MGDA (Sener & Koltun, NeurIPS 2018): the min-norm point of the convex hull of the g_k.

    Solves `min_{w in simplex} |w @ G|^2 = w^T gram w`. With
    `solver="frank_wolfe"`, by their Algorithm 2: start at `w = 1/K`; pick the
    vertex `t = argmin_r (gram w)_r`; exact line search between `w @ G` and
    `g_t` (Algorithm 1); stop when the step moves `w` by less than `tol` (L1)
    or after `max_iter` steps (sublinear convergence: many steps when the
    min-norm point is near 0). With `solver="exact"`, by `simplex_qp` (one
    batched solve over the 2^K faces, K <= UPGRAD_MAX_HEADS): same point,
    to float precision, at a fraction of the cost. `"auto"`: exact when
    K <= UPGRAD_MAX_HEADS. With `rep_grad` this is MGDA-UB (the gradients are
    taken at the trunk output).

    Args:
        gram: `K x K` Gramian.
        solver: `"auto"`, `"exact"` or `"frank_wolfe"`.
        max_iter: Frank-Wolfe iterations at most.
        tol: Frank-Wolfe stops when `sum |w_new - w|` falls below this.
    """
    k = _k(gram)
    gram = tf.convert_to_tensor(gram, tf.float32)
    # The weights do not depend on the Gramian's scale: normalise for float32 robustness.
    scale = tf.reduce_max(tf.linalg.diag_part(gram))
    gram = tf.math.divide_no_nan(gram, scale)
    if solver == "exact" or (solver == "auto" and k <= UPGRAD_MAX_HEADS):
        return Weighting(simplex_qp(gram), _no_projection())
    w0 = tf.fill([k], 1.0 / k)

    def body(i: tf.Tensor, w: tf.Tensor, change: tf.Tensor):
        gw = tf.linalg.matvec(gram, w)
        t = tf.argmin(gw, output_type=tf.int32)
        gamma = _min_norm_line(gram[t, t], gw[t], tf.tensordot(w, gw, 1))
        new = (1.0 - gamma) * w + gamma * tf.one_hot(t, k)
        return i + 1, new, tf.reduce_sum(tf.abs(new - w))

    _, w, _ = tf.while_loop(
        lambda i, w, change: tf.logical_and(i < max_iter, change >= tol),
        body, (tf.constant(0), w0, tf.constant(np.inf, tf.float32)),
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


def _cagrad_exact(g: tf.Tensor, b: tf.Tensor, radius: tf.Tensor, reg: float = 1e-6) -> tf.Tensor:
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
    faces = _free_masks(k)[1:]
    masks = tf.constant(faces)                                             # (S, K)
    rhs = tf.stack([masks, masks * b[None, :]], axis=2)                    # (S, K, 2)
    sol = tf.linalg.solve(_face_systems(g + reg * tf.eye(k), faces), rhs)
    a, c = sol[:, :, 0], sol[:, :, 1]
    a_sum, c_sum = tf.reduce_sum(a, 1), tf.reduce_sum(c, 1)
    b_c = tf.reduce_sum(masks * b[None, :] * c, 1)
    disc = c_sum**2 - a_sum * (b_c - radius**2)
    root = tf.sqrt(tf.maximum(disc, 1e-30))
    mu = (c_sum + root) / a_sum
    # Smooth KKT points, then the min-norm candidates (from the same solve).
    w = tf.concat([(mu[:, None] * a - c) / root[:, None], a / a_sum[:, None]], axis=0)
    feasible = tf.reduce_all(tf.math.is_finite(w), axis=1) & tf.reduce_all(w >= -1e-6, axis=1)
    feasible &= tf.concat([disc > 0, tf.ones_like(disc > 0)], axis=0)
    w = tf.where(feasible[:, None], tf.maximum(w, 0.0), 1.0 / k)
    norms = tf.sqrt(tf.maximum(_quadratic_forms(w, g), 0.0))
    objective = tf.where(feasible, tf.reduce_sum(w * b, axis=1) + radius * norms, np.inf)
    return tf.gather(w, tf.argmin(objective, output_type=tf.int32))


def _cagrad_pgd(g: tf.Tensor, b: tf.Tensor, radius: tf.Tensor, max_iter: int,
                tol: float) -> tf.Tensor:
    """The same problem by projected gradient descent on the simplex (any K)."""
    k = _k(g)
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
        body, (tf.constant(0), tf.fill([k], 1.0 / k), tf.constant(np.inf, tf.float32)),
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
    gram = tf.convert_to_tensor(gram, tf.float32)
    mean = tf.fill([k], 1.0 / k)
    if c == 0:
        return Weighting(mean, _no_projection())
    scale = tf.reduce_max(tf.linalg.diag_part(gram))
    g = tf.math.divide_no_nan(gram, scale)             # argmin is scale invariant
    b = tf.reduce_mean(g, axis=1)                       # G g0 in Gramian form
    g0_norm = tf.sqrt(tf.maximum(tf.reduce_mean(b), 0.0) + 1e-12)
    radius = c * g0_norm
    if solver == "exact" or (solver == "auto" and k <= UPGRAD_MAX_HEADS):
        w = _cagrad_exact(g, b, radius)
    else:
        w = _cagrad_pgd(g, b, radius, max_iter, tol)
    gw_norm = tf.sqrt(tf.maximum(tf.tensordot(w, tf.linalg.matvec(g, w), 1), 0.0)) + 1e-8
    weights = mean + (radius / gw_norm) * w
    if rescale == 1:
        weights /= 1.0 + c**2
    elif rescale == 2:
        weights /= 1.0 + c
    return Weighting(weights, _no_projection())


# -- UPGrad ----------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _free_masks(k: int) -> np.ndarray:
    """All 2^k subsets of `range(k)` as 0/1 rows (1 = coordinate free, 0 = at its bound)."""
    return np.array(list(itertools.product([0.0, 1.0], repeat=k)), np.float32)


def box_qp(gram: tf.Tensor, lower: tf.Tensor) -> tf.Tensor:
    """Solves `min_{w >= lower[p]} w^T gram w` exactly, for every row p of `lower`.

    The optimum has some coordinates at their bound and the others solving the
    unconstrained problem restricted to them. All 2^K such candidates are
    computed in one batched solve; the best feasible one is the optimum (the
    all-at-bound candidate is always feasible). `gram` must be positive definite.

    Args:
        gram: `K x K` positive definite matrix.
        lower: `P x K` lower bounds.

    Returns:
        `P x K` minimisers.
    """
    k = _k(gram)
    gram = tf.convert_to_tensor(gram, tf.float32)
    lower_t = tf.transpose(tf.convert_to_tensor(lower, tf.float32))      # (K, P): column p = bound p
    faces = _free_masks(k)
    masks = tf.constant(faces[:, :, None])                                # (S, K, 1)
    # Every candidate is laid out (S, K, P), as the batched solve wants it: transposing
    # (S, P, K) tensors or broadcasting batched matmuls cost ~70 us each on these shapes.
    fixed = (1.0 - masks) * lower_t[None]                                 # bound coords at their bound
    # gram @ fixed_s = (gram * bound_s) @ lower_t, for every face in one 2-D matmul.
    bound_cols = tf.constant((1.0 - faces)[:, None, :])                   # (S, 1, K)
    gram_fixed = tf.reshape(tf.matmul(tf.reshape(gram[None] * bound_cols, [-1, k]), lower_t),
                            tf.shape(fixed))
    # Free coords see the fixed ones: gram_FF w_F = -(gram @ fixed)_F.
    free = tf.linalg.solve(_face_systems(gram, faces), -masks * gram_fixed)
    cand = masks * free + fixed                                           # (S, K, P)
    scale = tf.reduce_max(tf.abs(lower_t)) + 1.0
    feasible = tf.reduce_all(cand >= lower_t[None] - 1e-5 * scale, axis=1)  # (S, P)
    # The solve makes the gradient gram @ cand vanish on the free coordinates, so
    # cand^T gram cand = cand . (gram @ cand) = cand . (gram @ fixed) (gram is symmetric).
    objective = tf.where(feasible, tf.reduce_sum(cand * gram_fixed, axis=1), np.inf)
    best = tf.argmin(objective, axis=0, output_type=tf.int32)             # (P,)
    # out[p] = cand[best[p], :, p]
    return tf.gather(tf.gather(cand, best), tf.range(tf.shape(best)[0]), axis=2, batch_dims=1)


def upgrad_weighting(gram: tf.Tensor, reg: float = 1e-4) -> Weighting:
    """UPGrad (Quinton & Rey 2024, Jacobian descent): mean of each g_i projected onto the dual cone.

    The projection of `g_i` onto the dual cone `{x : G x >= 0}` of the heads'
    gradients is `w_i @ G` with `w_i = argmin_{v >= e_i} v^T gram v` (their
    Proposition 1); the aggregate is `(1/K) sum_i w_i @ G`, so its inner
    product with every `g_j` is non-negative. As in torchjd, the Gramian is
    normalised by its largest diagonal entry and regularised with `reg * I`
    so that the small QPs are strictly convex.

    Args:
        gram: `K x K` Gramian, `K <= UPGRAD_MAX_HEADS`.
        reg: ridge added to the normalised Gramian.
    """
    k = _k(gram)
    if k > UPGRAD_MAX_HEADS:
        raise ValueError(f"upgrad supports at most {UPGRAD_MAX_HEADS} heads, got {k}")
    gram = tf.convert_to_tensor(gram, tf.float32)
    scale = tf.reduce_max(tf.linalg.diag_part(gram))
    g = tf.math.divide_no_nan(gram, scale) + reg * tf.eye(k)
    w = box_qp(g, tf.eye(k))
    return Weighting(tf.reduce_mean(w, axis=0), _no_projection())


# -- IMTL-G ----------------------------------------------------------------------------


def imtl_weighting(gram: tf.Tensor) -> Weighting:
    """IMTL-G (Liu et al., ICLR 2021): the aggregate has equal projections on every unit g_k.

    With `u_k = g_k / |g_k|`, `D = [g_1 - g_2, ..., g_1 - g_K]^T`,
    `U = [u_1 - u_2, ..., u_1 - u_K]^T`, the paper's closed form is
    `alpha_{2..K} = g_1 U^T (D U^T)^{-1}`, `alpha_1 = 1 - sum alpha_{2..K}`, and
    `d = sum_k alpha_k g_k`. Every product is an entry of the Gramian.
    """
    k = _k(gram)
    gram = tf.convert_to_tensor(gram, tf.float32)
    if k == 1:
        return Weighting(tf.ones([1]), _no_projection())
    norms = tf.sqrt(tf.maximum(tf.linalg.diag_part(gram), 1e-20))
    cos_part = gram / norms[None, :]             # [a, b] = g_a . u_b
    # g_a . (u_1 - u_b) for b = 2..K
    g_dot_u = cos_part[:, :1] - cos_part[:, 1:]                  # (K, K-1)
    du = g_dot_u[:1, :] - g_dot_u[1:, :]                         # (K-1, K-1): (g_1 - g_a).(u_1 - u_b)
    # alpha_rest solves alpha^T (D U^T) = g_1 U^T, i.e. (D U^T)^T alpha = (g_1 U^T)^T. D U^T
    # is singular when two heads' gradients are parallel (or more heads than gradient
    # dimensions): then the minimum-norm least-squares solution, where `solve` would
    # fail the step ("Input matrix is not invertible").
    alpha_rest = tf.linalg.lstsq(tf.linalg.adjoint(du), g_dot_u[0][:, None], fast=False)[:, 0]
    alpha = tf.concat([[1.0 - tf.reduce_sum(alpha_rest)], alpha_rest], axis=0)
    return Weighting(alpha, _no_projection())


# -- registry --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Aggregator:
    """A validated aggregator: a name, its options bound, and where it is valid.

    Attributes:
        name: the config name (`"pcgrad"`).
        weighting: `gram -> Weighting` (for PCGrad also accepts `order=`).
        rep_grad: whether combining gradients at the trunk output is valid
            (constant weights: identical; MGDA: the paper's MGDA-UB bound;
            IMTL-G: the paper computes it on the shared features).
        random_order: the step passes a fresh random `order=` every step (PCGrad).
        citation: the paper.
    """

    name: str
    weighting: Callable[..., Weighting]
    rep_grad: bool
    random_order: bool
    citation: str
    options: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __call__(self, gram: tf.Tensor, **kwargs: Any) -> Weighting:
        return self.weighting(gram, **self.options, **kwargs)


_SPECS: dict[str, tuple[Callable[..., Weighting], bool, bool, str]] = {
    "sum": (sum_weighting, True, False, "sum of the heads' trunk gradients"),
    "mean": (mean_weighting, True, False, "mean of the heads' trunk gradients"),
    "weights": (fixed_weighting, True, False, "fixed weighted sum"),
    "pcgrad": (pcgrad_weighting, False, True, "Yu et al., NeurIPS 2020"),
    "mgda": (mgda_weighting, True, False, "Sener & Koltun, NeurIPS 2018"),
    "cagrad": (cagrad_weighting, False, False, "Liu et al., NeurIPS 2021"),
    "upgrad": (upgrad_weighting, False, False, "Quinton & Rey, arXiv:2406.16232"),
    "imtl": (imtl_weighting, True, False, "Liu et al., ICLR 2021 (IMTL-G)"),
}

#: Names accepted by `get_aggregator`.
AGGREGATORS = tuple(_SPECS)
#: Aggregators valid with `rep_grad` (combining at the trunk output).
REP_GRAD_AGGREGATORS = tuple(n for n, spec in _SPECS.items() if spec[1])

_OPTIONS = {
    "sum": {}, "mean": {}, "weights": {"weights": None},
    "pcgrad": {}, "mgda": {"solver": "auto", "max_iter": 250, "tol": 1e-6},
    "cagrad": {"c": 0.4, "rescale": 1, "solver": "auto", "max_iter": 200, "tol": 1e-7},
    "upgrad": {"reg": 1e-4}, "imtl": {},
}


def _number(name: str, key: str, value: Any, low: float, high: float = math.inf,
            integer: bool = False, closed_high: bool = True) -> None:
    ok = not isinstance(value, bool) and isinstance(value, int if integer else (int, float))
    ok = ok and math.isfinite(value) and low <= value and (value <= high if closed_high else value < high)
    if not ok:
        bound = f"[{low}, {high}{']' if closed_high else ')'}"
        kind = "an integer" if integer else "a number"
        raise ValueError(f"aggregator {name!r}: {key} must be {kind} in {bound}, got {value!r}")


def get_aggregator(name: str, num_heads: int | None = None, **options: Any) -> Aggregator:
    """Validates an aggregator name and its options, once, outside any traced code.

    Args:
        name: one of `AGGREGATORS`.
        num_heads: the number of heads it will combine, when known (checks
            `weights` length and `upgrad`'s limit).
        **options: the aggregator's keyword options (`weights=[...]` for
            `weights`; `c`, `rescale` for `cagrad`; `max_iter`, `tol` for `mgda`;
            `reg` for `upgrad`).

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
        if merged["solver"] == "exact" and num_heads is not None and num_heads > UPGRAD_MAX_HEADS:
            raise ValueError(f"aggregator 'mgda': solver 'exact' supports at most "
                             f"{UPGRAD_MAX_HEADS} heads, got {num_heads}; use 'frank_wolfe'")
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
    if name == "upgrad":
        _number(name, "reg", merged["reg"], 0.0)
        if num_heads is not None and num_heads > UPGRAD_MAX_HEADS:
            raise ValueError(
                f"aggregator 'upgrad' supports at most {UPGRAD_MAX_HEADS} heads training the trunk, "
                f"got {num_heads}; use mgda or cagrad for more heads"
            )
    fn, rep_ok, random_order, citation = _SPECS[name]
    return Aggregator(name, fn, rep_ok, random_order, citation, merged)


def aggregate(grads: tf.Tensor, name: str, **options: Any) -> Aggregation:
    """Aggregates the rows of a `K x D` gradient matrix with aggregator `name`.

    Example:
        >>> import numpy as np, multihead as mh
        >>> g = np.array([[1.0, 0.0], [-1.0, 1.0]], np.float32)
        >>> d = mh.aggregate(g, "pcgrad").direction.numpy()   # conflicts removed
        >>> [round(float(x), 6) for x in d]
        [0.5, 1.5]

    Args:
        grads: `K x D` matrix, row k head k's (flattened) trunk gradient.
        name: one of `AGGREGATORS`.
        **options: the aggregator's options, plus `order=` for PCGrad.
    """
    grads = tf.convert_to_tensor(grads, tf.float32)
    call_opts = {k: v for k, v in options.items() if k != "order"}
    agg = get_aggregator(name, num_heads=int(grads.shape[0]), **call_opts)
    extra = {"order": tf.convert_to_tensor(options["order"], tf.int32)} if "order" in options else {}
    # Traced once per call: the solvers' while loops are slow op by op in eager mode.
    result = tf.function(lambda gram: agg(gram, **extra))(gramian(grads))
    return Aggregation(tf.linalg.matvec(grads, result.weights, transpose_a=True),
                       result.weights, result.projections)
