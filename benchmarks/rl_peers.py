"""RL throughput and returns side by side with Stable-Baselines3, on the same core.

Rows: DQN on CartPole-v1, TD3 and SAC on Pendulum-v1, PPO on CartPole-v1, each from the
committed experiment config (experiments/<task>_<env>.yaml) with SB3 given the same
hyper-parameters (learning rates, buffer, batch, gamma, tau, start-up, networks, target
periods, PPO's rollout/epochs/clipping; the mapping is `sb3_spec`). For every row and seed the
two runs go one after the other, each in a fresh process with one thread, and the table gives
multihead / SB3 ratios of environment steps per second and of CPU seconds for the same
updates (same budget, same update schedule), and both
final returns (mean of the evaluation episodes, deterministic policy, at the same budget).

SB3 is never a dependency of multihead: it runs in the Python of a separate venv,
`--sb3-python` (e.g. one made with `python3 -m venv peers && peers/bin/pip install
torch==2.13.0 stable-baselines3 gymnasium`). Without it, the SB3 rows are skipped with one line.

    .venv/bin/python benchmarks/rl_peers.py --sb3-python peers/bin/python            # full budgets
    taskset -c 1 .venv/bin/python benchmarks/rl_peers.py --sb3-python peers/bin/python \\
        --steps 5000 --seeds 0 1 2                                                  # shorter
    .venv/bin/python benchmarks/rl_peers.py --quick                                   # smoke

Differences that remain: SB3's DQN is not double DQN (multihead's config uses `double: true`),
and SB3 clips DQN gradients at norm 10 by default (switched off here to match).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = Path(__file__).resolve().parent.parent
ROWS = {"dqn": "dqn_cartpole.yaml", "td3": "td3_pendulum.yaml", "sac": "sac_pendulum.yaml",
        "ppo": "ppo_cartpole.yaml"}
QUICK_STEPS = {"dqn": 600, "td3": 400, "sac": 400, "ppo": 512}


def _config(task: str, overrides: list[str]) -> Any:
    from multihead.experiments.config.schema import load_config

    return load_config(ROOT / "experiments" / ROWS[task], overrides)


def _overrides(task: str, seed: int, steps: int, eval_episodes: int) -> list[str]:
    """The run's budget: `steps` environment steps, one evaluation at the end."""
    sets = [f"seed={seed}", f"train.steps={steps}", f"train.eval_every={steps}",
            f"env.eval_episodes={eval_episodes}", "env.stop_return=null"]
    if task in ("td3", "sac"):  # start-up shorter than a short budget
        start = min(1000, steps // 4)
        sets += [f"{task}.start_steps={start}", f"{task}.learning_starts={start}"]
    if task == "dqn":
        sets += [f"dqn.learning_starts={min(1000, steps // 4)}"]
    return sets


def run_multihead(task: str, seed: int, steps: int, eval_episodes: int) -> dict[str, Any]:
    """One multihead run in this (fresh) process, one thread."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    from multihead.experiments.run import runner as tasks

    runner = tasks.prepare(_config(task, _overrides(task, seed, steps, eval_episodes)))
    cpu = time.process_time()
    metrics = runner.run(None, verbose=False)
    return {"env_steps": metrics["env_steps"], "updates": metrics["updates"],
            "wall_s": metrics["wall_time_s"], "cpu_s": time.process_time() - cpu,
            "mean_return": metrics["evals"][-1]["mean_return"]}


def sb3_spec(task: str, seed: int, steps: int, eval_episodes: int) -> dict[str, Any]:
    """SB3's algorithm and keyword arguments equal to the multihead config's."""
    c = _config(task, _overrides(task, seed, steps, eval_episodes))
    heads, section = c.model.heads, getattr(c, task)

    def lr(head: str) -> float:
        return float(heads[head].optimizer["config"]["learning_rate"])

    def units(head: str) -> list[int]:
        layers = heads[head].layers
        first = layers[0] if isinstance(layers, list) else layers
        return list(first["mlp"]["units"])

    if task == "dqn":
        kwargs = {"learning_rate": lr(section.head), "buffer_size": section.buffer_size,
                  "learning_starts": section.learning_starts, "batch_size": c.train.batch_size,
                  "gamma": section.gamma, "train_freq": section.train_every, "gradient_steps": 1,
                  "target_update_interval": section.target_every * section.train_every,
                  "exploration_initial_eps": section.epsilon_start,
                  "exploration_final_eps": section.epsilon_end,
                  "exploration_fraction": min(1.0, section.epsilon_decay_steps / steps),
                  "max_grad_norm": 1e10, "policy_kwargs": {"net_arch": list(c.model.trunk["mlp"]["units"])}}
        return {"algo": "DQN", "env": c.env.id, "seed": seed, "steps": steps,
                "eval_episodes": eval_episodes, "kwargs": kwargs}
    if task in ("td3", "sac"):
        critic = section.critic_heads[0]
        kwargs = {"learning_rate": lr(critic), "buffer_size": section.buffer_size,
                  "learning_starts": section.learning_starts, "batch_size": c.train.batch_size,
                  "gamma": section.gamma, "tau": section.tau, "train_freq": 1, "gradient_steps": 1,
                  "policy_kwargs": {"net_arch": units(critic)}}
        if task == "td3":
            kwargs.update(policy_delay=heads[section.actor_head].every,
                          target_policy_noise=section.policy_noise,
                          target_noise_clip=section.noise_clip,
                          action_noise_sigma=section.exploration_noise)
        else:
            kwargs.update(ent_coef=f"auto_{section.initial_alpha}")
        return {"algo": task.upper(), "env": c.env.id, "seed": seed, "steps": steps,
                "eval_episodes": eval_episodes, "kwargs": kwargs}
    rate = lr(section.policy_head)
    clip = section.clip_range
    kwargs = {"n_envs": section.num_envs, "n_steps": section.n_steps,
              "batch_size": c.train.batch_size, "n_epochs": section.n_epochs,
              "gamma": section.gamma, "gae_lambda": section.gae_lambda,
              "learning_rate": {"linear": rate} if section.learning_rate_decay == "linear" else rate,
              "clip_range": {"linear": clip} if section.clip_range_decay == "linear" else clip,
              "ent_coef": section.ent_coef, "vf_coef": float(heads[section.value_head].weight),
              "normalize_advantage": section.normalize_advantages, "max_grad_norm": 0.5,
              "policy_kwargs": {"net_arch": {"pi": units(section.policy_head),
                                             "vf": units(section.value_head)}}}
    return {"algo": "PPO", "env": c.env.id, "seed": seed, "steps": steps,
            "eval_episodes": eval_episodes, "kwargs": kwargs}


def run_sb3(python: str, spec: dict[str, Any]) -> dict[str, Any]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    out = subprocess.run([python, str(ROOT / "benchmarks" / "_sb3_worker.py")],
                         input=json.dumps(spec), capture_output=True, text=True, env=env,
                         timeout=6 * 3600, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"SB3 {spec['algo']} failed: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def sb3_available(python: str | None) -> str | None:
    """None if `python` runs SB3, else the one line saying why the SB3 rows are skipped."""
    if not python:
        return "SB3 rows skipped: no --sb3-python (a venv with stable-baselines3 and torch)"
    try:
        out = subprocess.run([python, "-c", "import stable_baselines3, torch"], capture_output=True,
                             text=True, timeout=300, check=False)
    except OSError as err:
        return f"SB3 rows skipped: --sb3-python {python}: {err.strerror}"
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["?"])[-1]
        return f"SB3 rows skipped: --sb3-python {python} cannot import stable_baselines3 ({last})"
    return None


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=list(ROWS), choices=list(ROWS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, help="environment steps per run (default: the config's)")
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--sb3-python", help="the Python of a venv with stable-baselines3")
    parser.add_argument("--quick", action="store_true",
                        help="a few hundred environment steps per run, seed 0: a smoke test")
    parser.add_argument("--json", help="also write every run's figures to this file")
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.eval_episodes = args.seeds[:1], 2
    skipped = sb3_available(args.sb3_python)
    if skipped:
        print(skipped, flush=True)
    print(f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)
    ctx = multiprocessing.get_context("spawn")  # a fresh TensorFlow per run
    results: list[dict[str, Any]] = []
    for task in args.tasks:
        steps = QUICK_STEPS[task] if args.quick else (args.steps or _config(task, []).train.steps)
        for seed in args.seeds:
            with concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx) as pool:
                ours = pool.submit(run_multihead, task, seed, steps, args.eval_episodes).result()
            peer = None if skipped else run_sb3(
                args.sb3_python, sb3_spec(task, seed, steps, args.eval_episodes))
            results.append({"task": task, "seed": seed, "steps": steps, "multihead": ours,
                            "sb3": peer})
            print(f"done: {task} seed {seed}: multihead {ours['env_steps'] / ours['wall_s']:.0f} "
                  f"env steps/s, return {ours['mean_return']:.1f}"
                  + (f"; SB3 {peer['env_steps'] / peer['wall_s']:.0f} env steps/s, return "
                     f"{peer['mean_return']:.1f}" if peer else ""), file=sys.stderr, flush=True)
    print(f"load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print("| task | env steps | seeds | multihead env steps/s | SB3 env steps/s | ratio | "
          "CPU s for the same updates: multihead / SB3 | return multihead | return SB3 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for task in args.tasks:
        rows = [r for r in results if r["task"] == task]
        ours = [r["multihead"] for r in rows]
        speed = statistics.median(o["env_steps"] / o["wall_s"] for o in ours)
        ret = statistics.median(o["mean_return"] for o in ours)
        if skipped:
            print(f"| {task} | {rows[0]['steps']} | {len(rows)} | {speed:.0f} | - | - | - | "
                  f"{ret:.1f} | - |")
            continue
        peers = [r["sb3"] for r in rows]
        peer_speed = statistics.median(p["env_steps"] / p["wall_s"] for p in peers)
        # the same budget and hyper-parameters make the same updates (the two count them
        # differently: SB3's PPO counts epochs), so the CPU ratio is the ratio per update
        per_update = statistics.median(o["cpu_s"] / p["cpu_s"] for o, p in zip(ours, peers))
        print(f"| {task} | {rows[0]['steps']} | {len(rows)} | {speed:.0f} | {peer_speed:.0f} | "
              f"{_ratio(speed, peer_speed)} | {per_update:.2f}x | {ret:.1f} | "
              f"{statistics.median(p['mean_return'] for p in peers):.1f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
