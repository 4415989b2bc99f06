"""Shared timing helpers for the benchmark scripts (not part of the package)."""

from __future__ import annotations

import os
import statistics
import time
from typing import Callable, Mapping

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def time_per_call(fn: Callable[[], object], calls: int) -> float:
    """Seconds per call of `fn` over `calls` calls (the result of the last call is awaited)."""
    start = time.perf_counter()
    result = None
    for _ in range(calls):
        result = fn()
    _wait(result)
    return (time.perf_counter() - start) / calls


def _wait(result: object) -> None:
    """Forces pending TF work to finish (reads one value of the result)."""
    import tensorflow as tf

    leaves = [x for x in tf.nest.flatten(result) if hasattr(x, "numpy")]
    if leaves:
        leaves[0].numpy()


def interleaved_medians(variants: Mapping[str, Callable[[], object]], calls: int,
                        repeats: int) -> dict[str, float]:
    """Median seconds per call of each variant, the variants timed round-robin in each repeat
    so that machine load drifts hit them alike."""
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, fn in variants.items():
            samples[name].append(time_per_call(fn, calls))
    return {name: statistics.median(values) for name, values in samples.items()}


def interleaved_wall_and_cpu(variants: Mapping[str, Callable[[], object]], calls: int,
                             repeats: int) -> tuple[dict[str, float], dict[str, float]]:
    """As `interleaved_medians`, and also the median process CPU seconds per call (all
    threads). On a machine shared with other jobs the CPU time moves less with their load
    than the wall time: waiting for a core is not counted."""
    wall: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, fn in variants.items():
            start = time.process_time()
            wall[name].append(time_per_call(fn, calls))
            cpu[name].append((time.process_time() - start) / calls)
    return ({name: statistics.median(v) for name, v in wall.items()},
            {name: statistics.median(v) for name, v in cpu.items()})


def train_quietly(config: str, run_dir: str, sets: list[str]) -> None:
    """`multihead train config --run-dir run_dir --quiet --set ...`, its summary table
    swallowed; exits naming the command if the run fails."""
    import contextlib
    import io

    from multihead.cli.main import main

    args = ["train", config, "--run-dir", run_dir, "--quiet"]
    for assignment in sets:
        args += ["--set", assignment]
    with contextlib.redirect_stdout(io.StringIO()):
        code = main(args)
    if code != 0:
        raise SystemExit(f"run failed: {' '.join(args)}")


def table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows)


def summed_step(model: object) -> Callable:
    """A hand-written compiled step for `model` (a `MultiHeadModel` with scalar regression
    heads): one tape, the sum of the heads' MSE losses, one Adam on every variable. This is
    LibMTL's EW step, the lower bound of a step that trains on one weighted loss."""
    import keras
    import tensorflow as tf

    optimizer = keras.optimizers.Adam(1e-3)
    variables = model.trainable_variables
    optimizer.build(variables)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            out = model(x, training=True)
            loss = tf.add_n([tf.reduce_mean(tf.square(y[h] - out[h])) for h in out])
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    return step


def mlp_model(heads: list[str], input_dim: int, width: int = 256, seed: int = 0) -> object:
    """The benchmarks' model: trunk Dense(width) relu x2, a Dense(1) head per name, built."""
    import keras

    import multihead as mh

    keras.utils.set_random_seed(seed)
    model = mh.MultiHeadModel(
        trunk=keras.Sequential([keras.layers.Dense(width, activation="relu"),
                                keras.layers.Dense(width, activation="relu")]),
        heads={h: keras.layers.Dense(1) for h in heads})
    model.build((None, input_dim))
    return model

