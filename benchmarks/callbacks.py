"""`fit` with EarlyStopping + BestCheckpoint vs `fit` without callbacks.

    python benchmarks/callbacks.py            # 3000 steps x 7 repeats, ~4 min on 2 cores
    python benchmarks/callbacks.py --quick    # 1000 steps x 5 repeats

The quickstart model built in Python (experiments/quickstart.yaml: 100 inputs, a
128-128 relu MLP trunk, two Dense(1) heads, Adam 1e-3, batch 128, MMoE synthetic data
with 20000 training and 2000 eval rows), `steps_per_execution="auto"`. Both variants
evaluate every 500 steps, so the ratio is the cost of the callbacks themselves:
EarlyStopping's weight snapshots at improving evaluations (its patience is too large
to stop) and BestCheckpoint's checkpoint writes (a fresh directory each repeat, so the
first evaluation and every later improvement writes one). Two identical trainers are
timed in alternating order within each repeat; the figure is the median over repeats
of the ratio with / without. Goal: <= 1.02.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _timing  # noqa: E402,F401  (quiet TF start-up)

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import multihead as mh  # noqa: E402
from multihead.training.callbacks import EarlyStopping  # noqa: E402
from multihead.io.best_checkpoint import BestCheckpoint  # noqa: E402

tf.get_logger().setLevel("ERROR")
EVAL_EVERY = 500


def make_trainer() -> mh.Trainer:
    keras.utils.set_random_seed(0)
    model = mh.MultiHeadModel(
        trunk=keras.Sequential([keras.layers.Dense(128, activation="relu"),
                                keras.layers.Dense(128, activation="relu")]),
        heads={h: keras.layers.Dense(1) for h in ("y1", "y2")},
    )
    model.build((None, 100))
    return mh.Trainer(model, {h: mh.Objective("mse", keras.optimizers.Adam(1e-3), metrics=["mae"])
                              for h in ("y1", "y2")})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1000 steps, 5 repeats")
    parser.add_argument("--steps", type=int, help="steps per fit (default 3000, quick 1000)")
    parser.add_argument("--repeats", type=int, help="repeats (default 7, quick 5)")
    args = parser.parse_args()
    steps = args.steps or (1000 if args.quick else 3000)
    repeats = max(5, args.repeats or (5 if args.quick else 7))
    data = mh.mmoe_synthetic(tasks=["y1", "y2"], correlation=0.5, train_size=20000, eval_size=2000,
                             input_dim=100, seed=0)
    trainers = {"none": make_trainer(), "callbacks": make_trainer()}
    scratch = tempfile.mkdtemp(prefix="bench-callbacks-")

    def fit(name: str, repeat: int) -> float:
        callbacks = [] if name == "none" else [
            EarlyStopping("eval/mean_loss", patience=10**6),
            BestCheckpoint(os.path.join(scratch, f"r{repeat}"), monitor="eval/mean_loss")]
        start = time.perf_counter()
        trainers[name].fit(data.train, steps, batch_size=128, eval_data=data.eval,
                           eval_every=EVAL_EVERY, verbose=False, steps_per_execution="auto",
                           callbacks=callbacks)
        return time.perf_counter() - start

    for name in trainers:  # trace and settle the call size outside the timed repeats
        fit(name, -1 - len(name))
    seconds: dict[str, list[float]] = {name: [] for name in trainers}
    ratios = []
    for repeat in range(repeats):
        order = list(trainers) if repeat % 2 == 0 else list(reversed(trainers))
        for name in order:
            seconds[name].append(fit(name, repeat))
        ratios.append(seconds["callbacks"][-1] / seconds["none"][-1])
    saves = len(os.listdir(scratch))
    print(f"quickstart model (100 -> 128 -> 128 relu, two Dense(1) heads, Adam, batch 128), "
          f"{steps} steps per fit, eval every {EVAL_EVERY}, steps_per_execution='auto', "
          f"{repeats} repeats")
    print(_timing.table([
        ["variant", "median s/fit", "ms/step"],
        *[[name, f"{statistics.median(v):.3f}", f"{1e3 * statistics.median(v) / steps:.3f}"]
          for name, v in seconds.items()],
    ]))
    print(f"EarlyStopping + BestCheckpoint / none: median ratio {statistics.median(ratios):.3f} "
          f"(per repeat: {', '.join(f'{r:.3f}' for r in ratios)}; goal <= 1.02; {saves} best dirs)")


if __name__ == "__main__":
    main()
