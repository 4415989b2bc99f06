"""`task: dqn`: deep Q-learning (Mnih et al., Nature 2015) with a target network.

The Q head is trained by the compiled train step through a research loss
(`multihead.rl.dqn.dqn_loss`) that reads the Q values of the target network for
the TD target; optional double DQN (van Hasselt et al., AAAI 2016). This module
turns the config into those objects and runs the loop: act epsilon-greedily in
one environment, store transitions, train on replay minibatches.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from multihead.experiments.build.builders import build_trunk
from multihead.experiments.config.rl_section import DQNConfig
from multihead.experiments.config.schema import ConfigError, ExperimentConfig
from multihead.experiments.run.rl import (
    RLRun,
    RLRunner,
    RLTask,
    check_head_outputs,
    check_tau,
    env_and_model,
    research_objectives,
)
from multihead.rl.dqn import dqn_loss, epsilon_greedy, linear_epsilon
from multihead.rl.driver import greedy_policy, head_outputs
from multihead.rl.replay import ReplayBuffer
from multihead.rl.target_network import TargetNetwork

#: Hard sync period of the target network, in updates, when neither `dqn.target_every` nor
#: `dqn.target_tau` is given.
DEFAULT_TARGET_EVERY = 500


@dataclasses.dataclass
class DQNRunner(RLRunner):
    """Everything built and validated by `prepare`; `run` trains and writes the run."""

    dqn: DQNConfig

    @property
    def target(self) -> TargetNetwork:
        """The target network of the Q head."""
        return self.task.targets[self.dqn.head]

    def run(self, run_dir: str | None, verbose: bool = True, resume: bool = False,
            extra_callbacks: Sequence[Any] = ()) -> dict[str, Any]:
        """See `RLRunner`. Returns `RLRun.finish`'s metrics, the last TD loss and the mean
        of the last 100."""
        dqn, task, seed = self.dqn, self.task, self.task.config.seed
        greedy = greedy_policy(head_outputs(task.model, dqn.head))
        run = RLRun(task, run_dir, verbose, greedy, num_envs=1, env_seed=seed, resume=resume,
                    callbacks=extra_callbacks)
        driver = run.driver
        buffer = ReplayBuffer(dqn.buffer_size, task.env_spec.obs_shape, seed=seed)
        rng = np.random.default_rng(seed)
        run.start({"explore": rng}, replay=buffer)
        while run.running:
            eps = linear_epsilon(driver.env_steps, dqn.epsilon_start, dqn.epsilon_end,
                                 dqn.epsilon_decay_steps)
            action = epsilon_greedy(rng, eps, task.env_spec.num_actions, lambda: greedy(driver.obs)[0])
            step = driver.step([action])
            buffer.add(step.obs[0], action, step.reward[0], step.next_obs[0], bool(step.terminated[0]))
            if driver.env_steps > dqn.learning_starts and driver.env_steps % dqn.train_every == 0:
                batch = buffer.sample(task.config.train.batch_size)
                run.train(batch.obs, ReplayBuffer.as_targets(batch))
            if run.after_steps():
                break
        losses = run.losses[dqn.head]
        return {**run.finish(),
                "final_loss": losses[-1] if losses else None,
                "mean_loss_last_100": float(np.mean(losses[-100:])) if losses else None}


def prepare(config: ExperimentConfig) -> DQNRunner:
    """Builds the env, model, Q objective and target network of a `task: dqn` config."""
    dqn = config.dqn or DQNConfig()
    check_tau(dqn.target_tau, dqn.target_every, "dqn.target")
    if dqn.epsilon_start > 1 or dqn.epsilon_end > 1:
        raise ConfigError(f"dqn.epsilon_start/epsilon_end: must be in [0, 1], got "
                          f"{dqn.epsilon_start!r}/{dqn.epsilon_end!r}")
    env_cfg, spec, model = env_and_model(config, {"dqn.head": dqn.head})
    check_head_outputs(model, dqn.head, spec.num_actions, "Q")
    every = None if dqn.target_tau is not None else (dqn.target_every or DEFAULT_TARGET_EVERY)
    target = TargetNetwork(model, heads=[dqn.head], every=every, tau=dqn.target_tau)
    td_loss = config.model.heads[dqn.head].loss
    objectives = research_objectives(config, lambda: {
        dqn.head: dqn_loss(model, target, dqn.head, dqn.gamma, dqn.double, td_loss=td_loss)})
    task = RLTask(config, env_cfg, spec, model, objectives, {dqn.head: target}, build_trunk(config))
    return DQNRunner(task, dqn)
