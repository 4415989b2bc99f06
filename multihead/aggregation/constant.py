"""Constant weights: the sum, the mean, fixed user weights, and random weights (RLW)."""

from __future__ import annotations

import math
from typing import Any, Sequence

import tensorflow as tf

from multihead.aggregation._numerics import _as_gram, _k, _no_projection
from multihead.aggregation.base import GramianWeighting, Weighting

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


class Sum(GramianWeighting):
    """`d = sum_k g_k`: what per-head SGD does to the trunk, with one optimizer."""

    name = "sum"
    citation = "sum of the heads' trunk gradients"
    rep_grad = True
    constant = True

    def __init__(self) -> None:
        self._options: dict[str, Any] = {}

    def weigh(self, gram: tf.Tensor, **draws: tf.Tensor) -> Weighting:
        return sum_weighting(gram)


class Mean(GramianWeighting):
    """`d = (1/K) sum_k g_k`."""

    name = "mean"
    citation = "mean of the heads' trunk gradients"
    rep_grad = True
    constant = True

    def __init__(self) -> None:
        self._options: dict[str, Any] = {}

    def weigh(self, gram: tf.Tensor, **draws: tf.Tensor) -> Weighting:
        return mean_weighting(gram)


class FixedWeights(GramianWeighting):
    """`d = sum_k weights[k] g_k` with fixed user weights, one per head in head order.

    Args:
        weights: `[w_1, ..., w_K]`, finite numbers.
    """

    name = "weights"
    citation = "fixed weighted sum"
    rep_grad = True
    constant = True

    def __init__(self, weights: Sequence[float] | None = None) -> None:
        if (not isinstance(weights, (list, tuple)) or not weights
                or not all(isinstance(w, (int, float)) and not isinstance(w, bool)
                           and math.isfinite(w) for w in weights)):
            raise ValueError(
                f"aggregator 'weights' needs weights=[w_1, ..., w_K] (one number per head), got {weights!r}"
            )
        self._options = {"weights": [float(w) for w in weights]}

    def check_heads(self, num_heads: int) -> None:
        count = len(self._options["weights"])
        if count != num_heads:
            raise ValueError(
                f"aggregator 'weights': weights has {count} entries but {num_heads} heads "
                "train the trunk; give one weight per such head, in head order"
            )

    def for_heads(self, positions: Sequence[int]) -> FixedWeights:
        return FixedWeights([self._options["weights"][i] for i in positions])

    def weigh(self, gram: tf.Tensor, **draws: tf.Tensor) -> Weighting:
        return fixed_weighting(gram, self._options["weights"])


class RandomWeights(GramianWeighting):
    """Random weighting (Lin et al., TMLR 2022): `w = softmax(z)`, `z ~ N(0, I)` each step."""

    name = "random"
    citation = "Lin et al., TMLR 2022 (RLW)"
    rep_grad = True
    constant = True
    noise = "normal"

    def __init__(self) -> None:
        self._options: dict[str, Any] = {}

    def weigh(self, gram: tf.Tensor, noise: tf.Tensor | None = None, **draws: tf.Tensor) -> Weighting:
        if noise is None:
            raise ValueError("aggregator 'random' needs noise=: K standard normal draws")
        return random_weighting(gram, noise)
