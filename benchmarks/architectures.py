"""Step time of each multi-task architecture at matched parameter counts, as ratios to a
shared-bottom trunk, side by side in one process.

Two regression heads (`Dense(1)` each) on 100 inputs, batch 256, Adam per head, the
default per-head trunk update. The shared-bottom trunk is one Dense(512, relu) layer
(52k parameters); each architecture's expert (or column) width is the one that brings
its total parameter count closest to that:

  shared_bottom   Dense(512)
  mmoe            8 experts, 1 layer each, a softmax gate per head
  omoe            8 experts, one shared gate
  cgc             4 shared + 2 per head experts (8 in all)
  ple             the same over 2 levels
  dselect_k       8 experts, k = 2
  cross_stitch    a column of 2 Dense layers per head, stitch units after each
  mmoe_before     (with --before) MMoE as it was: the expert bias added to the 3-d
                  (batch, experts, units) output (its gradient a reduction over the batch
                  axis) and each head's mixture a broadcast product and sum, where the layer
                  now adds the bias to the flat output and mixes with a batched matmul

Each is timed through the Trainer's compiled step (the `tf.function` `Trainer.step`
calls); medians over repeats, the variants timed round-robin within each repeat so
that load from other processes hits them alike. The machine is shared: read the
ratios, not the milliseconds; the CPU columns (process CPU time, all threads) move
less with other jobs' load than the wall time. (MTAN is convolutional and has no dense
counterpart here.)

    python benchmarks/architectures.py            # 15 repeats of 50 steps
    python benchmarks/architectures.py --quick    # 5 repeats of 20 steps
    python benchmarks/architectures.py --only mmoe --before   # MMoE now and before, side by side
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import multihead as mh  # noqa: E402
from multihead.model.architectures import StackedDense  # noqa: E402
from _timing import interleaved_wall_and_cpu, table  # noqa: E402

IN_DIM, BATCH, WIDTH = 100, 256, 512
HEADS = ["a", "b"]


class _StackedDense3dBias(StackedDense):
    """The expert layer as it was: the bias added to the 3-d (batch, experts, units) output."""

    def call(self, inputs):
        flat = tf.matmul(inputs, tf.reshape(self.kernel, [-1, self.n * self.units]))
        return self.activation(tf.reshape(flat, [-1, self.n, self.units]) + self.bias)


class _MMoEBefore(mh.MMoE):
    """MMoE as it was: the 3-d expert bias, each head's mixture a broadcast product and sum."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for layer in self.experts.stack:  # same variables, the former computation
            layer.__class__ = _StackedDense3dBias

    def forward(self, inputs, training=None):
        expert_out = self.experts(inputs)
        gates = {h: gate(inputs) for h, gate in zip(self.head_names, self.gates)}
        return ({h: tf.reduce_sum(g[:, :, None] * expert_out, axis=1) for h, g in gates.items()},
                gates)


TRUNKS = {
    "shared_bottom": lambda u: keras.Sequential([keras.layers.Dense(u, activation="relu")]),
    "mmoe": lambda u: mh.MMoE(HEADS, experts=8, expert_units=[u]),
    "omoe": lambda u: mh.OMoE(HEADS, experts=8, expert_units=[u]),
    "cgc": lambda u: mh.CGC(HEADS, shared_experts=4, task_experts=2, expert_units=[u]),
    "ple": lambda u: mh.PLE(HEADS, shared_experts=4, task_experts=2, expert_units=[u], levels=2),
    "dselect_k": lambda u: mh.DSelectK(HEADS, experts=8, k=2, expert_units=[u]),
    "cross_stitch": lambda u: mh.CrossStitch(HEADS, units=[u, u]),
    "mmoe_before": lambda u: _MMoEBefore(HEADS, experts=8, expert_units=[u], name="mmoe_before"),
}
_OPTIONAL = ("mmoe_before",)  # run with --before only


def build(name: str, width: int, seed: int = 0) -> mh.MultiHeadModel:
    keras.utils.set_random_seed(seed)
    model = mh.MultiHeadModel(TRUNKS[name](width), {h: keras.layers.Dense(1) for h in HEADS})
    model.build((None, IN_DIM))
    return model


def count(model: mh.MultiHeadModel) -> int:
    return int(sum(np.prod(v.shape) for v in model.trainable_variables))


def matched_width(name: str, target: int) -> int:
    """The width whose model has the parameter count closest to `target` (the count grows
    with the width: bisection)."""
    low, high = 1, WIDTH
    while low < high:
        mid = (low + high) // 2
        if count(build(name, mid)) < target:
            low = mid + 1
        else:
            high = mid
    candidates = [w for w in (low - 1, low) if w >= 1]
    return min(candidates, key=lambda w: abs(count(build(name, w)) - target))


def compiled_step(model: mh.MultiHeadModel):
    trainer = mh.Trainer(model, {h: mh.Objective("mse", keras.optimizers.Adam(1e-3)) for h in HEADS})
    return trainer._runner.ensure_built(None)  # noqa: SLF001 - the compiled step Trainer.step calls


def main() -> None:
    global WIDTH, BATCH, IN_DIM  # noqa: PLW0603 - a script's settings, read by build()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 repeats of 20 steps")
    parser.add_argument("--width", type=int, default=WIDTH, help="shared-bottom width (512)")
    parser.add_argument("--batch", type=int, default=BATCH, help="batch size (256)")
    parser.add_argument("--in-dim", type=int, default=IN_DIM, help="input features (100)")
    parser.add_argument("--only", help="comma-separated architectures besides shared_bottom")
    parser.add_argument("--before", action="store_true",
                        help="also MMoE as it was before (mmoe_before)")
    args = parser.parse_args()
    WIDTH, BATCH, IN_DIM = args.width, args.batch, args.in_dim
    names = ["shared_bottom"] + [n for n in TRUNKS if n != "shared_bottom" and n not in _OPTIONAL
                                 and (not args.only or n in args.only.split(","))]
    if args.before:
        names.append("mmoe_before")
    calls, repeats = (20, 5) if args.quick else (50, 15)
    rng = np.random.default_rng(1)
    x = tf.constant(rng.standard_normal((BATCH, IN_DIM)), tf.float32)
    y = {h: tf.constant(rng.standard_normal((BATCH, 1)), tf.float32) for h in HEADS}
    target = count(build("shared_bottom", WIDTH))
    widths, params, steps = {}, {}, {}
    for name in names:
        widths[name] = WIDTH if name == "shared_bottom" else matched_width(name, target)
        model = build(name, widths[name])
        params[name] = count(model)
        step = compiled_step(model)
        step(x, y)  # trace
        steps[name] = lambda step=step: step(x, y)
    medians, cpu = interleaved_wall_and_cpu(steps, calls, repeats)
    base, cpu_base = medians["shared_bottom"], cpu["shared_bottom"]
    rows = [["architecture", "width", "parameters", "ms / step", "ratio", "CPU ms / step", "CPU ratio"]]
    for name in names:
        rows.append([name, str(widths[name]), str(params[name]), f"{medians[name] * 1e3:.2f}",
                     f"{medians[name] / base:.2f}x", f"{cpu[name] * 1e3:.2f}",
                     f"{cpu[name] / cpu_base:.2f}x"])
    print(f"step time at matched parameters, {IN_DIM} inputs, batch {BATCH}, median of "
          f"{repeats} x {calls} steps")
    print(table(rows))


if __name__ == "__main__":
    main()
