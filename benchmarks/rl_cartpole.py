"""Environment steps and wall time for `dqn` and `actor_critic` to solve CartPole-v1.

"Solved" = the first greedy evaluation (every `train.eval_every` environment steps) whose mean
return over 20 episodes is >= 475 (max 500); the run stops there. Each run uses the experiment
config as committed (experiments/dqn_cartpole.yaml, experiments/a2c_cartpole.yaml) with only the
seed changed, run through the same code path as `multihead train` (`tasks.prepare(config).run`).

    /work/venv/bin/python benchmarks/rl_cartpole.py                 # both tasks, seeds 0 1 2
    /work/venv/bin/python benchmarks/rl_cartpole.py --jobs 2        # two runs at a time
    /work/venv/bin/python benchmarks/rl_cartpole.py --quick         # 2,000 env steps each: smoke

Wall times are on a shared 2-core CPU and are noisy; environment steps are deterministic per seed
only up to floating-point nondeterminism of the CPU kernels.
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
CONFIGS = {"dqn": ROOT / "experiments" / "dqn_cartpole.yaml",
           "actor_critic": ROOT / "experiments" / "a2c_cartpole.yaml"}


def run_one(task: str, seed: int, quick: bool, verbose: bool) -> dict:
    from multihead.experiments.run import runner as tasks
    from multihead.experiments.config.schema import load_config

    overrides = [f"seed={seed}"]
    if quick:
        overrides += ["train.steps=2000", "train.eval_every=1000", "env.eval_episodes=5"]
    config = load_config(CONFIGS[task], overrides)
    metrics = tasks.prepare(config).run(None, verbose=verbose)
    metrics["seed"] = seed
    return metrics


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--jobs", type=int, default=1, help="runs in parallel (processes)")
    parser.add_argument("--quick", action="store_true", help="2,000 environment steps per run")
    parser.add_argument("--verbose", action="store_true", help="progress lines of every run")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    runs = [(t, s) for t in args.tasks for s in args.seeds]
    results = []
    ctx = multiprocessing.get_context("spawn")  # a fresh TensorFlow per run
    with concurrent.futures.ProcessPoolExecutor(max_workers=args.jobs, mp_context=ctx,
                                                max_tasks_per_child=1) as pool:
        futures = {pool.submit(run_one, t, s, args.quick, args.verbose): (t, s) for t, s in runs}
        for future in concurrent.futures.as_completed(futures):
            m = future.result()
            results.append(m)
            print(f"done: {m['task']} seed {m['seed']}: eval {m['eval_mean_return']:.1f} at "
                  f"{m['env_steps']} env steps, {m['wall_time_s']:.0f} s", file=sys.stderr, flush=True)
    results.sort(key=lambda m: (list(CONFIGS).index(m["task"]), m["seed"]))
    print("| task | seed | solved (eval mean >= 475 over 20 episodes) | env steps | updates | wall time | eval mean return |")
    print("|---|---|---|---|---|---|---|")
    for m in results:
        solved = "yes" if m["solved_at_env_steps"] is not None else "no"
        print(f"| {m['task']} | {m['seed']} | {solved} | {m['env_steps']:,} | {m['updates']:,} | "
              f"{m['wall_time_s']:.0f} s | {m['eval_mean_return']:.1f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
