"""`fit` on one dataset per head (`data={head: ...}`) against `fit` on one shared dataset.

    python benchmarks/per_head_data.py            # 1500 steps x 5 repeats, ~3 min on 2 cores
    python benchmarks/per_head_data.py --quick    # 400 steps x 3 repeats

The quickstart model (100 inputs, a 128-128 relu MLP trunk, two Dense(1) heads, one Adam
per head, batch 128, MMoE synthetic data with 20000 rows). Variants, timed round-robin in
each repeat (median seconds per `fit` call):

- `one dataset, auto`: `(x, {y1, y2})`, `steps_per_execution="auto"` (the default);
- `one dataset, 1 step/call`: the same with one step per compiled call;
- `per head, all`: `{y1: (x, y1), y2: (x, y2)}` with `sampling="all"`: each step runs the
  trunk once per head, on that head's own batch (twice the trunk work of one dataset);
- `per head, uniform`: one head drawn per step (one trunk pass, one head updated).

`per head, all` runs in the compiled loop, several steps per call, as one dataset does
(the heads' streams are zipped); a sampled head is drawn in Python, so `per head, uniform`
makes one compiled call per step.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _timing  # noqa: E402  (quiet TF start-up)

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import multihead as mh  # noqa: E402

tf.get_logger().setLevel("ERROR")
HEADS = ("y1", "y2")


def make_trainer() -> mh.Trainer:
    keras.utils.set_random_seed(0)
    model = mh.MultiHeadModel(
        trunk=keras.Sequential([keras.layers.Dense(128, activation="relu"),
                                keras.layers.Dense(128, activation="relu")]),
        heads={h: keras.layers.Dense(1) for h in HEADS},
    )
    model.build((None, 100))
    return mh.Trainer(model, {h: mh.Objective("mse", keras.optimizers.Adam(1e-3)) for h in HEADS})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="400 steps, 3 repeats")
    args = parser.parse_args()
    steps, repeats = (400, 3) if args.quick else (1500, 5)
    data = mh.mmoe_synthetic(tasks=list(HEADS), correlation=0.5, train_size=20000, eval_size=10)
    per_head = {h: (data.x_train, {h: data.y_train[h]}) for h in HEADS}
    runs = {
        "one dataset, auto": (data.train, {}),
        "one dataset, 1 step/call": (data.train, {"steps_per_execution": 1}),
        "per head, all": (per_head, {"sampling": "all"}),
        "per head, uniform": (per_head, {"sampling": "uniform"}),
    }
    variants = {}
    for name, (train, kwargs) in runs.items():
        trainer = make_trainer()
        trainer.fit(train, 20, batch_size=128, verbose=False, **kwargs)  # traces
        variants[name] = (lambda t=trainer, d=train, k=kwargs:
                          t.fit(d, steps, batch_size=128, verbose=False, **k))
    medians = _timing.interleaved_medians(variants, calls=1, repeats=repeats)
    base = medians["one dataset, auto"]
    rows = [["variant", "steps/s", "time vs one dataset, auto"]]
    for name, seconds in medians.items():
        rows.append([name, f"{steps / seconds:.0f}", f"{seconds / base:.2f}x"])
    print(f"{steps} steps per fit, median of {repeats} repeats (2 shared CPU cores)")
    print(_timing.table(rows))


if __name__ == "__main__":
    main()
