"""Why multihead keeps Keras' Adam rather than TF1's fused `ApplyAdam` kernel.

TF1's `AdamOptimizer` updates each variable with one fused kernel
(`ResourceApplyAdam`); Keras 3's Adam makes several elementwise passes. This
script measures, side by side in one run (medians of interleaved repeats), the
setting of `benchmarks/step_throughput.py` (trunk Dense 64->256->256 relu, K
Dense(1) heads, batch 256):

* the time of the per-head Adam updates alone (K optimizers on trunk + head,
  fixed gradients), Keras vs the fused kernel;
* the time of a whole hand-written TF2 step (a) with each, and of its gradients alone;
* how far the weights of (a) with the fused kernel drift from (a) with Keras' Adam
  after 50 steps from identical weights.

The kernel computes `1 - beta` in float32 (1 - 0.999f = 0.00099998713), Keras in
float64 before the cast (0.001f): a 1.3e-5 relative difference in the second
moment, which Adam's normalisation amplifies wherever a gradient is near zero.

    python benchmarks/fused_adam.py
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from _timing import interleaved_medians, table  # noqa: E402
from step_throughput import HandTF2, constant_batch, initial_weights  # noqa: E402


def fused_adam(optimizer, grads, variables) -> None:
    """`optimizer`'s Adam update through TF1's fused kernel, on `optimizer`'s own slots."""
    step = tf.cast(optimizer.iterations + 1, tf.float32)
    constant = lambda value: tf.constant(value, tf.float32)  # noqa: E731
    for grad, variable in zip(grads, variables):
        i = optimizer._get_variable_index(variable)  # noqa: SLF001
        tf.raw_ops.ResourceApplyAdam(
            var=variable.value.handle, m=optimizer._momentums[i].value.handle,  # noqa: SLF001
            v=optimizer._velocities[i].value.handle,  # noqa: SLF001
            beta1_power=tf.pow(constant(optimizer.beta_1), step),
            beta2_power=tf.pow(constant(optimizer.beta_2), step),
            lr=tf.cast(optimizer.learning_rate, tf.float32), beta1=constant(optimizer.beta_1),
            beta2=constant(optimizer.beta_2), epsilon=constant(optimizer.epsilon), grad=grad)
    optimizer.iterations.assign_add(1)


class Variant(HandTF2):
    """(a), with the Adam update, the fused kernel, or no update at all (gradients only)."""

    def __init__(self, init, width, update):
        self.update = update
        super().__init__(init, width)

    def _step(self, x, ys):
        with tf.GradientTape(persistent=True) as tape:
            feats = self.trunk(x, training=True)
            losses = {h: tf.reduce_mean(tf.square(ys[h] - head(feats, training=True)))
                      for h, head in self.heads.items()}
        done = []
        for h, opt in self.opts.items():
            grads = tape.gradient(losses[h], self.var_lists[h])
            if self.update == "keras":
                opt.apply_gradients(zip(grads, self.var_lists[h]))
            elif self.update == "fused":
                fused_adam(opt, grads, self.var_lists[h])
            else:
                done.append(tf.add_n([tf.reduce_sum(g) for g in grads]))
        del tape
        return done or losses

    def apply_only(self, grads):
        for h, opt in self.opts.items():
            if self.update == "keras":
                opt.apply_gradients(zip(grads[h], self.var_lists[h]))
            else:
                fused_adam(opt, grads[h], self.var_lists[h])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    k, width = args.heads, args.width
    init = initial_weights(k, width)
    _, _, xt, yt = constant_batch(k, args.batch)

    keras_a, fused_a = Variant(init, width, "keras"), Variant(init, width, "fused")
    for _ in range(50):
        keras_a.step(xt, yt)
        fused_a.step(xt, yt)
    drift = max(float(np.max(np.abs(p - q))) for p, q in zip(keras_a.variables(), fused_a.variables()))
    one_keras, one_fused = Variant(init, width, "keras"), Variant(init, width, "fused")
    one_keras.step(xt, yt)
    one_fused.step(xt, yt)
    first = max(float(np.max(np.abs(p - q))) for p, q in zip(one_keras.variables(), one_fused.variables()))

    rng = np.random.default_rng(3)
    grads = {h: [tf.constant(rng.standard_normal(v.shape).astype("float32")) for v in keras_a.var_lists[h]]
             for h in keras_a.heads}
    apply_keras, apply_fused = tf.function(keras_a.apply_only), tf.function(fused_a.apply_only)
    gradients_only = Variant(init, width, "none")
    variants = {
        "Adam updates only, Keras": lambda: apply_keras(grads),
        "Adam updates only, fused kernel": lambda: apply_fused(grads),
        "step (a), Keras Adam": lambda: keras_a.step(xt, yt),
        "step (a), fused kernel": lambda: fused_a.step(xt, yt),
        "step (a), gradients only": lambda: gradients_only.step(xt, yt),
    }
    for fn in variants.values():
        fn()
    t = interleaved_medians(variants, 100, args.repeats)
    print(f"K={k}, trunk 64->{width}->{width}, batch {args.batch}; medians of {args.repeats}")
    rows = [["variant", "us per call"]] + [[name, f"{s * 1e6:.0f}"] for name, s in t.items()]
    print(table(rows))
    print(f"fused kernel vs Keras: updates {t['Adam updates only, Keras'] / t['Adam updates only, fused kernel']:.2f}x, "
          f"whole step {t['step (a), Keras Adam'] / t['step (a), fused kernel']:.2f}x faster")
    print(f"max |w_fused - w_keras|: after 1 step {first:.1e}, after 50 steps {drift:.1e} "
          "(requirement for the framework's step: within 1e-5 of (a))")


if __name__ == "__main__":
    main()
