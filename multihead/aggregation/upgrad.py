"""UPGrad and DualProj (Quinton & Rey, "Jacobian Descent for Multi-Objective Optimization",
2024, arXiv:2406.16232), as torchjd."""

from __future__ import annotations


import tensorflow as tf

from multihead.aggregation._numerics import _as_gram, _k, _no_projection, _ridge
from multihead.aggregation.base import GramianWeighting, Weighting, check_number
from multihead.aggregation.solvers import UPGRAD_MAX_HEADS, _normalize_trace, box_qp

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


class _DualCone(GramianWeighting):
    """UPGrad's and DualProj's options: torchjd's `reg_eps` and `norm_eps`; at most
    `UPGRAD_MAX_HEADS` heads (their QPs are solved by enumerating the 2^K active sets)."""

    def __init__(self, reg: float = 1e-4, norm_eps: float = 1e-4) -> None:
        # reg = 0 is the exact projection (box_qp solves singular Gramians); a negative
        # ridge makes the QP non-convex, an infinite one every weight 0: refused.
        check_number(self.label, "reg", reg, 0.0)
        check_number(self.label, "norm_eps", norm_eps, 0.0)
        self._options = {"reg": reg, "norm_eps": norm_eps}

    def check_heads(self, num_heads: int) -> None:
        if num_heads > UPGRAD_MAX_HEADS:
            raise ValueError(
                f"aggregator {self.label!r} supports at most {UPGRAD_MAX_HEADS} heads training the "
                f"trunk, got {num_heads}; use mgda or cagrad for more heads"
            )


class UPGrad(_DualCone):
    """UPGrad: the mean of each gradient projected onto the dual cone (`upgrad_weighting`)."""

    name = "upgrad"
    citation = "Quinton & Rey, arXiv:2406.16232"

    def weigh(self, gram: tf.Tensor, **draws: tf.Tensor) -> Weighting:
        return upgrad_weighting(gram, **self._options)


class DualProj(_DualCone):
    """DualProj: the mean projected onto the dual cone (`dualproj_weighting`)."""

    name = "dualproj"
    citation = "Quinton & Rey, arXiv:2406.16232 (torchjd)"

    def weigh(self, gram: tf.Tensor, **draws: tf.Tensor) -> Weighting:
        return dualproj_weighting(gram, **self._options)
