"""Step throughput of multihead against what a researcher would otherwise write.

Side by side in one run (medians of repeats, variants timed round-robin):

  (a) hand-written TF2: `tf.function` step, persistent GradientTape, one
      `tape.gradient` and one Keras Adam per head on var_list = trunk + head;
  (b) classic TF1: `tf.compat.v1` graph, `variable_scope` + `get_collection`, one
      `AdamOptimizer.minimize(loss_k, var_list=...)` per head,
      `sess.run([all train ops], feed_dict)`;
  (c) one summed loss, one optimizer (the lower bound: one backward pass);
  multihead `Trainer.step`, and `Trainer.fit` end to end over a tf.data pipeline
  against a naive Python loop over the same pipeline calling (a), and TF1 feeding
  numpy batches.

Also: achieved GFLOP/s of the step at width 2048 / batch 1024 against a large
`tf.matmul` in the same run, trace and step time for K = 1..64, peak memory of
`Trainer.step` against (a) (separate processes), and XLA on/off.

    python benchmarks/step_throughput.py            # the full grid (long)
    python benchmarks/step_throughput.py --quick    # K = 1, 4, 16 at width 256, batch 256
    python benchmarks/step_throughput.py --only fit # one section (repeatable)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import interleaved_medians, table, time_per_call  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import multihead as mh  # noqa: E402

IN_DIM = 64
LR = 1e-3
SECTIONS = ("grid", "fit", "flops", "scaling", "memory", "xla")


def initial_weights(k: int, width: int, seed: int = 0) -> dict[str, list[np.ndarray]]:
    """Glorot-uniform weights shared by every variant, so all start identical."""
    rng = np.random.default_rng(seed)

    def glorot(n_in: int, n_out: int) -> np.ndarray:
        limit = np.sqrt(6.0 / (n_in + n_out))
        return rng.uniform(-limit, limit, (n_in, n_out)).astype(np.float32)

    return {
        "trunk": [glorot(IN_DIM, width), np.zeros(width, np.float32),
                  glorot(width, width), np.zeros(width, np.float32)],
        **{f"h{i}": [glorot(width, 1), np.zeros(1, np.float32)] for i in range(k)},
    }


def batch(k: int, size: int, seed: int = 1) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((size, IN_DIM)).astype(np.float32)
    return x, {f"h{i}": rng.standard_normal((size, 1)).astype(np.float32) for i in range(k)}


def constant_batch(k: int, size: int):
    """`batch(k, size)` as tensors: (x, ys) for TF1, (xt, yt) for the TF2 variants."""
    x, ys = batch(k, size)
    return x, ys, tf.constant(x), {h: tf.constant(v) for h, v in ys.items()}


def keras_parts(init: dict[str, list[np.ndarray]], width: int, dtype=None):
    """The trunk and heads with weights `init`; `dtype`: the trunk's dtype policy (e.g.
    `"mixed_float16"`; the heads' output layers stay float32)."""
    trunk = keras.Sequential([keras.layers.Dense(width, activation="relu", dtype=dtype),
                              keras.layers.Dense(width, activation="relu", dtype=dtype)])
    trunk.build((None, IN_DIM))
    trunk.set_weights(init["trunk"])
    heads = {}
    for name, values in init.items():
        if name != "trunk":
            heads[name] = keras.layers.Dense(1)
            heads[name].build((None, width))
            heads[name].set_weights(values)
    return trunk, heads


class HandTF2:
    """(a): what a careful researcher writes by hand in TF2."""

    def __init__(self, init, width):
        self.trunk, self.heads = keras_parts(init, width)
        self.var_lists = {h: self.trunk.trainable_variables + head.trainable_variables
                          for h, head in self.heads.items()}
        self.opts = {h: keras.optimizers.Adam(LR) for h in self.heads}
        for h, opt in self.opts.items():
            opt.build(self.var_lists[h])
        self.step = tf.function(self._step)

    def _step(self, x, ys):
        with tf.GradientTape(persistent=True) as tape:
            feats = self.trunk(x, training=True)
            losses = {h: tf.reduce_mean(tf.square(ys[h] - head(feats, training=True)))
                      for h, head in self.heads.items()}
        for h, opt in self.opts.items():
            grads = tape.gradient(losses[h], self.var_lists[h])
            opt.apply_gradients(zip(grads, self.var_lists[h]))
        del tape
        return losses

    def variables(self):
        return [v.numpy() for v in self.trunk.trainable_variables] + [
            v.numpy() for h in self.heads for v in self.heads[h].trainable_variables]


