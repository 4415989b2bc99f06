"""`task: actor_critic`: synchronous advantage actor-critic (A2C; Mnih et al., ICML 2016).

A shared trunk feeds a policy head (action logits) and a value head V; each head
has its own loss (`multihead.rl.actor_critic.actor_critic_losses`) and its own
optimizer on its own var_list (trunk + head). The n-step returns bootstrap from V,
or from an exact copy V_target (a `TargetNetwork` of trunk + value head) when
`value_target_every`/`_tau` is set. This module turns the config into those
objects and runs the loop: roll out `n_steps` in `num_envs` environments, train
on the rollout.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from multihead.objectives.objective import HeadLoss
from multihead.experiments.build.builders import build_trunk
from multihead.experiments.config.rl_section import ActorCriticConfig
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
from multihead.rl.actor_critic import actor_critic_losses, rollout_batch, sample_actions
from multihead.rl.driver import greedy_policy, head_outputs
from multihead.rl.target_network import TargetNetwork

#: What the config's `loss` of the policy head may say: the task sets that loss.
POLICY_LOSS_NAMES = ("mse", "policy_gradient")

#: Training environment `i` first starts from `reset(seed=ENV_SEED_SCALE * config.seed + i)`.
ENV_SEED_SCALE = 1000


@dataclasses.dataclass
class ActorCriticRunner(RLRunner):
    """Everything built and validated by `prepare`; `run` trains and writes the run."""

    ac: ActorCriticConfig

    @property
    def value_target(self) -> TargetNetwork | None:
        """V_target, or None when the returns bootstrap from V itself."""
        return self.task.targets.get(self.ac.value_head)

    def run(self, run_dir: str | None, verbose: bool = True, resume: bool = False,
            extra_callbacks: Sequence[Any] = ()) -> dict[str, Any]:
        """See `RLRunner`. Returns `RLRun.finish`'s metrics and the last loss of each head."""
        ac, task, seed = self.ac, self.task, self.task.config.seed
        logits = head_outputs(task.model, ac.policy_head)
        run = RLRun(task, run_dir, verbose, greedy_policy(logits), num_envs=ac.num_envs,
                    env_seed=ENV_SEED_SCALE * seed, resume=resume, callbacks=extra_callbacks)
        driver = run.driver
        rng = np.random.default_rng(seed)
        run.start({"sample": rng})
        while run.running:
            steps = [driver.step(sample_actions(logits(driver.obs).numpy(), rng)) for _ in range(ac.n_steps)]
            run.train(*rollout_batch(steps))
            if run.after_steps():
                break
        return {**run.finish(), "final_loss": {h: (v[-1] if v else None) for h, v in run.losses.items()}}


def prepare(config: ExperimentConfig) -> ActorCriticRunner:
    """Builds the envs, model, per-head objectives and V_target of a `task: actor_critic` config."""
    ac = config.actor_critic or ActorCriticConfig()
    check_tau(ac.value_target_tau, ac.value_target_every, "actor_critic.value_target")
    env_cfg, spec, model = env_and_model(
        config, {"actor_critic.policy_head": ac.policy_head, "actor_critic.value_head": ac.value_head})
    policy_loss = config.model.heads[ac.policy_head].loss
    if policy_loss not in POLICY_LOSS_NAMES:
        raise ConfigError(
            f"model.heads.{ac.policy_head}.loss: the policy head's loss is set by the task (policy "
            f"gradient with entropy bonus actor_critic.entropy_coef); leave it out, got {policy_loss!r}"
        )
    check_head_outputs(model, ac.policy_head, spec.num_actions, "policy")
    check_head_outputs(model, ac.value_head, 1, "value")
    targets: dict[str, TargetNetwork] = {}
    if ac.value_target_every is not None or ac.value_target_tau is not None:
        targets[ac.value_head] = TargetNetwork(model, heads=[ac.value_head], every=ac.value_target_every,
                                               tau=ac.value_target_tau)

    def make_losses() -> dict[str, HeadLoss]:
        policy, value = actor_critic_losses(
            model, ac.policy_head, ac.value_head, ac.gamma, ac.entropy_coef,
            targets.get(ac.value_head), value_loss=config.model.heads[ac.value_head].loss,
            normalize_advantages=ac.normalize_advantages)
        return {ac.policy_head: policy, ac.value_head: value}

    objectives = research_objectives(config, make_losses, losses_set_by_task=[ac.policy_head])
    task = RLTask(config, env_cfg, spec, model, objectives, targets, build_trunk(config))
    return ActorCriticRunner(task, ac)
