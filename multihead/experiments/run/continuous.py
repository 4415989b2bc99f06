"""`task: td3` and `task: sac`: off-policy actor-critic on a Box action space.

The model (`multihead.rl.continuous.agent_model`): a trunk without variables and
heads that read `{obs, action}`: the actor, twin critics and, for SAC, the
temperature, built from `model.heads.<head>.layers` (hidden layers; the task adds
the output layer). Each head's objective is its research loss
(`multihead.rl.td3.td3_losses`, `multihead.rl.sac.sac_losses`) with the head's
optimizer, weight and `every` from the config, and trains that head only. This
module turns the config into those objects and runs the loop: uniform random actions
for `start_steps`, then the exploring policy, one environment, transitions into a
replay buffer, one update on a replay minibatch (with fresh noise) every
`train_every` environment steps after `learning_starts`; the evaluations act with
the deterministic policy.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence, Union

import numpy as np

from multihead.experiments.build.builders import build_layer
from multihead.experiments.config.rl_section import RL_TASKS, SACConfig, TD3Config
from multihead.experiments.config.schema import ConfigError, ExperimentConfig
from multihead.experiments.run.rl import EnvSpec, RLRun, RLRunner, RLTask, env_and_model, research_objectives
from multihead.rl.continuous import actor_outputs, agent_inputs, agent_model
from multihead.rl.replay import ReplayBuffer
from multihead.rl.sac import sac_losses, sample_squashed
from multihead.rl.target_network import TargetNetwork
from multihead.rl.td3 import td3_losses

AgentConfig = Union[TD3Config, SACConfig]
#: obs `(1, obs_dim)`, rng -> the exploring action `(1, action_dim)` in the environment's units.
Explore = Callable[[np.ndarray, np.random.Generator], np.ndarray]


@dataclasses.dataclass
class ContinuousRunner(RLRunner):
    """Everything built and validated by `prepare`; `run` trains and writes the run.

    Attributes:
        agent: the `td3:` or `sac:` section.
        act: the deterministic policy the evaluations run.
        explore: the exploring policy of the training environment.
        noise_keys: the standard-normal noise each batch carries, `(batch, action_dim)` each.
    """

    agent: AgentConfig
    act: Callable[[np.ndarray], np.ndarray]
    explore: Explore
    noise_keys: tuple[str, ...]

    def run(self, run_dir: str | None, verbose: bool = True, resume: bool = False,
            extra_callbacks: Sequence[Any] = ()) -> dict[str, Any]:
        """See `RLRunner`. Returns `RLRun.finish`'s metrics and the last loss of each head."""
        agent, task, seed = self.agent, self.task, self.task.config.seed
        spec, batch_size = task.env_spec, task.config.train.batch_size
        low, high = np.array(spec.action_low, np.float32), np.array(spec.action_high, np.float32)
        run = RLRun(task, run_dir, verbose, self.act, num_envs=1, env_seed=seed, resume=resume,
                    callbacks=extra_callbacks)
        driver = run.driver
        buffer = ReplayBuffer(agent.buffer_size, spec.obs_shape, seed=seed,
                              action_shape=low.shape, action_dtype="float32")
        rng = np.random.default_rng(seed)  # exploration, and the noise of every batch
        run.start({"explore": rng}, replay=buffer)
        while run.running:
            if driver.env_steps < agent.start_steps:
                action = rng.uniform(low, high)[None]
            else:
                action = np.clip(self.explore(driver.obs, rng), low, high)
            step = driver.step(action)
            buffer.add(step.obs[0], step.action[0], step.reward[0], step.next_obs[0],
                       bool(step.terminated[0]))
            if driver.env_steps > agent.learning_starts and driver.env_steps % agent.train_every == 0:
                batch = buffer.sample(batch_size)
                noise = {k: rng.standard_normal((batch_size, len(low))).astype(np.float32)
                         for k in self.noise_keys}
                run.train(agent_inputs(batch.obs, batch.action),
                          {"reward": batch.reward, "next_obs": batch.next_obs,
                           "terminated": batch.terminated, **noise})
            if run.after_steps():
                break
        return {**run.finish(), "final_loss": {h: (v[-1] if v else None) for h, v in run.losses.items()}}


def _heads(config: ExperimentConfig, agent: AgentConfig) -> dict[str, str]:
    """Config key -> head, for the heads the task trains."""
    key = config.task
    if len(agent.critic_heads) != 2:
        raise ConfigError(f"{key}.critic_heads: name two heads (the twin critics), got "
                          f"{agent.critic_heads!r}")
    heads = {f"{key}.actor_head": agent.actor_head,
             **{f"{key}.critic_heads[{i}]": h for i, h in enumerate(agent.critic_heads)}}
    if isinstance(agent, SACConfig):
        heads[f"{key}.temperature_head"] = agent.temperature_head
    return heads