class Summed(HandTF2):
    """(c): one summed loss, one optimizer, one backward pass."""

    def __init__(self, init, width):
        super().__init__(init, width)
        self.all_vars = self.trunk.trainable_variables + [
            v for head in self.heads.values() for v in head.trainable_variables]
        self.opt = keras.optimizers.Adam(LR)
        self.opt.build(self.all_vars)

    def _step(self, x, ys):
        with tf.GradientTape() as tape:
            feats = self.trunk(x, training=True)
            loss = tf.add_n([tf.reduce_mean(tf.square(ys[h] - head(feats, training=True)))
                             for h, head in self.heads.items()])
        self.opt.apply_gradients(zip(tape.gradient(loss, self.all_vars), self.all_vars))
        return loss


class TF1:
    """(b): the classic TF1 graph: variable_scope, get_collection, minimize(var_list), sess.run."""

    def __init__(self, init, width):
        v1 = tf.compat.v1
        self.graph = tf.Graph()
        with self.graph.as_default():
            self.x = v1.placeholder(tf.float32, [None, IN_DIM])
            self.ys = {h: v1.placeholder(tf.float32, [None, 1]) for h in init if h != "trunk"}
            with v1.variable_scope("trunk"):
                w1 = v1.get_variable("w1", initializer=init["trunk"][0])
                b1 = v1.get_variable("b1", initializer=init["trunk"][1])
                w2 = v1.get_variable("w2", initializer=init["trunk"][2])
                b2 = v1.get_variable("b2", initializer=init["trunk"][3])
                feats = tf.nn.relu(tf.matmul(tf.nn.relu(tf.matmul(self.x, w1) + b1), w2) + b2)
            trunk_vars = v1.get_collection(v1.GraphKeys.TRAINABLE_VARIABLES, scope="trunk")
            self.train_ops, self.losses = [], []
            for h in self.ys:
                with v1.variable_scope(h):
                    w = v1.get_variable("w", initializer=init[h][0])
                    b = v1.get_variable("b", initializer=init[h][1])
                    loss = tf.reduce_mean(tf.square(self.ys[h] - (tf.matmul(feats, w) + b)))
                head_vars = v1.get_collection(v1.GraphKeys.TRAINABLE_VARIABLES, scope=h)
                self.train_ops.append(
                    v1.train.AdamOptimizer(LR, epsilon=1e-7).minimize(loss, var_list=trunk_vars + head_vars))
                self.losses.append(loss)
            self.sess = v1.Session(graph=self.graph, config=v1.ConfigProto())
            self.sess.run(v1.global_variables_initializer())

    def step(self, x, ys):
        feed = {self.x: x, **{self.ys[h]: ys[h] for h in self.ys}}
        return self.sess.run([self.train_ops, self.losses], feed_dict=feed)[1]


def multihead_trainer(init, width, jit_compile=False):
    trunk, heads = keras_parts(init, width)
    model = mh.MultiHeadModel(trunk, heads)
    model.build((None, IN_DIM))
    objectives = {h: mh.Objective("mse", keras.optimizers.Adam(LR)) for h in heads}
    return mh.Trainer(model, objectives, jit_compile=jit_compile)


def pipeline(k, size, batches=64):
    """The same shuffled, prefetched tf.data pipeline for every end-to-end variant."""
    return mh.as_dataset(batch(k, size * batches, seed=2), size, seed=0).repeat()


def calls_for(fn, budget=0.25):
    """Calls per timing so that one timing takes about `budget` seconds."""
    return max(3, int(budget / max(time_per_call(fn, 3), 1e-6)))


