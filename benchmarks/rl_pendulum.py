"""Evaluation-return curves and wall time of `td3` and `sac` on Pendulum-v1.

Each run uses the experiment config as committed (experiments/td3_pendulum.yaml,
experiments/sac_pendulum.yaml: 20,000 environment steps, an evaluation of 10 seeded episodes
with the deterministic policy every 2,000) with only the seed changed (plus any `--set`), run
through the same code path as `multihead train`. The target is a mean evaluation return
>= -200 (random play scores about -1,200); a run reaches it if any evaluation does.

    .venv/bin/python benchmarks/rl_pendulum.py                      # both tasks, seeds 0 1 2
    taskset -c 1 .venv/bin/python benchmarks/rl_pendulum.py --tasks td3 --seeds 0
    .venv/bin/python benchmarks/rl_pendulum.py --jobs 2             # two runs at a time
    .venv/bin/python benchmarks/rl_pendulum.py --quick              # 1,500 env steps each: smoke

Wall times are of a shared 2-core CPU and are noisy (the load average is printed); returns are
deterministic per seed only up to floating-point nondeterminism of the CPU kernels.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = Path(__file__).resolve().parent.parent
CONFIGS = {"td3": ROOT / "experiments" / "td3_pendulum.yaml",
           "sac": ROOT / "experiments" / "sac_pendulum.yaml"}
TARGET = -200.0


def run_one(task: str, seed: int, sets: list[str], quick: bool, verbose: bool) -> dict:
    from multihead.experiments.config.schema import load_config
    from multihead.experiments.run import runner as tasks

    overrides = [f"seed={seed}", *sets]
    if quick:
        overrides += ["train.steps=1500", "train.eval_every=750", "env.eval_episodes=3"]
    metrics = tasks.prepare(load_config(CONFIGS[task], overrides)).run(None, verbose=verbose)
    metrics["seed"] = seed
    return metrics


def first_reaching(metrics: dict, target: float = TARGET) -> int | None:
    """The environment steps of the first evaluation whose mean return is >= `target`."""
    return next((e["env_steps"] for e in metrics["evals"] if e["mean_return"] >= target), None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="config override of every run (as multihead train --set)")
    parser.add_argument("--jobs", type=int, default=1, help="runs in parallel (processes)")
    parser.add_argument("--quick", action="store_true", help="1,500 environment steps per run")
    parser.add_argument("--verbose", action="store_true", help="progress lines of every run")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    print(f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)
    runs = [(t, s) for t in args.tasks for s in args.seeds]
    results = []
    ctx = multiprocessing.get_context("spawn")  # a fresh TensorFlow per run
    with concurrent.futures.ProcessPoolExecutor(max_workers=args.jobs, mp_context=ctx,
                                                max_tasks_per_child=1) as pool:
        futures = {pool.submit(run_one, t, s, args.set, args.quick, args.verbose): (t, s)
                   for t, s in runs}
        for future in concurrent.futures.as_completed(futures):
            m = future.result()
            results.append(m)
            curve = " ".join(f"{e['mean_return']:.0f}" for e in m["evals"])
            print(f"done: {m['task']} seed {m['seed']}: {m['wall_time_s']:.0f} s; eval returns {curve}",
                  file=sys.stderr, flush=True)
    print(f"load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    results.sort(key=lambda m: (list(CONFIGS).index(m["task"]), m["seed"]))
    steps = [e["env_steps"] for e in results[0]["evals"]] if results else []
    print(f"| task | seed | reached {TARGET:.0f} at | wall time | eval mean return at env steps "
          f"{', '.join(f'{s:,}' for s in steps)} |")
    print("|---|---|---|---|---|")
    for m in results:
        reached = first_reaching(m)
        curve = ", ".join(f"{e['mean_return']:.0f}" for e in m["evals"])
        print(f"| {m['task']} | {m['seed']} | {'-' if reached is None else f'{reached:,}'} | "
              f"{m['wall_time_s']:.0f} s | {curve} |")
    for task in args.tasks:
        ok = sum(first_reaching(m) is not None for m in results if m["task"] == task)
        print(f"{task}: {ok} of {sum(m['task'] == task for m in results)} seeds reached {TARGET:.0f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
