"""Nash-MTL (Navon et al., ICML 2022) and FairGrad (Ban & Ji, ICML 2024): weights that solve
a bargaining problem on the Gramian."""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from multihead.aggregation._numerics import _as_gram, _k, _no_projection
from multihead.aggregation.base import (
    GramianWeighting,
    StateSpec,
    StatefulGramianWeighting,
    Weighting,
    check_number,
)
from multihead.aggregation.solvers import _bargaining_weights

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
    _k(gram)  # the number of heads must be static
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


class NashMTL(StatefulGramianWeighting):
    """Nash-MTL: the Nash bargaining solution `(G G^T alpha)_i = 1 / alpha_i`
    (`nash_mtl_weighting`).

    Args:
        update_weights_every: recompute the weights every this many steps (>= 1).
        optim_niter: Newton steps at most (>= 1).
        max_norm: clip the aggregate's norm to this (0: off).
    """

    name = "nash_mtl"
    citation = "Navon et al., ICML 2022"

    def __init__(self, update_weights_every: int = 1, optim_niter: int = 20,
                 max_norm: float = 1.0) -> None:
        check_number("nash_mtl", "update_weights_every", update_weights_every, 1, integer=True)
        check_number("nash_mtl", "optim_niter", optim_niter, 1, integer=True)
        check_number("nash_mtl", "max_norm", max_norm, 0.0)
        self._options = {"update_weights_every": update_weights_every,
                         "optim_niter": optim_niter, "max_norm": max_norm}

    def state_spec(self) -> dict[str, StateSpec]:
        return {"alpha": StateSpec(lambda k: np.ones(k), 1),
                "step": StateSpec(lambda k: np.zeros((), np.int64), 0)}

    def weigh(self, gram: tf.Tensor, state: dict[str, tf.Tensor] | None = None,
              **draws: tf.Tensor) -> Weighting:
        return nash_mtl_weighting(gram, state, **self._options)


class FairGrad(GramianWeighting):
    """FairGrad: alpha-fair weights `(G G^T w)_i = w_i^(-1/alpha)` (`fairgrad_weighting`).

    Args:
        alpha: the fairness parameter, > 0 (1: Nash-MTL's point).
    """

    name = "fairgrad"
    citation = "Ban & Ji, ICML 2024"

    def __init__(self, alpha: float = 1.0) -> None:
        # alpha = 0 is utilitarian (the plain sum): w^(-1/alpha) is then undefined.
        if not (isinstance(alpha, (int, float)) and not isinstance(alpha, bool)
                and math.isfinite(alpha) and alpha > 0):
            raise ValueError(f"aggregator 'fairgrad': alpha must be a number > 0 (alpha -> 0 is "
                             f"the sum: use aggregator 'sum'), got {alpha!r}")
        self._options = {"alpha": alpha}

    def weigh(self, gram: tf.Tensor, **draws: tf.Tensor) -> Weighting:
        return fairgrad_weighting(gram, **self._options)
