"""How fast `multihead` answers: `--help`, `train --help` and `compare` (JSON only) against
the import of TensorFlow alone, each a fresh process.

    python benchmarks/cli_startup.py            # 7 runs of each
    python benchmarks/cli_startup.py --quick    # 3 runs of each

Variants, each a whole `python ...` process timed from start to exit (the interpreter's own
start-up counts, as it does for a user), run round-robin so machine-load drifts hit them
alike; the figure is the median:

- `help`: `python -m multihead --help`;
- `train-help`: `python -m multihead train --help`;
- `compare`: `python -m multihead compare RUN --json` on a run directory written by hand
  (config.yaml and metrics.json only; compare reads JSON and YAML);
- `import-tf`: `python -c "import tensorflow"`, the floor of any command that trains.

The ratio column is each variant's time over `import-tf`'s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import table  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _write_run(run_dir: str) -> None:
    """A finished run as compare reads it: its config and final metrics."""
    os.makedirs(run_dir)
    with open(os.path.join(ROOT, "experiments", "quickstart.yaml"), encoding="utf-8") as fh:
        config = yaml.safe_load(fh)
    with open(os.path.join(run_dir, "config.yaml"), "w", encoding="utf-8") as fh:
        yaml.safe_dump(config, fh)
    metrics = {"steps": 10, "eval": {"y1": {"loss": 0.5}, "y2": {"loss": 0.25}},
               "evals": [{"step": 10, "eval": {"y1": {"loss": 0.5}, "y2": {"loss": 0.25}}}]}
    with open(os.path.join(run_dir, "metrics.json"), "w", encoding="utf-8") as fh:
        json.dump(metrics, fh)


def _seconds(cmd: list[str]) -> float:
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    start = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    repeats = 3 if args.quick else 7
    with tempfile.TemporaryDirectory() as workdir:
        run_dir = os.path.join(workdir, "run")
        _write_run(run_dir)
        variants = {
            "help": [sys.executable, "-m", "multihead", "--help"],
            "train-help": [sys.executable, "-m", "multihead", "train", "--help"],
            "compare": [sys.executable, "-m", "multihead", "compare", run_dir, "--json"],
            "import-tf": [sys.executable, "-c", "import tensorflow"],
        }
        samples: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(repeats):
            for name, cmd in variants.items():
                samples[name].append(_seconds(cmd))
    medians = {name: statistics.median(values) for name, values in samples.items()}
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    rows = [["variant", "median s", "vs import-tf"]]
    for name, seconds in medians.items():
        rows.append([name, f"{seconds:.2f}", f"{seconds / medians['import-tf']:.2f}x"])
    print(f"{repeats} runs each, {cores} cores")
    print(table(rows))
    print("samples (s):", {name: [round(v, 2) for v in values] for name, values in samples.items()})


if __name__ == "__main__":
    main()