def step_table(ks, widths, sizes, repeats):
    rows = [["K", "width", "batch", "(a) steps/s", "(b) TF1", "(c) summed", "mh.step", "mh/(a)",
             "mh/(b)", "max|w_mh - w_a|"]]
    for width in widths:
        for size in sizes:
            for k in ks:
                init = initial_weights(k, width)
                x, ys, xt, yt = constant_batch(k, size)
                hand, summed, tf1 = HandTF2(init, width), Summed(init, width), TF1(init, width)
                trainer = multihead_trainer(init, width)
                # Numerics first, from the identical initial weights: 50 steps each.
                ref, ours = HandTF2(init, width), multihead_trainer(init, width)
                for _ in range(50):
                    ref.step(xt, yt)
                    ours.step((xt, yt))
                ours_w = [v.numpy() for v in ours.model.trunk_variables] + [
                    v.numpy() for h in ours.model.head_names for v in ours.model.head_variables(h)]
                diff = max(float(np.max(np.abs(a - b))) for a, b in zip(ref.variables(), ours_w))
                variants = {
                    "a": lambda: hand.step(xt, yt),
                    "b": lambda: tf1.step(x, ys),
                    "c": lambda: summed.step(xt, yt),
                    "mh": lambda: trainer.step((xt, yt)),
                }
                calls = calls_for(variants["a"])
                t = interleaved_medians(variants, calls, repeats)
                rows.append([str(k), str(width), str(size), f"{1 / t['a']:.0f}", f"{1 / t['b']:.0f}",
                             f"{1 / t['c']:.0f}", f"{1 / t['mh']:.0f}", f"{t['a'] / t['mh']:.3f}",
                             f"{t['b'] / t['mh']:.3f}", f"{diff:.1e}"])
                print(table(rows[:1] + rows[-1:]).splitlines()[-1], flush=True)
    return rows


def fit_table(k, width, size, steps, repeats, steps_per_execution):
    init = initial_weights(k, width)
    arrays = batch(k, size * 64, seed=2)
    ds = pipeline(k, size)
    hand, tf1, trainer = HandTF2(init, width), TF1(init, width), multihead_trainer(init, width)
    rng = np.random.default_rng(0)

    def naive():
        for x, ys in ds.take(steps):
            out = hand.step(x, ys)
        return out

    def tf1_loop():
        # The classic input path: a numpy permutation per epoch, fancy-indexed batches, feed_dict.
        x_all, ys_all = arrays
        order = rng.permutation(len(x_all))
        for i in range(steps):
            idx = order[(i * size) % len(x_all):][:size]
            out = tf1.step(x_all[idx], {h: y[idx] for h, y in ys_all.items()})
        return out

    def fit(spe):
        return lambda: trainer.fit(ds, steps=steps, verbose=False, steps_per_execution=spe)

    # The floor: per-call steps on one constant batch, no data pipeline at all.
    _, _, xt, yt = constant_batch(k, size)

    def a_constant():
        for _ in range(steps):
            hand.step(xt, yt)

    def mh_constant():
        for _ in range(steps):
            trainer.step((xt, yt))

    fixed = f"mh.fit spe={steps_per_execution}"
    variants = {"naive (a) loop": naive, "TF1 feed_dict loop": tf1_loop, "mh.fit spe=1": fit(1),
                fixed: fit(steps_per_execution), "mh.fit spe=auto (default)": fit("auto"),
                "(a) per call, one constant batch": a_constant,
                "mh.step per call, one constant batch": mh_constant}
    for fn in variants.values():
        fn()  # warm-up: traces
    t = interleaved_medians(variants, 1, repeats)
    auto = t["mh.fit spe=auto (default)"]
    rows = [["end to end", "steps/s", f"{fixed} speed-up", "spe=auto speed-up"]]
    for name, seconds in t.items():
        rows.append([name, f"{steps / seconds:.0f}", f"{seconds / t[fixed]:.2f}x", f"{seconds / auto:.2f}x"])
    return rows


def flops_table(k, width, size, repeats):
    init = initial_weights(k, width)
    _, _, xt, yt = constant_batch(k, size)
    trainer = multihead_trainer(init, width)
    trainer.step((xt, yt))
    # Matmul FLOPs of one step (2 per multiply-add). Forward: trunk 2B(in*w + w*w), heads 2BKw.
    # Backward per head through the trunk (K tape.gradient calls): weight grads of both
    # layers 2B(in*w + w*w), input grad of layer 2 only 2Bw*w; head layers: 2 * 2Bw each.
    fwd = 2 * size * (IN_DIM * width + width * width) + 2 * size * k * width
    bwd = k * (2 * size * (IN_DIM * width + width * width) + 2 * size * width * width + 4 * size * width)
    flops = fwd + bwd
    n = 2048
    a, b = tf.random.normal([n, n]), tf.random.normal([n, n])
    matmul = tf.function(lambda: tf.matmul(a, b))
    matmul()
    t = interleaved_medians({"step": lambda: trainer.step((xt, yt)), "matmul": matmul},
                            calls=5, repeats=repeats)
    step_gflops = flops / t["step"] / 1e9
    peak = 2 * n**3 / t["matmul"] / 1e9
    return [["width", "batch", "K", "step GFLOP/s", f"matmul {n}^3 GFLOP/s", "fraction"],
            [str(width), str(size), str(k), f"{step_gflops:.1f}", f"{peak:.1f}", f"{step_gflops / peak:.0%}"]]


