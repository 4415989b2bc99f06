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
