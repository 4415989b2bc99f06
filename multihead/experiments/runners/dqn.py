"""`task: dqn`: deep Q-learning (Mnih et al., Nature 2015) with a target network.

The Q head is trained by the compiled train step through a research loss that
reads the Q values of the target network (`TargetNetwork`, under
`stop_gradient`) for the TD target. Optional double DQN (van Hasselt et al.,
AAAI 2016): the online network picks the next action, the target network
evaluates it.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Callable

import keras
import numpy as np
import tensorflow as tf

from multihead.experiments.builders import build_model, build_objectives, build_trainer, build_trunk
from multihead.io.checkpoints import save_checkpoint
from multihead.experiments.config import ConfigError, DQNConfig, EnvConfig, ExperimentConfig
from multihead.core.model import MultiHeadModel
from multihead.core.objectives import HeadLoss, Objective, resolve_loss
from multihead.rl.replay import ReplayBuffer
from multihead.rl.target_network import TargetNetwork
from multihead.experiments.runners.rl import (
    Episodes,
    check_head_outputs,
    check_tau,
    env_factory,
    evaluate,
    greedy_policy,
    head_outputs,
    reject_metrics,
)

DEFAULT_TARGET_EVERY = 500


# -- pure math --------------------------------------------------------------------------


def td_target(reward: Any, terminated: Any, next_q_target: Any, gamma: float,
              next_q_online: Any | None = None) -> tf.Tensor:
    """One-step TD target `r + gamma * (1 - terminated) * Q'(s', a*)`.

    DQN (Mnih et al., 2015): `a* = argmax_a Q'(s', a)`, i.e. `max_a Q'(s', a)`.
    Double DQN (van Hasselt et al., 2016), when `next_q_online` is given:
    `a* = argmax_a Q(s', a)` from the online network, evaluated by `Q'`.

    Args:
        reward: `(n,)` rewards.
        terminated: `(n,)` 1.0 where `s'` is terminal, else 0.0.
        next_q_target: `(n, actions)` target-network Q values at `s'`.
        gamma: discount.
        next_q_online: `(n, actions)` online Q values at `s'` (double DQN) or None.
    """
    next_q_target = tf.convert_to_tensor(next_q_target, tf.float32)
    if next_q_online is None:
        next_value = tf.reduce_max(next_q_target, axis=-1)
    else:
        best = tf.argmax(next_q_online, axis=-1, output_type=tf.int32)
        next_value = tf.gather(next_q_target, best, axis=-1, batch_dims=1)
    reward = tf.cast(reward, tf.float32)
    terminated = tf.cast(terminated, tf.float32)
    return reward + gamma * (1.0 - terminated) * next_value


def linear_epsilon(step: int, start: float, end: float, decay_steps: int) -> float:
    """Epsilon decayed linearly from `start` to `end` over `decay_steps` steps, then constant."""
    frac = min(step / decay_steps, 1.0)
    return start + frac * (end - start)


# -- the loss ----------------------------------------------------------------------------


def dqn_loss(model: MultiHeadModel, target: TargetNetwork, head: str, gamma: float,
             double: bool = False, td_loss: Any = "mse") -> HeadLoss:
    """The research loss of Q head `head`: `td_loss(td_target, Q(s, a))` over the batch.

    The batch is `(obs, {"action", "reward", "next_obs", "terminated"})`
    (`ReplayBuffer.as_targets`). The TD target is computed from `target` (and,
    for double DQN, the online model) under `stop_gradient`, so the gradient
    flows only through `Q(s, a)`.

    Args:
        model: the online model.
        target: target network copying at least `head`.
        head: the Q head (one output per action).
        gamma: discount.
        double: double DQN target.
        td_loss: Keras loss between target and `Q(s, a)` (`"mse"`, `"huber"`, ...).
    """
    elementwise = resolve_loss(td_loss, head)

    def loss(inputs: Any, targets: Any, q: Any) -> tf.Tensor:
        action = tf.cast(targets["action"], tf.int32)
        q_sa = tf.gather(q, action, axis=-1, batch_dims=1)
        next_q_target = target(targets["next_obs"])[head]
        next_q_online = None
        if double:
            next_q_online = tf.stop_gradient(model(targets["next_obs"], training=False)[head])
        y = tf.stop_gradient(td_target(targets["reward"], targets["terminated"], next_q_target,
                                       gamma, next_q_online))
        return elementwise(inputs, {head: y[:, None]}, q_sa[:, None])

    return loss


# -- the task ----------------------------------------------------------------------------


@dataclasses.dataclass
class DQNRunner:
    """Everything built and validated by `prepare`; `run` trains and writes the run."""

    config: ExperimentConfig
    env: EnvConfig
    dqn: DQNConfig
    make_env: Callable[[], Any]
    obs_shape: tuple[int, ...]
    num_actions: int
    model: MultiHeadModel
    objectives: dict[str, Objective]
    target: TargetNetwork
    trunk: Any = "per_head"

    def run(self, run_dir: str | None, verbose: bool = True) -> dict[str, Any]:
        """Trains for `train.steps` environment steps, or until a greedy evaluation reaches
        `env.stop_return`.

        Args:
            run_dir: where events and the final checkpoints go; None writes nothing.
            verbose: print progress lines (environment steps, episodes, recent mean return).

        Returns:
            The metrics written to `metrics.json`: environment steps, episodes, updates,
            target updates and syncs, losses, every evaluation, wall time.
        """
        cfg, dqn, seed = self.config, self.dqn, self.config.seed
        head = dqn.head
        trainer = build_trainer(cfg, self.model, self.objectives, run_dir, trunk=self.trunk,
                                strategy=None, write_config=True)
        greedy = greedy_policy(head_outputs(self.model, head))

        total = cfg.train.steps
        eval_every = cfg.train.eval_every or total
        buffer = ReplayBuffer(dqn.buffer_size, self.obs_shape, seed=seed)
        rng = np.random.default_rng(seed)
        env = self.make_env()
        episodes = Episodes(trainer.monitor, total, verbose)
        obs, _ = env.reset(seed=seed)
        ep_return, ep_length = 0.0, 0
        losses: list[float] = []
        evals: list[tuple[int, float]] = []
        solved_at: int | None = None
        start = time.perf_counter()
        env_steps = 0
        for env_steps in range(1, total + 1):
            eps = linear_epsilon(env_steps - 1, dqn.epsilon_start, dqn.epsilon_end, dqn.epsilon_decay_steps)
            if rng.random() < eps:
                action = int(rng.integers(self.num_actions))
            else:
                action = int(greedy(np.asarray(obs, np.float32)[None])[0])
            next_obs, reward, terminated, truncated, _ = env.step(action)
            buffer.add(obs, action, reward, next_obs, terminated)
            ep_return += float(reward)
            ep_length += 1
            obs = next_obs
            if terminated or truncated:
                episodes.finished(env_steps, ep_return, ep_length)
                obs, _ = env.reset()
                ep_return, ep_length = 0.0, 0
            if env_steps > dqn.learning_starts and env_steps % dqn.train_every == 0:
                batch = buffer.sample(cfg.train.batch_size)
                result = trainer.step((batch.obs, ReplayBuffer.as_targets(batch)))
                loss = result.losses[head]
                if not np.isfinite(loss):
                    raise FloatingPointError(f"the TD loss of head {head!r} became {loss} at env step {env_steps}")
                losses.append(loss)
                self.target.update()
            episodes.progress(env_steps)
            if env_steps % eval_every == 0 or env_steps == total:
                result = evaluate(self.make_env, greedy, self.env.eval_episodes, seed=10_000 + seed)
                evals.append((env_steps, result.mean_return))
                episodes.evaluated(env_steps, result)
                if self.env.stop_return is not None and result.mean_return >= self.env.stop_return:
                    solved_at = env_steps
                    break
        wall = time.perf_counter() - start
        env.close()
        if run_dir is not None:
            save_checkpoint(os.path.join(run_dir, "checkpoints", "final"), self.model, trainer=trainer,
                            targets={head: self.target})
        trainer.close()
        return {
            "task": "dqn",
            "env": self.env.id,
            "env_steps": env_steps,
            "episodes": episodes.count,
            "updates": trainer.global_step,
            "target_updates": int(self.target.counter.numpy()),
            "target_syncs": self.target.num_syncs if self.target.every else None,
            "final_loss": losses[-1] if losses else None,
            "mean_loss_last_100": float(np.mean(losses[-100:])) if losses else None,
            "eval_mean_return": evals[-1][1],
            "eval_episodes": self.env.eval_episodes,
            "evals": [{"env_steps": s, "mean_return": r} for s, r in evals],
            "solved_at_env_steps": solved_at,
            "wall_time_s": wall,
        }


def prepare(config: ExperimentConfig) -> DQNRunner:
    """Builds the env, model, Q objective and target network of a `task: dqn` config."""
    keras.utils.set_random_seed(config.seed)
    env_cfg = config.env or EnvConfig()
    dqn = config.dqn or DQNConfig()
    check_tau(dqn.target_tau, dqn.target_every, "dqn.target")
    reject_metrics(config)
    if dqn.epsilon_start > 1 or dqn.epsilon_end > 1:
        raise ConfigError(f"dqn.epsilon_start/epsilon_end: must be in [0, 1], got "
                          f"{dqn.epsilon_start!r}/{dqn.epsilon_end!r}")
    make_env, obs_shape, num_actions = env_factory(env_cfg)
    if dqn.head not in config.model.heads:
        raise ConfigError(f"dqn.head: the model has no head {dqn.head!r}; "
                          f"its heads are {list(config.model.heads)}")
    if len(config.model.heads) != 1:
        extra = [h for h in config.model.heads if h != dqn.head]
        raise ConfigError(f"model.heads.{extra[0]}: task dqn trains one Q head ({dqn.head!r}); "
                          "remove the other heads")
    model = build_model(config, (None,) + obs_shape)
    check_head_outputs(model, dqn.head, num_actions, "Q", "dqn.head")
    every = dqn.target_every if dqn.target_tau is None and dqn.target_every else None
    if dqn.target_tau is None and every is None:
        every = DEFAULT_TARGET_EVERY
    target = TargetNetwork(model, heads=[dqn.head], every=every, tau=dqn.target_tau)
    head_cfg = config.model.heads[dqn.head]
    build_objectives(config)  # validates optimizer/loss names with their key paths
    try:
        loss = dqn_loss(model, target, dqn.head, dqn.gamma, dqn.double, td_loss=head_cfg.loss)
    except (ValueError, TypeError) as err:
        raise ConfigError(f"model.heads.{dqn.head}.loss: {err}") from None
    objective = Objective(loss=loss, optimizer=head_cfg.optimizer, weight=head_cfg.weight,
                          every=head_cfg.every, trains_trunk=head_cfg.trains_trunk)
    return DQNRunner(config, env_cfg, dqn, make_env, obs_shape, num_actions, model,
                     {dqn.head: objective}, target, build_trunk(config))