def scaling_table(ks, width, size, repeats):
    rows = [["K", "trace s", "step ms", "step ms / K"]]
    for k in ks:
        init = initial_weights(k, width)
        _, _, xt, yt = constant_batch(k, size)
        trainer = multihead_trainer(init, width)
        start = time.perf_counter()
        trainer.step((xt, yt))
        first = time.perf_counter() - start
        step = interleaved_medians({"mh": lambda: trainer.step((xt, yt))}, calls=10, repeats=repeats)["mh"]
        rows.append([str(k), f"{first - step:.2f}", f"{step * 1e3:.2f}", f"{step * 1e3 / k:.2f}"])
        print(rows[-1], flush=True)
    return rows


def _peak_rss_mib() -> float:
    """This process's peak resident memory (VmHWM). Unlike `ru_maxrss`, it is not carried over
    from the process that forked us, so separate processes compare cleanly."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def memory_child(variant, k, width, size):
    init = initial_weights(k, width)
    _, _, xt, yt = constant_batch(k, size)
    runner = HandTF2(init, width) if variant == "a" else multihead_trainer(init, width)
    step = (lambda: runner.step(xt, yt)) if variant == "a" else (lambda: runner.step((xt, yt)))
    for _ in range(20):
        step()
    print(json.dumps({"peak_mib": _peak_rss_mib()}))


def memory_table(k, width, size):
    rows = [["variant", "peak RSS MiB"]]
    peaks = {}
    for variant in ["a", "mh"]:
        out = subprocess.run([sys.executable, __file__, "--memory-child", variant, str(k), str(width),
                              str(size)], capture_output=True, text=True, timeout=600, check=True)
        peaks[variant] = json.loads(out.stdout.strip().splitlines()[-1])["peak_mib"]
        rows.append([variant, f"{peaks[variant]:.0f}"])
    rows.append(["mh / (a)", f"{peaks['mh'] / peaks['a']:.3f}"])
    return rows


def xla_table(k, width, size, repeats):
    init = initial_weights(k, width)
    _, _, xt, yt = constant_batch(k, size)
    plain, xla = multihead_trainer(init, width), multihead_trainer(init, width, jit_compile=True)
    t = interleaved_medians({"off": lambda: plain.step((xt, yt)), "on": lambda: xla.step((xt, yt))},
                            calls=50, repeats=repeats)
    return [["jit_compile", "step ms"], ["False", f"{t['off'] * 1e3:.2f}"], ["True", f"{t['on'] * 1e3:.2f}"]]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short subset of the grid")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", choices=SECTIONS, action="append",
                        help="run only these sections (repeatable); default: all")
    parser.add_argument("--memory-child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        variant, k, width, size = args.memory_child
        memory_child(variant, int(k), int(width), int(size))
        return
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, TF {tf.__version__}, "
          f"Keras {keras.__version__}; medians of {args.repeats} repeats")
    if args.quick:
        ks, widths, sizes, scale_ks = [1, 4, 16], [256], [256], [1, 8, 64]
    else:
        ks, widths, sizes, scale_ks = [1, 2, 4, 8, 16], [256, 2048], [256, 1024], [1, 2, 4, 8, 16, 32, 64]
    sections = {
        "grid": ("Step throughput (per call, same data, identical initial weights)",
                 lambda: step_table(ks, widths, sizes, args.repeats)),
        # 1000 steps per timed run: creating and deleting a data iterator costs 15-300 ms,
        # paid once per run (amortized as in a real run, not once per 200 steps).
        "fit": ("End to end, K=4, width 256, batch 256, 1000 steps",
                lambda: fit_table(4, 256, 256, 1000, args.repeats, steps_per_execution=20)),
        "flops": ("Near the hardware",
                  lambda: flops_table(4, 2048 if not args.quick else 1024, 1024, args.repeats)),
        "scaling": ("Scaling in K (width 256, batch 256)",
                    lambda: scaling_table(scale_ks, 256, 256, args.repeats)),
        "memory": ("Peak memory, K=8, width 256, batch 1024 (separate processes)",
                   lambda: memory_table(8, 256, 1024)),
        "xla": ("XLA, K=4, width 256, batch 256", lambda: xla_table(4, 256, 256, args.repeats)),
    }
    for name in SECTIONS:
        if args.only is None or name in args.only:
            title, rows = sections[name]
            print(f"\n## {title}")
            print(table(rows()))


if __name__ == "__main__":
    main()
