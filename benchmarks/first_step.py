"""The first step's cost (trace + first call) and the steady step, per head against an
aggregated trunk (`mgda`, `pcgrad`), as the number of heads K grows.

Each configuration runs in a fresh subprocess (no trace cache shared between them), `repeats`
times; the table shows the medians, the size of the compiled step's graph (its nodes, those of
nested functions included) and the ratio of each aggregated trainer to the per-head one.

    python benchmarks/first_step.py              # K = 4, 16, 64; trunk [256, 256], batch 128
    python benchmarks/first_step.py --quick      # K = 2, 4; trunk [32, 32], batch 16; seconds
    taskset -c 1 python benchmarks/first_step.py --repeats 3 --methods per_head mgda
    python benchmarks/first_step.py --monitored  # TensorBoard monitoring on: the first step
                                                 # is a logging step (scalars, histograms)
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

from _timing import table, time_per_call  # noqa: E402

METHODS = ("per_head", "mgda", "pcgrad")


def graph_nodes(concrete) -> int:
    """Nodes of a concrete function's graph, with those of every function it calls (cond
    branches, loop bodies): what tracing built."""
    graph_def = concrete.graph.as_graph_def()
    return len(graph_def.node) + sum(len(f.node_def) for f in graph_def.library.function)


def measure_one(method: str, k: int, width: int, batch: int, steps: int,
                monitored: bool = False) -> dict[str, float]:
    """In this process: seconds of the first `Trainer.step` (trace + call), median seconds of
    a steady step, and the compiled step's graph nodes. `monitored`: the trainer logs to
    TensorBoard at the default cadence (every 100, histograms every 1000)."""
    import tempfile

    import keras
    import numpy as np
    import tensorflow as tf

    import multihead as mh

    keras.utils.set_random_seed(0)
    trunk = keras.Sequential([keras.layers.Dense(width, activation="relu"),
                              keras.layers.Dense(width, activation="relu")])
    heads = {f"h{i}": keras.layers.Dense(1) for i in range(k)}
    model = mh.MultiHeadModel(trunk, heads)
    model.build((None, 64))
    objectives = {h: mh.Objective("mse", keras.optimizers.Adam(1e-3)) for h in heads}
    policy = "per_head" if method == "per_head" else {"optimizer": "adam", "aggregator": method}
    logging = {"log_dir": tempfile.mkdtemp(), "log_every": 100, "histograms_every": 1000}
    trainer = mh.Trainer(model, objectives, trunk=policy, **(logging if monitored else {}))
    rng = np.random.default_rng(0)
    # Tensors, not arrays: the step then runs through its cached concrete function.
    x = tf.constant(rng.normal(size=(batch, 64)).astype("float32"))
    y = {h: tf.constant(rng.normal(size=(batch, 1)).astype("float32")) for h in heads}
    start = time.perf_counter()
    trainer.step((x, y))  # returns host values: the step has run
    first = time.perf_counter() - start
    step_fn = lambda: trainer.step((x, y))  # noqa: E731
    steady = statistics.median(time_per_call(step_fn, max(1, steps // 5)) for _ in range(5))
    concretes = list(trainer._runner.train_step.loops._cache._concrete.values())
    return {"first": first, "steady": steady, "nodes": sum(graph_nodes(c) for c in concretes)}


def run_fresh(method: str, k: int, width: int, batch: int, steps: int,
              monitored: bool = False) -> dict[str, float]:
    """`measure_one` in a fresh Python process."""
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", method, str(k),
                          "--width", str(width), "--batch", str(batch), "--steps", str(steps)]
                         + (["--monitored"] if monitored else []),
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{method} K={k} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="K = 2, 4, trunk [32, 32], batch 16, per_head and mgda, once")
    parser.add_argument("--ks", type=int, nargs="+", help="numbers of heads (default 4 16 64)")
    parser.add_argument("--methods", nargs="+", choices=METHODS, help="default: all three")
    parser.add_argument("--repeats", type=int, help="fresh processes per configuration (default 3)")
    parser.add_argument("--width", type=int, help="trunk width (default 256)")
    parser.add_argument("--batch", type=int, help="batch size (default 128)")
    parser.add_argument("--steps", type=int, default=20, help="steady steps timed")
    parser.add_argument("--monitored", action="store_true",
                        help="TensorBoard monitoring on (the first step logs scalars and histograms)")
    parser.add_argument("--one", nargs=2, metavar=("METHOD", "K"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    width = args.width or (32 if args.quick else 256)
    batch = args.batch or (16 if args.quick else 128)
    if args.one:
        method, k = args.one
        print(json.dumps(measure_one(method, int(k), width, batch, args.steps, args.monitored)))
        return
    ks = args.ks or ([2, 4] if args.quick else [4, 16, 64])
    methods = args.methods or (("per_head", "mgda") if args.quick else METHODS)
    repeats = args.repeats or (1 if args.quick else 3)
    steps = 5 if args.quick else args.steps
    results: dict[tuple[str, int], dict[str, float]] = {}
    for k in ks:
        for method in methods:
            runs = [run_fresh(method, k, width, batch, steps, args.monitored) for _ in range(repeats)]
            results[method, k] = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
            print(f"# {method} K={k}: first {results[method, k]['first']:.2f} s", file=sys.stderr)
    print(f"trunk [{width}, {width}], batch {batch}, median of {repeats} fresh process(es)"
          + (", monitored" if args.monitored else ""))
    rows = [["method", "K", "first_s", "steady_ms", "nodes", "first/per_head", "steady/per_head"]]
    for k in ks:
        base = results.get(("per_head", k))
        for method in methods:
            r = results[method, k]
            ratios = (["%.2f" % (r["first"] / base["first"]), "%.2f" % (r["steady"] / base["steady"])]
                      if base else ["-", "-"])
            rows.append([method, str(k), "%.2f" % r["first"], "%.2f" % (r["steady"] * 1e3),
                         str(int(r["nodes"]))] + ratios)
    print(table(rows))


if __name__ == "__main__":
    main()
