"""Steps/s of an aggregated trunk with constant weights: one backward pass of the weighted loss
(`one_pass_backward=True`, the default) against one backward pass per head (`False`), and the
first step (trace + call) of both.

The model: trunk Dense 64->W->W relu (W = 256), K Dense(1) heads, batch 128, Adam everywhere,
no XLA, no TensorBoard. Side by side in one process, for K = 4 and 16:

  summed       hand-written `tf.function`: one tape, the sum of the K losses, one Adam on
               every variable (the lower bound: LibMTL's EW step);
  per_head     `mh.Trainer` default trunk: K backward passes, K Adams on trunk + head;
  <m>/K-pass   `TrunkPolicy(aggregator=<m>)`, `one_pass_backward=False`;
  <m>/1-pass   the same with the default `one_pass_backward=True`;
  sum+rep      `rep_grad=True` (K head-sized passes, one trunk pass), for comparison,

for <m> in sum, mean, weights (1, 2, ..., K) and uncertainty (a loss weighting under sum).
The trainers are timed through their compiled step (what `Trainer.step` calls, without its
per-step Python checks); medians over repeats, the variants timed round-robin in each repeat.
Wall time and process CPU time are both shown: the machine is shared, read the ratios.

The first step is timed in fresh processes (no trace cache shared), median of 3, for
<m> = sum at K = 16 (`--first-ks` to change), with the compiled graph's size (nodes, those of
cond branches included): the one-pass step holds the per-head step as its fallback branch.

    taskset -c 1 python benchmarks/one_pass.py                 # K = 4, 16; first step at K = 16
    taskset -c 1 python benchmarks/one_pass.py --quick         # K = 4 only, fewer repeats
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))  # this checkout's multihead, not an installed one

from _timing import interleaved_wall_and_cpu, summed_step, table  # noqa: E402

IN_DIM, WIDTH, BATCH = 64, 256, 128
METHODS = ("sum", "mean", "weights", "uncertainty")


def _model(k: int):
    import keras

    import multihead as mh

    keras.utils.set_random_seed(0)
    model = mh.MultiHeadModel(
        trunk=keras.Sequential([keras.layers.Dense(WIDTH, activation="relu"),
                                keras.layers.Dense(WIDTH, activation="relu")]),
        heads={f"h{i}": keras.layers.Dense(1) for i in range(k)})
    model.build((None, IN_DIM))
    return model


def _batch(k: int):
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(1)
    x = tf.constant(rng.standard_normal((BATCH, IN_DIM)), tf.float32)
    return x, {f"h{i}": tf.constant(rng.standard_normal((BATCH, 1)), tf.float32) for i in range(k)}


def _policy(method: str, k: int, rep_grad: bool = False):
    import keras

    import multihead as mh

    if method == "uncertainty":
        return mh.TrunkPolicy(keras.optimizers.Adam(1e-3), "sum", loss_weighting="uncertainty")
    options = {"weights": [1.0 + i for i in range(k)]} if method == "weights" else {}
    return mh.TrunkPolicy(keras.optimizers.Adam(1e-3), method, options, rep_grad=rep_grad)


def _trainer(k: int, trunk, one_pass: bool = True):
    import keras

    import multihead as mh

    return mh.Trainer(_model(k), {f"h{i}": mh.Objective("mse", keras.optimizers.Adam(1e-3))
                                  for i in range(k)}, trunk=trunk, one_pass_backward=one_pass)


def _summed(k: int):
    return summed_step(_model(k))


def steady(k: int, calls: int, repeats: int) -> list[list[str]]:
    """Rows of the steady-step table at K heads."""
    def compiled(trainer):
        return trainer._runner.ensure_built(None)  # noqa: SLF001 - what Trainer.step calls

    variants = {"summed": _summed(k), "per_head": compiled(_trainer(k, "per_head"))}
    for method in METHODS:
        for one_pass in (False, True):
            name = f"{method}/{'1-pass' if one_pass else 'K-pass'}"
            variants[name] = compiled(_trainer(k, _policy(method, k), one_pass))
    variants["sum+rep"] = compiled(_trainer(k, _policy("sum", k, rep_grad=True), False))
    x, y = _batch(k)
    calls_of = {name: (lambda fn=fn: fn(x, y)) for name, fn in variants.items()}
    for fn in calls_of.values():  # trace and warm up
        fn()
        fn()
    wall, cpu = interleaved_wall_and_cpu(calls_of, calls, repeats)
    rows = []
    for name in variants:
        method = name.split("/")[0]
        ratio = "-"
        if name.endswith("/1-pass"):
            other = f"{method}/K-pass"
            ratio = f"{wall[other] / wall[name]:.2f} / {cpu[other] / cpu[name]:.2f}"
        rows.append([str(k), name, f"{1 / wall[name]:.0f}", f"{wall[name] * 1e3:.2f}",
                     f"{cpu[name] * 1e3:.2f}", f"{wall['summed'] / wall[name]:.2f}", ratio])
    return rows


def measure_first(method: str, k: int, one_pass: bool) -> dict[str, float]:
    """In this process: seconds of the first `Trainer.step` (trace + call) and graph nodes."""
    trainer = _trainer(k, _policy(method, k), one_pass)
    batch = _batch(k)
    start = time.perf_counter()
    trainer.step(batch)  # returns host values: the step has run
    first = time.perf_counter() - start
    nodes = 0
    for concrete in trainer._runner.train_step.loops._cache._concrete.values():  # noqa: SLF001
        graph_def = concrete.graph.as_graph_def()
        nodes += len(graph_def.node) + sum(len(f.node_def) for f in graph_def.library.function)
    return {"first": first, "nodes": nodes}


def first_step(method: str, k: int, one_pass: bool, repeats: int) -> dict[str, float]:
    """`measure_first` in `repeats` fresh processes: the medians."""
    runs = []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", method, str(k),
                              str(int(one_pass))], capture_output=True, text=True, check=False)
        if out.returncode != 0:
            raise SystemExit(f"{method} K={k} failed:\n{out.stderr[-3000:]}")
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="K = 4; 5 repeats of 10 steps")
    parser.add_argument("--ks", type=int, nargs="+", help="numbers of heads (default 4 16)")
    parser.add_argument("--first-ks", type=int, nargs="*", help="first step at these K (default 16)")
    parser.add_argument("--calls", type=int, help="steps per timing (default 20)")
    parser.add_argument("--repeats", type=int, help="repeats (default 15)")
    parser.add_argument("--one", nargs=3, metavar=("METHOD", "K", "ONE_PASS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        method, k, one_pass = args.one
        print(json.dumps(measure_first(method, int(k), bool(int(one_pass)))))
        return
    ks = args.ks or ([4] if args.quick else [4, 16])
    first_ks = args.first_ks if args.first_ks is not None else ([] if args.quick else [16])
    calls = args.calls or (10 if args.quick else 20)
    repeats = args.repeats or (5 if args.quick else 15)
    print(f"trunk [{WIDTH}, {WIDTH}], batch {BATCH}, Adam; load average {os.getloadavg()[0]:.2f}")
    rows = [["K", "variant", "steps/s", "wall_ms", "cpu_ms", "vs summed", "1-pass gain wall / cpu"]]
    for k in ks:
        rows += steady(k, calls, repeats)
    print(table(rows))
    if first_ks:
        rows = [["K", "variant", "first_s", "nodes"]]
        for k in first_ks:
            for one_pass in (False, True):
                r = first_step("sum", k, one_pass, 3)
                rows.append([str(k), f"sum/{'1-pass' if one_pass else 'K-pass'}",
                             f"{r['first']:.2f}", str(int(r["nodes"]))])
        print("\nfirst step (trace + call), median of 3 fresh processes")
        print(table(rows))
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
