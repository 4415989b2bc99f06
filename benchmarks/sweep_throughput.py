"""Trials per hour of `multihead sweep`: --jobs 1 vs --jobs 2, and --jobs 2 with vs without
the thread-pool sizing rule (TensorFlow intra/inter-op threads = max(1, cores // jobs)).

    python benchmarks/sweep_throughput.py            # 4 trials x 1000 steps, 3 repeats (~15 min on 2 cores)
    python benchmarks/sweep_throughput.py --quick    # 4 trials x 400 steps, 2 repeats

Each trial is the quickstart (experiments/quickstart.yaml: a 128-128 relu MLP trunk, two
heads, batch 128, 20000 training rows) for STEPS steps with one evaluation, its seed the
only axis (`--grid seed=0,1,2,3`). A variant is a whole `multihead sweep` process, timed
from start to exit (so each trial's TensorFlow start-up counts, as it does for a user);
the variants run round-robin in each repeat so machine-load drifts hit them alike, and the
figure is the median over repeats. Variants:

- `jobs1`: one trial at a time, all cores (threads auto = cores);
- `jobs2`: two at a time, threads auto = cores // 2 each;
- `jobs2-unsized`: two at a time, TensorFlow's default pools (each sized for all cores).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import table  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICKSTART = os.path.join(ROOT, "experiments", "quickstart.yaml")
VARIANTS = {"jobs1": ["--jobs", "1"], "jobs2": ["--jobs", "2"],
            "jobs2-unsized": ["--jobs", "2", "--threads", "none"]}


def run_sweep(flags: list[str], steps: int, trials: int, workdir: str) -> float:
    """Seconds of one `multihead sweep` process."""
    sweep_dir = tempfile.mkdtemp(dir=workdir)
    os.rmdir(sweep_dir)
    cmd = [sys.executable, "-m", "multihead", "sweep", QUICKSTART, "--quiet", "--sweep-dir", sweep_dir,
           "--grid", "seed=" + ",".join(str(s) for s in range(trials)),
           "--set", f"train.steps={steps}", "--set", f"train.eval_every={steps}",
           "--set", "log.histograms_every=0", *flags]
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    start = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seconds = time.perf_counter() - start
    shutil.rmtree(sweep_dir, ignore_errors=True)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    steps, repeats, trials = (400, 2, 4) if args.quick else (1000, 3, 4)
    samples: dict[str, list[float]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory() as workdir:
        for _ in range(repeats):
            for name, flags in VARIANTS.items():
                samples[name].append(run_sweep(flags, steps, trials, workdir))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    medians = {name: statistics.median(values) for name, values in samples.items()}
    rows = [["variant", "median s", "trials/hour", "vs jobs1"]]
    for name, seconds in medians.items():
        rows.append([name, f"{seconds:.1f}", f"{trials / seconds * 3600:.0f}",
                     f"{medians['jobs1'] / seconds:.2f}x"])
    print(f"{trials} trials x {steps} steps, {repeats} repeats, {cores} cores")
    print(table(rows))
    print("samples (s):", {name: [round(v, 1) for v in values] for name, values in samples.items()})


if __name__ == "__main__":
    main()
