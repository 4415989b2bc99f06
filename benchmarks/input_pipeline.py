"""Input pipeline: does each data source feed the quickstart model's compiled step fast enough?

Every source (`npz`, `csv`, `tfrecord`, `python`) is read into arrays once by
`multihead.experiments.build.data_sources`, then `Trainer.fit` batches them with `mh.as_dataset`
(one permutation per epoch, one gather per batch, prefetch). So two numbers per source:

- read: rows/s of `mh.load_data` (once per run, before the first step);
- feed: batches/s of the batched training stream at batch 256, against the steps/s the
  compiled train step consumes (quickstart model: trunk 128-128, two 32-1 heads, 100 inputs).

Run: `.venv/bin/python benchmarks/input_pipeline.py [--rows 20000]`
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import textwrap
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _timing  # noqa: E402,F401 - sets TF_CPP_MIN_LOG_LEVEL

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import multihead as mh  # noqa: E402

BATCH = 256
HEADS = ("y1", "y2")


def _write(directory: str, x: np.ndarray, y: dict[str, np.ndarray]) -> dict[str, dict]:
    np.savez(os.path.join(directory, "d.npz"), x=x, **y)
    d = x.shape[1]
    with open(os.path.join(directory, "d.csv"), "w") as fh:
        fh.write(",".join([f"x{i}" for i in range(d)] + list(HEADS)) + "\n")
        rows = np.concatenate([x, y["y1"], y["y2"]], axis=1)
        np.savetxt(fh, rows, fmt="%.9g", delimiter=",")
    with tf.io.TFRecordWriter(os.path.join(directory, "d.tfrecord")) as writer:
        for i in range(len(x)):
            feature = {"x": tf.train.Feature(float_list=tf.train.FloatList(value=x[i]))}
            for h in HEADS:
                feature[h] = tf.train.Feature(float_list=tf.train.FloatList(value=y[h][i]))
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    with open(os.path.join(directory, "bench_source.py"), "w") as fh:
        fh.write(textwrap.dedent(f"""
            import numpy as np
            def arrays():
                with np.load({os.path.join(directory, "d.npz")!r}) as f:
                    return f["x"], {{h: f[h] for h in {HEADS!r}}}
        """))
    sys.path.insert(0, directory)
    return {
        "npz": {"kind": "npz", "train": os.path.join(directory, "d.npz")},
        "csv": {"kind": "csv", "train": os.path.join(directory, "d.csv"),
                "features": [f"x{i}" for i in range(d)]},
        "tfrecord": {"kind": "tfrecord", "train": os.path.join(directory, "d.tfrecord"),
                     "shapes": {"x": [d], "y1": [1], "y2": [1]}},
        "python": {"kind": "python", "function": "bench_source:arrays"},
    }


def _step_rate(data: mh.MultiTaskData, steps: int) -> float:
    keras.utils.set_random_seed(0)
    model = mh.MultiHeadModel(
        keras.Sequential([keras.layers.Dense(128, activation="relu"),
                          keras.layers.Dense(128, activation="relu")]),
        {h: keras.Sequential([keras.layers.Dense(32, activation="relu"), keras.layers.Dense(1)])
         for h in HEADS})
    model.build((None, data.x_train.shape[1]))
    trainer = mh.Trainer(model, {h: mh.Objective("mse", optimizer="adam") for h in HEADS})
    # the same stream as the timed fit: the consumption rate, with the feed overlapped
    trainer.fit(data.train, 200, batch_size=BATCH, verbose=False)  # trace + warm-up
    history = trainer.fit(data.train, steps, batch_size=BATCH, verbose=False)
    return steps / history.wall_time


def _feed_rate(data: mh.MultiTaskData, batches: int) -> float:
    stream = iter(mh.as_dataset(data.train, BATCH).repeat())
    for _ in range(20):
        next(stream)
    start = time.perf_counter()
    for _ in range(batches):
        next(stream)
    return batches / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.rows, 100)).astype(np.float32)
    y = {"y1": x[:, :1].copy(), "y2": np.sin(x[:, 1:2])}
    with tempfile.TemporaryDirectory() as directory:
        sources = _write(directory, x, y)
        rows = []
        step_rate = None
        for name, section in sources.items():
            start = time.perf_counter()
            data = mh.load_data(section, heads=HEADS)
            read = args.rows / (time.perf_counter() - start)
            if step_rate is None:
                step_rate = _step_rate(data, args.steps)
            feed = _feed_rate(data, 2000)
            rows.append((name, read, feed))
    print(f"compiled step (quickstart model, batch {BATCH}): {step_rate:.0f} steps/s")
    print(f"{'source':10} {'read rows/s':>12} {'feed batches/s':>15} {'feed / step':>12}")
    for name, read, feed in rows:
        print(f"{name:10} {read:12.0f} {feed:15.0f} {feed / step_rate:11.1f}x")


if __name__ == "__main__":
    main()
