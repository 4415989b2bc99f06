"""One vectorised trunk backward for K heads against K backward passes.

The setting of `benchmarks/step_throughput.py`: trunk Dense 64->width->width relu,
K Dense(1) heads, MSE, Adam per head, batch 256. Side by side in one process
(medians of interleaved repeats, the load average printed):

* `Trainer.step` with `batched_backward=False` (K backward passes, the default)
  and `True` (one vectorised pass, `multihead.step.batched_backward`);
* the heads' gradients alone (no optimizer update), through the per-head rule's
  own `head_plans`, K passes vs batched;
* the largest difference between the two ways' gradients (float32 rounding);
* the trunk's VJP alone, for K given cotangents: K `tape.gradient` calls, pfor
  (`vectorized_map`), and a hand-written batched VJP of the Dense-relu trunk (one
  reshaped matmul per layer, no pfor): the best a batched pass could do here.

    taskset -c 1 python benchmarks/batched_backward.py            # K = 16, 4 at width 256
    taskset -c 1 python benchmarks/batched_backward.py --small    # also width 32, batch 32
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import interleaved_medians, table  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import multihead as mh  # noqa: E402
from multihead.objectives.objective import resolve_loss  # noqa: E402
from multihead.step.options import StepOptions  # noqa: E402
from multihead.step.train_step import StepObjective, TrainStep  # noqa: E402
from multihead.step.trunk_rule import Backward, HeadsPass, PerHeadRule, head_plans  # noqa: E402
from step_throughput import IN_DIM, constant_batch, initial_weights, keras_parts  # noqa: E402

LR = 1e-3


def trainer(init, width, batched):
    trunk, heads = keras_parts(init, width)
    model = mh.MultiHeadModel(trunk, heads)
    model.build((None, IN_DIM))
    return mh.Trainer(model, {h: mh.Objective("mse", keras.optimizers.Adam(LR)) for h in heads},
                      batched_backward=batched)


def gradients_function(init, width, batched):
    """A compiled function: the gradients the heads' optimizers would get, nothing applied."""
    trunk, heads = keras_parts(init, width)
    model = mh.MultiHeadModel(trunk, heads)
    model.build((None, IN_DIM))
    specs = tuple(StepObjective(h, resolve_loss("mse", h), keras.optimizers.SGD(),
                           tuple(model.var_list(h)), lambda step: tf.constant(1.0), 1, True)
                  for h in heads)
    step = TrainStep(model, specs, StepOptions(), tf.Variable(0, dtype=tf.int64),
                     PerHeadRule(batched))

    @tf.function(autograph=False)
    def grads(x, ys):
        counter = tf.constant(0, tf.int64)
        with tf.GradientTape(persistent=True) as tape:
            fwd = step.forward(x, ys, specs, counter)
        heads_pass = HeadsPass(specs, fwd.losses, counter, tuple(model.trunk_variables),
                               Backward(tape, fwd.objectives), features=fwd.features,
                               trunk_reg=fwd.trunk_reg)
        plans = head_plans(specs, heads_pass, batched)
        return [p.gradients() if callable(p.gradients) else p.gradients for p in plans]

    return grads


def trunk_vjps(init, width, k, size):
    """The trunk's VJP for K stacked cotangents: K passes, pfor, by hand."""
    trunk, _ = keras_parts(init, width)
    x = tf.random.stateless_normal([size, IN_DIM], seed=[0, 1])
    cotangents = tf.random.stateless_normal([k, size, width], seed=[0, 2])
    variables = trunk.trainable_variables
    (w1, b1), (w2, b2) = trunk.layers[0].weights, trunk.layers[1].weights

    def forward():
        with tf.GradientTape(persistent=True) as tape:
            features = trunk(x, training=True)
        return tape, features

    @tf.function(autograph=False)
    def k_passes():
        tape, features = forward()
        return [tape.gradient(features, variables, output_gradients=cotangents[i])
                for i in range(k)]

    @tf.function(autograph=False)
    def pfor():
        tape, features = forward()
        return tf.vectorized_map(
            lambda c: tape.gradient(features, variables, output_gradients=c), cotangents)

    @tf.function(autograph=False)
    def by_hand():
        h = tf.nn.relu(x @ w1 + b1)
        f = tf.nn.relu(h @ w2 + b2)
        d2 = cotangents * tf.cast(f > 0, tf.float32)                       # (K, B, w)
        flat2 = tf.reshape(tf.transpose(d2, [1, 0, 2]), [size, k * width])  # (B, K w)
        dw2 = tf.transpose(tf.reshape(tf.transpose(h) @ flat2, [width, k, width]), [1, 0, 2])
        d1 = tf.reshape(tf.reshape(d2, [k * size, width]) @ tf.transpose(w2), [k, size, width])
        d1 = d1 * tf.cast(h > 0, tf.float32)
        dw1 = tf.einsum("bi,kbj->kij", x, d1)
        return dw1, tf.reduce_sum(d1, 1), dw2, tf.reduce_sum(d2, 1)

    return {"vjp K": k_passes, "vjp pfor": pfor, "vjp by hand": by_hand}


def calls_for(fn, budget=0.3):
    import time
    fn()
    start = time.perf_counter()
    fn()
    return max(3, int(budget / max(time.perf_counter() - start, 1e-6)))


def row(k, width, size, repeats):
    init = initial_weights(k, width)
    _, _, xt, yt = constant_batch(k, size)
    per_head, batched = trainer(init, width, False), trainer(init, width, True)
    g_per_head, g_batched = (gradients_function(init, width, False),
                             gradients_function(init, width, True))
    gap = max(float(np.max(np.abs(a - b))) for ga, gb in zip(g_per_head(xt, yt), g_batched(xt, yt))
              for a, b in zip(ga, gb))
    variants = {"step K": lambda: per_head.step((xt, yt)),
                "step batched": lambda: batched.step((xt, yt)),
                "grads K": lambda: g_per_head(xt, yt),
                "grads batched": lambda: g_batched(xt, yt),
                **trunk_vjps(init, width, k, size)}
    calls = calls_for(variants["step K"])
    t = interleaved_medians(variants, calls, repeats)
    return [str(k), str(width), str(size), f"{1 / t['step K']:.0f}", f"{1 / t['step batched']:.0f}",
            f"{t['step K'] / t['step batched']:.2f}x",
            f"{t['grads K'] * 1e3:.2f}", f"{t['grads batched'] * 1e3:.2f}",
            f"{t['grads K'] / t['grads batched']:.2f}x", f"{gap:.1e}",
            f"{t['vjp K'] / t['vjp pfor']:.2f}x", f"{t['vjp K'] / t['vjp by hand']:.2f}x"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--small", action="store_true", help="also width 32, batch 32")
    args = parser.parse_args()
    grid = [(16, 256, 256), (4, 256, 256)] + ([(16, 32, 32), (4, 32, 32)] if args.small else [])
    print(f"load average before: {os.getloadavg()}  cores allowed: {len(os.sched_getaffinity(0))}")
    rows = [["K", "width", "batch", "step K passes/s", "step batched/s", "batched/K",
             "grads K ms", "grads batched ms", "batched/K", "max|grad gap|",
             "VJP: K/pfor", "K/by hand"]]
    for k, width, size in grid:
        rows.append(row(k, width, size, args.repeats))
    print(table(rows))
    print("ratios > 1: the batched pass is faster (medians of interleaved repeats); the VJP "
          "columns time the trunk's VJP alone for K given cotangents")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
