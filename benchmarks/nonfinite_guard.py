"""Cost of the per-head non-finite guard: `Objective(on_nonfinite="skip")` (the default: each
head's update runs only when its loss and gradients are finite) against `"apply"` (no guard),
side by side in one process, same model and batch.

    python benchmarks/nonfinite_guard.py            # K = 1, 4, 16; 7 rounds of 30 steps
    python benchmarks/nonfinite_guard.py --quick    # K = 4; 5 rounds
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _timing import interleaved_medians  # noqa: E402


def _trainer(k: int, policy: str):
    import keras
    import multihead as mh

    keras.utils.set_random_seed(0)
    trunk = keras.Sequential([keras.layers.Dense(256, activation="relu"),
                              keras.layers.Dense(256, activation="relu")])
    heads = {f"h{i}": keras.layers.Dense(1) for i in range(k)}
    model = mh.MultiHeadModel(trunk, heads)
    model.build((None, 64))
    return mh.Trainer(model, {h: mh.Objective("mse", keras.optimizers.Adam(1e-3), on_nonfinite=policy)
                              for h in heads})


def measure(k: int, rounds: int, steps: int = 30) -> tuple[float, float]:
    """Median seconds per `Trainer.step` with the guard and without it."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(256, 64)).astype("float32"))
    y = {f"h{i}": tf.constant(rng.normal(size=(256, 1)).astype("float32")) for i in range(k)}
    trainers = {p: _trainer(k, p) for p in ("skip", "apply")}
    for trainer in trainers.values():
        for _ in range(5):  # trace and warm up
            trainer.step((x, y))
    medians = interleaved_medians(
        {p: (lambda t=t: t.step((x, y))) for p, t in trainers.items()}, steps, rounds)
    return medians["skip"], medians["apply"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="K=4 only, 5 rounds")
    args = parser.parse_args()
    ks, rounds = ([4], 5) if args.quick else ([1, 4, 16], 7)
    print(" K  guarded ms  unguarded ms  guarded/unguarded")
    for k in ks:
        guarded, plain = measure(k, rounds)
        print(f"{k:2d}  {guarded * 1e3:10.2f}  {plain * 1e3:12.2f}  {guarded / plain:17.3f}")


if __name__ == "__main__":
    main()
