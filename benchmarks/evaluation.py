"""Evaluation time: the compiled `Evaluator` against `model.predict` plus numpy.

The quickstart model (experiments/quickstart.yaml: 100 inputs, trunk MLP 128-128
relu, two heads MLP 32-1, mse losses, mae metrics) on 20,000 evaluation rows of
the MMoE synthetic data. Side by side in one run (medians of repeats after a
warm-up, variants timed round-robin), at each batch size:

  evaluator   `Evaluator.evaluate(as_dataset(arrays, batch_size, shuffle=False))`,
              the dataset built in every call, as `Trainer.evaluate` does for arrays;
  predict     `model.predict(x, batch_size=...)`, then each head's loss and metric
              over all rows in numpy (the floor: one forward pass, no per-batch host work);
  eager loop  one compiled forward pass per batch, each head's loss and metric
              read on the host per batch (the definition the evaluator must match).

    python benchmarks/evaluation.py            # batch 256 and 1024, 15 repeats
    python benchmarks/evaluation.py --quick    # the same with 5 repeats
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
from multihead.training.evaluation import Evaluator  # noqa: E402
from multihead.objectives.objective import resolve_loss, resolve_metric  # noqa: E402

ROWS = 20_000
HEADS = ("y1", "y2")


def quickstart_model(input_dim: int = 100) -> mh.MultiHeadModel:
    """The model of experiments/quickstart.yaml, built."""
    keras.utils.set_random_seed(0)
    trunk = keras.Sequential([keras.layers.Dense(128, activation="relu"),
                              keras.layers.Dense(128, activation="relu")])
    heads = {h: keras.Sequential([keras.layers.Dense(32, activation="relu"), keras.layers.Dense(1)])
             for h in HEADS}
    model = mh.MultiHeadModel(trunk, heads)
    model.build((None, input_dim))
    return model


def predict_and_numpy(model: mh.MultiHeadModel, x: np.ndarray, y: dict[str, np.ndarray],
                      batch_size: int) -> dict[str, dict[str, float]]:
    """mse and mae of every head over all rows, from `model.predict`."""
    outputs = model.predict(x, batch_size=batch_size, verbose=0)
    results = {}
    for head in HEADS:
        error = outputs[head] - y[head]
        results[head] = {"loss": float(np.mean(error ** 2)),
                         "mean_absolute_error": float(np.mean(np.abs(error)))}
    return results


def eager_loop(model: mh.MultiHeadModel, predict, losses, x: np.ndarray, y: dict[str, np.ndarray],
               batch_size: int) -> dict[str, dict[str, float]]:
    """Per batch: a compiled forward pass, then each loss and metric read on the host."""
    metrics = {h: [resolve_metric("mae", h)] for h in HEADS}
    totals, count = {h: 0.0 for h in HEADS}, 0
    for inputs, targets in mh.as_dataset((x, y), batch_size, shuffle=False):
        outputs = predict(inputs)
        n = int(inputs.shape[0])
        count += n
        for head in HEADS:
            totals[head] += float(losses[head](inputs, targets, outputs[head])) * n
            for metric in metrics[head]:
                metric.update_state(targets[head], outputs[head])
    return {h: {"loss": totals[h] / count, **{m.name: float(m.result()) for m in metrics[h]}}
            for h in HEADS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 repeats instead of 15")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[256, 1024])
    args = parser.parse_args()
    repeats = 5 if args.quick else 15

    data = mh.mmoe_synthetic(tasks=list(HEADS), train_size=1, eval_size=ROWS, seed=0)
    x, y = data.x_eval, data.y_eval
    model = quickstart_model(x.shape[1])
    losses = {h: resolve_loss("mse", h) for h in HEADS}
    evaluator = Evaluator(model, losses, metrics={h: ["mae"] for h in HEADS},
                          loss_specs={h: "mse" for h in HEADS})
    predict = tf.function(lambda inputs: model(inputs, training=False), reduce_retracing=True)

    print(f"{ROWS} rows, {len(HEADS)} heads, median of {repeats} repeats (seconds per evaluation)")
    rows = [["batch", "evaluator", "predict+numpy", "eager loop", "evaluator/predict",
             "eager/predict", "max rel. diff"]]
    for batch_size in args.batch_sizes:
        variants = {
            "evaluator": lambda b=batch_size: evaluator.evaluate(mh.as_dataset((x, y), b, shuffle=False)),
            "predict": lambda b=batch_size: predict_and_numpy(model, x, y, b),
            "eager": lambda b=batch_size: eager_loop(model, predict, losses, x, y, b),
        }
        results = {name: fn() for name, fn in variants.items()}  # warm-up: traces, checks
        diff = max(abs(results["evaluator"][h][k] - ref[h][k]) / abs(ref[h][k])
                   for ref in (results["predict"], results["eager"]) for h in HEADS for k in ref[h])
        times = interleaved_medians(variants, calls=1, repeats=repeats)
        rows.append([str(batch_size), f"{times['evaluator'] * 1e3:.1f} ms",
                     f"{times['predict'] * 1e3:.1f} ms", f"{times['eager'] * 1e3:.1f} ms",
                     f"{times['evaluator'] / times['predict']:.2f}x",
                     f"{times['eager'] / times['predict']:.2f}x", f"{diff:.1e}"])
    print(table(rows))
    print(f"evaluator traces: {evaluator.trace_count}")


if __name__ == "__main__":
    main()
