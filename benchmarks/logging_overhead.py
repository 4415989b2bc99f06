"""Step time with TensorBoard monitoring at the default cadence vs monitoring off.

    python benchmarks/logging_overhead.py            # ~3 min on 2 cores
    python benchmarks/logging_overhead.py --quick    # ~40 s
    python benchmarks/logging_overhead.py --cpu      # process CPU time, TF on one thread
    python benchmarks/logging_overhead.py --width 1024   # a bigger trunk

Identical trainers (same model, same batch) that differ only in their monitor are
timed side by side in one process, calling the compiled train step directly (the
`tf.function`: what the monitor adds to the graph; `Trainer.step`'s Python
overhead would only dilute the ratio):

* `off`: no monitor (`log_dir=None`).
* `quiet`: a monitor that never logs after step 0: the cost on non-logging steps.
* `scalars`: scalars on every step (losses, norms, lr, update ratios, cosines).
* `all`: scalars and gradient histograms on every step.
* `default`: `--every` / `--histograms-every` (100 / 1000).

Each repeat times a window of 100 steps of every variant, in a shuffled order,
including `off twin`, a second unmonitored trainer, and takes each variant's
ratio to the mean of the repeat's two unmonitored windows (close in time, so
load drifts on a shared machine cancel; the twin's own ratio shows the noise
floor); the script prints the medians of these ratios over repeats. A 100-step window holds one logging step of `default` but
a histogram step only every 10th window, so the headline figure is composed from
the per-step costs: `quiet + (scalars - quiet) / every + (all - scalars) /
histograms_every`, next to the direct median for `default`.
The last column times `fit(steps_per_execution=20)` (2000 steps, the monitor at the default
cadence against none): there the step counter is read once per call, not once per step.
Goal: <= 1.03 at every=100, histograms_every=1000.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import multihead as mh  # noqa: E402
from _timing import mlp_model  # noqa: E402

tf.get_logger().setLevel("ERROR")  # one trace per trainer is expected, not a retracing problem


def make_trainer(heads: list[str], log_dir: str | None, every: int, histograms_every: int,
                 input_dim: int, width: int = 256) -> mh.Trainer:
    model = mlp_model(heads, input_dim, width)
    return mh.Trainer(model, {h: mh.Objective("mse", keras.optimizers.Adam(1e-4)) for h in heads},
                      log_dir=log_dir, log_every=every, histograms_every=histograms_every)


def window_seconds(fn, steps: int, clock=time.perf_counter) -> float:
    start = clock()
    result = None
    for _ in range(steps):
        result = fn()
    tf.nest.flatten(result)[0].numpy()  # wait for the last step
    return (clock() - start) / steps


def fit_ratio(off: mh.Trainer, monitored: mh.Trainer, x, y, repeats: int, steps: int = 2000,
              steps_per_execution: int = 20) -> float:
    """`fit` time with the monitor over `fit` time without: median of interleaved repeats. A
    multi-step call reads the step counter once and ends at logging steps."""
    data = tf.data.Dataset.from_tensors((x, y)).repeat()
    ratios = []
    for _ in range(repeats):
        seconds = []
        for trainer in (off, monitored):
            start = time.perf_counter()
            trainer.fit(data, steps=steps, verbose=False, steps_per_execution=steps_per_execution)
            seconds.append(time.perf_counter() - start)
        ratios.append(seconds[1] / seconds[0])
    return statistics.median(ratios)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short run (K=2, fewer repeats)")
    parser.add_argument("--cpu", action="store_true",
                        help="time process CPU time with TF on one thread (steadier on a shared machine)")
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--histograms-every", type=int, default=1000)
    parser.add_argument("--heads", type=int, nargs="+", help="numbers of heads (default 2 4)")
    parser.add_argument("--width", type=int, default=256, help="trunk width (default 256)")
    parser.add_argument("--repeats", type=int, help="windows per variant (default 40, quick 10)")
    args = parser.parse_args()
    if args.cpu:
        tf.config.threading.set_inter_op_parallelism_threads(1)
        tf.config.threading.set_intra_op_parallelism_threads(1)
    clock = time.process_time if args.cpu else time.perf_counter
    heads_list = args.heads or ([2] if args.quick else [2, 4])
    repeats = args.repeats or (10 if args.quick else 40)
    window = 100
    batch, input_dim = 256, 64
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal((batch, input_dim)).astype("float32"))
    never = 10**9
    cadences = {"quiet": (never, never), "scalars": (1, 0), "all": (1, 1),
                "default": (args.every, args.histograms_every)}

    print(f"trunk Dense {input_dim}->{args.width}->{args.width} relu, K Dense(1) heads, Adam, batch {batch}; "
          f"{'CPU time, 1 thread' if args.cpu else 'wall time'}; median over {repeats} repeats "
          f"of the ratio of a {window}-step window to the repeat's unmonitored windows")
    rows = [("K", "off ms/step", "off twin", "quiet", "scalars", "all", "default (direct)",
             f"default composed (every={args.every}, hist={args.histograms_every})",
             "default, fit spe=20")]
    with tempfile.TemporaryDirectory() as tmp:
        for k in heads_list:
            heads = [f"y{i}" for i in range(k)]
            y = {h: tf.constant(rng.standard_normal((batch, 1)).astype("float32")) for h in heads}
            off = make_trainer(heads, None, 1, 0, input_dim, args.width)
            trainers = {name: make_trainer(heads, os.path.join(tmp, f"{k}-{name}"), *cad, input_dim,
                                           args.width)
                        for name, cad in cadences.items()}
            for trainer in [off, *trainers.values()]:
                trainer.step((x, y))  # trace and build outside the timing
            trainers["off twin"] = make_trainer(heads, None, 1, 0, input_dim, args.width)  # the noise floor
            trainers["off twin"].step((x, y))
            off_times: list[float] = []
            ratios: dict[str, list[float]] = {name: [] for name in trainers}
            order = random.Random(0)
            trainers["off"] = off
            for _ in range(repeats):
                names = list(trainers)
                order.shuffle(names)  # no variant always runs first or right after another
                seconds = {name: window_seconds(lambda t=trainers[name]: t._runner.train_step(x, y),  # noqa: SLF001
                                                window, clock) for name in names}
                base = (seconds["off"] + seconds["off twin"]) / 2
                off_times.append(base)
                for name in ratios:
                    ratios[name].append(seconds[name] / base)
            r = {name: statistics.median(values) for name, values in ratios.items()}
            composed = (r["quiet"] + (r["scalars"] - r["quiet"]) / args.every
                        + (r["all"] - r["scalars"]) / args.histograms_every)
            rows.append((str(k), f"{statistics.median(off_times) * 1e3:.3f}", f"{r['off twin']:.3f}",
                         f"{r['quiet']:.3f}",
                         f"{r['scalars']:.3f}", f"{r['all']:.3f}", f"{r['default']:.3f}",
                         f"{composed:.3f}",
                         f"{fit_ratio(off, trainers['default'], x, y, max(3, repeats // 4)):.3f}"))
            for trainer in trainers.values():
                trainer.close()
    print("ratios to monitoring off:")
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())


if __name__ == "__main__":
    main()
