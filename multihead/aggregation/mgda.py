"""MGDA (Sener & Koltun, "Multi-Task Learning as Multi-Objective Optimization", NeurIPS 2018)."""

from __future__ import annotations


import numpy as np
import tensorflow as tf

from multihead.aggregation._numerics import _as_gram, _k, _no_projection, _ridge
from multihead.aggregation.base import GramianWeighting, Weighting, check_number, check_one_of
from multihead.aggregation.solvers import _min_norm_line, simplex_qp, simplex_qp_active_set

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
