"""Dynamic loss scaling per head, for models that compute in float16.

A float16 gradient underflows to zero below ~6e-8 (and overflows above 65504).
Loss scaling multiplies a loss by a large factor before its gradient is taken, so
the small gradients stay representable, and divides the gradients by it before the
update (Micikevicius et al., "Mixed Precision Training", ICLR 2018). With several
losses, one scale for all of them is set by the worst: here each head has its own
(as PyTorch's AMP notes advise for several losses and optimizers).

The dynamics are Keras' `LossScaleOptimizer`'s, per head:

* a head whose unscaled loss or unscaled gradient is not finite skips its update
  (the applier's non-finite guard), and its scale halves;
* after `growth_steps` finite updates in a row, its scale doubles.

The step asks `LossScales.scale` for a head's scaled objective; the applier asks
`unscale` for its gradients and calls `update` with whether they were finite. The
scales and counters are non-trainable variables, saved as the checkpoint part
`loss_scales`.

bfloat16 has float32's exponent range: it needs no loss scale.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Sequence

import keras
import tensorflow as tf

from multihead import _keras_internals as internals
from multihead._checks import check_float, check_int


@dataclasses.dataclass(frozen=True)
class DynamicLossScale:
    """How each head's loss scale starts and grows (Keras' `LossScaleOptimizer` defaults).

    Example:
        >>> import multihead as mh
        >>> mh.DynamicLossScale(initial=2.0 ** 10, growth_steps=500).growth_steps
        500

    Attributes:
        initial: every head's scale at the first step (a power of two keeps the
            unscaled gradients exact).
        growth_steps: a head's scale doubles after this many finite updates in a row.
    """

    initial: float = 2.0 ** 15
    growth_steps: int = 2000

    def __post_init__(self) -> None:
        check_float(self.initial, "DynamicLossScale.initial", minimum=0, min_open=True)
        check_int(self.growth_steps, "DynamicLossScale.growth_steps", minimum=1)


def computes_in_float16(layers: Iterable[keras.layers.Layer]) -> bool:
    """Whether some layer of `layers` (or under them) computes in float16 (`mixed_float16`)."""
    return any(sub.dtype_policy.compute_dtype == "float16"
               for layer in layers for sub in internals.all_layers(layer))


class LossScales(tf.Module):
    """Each head's dynamic loss scale and its count of finite updates since it last changed.

    Args:
        heads: the heads, in order.
        options: the initial scale and the growth period.
    """

    def __init__(self, heads: Sequence[str], options: DynamicLossScale = DynamicLossScale()) -> None:
        super().__init__(name="loss_scales")
        self.options = options
        #: Head -> its current scale (float32).
        self.scales = {h: tf.Variable(float(options.initial), trainable=False, dtype=tf.float32,
                                      name=f"loss_scale_{h}") for h in heads}
        #: Head -> finite updates since its scale last changed (int64).
        self.counts = {h: tf.Variable(0, trainable=False, dtype=tf.int64,
                                      name=f"loss_scale_count_{h}") for h in heads}

    def scale(self, head: str, objective: tf.Tensor) -> tf.Tensor:
        """`objective` times `head`'s scale: what the head's gradient is taken of."""
        return objective * self.scales[head]

    def unscale(self, head: str, grads: Sequence[Any]) -> list[Any]:
        """`grads` divided by `head`'s scale (None stays None)."""
        inverse = 1.0 / self.scales[head]
        return [None if g is None else
                tf.IndexedSlices(g.values * inverse, g.indices, g.dense_shape)
                if isinstance(g, tf.IndexedSlices) else g * inverse
                for g in grads]

    def updated(self, head: str, finite: tf.Tensor) -> list[tuple[tf.Variable, tf.Tensor]]:
        """After an update of `head` was applied (`finite`) or skipped, the new scale and
        count (for the applier to write): the scale halves on a skip, doubles after
        `growth_steps` finite updates in a row."""
        scale, count = self.scales[head], self.counts[head]
        grown = tf.logical_and(finite, count >= self.options.growth_steps - 1)
        factor = tf.where(finite, tf.where(grown, 2.0, 1.0), 0.5)
        return [(scale, scale * factor),
                (count, tf.where(tf.logical_and(finite, tf.logical_not(grown)), count + 1,
                                 tf.constant(0, tf.int64)))]

    def values(self) -> dict[str, float]:
        """Head -> its current scale."""
        return {h: float(v.numpy()) for h, v in self.scales.items()}