def _check_agent(config: ExperimentConfig, agent: AgentConfig) -> None:
    """The settings the schema cannot check alone, each error naming its key."""
    if not 0.0 < agent.tau <= 1.0:
        raise ConfigError(f"{config.task}.tau: must satisfy 0 < tau <= 1, got {agent.tau!r} (typical: 0.005)")
    if isinstance(agent, SACConfig) and not agent.initial_alpha > 0:
        raise ConfigError(f"sac.initial_alpha: must be > 0, got {agent.initial_alpha!r}")
    trunk = config.model.trunk
    if not (isinstance(trunk, dict) and trunk.get("class_name") == "Identity"):
        raise ConfigError(f"model.trunk: task {config.task} needs {{class_name: Identity}} (each "
                          f"head reads the observation and action itself), got {trunk!r}")
    set_by_task = [agent.actor_head] + ([agent.temperature_head] if isinstance(agent, SACConfig) else [])
    for head in set_by_task:
        if config.model.heads[head].loss != "mse":
            raise ConfigError(f"model.heads.{head}.loss: set by task {config.task}; leave it out, "
                              f"got {config.model.heads[head].loss!r}")
    if isinstance(agent, TD3Config):
        for head in agent.critic_heads:
            if config.model.heads[head].every != 1:
                raise ConfigError(f"model.heads.{head}.every: the critics update on every step "
                                  "(TD3 delays the actor: model.heads.<actor>.every), got "
                                  f"{config.model.heads[head].every}")


def _build_model(config: ExperimentConfig, agent: AgentConfig, spec: EnvSpec) -> Any:
    """The agent's model: each head's hidden layers from `model.heads.<head>.layers`."""
    _check_agent(config, agent)
    sac = isinstance(agent, SACConfig)
    bodies = {h: build_layer(config.model.heads[h].layers, f"model.heads.{h}.layers")
              for h in [agent.actor_head, *agent.critic_heads]}
    try:
        return agent_model(spec.obs_shape[0], spec.action_low, spec.action_high, bodies,
                           agent.actor_head, gaussian=sac,
                           temperature=agent.temperature_head if sac else None,
                           initial_alpha=agent.initial_alpha if sac else 1.0)
    except (ValueError, TypeError) as err:
        raise ConfigError(f"model: {str(err).strip().splitlines()[0]}") from None


def _policies(agent: AgentConfig, model: Any, spec: EnvSpec) -> tuple[Any, Explore, tuple[str, ...]]:
    """`(deterministic policy, exploring policy, noise keys of a batch)` of the agent."""
    low, high = np.array(spec.action_low), np.array(spec.action_high)
    middle, half = (high + low) / 2, (high - low) / 2
    outputs = actor_outputs(model, agent.actor_head, len(low))
    if isinstance(agent, TD3Config):
        def explore_td3(obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
            action = outputs(obs).numpy()
            return action + agent.exploration_noise * half * rng.standard_normal(action.shape)

        return lambda obs: outputs(obs).numpy(), explore_td3, ("noise",)

    def deterministic(obs: np.ndarray) -> np.ndarray:
        mean = np.split(outputs(obs).numpy(), 2, axis=-1)[0]
        return middle + half * np.tanh(mean)

    def explore_sac(obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return middle + half * sample_squashed(outputs(obs).numpy(), rng)

    return deterministic, explore_sac, ("noise", "next_noise")


def prepare(config: ExperimentConfig) -> ContinuousRunner:
    """Builds the env, model, per-head objectives and target network of a `task: td3` or
    `task: sac` config."""
    agent: AgentConfig = getattr(config, config.task) or RL_TASKS[config.task]()
    env_cfg, spec, model = env_and_model(config, _heads(config, agent),
                                         lambda spec: _build_model(config, agent, spec))
    actor, critics = agent.actor_head, list(agent.critic_heads)
    td_loss = config.model.heads[critics[0]].loss
    if isinstance(agent, TD3Config):
        delay = config.model.heads[actor].every
        target = TargetNetwork(model, heads=[actor, *critics], tau=agent.tau,
                               every=delay if delay > 1 else None)
        make = lambda: td3_losses(model, target, agent.gamma, agent.policy_noise,  # noqa: E731
                                  agent.noise_clip, spec.action_low, spec.action_high, actor,
                                  critics, td_loss)
        set_by_task = [actor]
    else:
        target = TargetNetwork(model, heads=critics, tau=agent.tau)
        make = lambda: sac_losses(model, target, agent.gamma, spec.action_low,  # noqa: E731
                                  spec.action_high, actor, critics, agent.temperature_head,
                                  td_loss, agent.target_entropy)
        set_by_task = [actor, agent.temperature_head]
    objectives = {h: dataclasses.replace(o, trains_trunk=False)  # the trunk has no variables
                  for h, o in research_objectives(config, make, set_by_task).items()}
    task = RLTask(config, env_cfg, spec, model, objectives, {"target": target})
    return ContinuousRunner(task, agent, *_policies(agent, model, spec))

