"""Step time with TensorBoard monitoring at the default cadence vs monitoring off.

    python benchmarks/logging_overhead.py            # ~3 min on 2 cores
    python benchmarks/logging_overhead.py --quick    # ~40 s

Identical trainers (same model, same batch) that differ only in their monitor are
timed round-robin in one process (so machine load drifts hit them alike), calling
the compiled train step directly (the `tf.function`: what the monitor adds to the
graph; `Trainer.step`'s Python overhead would only dilute the ratio):

* `off`: no monitor (`log_dir=None`).
* `quiet`: a monitor that never logs after step 0: the cost on non-logging steps.
* `scalars`: scalars on every step (losses, norms, lr, update ratios, cosines).
* `all`: scalars and gradient histograms on every step.
* `default`: `--every` / `--histograms-every` (100 / 1000), timed over windows of
  `--histograms-every` steps so the logging steps come in their real proportion.

It prints medians over repeats and two estimates of the overhead at the default
cadence: the direct `default / off`, and the one composed from the short, less
noisy windows: `(quiet + (scalars - quiet) / every + (all - scalars) /
histograms_every) / off`. Goal: <= 1.03 at every=100, histograms_every=1000.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import multihead as mh  # noqa: E402

tf.get_logger().setLevel("ERROR")  # one trace per trainer is expected, not a retracing problem


def make_trainer(heads: list[str], log_dir: str | None, every: int, histograms_every: int,
                 input_dim: int) -> mh.Trainer:
    keras.utils.set_random_seed(0)
    model = mh.MultiHeadModel(
        trunk=keras.Sequential([keras.layers.Dense(256, activation="relu"),
                                keras.layers.Dense(256, activation="relu")]),
        heads={h: keras.layers.Dense(1) for h in heads},
    )
    model.build((None, input_dim))
    return mh.Trainer(model, {h: mh.Objective("mse", keras.optimizers.Adam(1e-4)) for h in heads},
                      log_dir=log_dir, log_every=every, histograms_every=histograms_every)


def window_seconds(fn, steps: int) -> float:
    start = time.perf_counter()
    result = None
    for _ in range(steps):
        result = fn()
    tf.nest.flatten(result)[0].numpy()  # wait for the last step
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short run (K=2, fewer repeats)")
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--histograms-every", type=int, default=1000)
    parser.add_argument("--heads", type=int, nargs="+", help="numbers of heads (default 2 4)")
    parser.add_argument("--repeats", type=int, help="windows per variant (default 9, quick 3)")
    args = parser.parse_args()
    heads_list = args.heads or ([2] if args.quick else [2, 4])
    repeats = args.repeats or (3 if args.quick else 9)
    short = 100
    long = args.histograms_every // 2 if args.quick else args.histograms_every
    batch, input_dim = 256, 64
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal((batch, input_dim)).astype("float32"))
    never = 10**9
    cadences = {"off": None, "quiet": (never, never), "scalars": (1, 0), "all": (1, 1),
                "default": (args.every, args.histograms_every)}

    print(f"trunk Dense {input_dim}->256->256 relu, K Dense(1) heads, Adam, batch {batch}; "
          f"median of {repeats} windows ({short} steps; {long} for default and its off twin)")
    rows = [("K", "off", "quiet", "scalars", "all", "default", "off(long)",
             "quiet/off", "default/off direct", "default/off composed")]
    with tempfile.TemporaryDirectory() as tmp:
        for k in heads_list:
            heads = [f"y{i}" for i in range(k)]
            y = {h: tf.constant(rng.standard_normal((batch, 1)).astype("float32")) for h in heads}
            trainers = {
                name: make_trainer(heads, None if cad is None else os.path.join(tmp, f"{k}-{name}"),
                                   *(cad or (1, 0)), input_dim)
                for name, cad in cadences.items()
            }
            for trainer in trainers.values():
                trainer.step((x, y))  # trace and build outside the timing
            samples: dict[str, list[float]] = {name: [] for name in [*trainers, "off(long)"]}
            for _ in range(repeats):
                for name, trainer in trainers.items():
                    steps = long if name == "default" else short
                    samples[name].append(window_seconds(lambda t=trainer: t._train_step(x, y),  # noqa: SLF001
                                                        steps))
                samples["off(long)"].append(
                    window_seconds(lambda: trainers["off"]._train_step(x, y), long))  # noqa: SLF001
            ms = {name: statistics.median(values) * 1e3 for name, values in samples.items()}
            composed = (ms["quiet"] + (ms["scalars"] - ms["quiet"]) / args.every
                        + (ms["all"] - ms["scalars"]) / args.histograms_every) / ms["off"]
            rows.append((str(k), *(f"{ms[n]:.3f}" for n in samples),
                         f"{ms['quiet'] / ms['off']:.3f}", f"{ms['default'] / ms['off(long)']:.3f}",
                         f"{composed:.3f}"))
            for trainer in trainers.values():
                trainer.close()
    print("ms per step:")
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())


if __name__ == "__main__":
    main()
