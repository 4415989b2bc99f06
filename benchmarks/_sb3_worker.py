"""One Stable-Baselines3 run for `benchmarks/rl_peers.py`, run by the peers' own Python (a
separate venv with stable-baselines3 and torch: never a dependency of multihead).

Reads a JSON spec on stdin ({"algo", "env", "seed", "steps", "eval_episodes", "kwargs"}) and
prints one JSON line: env steps, updates, wall and CPU seconds of `learn`, and the mean return
of `eval_episodes` deterministic episodes at the end.
"""

from __future__ import annotations

import json
import sys
import time


def main() -> int:
    spec = json.loads(sys.stdin.read())
    import gymnasium as gym
    import numpy as np
    import stable_baselines3 as sb3
    import torch
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy

    torch.set_num_threads(1)
    kwargs = {k: (_linear(v["linear"]) if isinstance(v, dict) and "linear" in v else v)
              for k, v in spec["kwargs"].items()}
    n_envs = kwargs.pop("n_envs", 1)
    sigma = kwargs.pop("action_noise_sigma", None)
    env = make_vec_env(spec["env"], n_envs=n_envs, seed=spec["seed"]) if n_envs > 1 \
        else gym.make(spec["env"])
    if sigma is not None:  # Gaussian exploration noise, sigma times the action bound
        from stable_baselines3.common.noise import NormalActionNoise

        space = gym.make(spec["env"]).action_space
        kwargs["action_noise"] = NormalActionNoise(np.zeros(space.shape), sigma * space.high)
    model = getattr(sb3, spec["algo"])("MlpPolicy", env, seed=spec["seed"], verbose=0, device="cpu",
                                       **kwargs)
    wall, cpu = time.perf_counter(), time.process_time()
    model.learn(total_timesteps=spec["steps"])
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    mean_return, _ = evaluate_policy(model, gym.make(spec["env"]), deterministic=True,
                                     n_eval_episodes=spec["eval_episodes"])
    print(json.dumps({"env_steps": int(model.num_timesteps), "updates": int(model._n_updates),
                      "wall_s": wall, "cpu_s": cpu, "mean_return": float(mean_return),
                      "version": sb3.__version__}))
    return 0


def _linear(start: float):
    """SB3's linear schedule: `start` at the beginning, 0 at the end."""
    return lambda progress_remaining: progress_remaining * start


if __name__ == "__main__":
    sys.exit(main())
