"""Cost of inter-task affinity logging (`log.affinity_every`) as a fraction of the step.

    python benchmarks/affinity_cost.py              # K = 4 and 16, ~4 min on 2 cores
    python benchmarks/affinity_cost.py --quick      # K = 4, ~1 min
    python benchmarks/affinity_cost.py --heads 4 16 --every 10 100 1000

Identical trainers (trunk Dense 64->256->256 relu, K Dense(1) heads, per-head Adam, batch
256; the same model and batch) that differ only in their monitor are timed side by side in
one process, calling the compiled train step directly:

* `quiet`: a monitor that logs nothing after step 0 (what most steps of a run cost);
* `scalars`: scalars on every step (losses, norms, lr, update ratios, cosines), no affinity;
* `affinity`: scalars and the affinities on every step (`affinity_every=1`).

The affinity step's cost is `affinity - scalars` (the lookahead: one forward and K
backward passes, K forward passes at the looked-ahead trunks, the optimizer update on
copies of the slots), printed as a multiple of the `quiet` step; at a cadence of one
affinity step every N steps, the run pays `(affinity - scalars) / (N * quiet)` on top
of its steps: the last columns. Each variant is timed in windows of `--window` steps,
round-robin, and the medians over `--repeats` windows are taken; `--lookahead sgd`
times the paper's plain SGD lookahead instead of the optimizer's.
"""

from __future__ import annotations

import argparse
import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import multihead as mh  # noqa: E402
from _timing import interleaved_medians, mlp_model, table  # noqa: E402

tf.get_logger().setLevel("ERROR")


def make_trainer(heads: list[str], log_dir: str, every: int, affinity_every: int,
                 lookahead: str, input_dim: int, width: int) -> mh.Trainer:
    model = mlp_model(heads, input_dim, width)
    return mh.Trainer(model, {h: mh.Objective("mse", keras.optimizers.Adam(1e-4)) for h in heads},
                      log_dir=log_dir, log_every=every, histograms_every=0,
                      affinity_every=affinity_every, affinity_lookahead=lookahead)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="K = 4 only, fewer repeats")
    parser.add_argument("--heads", type=int, nargs="+", help="numbers of heads (default 4 16)")
    parser.add_argument("--every", type=int, nargs="+", default=[10, 100, 1000],
                        help="affinity cadences for the amortised columns (default 10 100 1000)")
    parser.add_argument("--width", type=int, default=256, help="trunk width (default 256)")
    parser.add_argument("--lookahead", choices=("optimizer", "sgd"), default="optimizer")
    parser.add_argument("--window", type=int, default=20, help="steps per timed window")
    parser.add_argument("--repeats", type=int, help="windows per variant (default 15, quick 5)")
    args = parser.parse_args()
    heads_list = args.heads or ([4] if args.quick else [4, 16])
    repeats = args.repeats or (5 if args.quick else 15)
    batch, input_dim = 256, 64
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal((batch, input_dim)).astype("float32"))
    never = 10**9
    variants = {"quiet": (never, 0), "scalars": (1, 0), "affinity": (1, 1)}
    print(f"trunk Dense {input_dim}->{args.width}->{args.width} relu, K Dense(1) heads, Adam, "
          f"batch {batch}, lookahead {args.lookahead}; wall time, median over {repeats} "
          f"windows of {args.window} steps")
    rows = [["K", "quiet ms/step", "scalars ms/step", "affinity ms/step",
             "affinity step / quiet step"]
            + [f"overhead at affinity_every={n}" for n in args.every]]
    with tempfile.TemporaryDirectory() as tmp:
        for k in heads_list:
            heads = [f"y{i}" for i in range(k)]
            y = {h: tf.constant(rng.standard_normal((batch, 1)).astype("float32")) for h in heads}
            trainers = {name: make_trainer(heads, os.path.join(tmp, f"{k}-{name}"), every, aff,
                                           args.lookahead, input_dim, args.width)
                        for name, (every, aff) in variants.items()}
            for trainer in trainers.values():
                trainer.step((x, y))  # trace and build outside the timing
            steps = {name: (lambda t=t: t._runner.train_step(x, y))  # noqa: SLF001
                     for name, t in trainers.items()}
            seconds = interleaved_medians(steps, args.window, repeats)
            extra = seconds["affinity"] - seconds["scalars"]
            rows.append([str(k)] + [f"{seconds[n] * 1e3:.2f}" for n in variants]
                        + [f"{extra / seconds['quiet']:.2f}x"]
                        + [f"{100 * extra / (n * seconds['quiet']):.2f}%" for n in args.every])
            for trainer in trainers.values():
                trainer.close()
    print(table(rows))


if __name__ == "__main__":
    main()
