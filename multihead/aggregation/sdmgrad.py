"""SDMGrad (Xiao et al., "Direction-oriented Multi-objective Learning: Simple and Provable
Stochastic Algorithms", NeurIPS 2023)."""

from __future__ import annotations


import numpy as np
import tensorflow as tf

from multihead.aggregation._numerics import _as_gram, _k, _no_projection
from multihead.aggregation.base import StateSpec, StatefulGramianWeighting, Weighting, check_number
from multihead.aggregation.solvers import _project_simplex

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


class SDMGrad(StatefulGramianWeighting):
    """SDMGrad: simplex weights by projected SGD, regularised toward the mean
    (`sdmgrad_weighting`).

    Args:
        lmbda: the regularisation towards the mean (>= 0; LibMTL's `SDMGrad_lamda`, 0.3).
        niter: projected SGD steps per call (>= 1; LibMTL's `SDMGrad_niter`, 20).
    """

    name = "sdmgrad"
    citation = "Xiao et al., NeurIPS 2023"

    def __init__(self, lmbda: float = 0.3, niter: int = 20) -> None:
        check_number("sdmgrad", "lmbda", lmbda, 0.0)
        check_number("sdmgrad", "niter", niter, 1, integer=True)
        self._options = {"lmbda": lmbda, "niter": niter}

    def state_spec(self) -> dict[str, StateSpec]:
        return {"w": StateSpec(lambda k: np.full(k, 1.0 / k), 1)}

    def weigh(self, gram: tf.Tensor, state: dict[str, tf.Tensor] | None = None,
              **draws: tf.Tensor) -> Weighting:
        return sdmgrad_weighting(gram, state, **self._options)
