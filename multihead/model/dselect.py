"""The DSelect-k gate (Hazimeh et al., NeurIPS 2021): a differentiable top-k selection of
experts by binary codes and smooth steps, with its entropy regulariser; `DSelectK`
(`multihead.model.architectures`) gives one per head."""

from __future__ import annotations

import math
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from multihead._checks import check_float, check_int


def smooth_step(t: Any, gamma: float) -> Any:
    """DSelect-k's smooth step: 0 below `-gamma/2`, 1 above `gamma/2`, the cubic
    `-2/gamma^3 t^3 + 3/(2 gamma) t + 1/2` between."""
    cubic = -2.0 / gamma ** 3 * t ** 3 + 3.0 / (2.0 * gamma) * t + 0.5
    return tf.where(t <= -gamma / 2, tf.zeros_like(t), tf.where(t >= gamma / 2, tf.ones_like(t), cubic))


def selector_entropy(selectors: Any) -> Any:
    """DSelect-k's entropy of the single-expert selectors `r` (any shape, experts last):
    `-sum r log(r + 1e-6)` over every element (the authors' definition, epsilon included)."""
    return -tf.reduce_sum(selectors * tf.math.log(selectors + 1e-6))


@keras.saving.register_keras_serializable(package="multihead")
class DSelectGate(keras.layers.Layer):
    """One head's DSelect-k gate (Hazimeh et al., NeurIPS 2021), per example.

    `k` selectors; selector i has `m = log2(n)` logits `z_i = W_i x + b_i` and picks
    expert j with weight `r_ij = prod_l S(z_il)^{bit_l(j)} (1 - S(z_il))^{1 - bit_l(j)}`
    (`S` the smooth step); the gate is `sum_i softmax(a)_i r_i`, `a = W_a x + b_a`.
    Output `(batch, n)`, a distribution over the experts with at most k non-zeros
    once the smooth steps saturate.

    With `entropy_reg > 0`, a training call adds (`add_loss`) the authors' entropy
    regulariser on the selectors, `entropy_reg * -sum_{b,i,j} r_ij log(r_ij + 1e-6)`
    (summed over the batch, as in google-research's `dselect_k_moe`), which pushes each
    selector towards one expert. The model adds it to the objective of the head that
    owns the gate.
    """

    def __init__(self, experts: int, k: int, gamma: float = 1.0, entropy_reg: float = 0.0,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.num_experts = check_int(experts, "DSelectGate.experts", minimum=1)
        self.k = check_int(k, "DSelectGate.k", minimum=1)
        self.entropy_reg = check_float(entropy_reg, "DSelectK.entropy_reg", minimum=0)
        bits = int(round(math.log2(self.num_experts)))
        if 2 ** bits != self.num_experts or self.num_experts < 2:
            raise ValueError(f"DSelectK.experts: must be a power of two >= 2 (each selector "
                             f"addresses experts by binary code), got {experts!r}")
        self.gamma = check_float(gamma, "DSelectK.gamma", minimum=0, min_open=True)
        self.bits = bits
        # bit l of expert j, as the paper's binary encoding.
        self._codes = np.array([[(j >> l) & 1 for l in range(bits)] for j in range(self.num_experts)],
                               dtype="float32")
        # Small logits start every smooth step in its linear part, where it has a gradient.
        small = keras.initializers.RandomUniform(-self.gamma / 100, self.gamma / 100)
        self.selector_logits = keras.layers.Dense(self.k * bits, kernel_initializer=small,
                                                  dtype=self.dtype_policy)
        self.selector_weights = keras.layers.Dense(self.k, kernel_initializer="zeros",
                                                   dtype=self.dtype_policy)

    def call(self, inputs: Any, training: bool | None = None) -> Any:
        z = tf.reshape(self.selector_logits(inputs), [-1, self.k, 1, self.bits])
        s = smooth_step(z, self.gamma)
        codes = tf.constant(self._codes, s.dtype)  # (n, m)
        single = tf.reduce_prod(codes * s + (1.0 - codes) * (1.0 - s), axis=-1)  # (b, k, n)
        if training and self.entropy_reg > 0:  # a loss: in float32 under a mixed policy
            self.add_loss(self.entropy_reg * selector_entropy(tf.cast(single, tf.float32)))
        weights = tf.nn.softmax(self.selector_weights(inputs), axis=-1)  # (b, k)
        return tf.einsum("bk,bkn->bn", weights, single)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "experts": self.num_experts, "k": self.k, "gamma": self.gamma,
                "entropy_reg": self.entropy_reg}
