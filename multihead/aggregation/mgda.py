"""Multi-objective descent from the simplex of the heads' gradients: MGDA (Sener & Koltun,
"Multi-Task Learning as Multi-Objective Optimization", NeurIPS 2018) and EPO (Mahapatra &
Rajan, "Multi-Task Learning with User Preferences: Gradient Descent with Controlled Ascent in
Pareto Optimization", ICML 2020, Exact Pareto Optimal search)."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import tensorflow as tf

from multihead.aggregation._numerics import _as_gram, _k, _no_projection, _ridge
from multihead.aggregation.base import GramianWeighting, Weighting, check_number, check_one_of
from multihead.aggregation.solvers import (
    _min_norm_line,
    simplex_lp,
    simplex_qp,
    simplex_qp_active_set,
)

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


class MGDA(GramianWeighting):
    """MGDA: the min-norm point of the convex hull of the heads' gradients (`mgda_weighting`).

    Args:
        solver: `"auto"`, `"exact"` or `"frank_wolfe"`.
        max_iter: Frank-Wolfe iterations at most (an integer >= 1).
        tol: Frank-Wolfe stops when `sum |w_new - w|` falls below this (>= 0).
    """

    name = "mgda"
    citation = "Sener & Koltun, NeurIPS 2018"
    rep_grad = True

    def __init__(self, solver: str = "auto", max_iter: int = 250, tol: float = 1e-6) -> None:
        check_one_of("mgda", "solver", solver, ("auto", "exact", "frank_wolfe"))
        check_number("mgda", "max_iter", max_iter, 1, integer=True)
        check_number("mgda", "tol", tol, 0.0)
        self._options = {"solver": solver, "max_iter": max_iter, "tol": tol}

    def weigh(self, gram: tf.Tensor, **draws: tf.Tensor) -> Weighting:
        return mgda_weighting(gram, **self._options)


def epo_weighting(gram: tf.Tensor, losses: tf.Tensor, preference: Sequence[float],
                  eps: float = 1e-4) -> Weighting:
    """EPO search (Mahapatra & Rajan, ICML 2020), one step: the authors' `EPO_LP.get_alpha`.

    With `rl = r * l` (preference times losses), `l^ = rl / sum(rl)`, its non-uniformity
    `mu = KL(l^ | 1/K) = sum_k l^_k log(K l^_k)` and the adjustments
    `a = r * (log(K l^) - mu)`, `Ca = C a` (`C` the Gramian):

    * off the preference ray (`mu > eps`), the balance LP: `max_alpha alpha.Ca` on the
      simplex subject to `(C alpha)_j >= Ca_j` for the heads with `Ca_j <= 0` and
      `(C alpha)_j >= 0` for the heads of largest `rl` (no other constraint); when no
      `Ca_j > 0`, `C alpha >= 0` on every head;
    * on the ray, the dominance LP: `max_alpha 1.C alpha` on the simplex subject to
      `C alpha >= 0` and `alpha.Ca >= min(max(Ca), 0)`.

    Each LP is solved exactly (`simplex_lp`: the simplex method in float64, where the authors
    call cvxpy with GLPK); an empty polytope falls back
    to `r / sum(r)`, as the authors' training loop does when its solver returns nothing.
    The weights are `K alpha` (the authors' loop multiplies by the number of tasks).

    Args:
        gram: `K x K` Gramian.
        losses: `(K,)` the heads' losses, positive.
        preference: `r`, K positive numbers: the point sought has `r_k L_k` equal.
        eps: the non-uniformity below which the losses are on the ray.
    """
    k = _k(gram)
    dtype = _as_gram(gram).dtype
    c = tf.cast(_as_gram(gram), tf.float64)
    # The LPs' solutions do not change with C's scale (every term is linear in C).
    c = tf.math.divide_no_nan(c, tf.reduce_max(tf.abs(tf.linalg.diag_part(c))))
    r = tf.constant(list(preference), tf.float64)
    rl = r * tf.cast(losses, tf.float64)
    l_hat = rl / tf.reduce_sum(rl)
    tiny = np.finfo(np.float64).eps
    mu = tf.reduce_sum(tf.where(l_hat > tiny, l_hat * tf.math.log(l_hat * k), 0.0))
    a = r * (tf.math.log(tf.maximum(l_hat, tiny) * k) - mu)
    ca = tf.linalg.matvec(c, a)
    balance = mu > eps
    ascent = ca > 0.0
    largest = tf.equal(rl, tf.reduce_max(rl))
    # Balance: rows j with Ca_j <= 0 keep C alpha >= Ca_j, the largest rl's C alpha >= 0;
    # with no Ca_j > 0, C alpha >= 0 on every row.
    kept = tf.where(tf.reduce_any(ascent), largest | ~ascent, tf.ones_like(ascent))
    bound = tf.where(tf.reduce_any(ascent) & ~largest, ca, tf.zeros_like(ca))
    rows = tf.concat([c, ca[None]], 0)
    bounds = tf.concat([tf.where(balance, bound, tf.zeros_like(ca)),
                        [tf.minimum(tf.reduce_max(ca), 0.0)]], 0)
    valid = tf.concat([tf.where(balance, kept, tf.ones_like(kept)), [~balance]], 0)
    objective = tf.where(balance, ca, tf.reduce_sum(c, 0))
    alpha, found = simplex_lp(objective, rows, bounds, valid)
    alpha = tf.where(found, alpha, r / tf.reduce_sum(r))
    return Weighting(tf.cast(k * alpha, dtype), _no_projection())


class EPO(GramianWeighting):
    """EPO: Exact Pareto Optimal search toward a preference vector (`epo_weighting`).

    Each step moves toward the Pareto point where `preference[k] * L_k` is the same for
    every head (the losses inversely proportional to the preference), descending every
    loss once the losses are on that ray: a sweep over preferences traces the Pareto
    front. It reads the heads' losses (positive ones: MSE, cross-entropy) besides their
    Gramian.

    Args:
        preference: `[r_1, ..., r_K]`, positive numbers, one per head in head order.
        eps: the non-uniformity `KL(r L / sum(r L) | 1/K)` below which the losses count as
            on the preference ray (the authors' default 1e-4).
    """

    name = "epo"
    citation = "Mahapatra & Rajan, ICML 2020"
    needs_losses = True

    def __init__(self, preference: Sequence[float] | None = None, eps: float = 1e-4) -> None:
        if (not isinstance(preference, (list, tuple)) or not preference
                or not all(isinstance(p, (int, float)) and not isinstance(p, bool)
                           and math.isfinite(p) and p > 0 for p in preference)):
            raise ValueError("aggregator 'epo' needs preference=[r_1, ..., r_K] (one positive "
                             f"number per head), got {preference!r}")
        check_number("epo", "eps", eps, 0.0)
        self._options: dict[str, Any] = {"preference": [float(p) for p in preference],
                                         "eps": float(eps)}

    def check_heads(self, num_heads: int) -> None:
        count = len(self._options["preference"])
        if count != num_heads:
            raise ValueError(
                f"aggregator 'epo': preference has {count} entries but {num_heads} heads "
                "train the trunk; give one number per such head, in head order")

    def for_heads(self, positions: Sequence[int]) -> EPO:
        return EPO([self._options["preference"][i] for i in positions], self._options["eps"])

    def weigh(self, gram: tf.Tensor, losses: tf.Tensor | None = None,
              **draws: tf.Tensor) -> Weighting:
        if losses is None:
            raise ValueError("aggregator 'epo' needs losses=: the heads' losses")
        return epo_weighting(gram, losses, **self._options)
