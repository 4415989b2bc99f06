"""Exact solvers of the small K x K problems the methods pose: min-norm point on the simplex,
box-constrained QPs, and the bargaining equations of Nash-MTL and FairGrad."""

from __future__ import annotations

import functools
import itertools

import numpy as np
import tensorflow as tf

from multihead.aggregation._numerics import _diagonal_scaling, _eps, _feasibility_tol, _k, _ridge, _as_gram


#: Largest number of heads `upgrad` (and MGDA's exact solver) accepts: they solve
#: their small QPs exactly by enumerating the 2^K active sets in one batched solve.
UPGRAD_MAX_HEADS = 12


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


def _simplex_tableau(objective: tf.Tensor, rows: tf.Tensor, bounds: tf.Tensor,
                     valid: tf.Tensor) -> tf.Tensor:
    """`simplex_lp`'s starting tableau: the equalities `1.w = 1` and `rows_j.w - s_j = b_j`,
    each row signed so that its right side is >= 0 and with its artificial variable (the
    starting basis), then the rows `z_j - c_j` of phase 2 (`max c.w`) and phase 1
    (`max -sum a`). Columns: w (K), s (m), artificials (m + 1), the right side."""
    k = int(objective.shape[0])
    m = int(rows.shape[0])
    dtype = objective.dtype
    rows = tf.where(valid[:, None], rows, tf.zeros_like(rows))
    bounds = tf.where(valid, bounds, -tf.ones_like(bounds))                  # 0.w >= -1
    sign = tf.where(bounds < 0.0, -tf.ones_like(bounds), tf.ones_like(bounds))
    table = tf.concat([
        tf.concat([tf.ones([1, k], dtype), sign[:, None] * rows], 0),
        tf.concat([tf.zeros([1, m], dtype), -tf.linalg.diag(sign)], 0),
        tf.eye(m + 1, dtype=dtype),
        tf.concat([tf.ones([1], dtype), sign * bounds], 0)[:, None]], 1)
    phase2 = tf.concat([-objective, tf.zeros([2 * m + 2], dtype)], 0)
    phase1 = tf.concat([-tf.reduce_sum(table[:, :k + m], 0), tf.zeros([m + 1], dtype),
                        -tf.reduce_sum(table[:, -1:], 0)], 0)
    return tf.concat([table, phase2[None], phase1[None]], 0)


def simplex_lp(objective: tf.Tensor, rows: tf.Tensor, bounds: tf.Tensor,
               valid: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Solves `max c.w` over `w >= 0, 1.w = 1, rows[i].w >= bounds[i]` (the rows where `valid`)
    exactly, by the two-phase simplex method.

    A dense tableau in the dtype of `objective` (float64 for exactness): the equalities
    `1.w = 1` and `rows_j.w - s_j = b_j` (a row that is not valid becomes `0.w >= -1`), one
    artificial variable each; phase 1 drives the artificials to 0 (the polytope is empty when
    it cannot), phase 2 maximises `c.w`. Bland's rule picks the entering and the leaving
    variable, so the method ends on degenerate vertices too; an artificial left in the basis
    at 0 leaves at the first pivot whose column touches its row, so it never turns positive.
    The polytope lies in the simplex, so it is bounded and the optimum is a vertex.

    Args:
        objective: `(K,)` the vector `c`.
        rows: `(m, K)` the constraints' rows.
        bounds: `(m,)` their lower bounds.
        valid: `(m,)` bool, which rows constrain (the others are ignored).

    Returns:
        `(w, found)`: the optimum (clipped at 0 and summing to 1) and whether the polytope
        is not empty; when it is, `w` is uniform and `found` False.
    """
    k = int(objective.shape[0])
    m = int(rows.shape[0])
    dtype = objective.dtype
    table = _simplex_tableau(objective, rows, bounds, valid)                        # (m + 3, n + 1)
    n = k + 2 * m + 1
    real = tf.range(n) < k + m                                                      # may enter
    basis = tf.range(k + m, n, dtype=tf.int32)                                      # artificials
    tol = 1e3 * _eps(dtype) * (1.0 + tf.reduce_max(tf.abs(table)))

    def pivot(i: tf.Tensor, table: tf.Tensor, basis: tf.Tensor, phase: tf.Tensor,
              done: tf.Tensor):
        reduced = tf.where(phase == 1, table[-1, :n], table[-2, :n])
        entering = (reduced < -tol) & real
        q = tf.argmax(tf.cast(entering, tf.int32), output_type=tf.int32)            # Bland: first
        column = table[:-2, q]
        positive = column > tol
        ratio = tf.where(positive, table[:-2, -1] / tf.where(positive, column, 1.0),
                         tf.constant(np.inf, dtype))
        # An artificial still basic (at 0) in phase 2 leaves on any nonzero entry.
        stuck = (phase == 2) & (basis >= k + m) & (tf.abs(column) > tol)
        ratio = tf.where(stuck, tf.zeros_like(ratio), ratio)
        limits = positive | stuck
        best = tf.reduce_min(ratio)
        p = tf.argmin(tf.where(limits & (ratio <= best + tol * (1.0 + best)), basis, n),
                      output_type=tf.int32)                                         # Bland: lowest
        moves = tf.reduce_any(entering) & tf.reduce_any(limits)
        row = table[p] / table[p, q]
        pivoted = tf.tensor_scatter_nd_update(table - table[:, q][:, None] * row[None], [[p]],
                                              row[None])
        table = tf.where(moves, pivoted, table)
        basis = tf.where(moves, tf.tensor_scatter_nd_update(basis, [[p]], [q]), basis)
        # Phase 1 ends where no column improves it: on to phase 2 if the artificials are 0.
        feasible = table[-1, -1] >= -tol
        next_phase = tf.where((phase == 1) & ~moves & feasible, 2, phase)
        done = ~moves & ((phase == 2) | ~feasible)
        return i + 1, table, basis, next_phase, done

    _, table, basis, phase, _ = tf.while_loop(
        lambda i, table, basis, phase, done: (i < 20 * n + 50) & ~done, pivot,
        (tf.constant(0), table, basis, tf.constant(1), tf.constant(False)))
    values = tf.scatter_nd(basis[:, None], table[:-2, -1], [n])
    w = tf.maximum(values[:k], 0.0)
    found = (phase == 2) & (tf.reduce_sum(w) > 0.0)
    uniform = tf.fill([k], tf.constant(1.0 / k, dtype))
    return tf.where(found, w / tf.reduce_sum(w), uniform), found


def _project_simplex(v: tf.Tensor) -> tf.Tensor:
    """Euclidean projection onto the probability simplex (Duchi et al., ICML 2008)."""
    k = v.shape[-1]
    u = tf.sort(v, direction="DESCENDING")
    cssv = tf.cumsum(u) - 1.0
    ind = tf.range(1, k + 1, dtype=v.dtype)
    rho = tf.reduce_max(tf.where(u - cssv / ind > 0, tf.range(k), 0))
    theta = cssv[rho] / tf.cast(rho + 1, v.dtype)
    return tf.maximum(v - theta, 0.0)


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
