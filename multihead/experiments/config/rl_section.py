"""The reinforcement-learning sections of an experiment config: `env:` and one section per RL
task (`dqn:`, `actor_critic:`, `ppo:`, `td3:`, `sac:`)."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Union

from multihead.experiments.config.fields import MAGNITUDE_MAX
from multihead.experiments.config.fields import field as _field

#: Bound on a loss coefficient (entropy_coef): larger ones drown the loss they are added to.
COEFFICIENT_MAX = 100.0
#: Parallel environments of an actor-critic run (each a gymnasium instance in this process).
MAX_ENVS = 4096
#: Steps of one actor-critic rollout.
MAX_ROLLOUT = 100_000


@dataclasses.dataclass
class EnvConfig:
    """`env:` the gymnasium environment of an RL task (`pip install multihead[rl]`)."""

    id: str = _field("CartPole-v1", doc="gymnasium environment id")
    max_episode_steps: Union[int, None] = _field(None, minimum=1, doc="default: the env's own")
    kwargs: dict[str, Any] = _field({}, doc="keyword arguments of gymnasium.make")
    eval_episodes: int = _field(20, minimum=1, doc="greedy episodes per evaluation")
    stop_return: Union[float, None] = _field(None, doc="stop once an evaluation's mean return reaches this")


@dataclasses.dataclass
class DQNConfig:
    """`dqn:` DQN (Mnih et al., 2015); `train.steps` counts environment steps, `train.batch_size`
    is the replay minibatch, `train.eval_every` the evaluation period in environment steps."""

    #: The `task:` this section configures, the action space it needs ("Any": Discrete or a
    #: finite Box) and the module whose `prepare(config)` builds its runner.
    task: ClassVar[str] = "dqn"
    action_space: ClassVar[str] = "Discrete"
    runner: ClassVar[str] = "multihead.experiments.run.dqn"

    head: str = _field("q", doc="the Q head: one output per action; its loss compares Q(s,a) to the TD target")
    buffer_size: int = _field(50000, minimum=1)
    learning_starts: int = _field(1000, minimum=0, doc="environment steps before the first update")
    train_every: int = _field(1, minimum=1, doc="environment steps per gradient step")
    gamma: float = _field(0.99, minimum=0, maximum=1, doc="discount factor")
    epsilon_start: float = _field(1.0, minimum=0, maximum=1)
    epsilon_end: float = _field(0.05, minimum=0, maximum=1)
    epsilon_decay_steps: int = _field(10000, minimum=1, doc="linear decay, in environment steps")
    target_every: Union[int, None] = _field(None, minimum=1, doc="hard sync period in updates (default 500)")
    target_tau: Union[float, None] = _field(None, doc="Polyak rate in (0, 1] instead of target_every")
    double: bool = _field(False, doc="double DQN: online network picks, target network evaluates")


@dataclasses.dataclass
class ActorCriticConfig:
    """`actor_critic:` synchronous advantage actor-critic (A2C, Mnih et al., 2016);
    `train.steps` counts environment steps, `train.eval_every` the evaluation period in them."""

    task: ClassVar[str] = "actor_critic"
    action_space: ClassVar[str] = "Discrete"
    runner: ClassVar[str] = "multihead.experiments.run.actor_critic"

    policy_head: str = _field("policy", doc="logits head, one output per action; loss set by the task")
    value_head: str = _field("value", doc="state-value head (1 output); its loss compares V(s) to the return")
    num_envs: int = _field(8, minimum=1, maximum=MAX_ENVS)
    n_steps: int = _field(5, minimum=1, maximum=MAX_ROLLOUT,
                          doc="rollout length per update (n-step returns)")
    gamma: float = _field(0.99, minimum=0, maximum=1, doc="discount factor")
    entropy_coef: float = _field(0.01, minimum=0, maximum=COEFFICIENT_MAX)
    normalize_advantages: bool = _field(False)
    value_target_every: Union[int, None] = _field(None, minimum=1, doc="V_target hard sync period in updates")
    value_target_tau: Union[float, None] = _field(None, doc="V_target Polyak rate in (0, 1]")


@dataclasses.dataclass
class PPOConfig:
    """`ppo:` proximal policy optimization (Schulman et al., 2017) with GAE, on a Discrete
    (categorical policy) or Box (diagonal Gaussian, state-independent log std) action space;
    `train.steps` counts environment steps, `train.batch_size` is the minibatch of the
    rollout's `num_envs * n_steps` rows, `train.eval_every` the evaluation period."""

    task: ClassVar[str] = "ppo"
    action_space: ClassVar[str] = "Any"
    runner: ClassVar[str] = "multihead.experiments.run.ppo"

    policy_head: str = _field("policy", doc="action logits (Discrete) or Gaussian means (Box); "
                                            "loss set by the task")
    value_head: str = _field("value", doc="state-value head (1 output); loss: mse")
    separate_optimizers: bool = _field(True, doc="true: one objective and optimizer per head; "
                                                 "false: one objective policy + <value>.weight * "
                                                 "value on the policy head's optimizer")
    num_envs: int = _field(8, minimum=1, maximum=MAX_ENVS)
    n_steps: int = _field(128, minimum=1, maximum=MAX_ROLLOUT, doc="rollout length per update")
    n_epochs: int = _field(10, minimum=1, doc="passes over the rollout per update")
    gamma: float = _field(0.99, minimum=0, maximum=1, doc="discount factor")
    gae_lambda: float = _field(0.95, minimum=0, maximum=1, doc="GAE lambda")
    clip_range: float = _field(0.2, minimum=0, maximum=1, doc="policy ratio clip eps")
    clip_range_decay: str = _field("constant", choices=("constant", "linear"),
                                   doc="linear: eps * (1 - env steps / train.steps)")
    clip_range_vf: Union[float, None] = _field(None, minimum=0, maximum=MAGNITUDE_MAX,
                                               doc="clip of the value change; null: unclipped")
    learning_rate_decay: str = _field("constant", choices=("constant", "linear"),
                                      doc="linear: each optimizer's learning rate * (1 - env "
                                          "steps / train.steps)")
    ent_coef: float = _field(0.0, minimum=0, maximum=COEFFICIENT_MAX, doc="entropy bonus weight")
    target_kl: Union[float, None] = _field(None, minimum=0, maximum=MAGNITUDE_MAX,
                                           doc="stop an update after the epoch whose approximate "
                                               "KL exceeds 1.5 * target_kl; null: all n_epochs")
    normalize_advantages: bool = _field(True, doc="per minibatch")
    log_std_init: float = _field(0.0, minimum=-20, maximum=2, doc="Box only: initial log std")


@dataclasses.dataclass
class TD3Config:
    """`td3:` TD3 (Fujimoto et al., 2018) on a Box action space: an actor head and twin critic
    heads reading `{obs, action}` (the trunk holds no variables; `model.heads.<h>.layers` are
    each head's hidden layers, the task adds the output layer); `train.steps` counts
    environment steps, `train.batch_size` is the replay minibatch."""

    task: ClassVar[str] = "td3"
    action_space: ClassVar[str] = "Box"
    runner: ClassVar[str] = "multihead.experiments.run.continuous"

    actor_head: str = _field("actor", doc="deterministic actor, tanh onto the action bounds; "
                                          "delay its updates with model.heads.<actor>.every: 2")
    critic_heads: list[str] = _field(["q1", "q2"], doc="the twin critics Q1, Q2")
    buffer_size: int = _field(1_000_000, minimum=1)
    start_steps: int = _field(1000, minimum=0, doc="environment steps of uniform random actions")
    learning_starts: int = _field(1000, minimum=0, doc="environment steps before the first update")
    train_every: int = _field(1, minimum=1, doc="environment steps per gradient step")
    gamma: float = _field(0.99, minimum=0, maximum=1, doc="discount factor")
    tau: float = _field(0.005, doc="Polyak rate of the target networks, in (0, 1]; they follow "
                                   "after every <actor>.every-th update")
    exploration_noise: float = _field(0.1, minimum=0, maximum=MAGNITUDE_MAX,
                                      doc="std of the Gaussian action noise, in half ranges")
    policy_noise: float = _field(0.2, minimum=0, maximum=MAGNITUDE_MAX,
                                 doc="target-policy smoothing noise std, in half ranges")
    noise_clip: float = _field(0.5, minimum=0, maximum=MAGNITUDE_MAX,
                               doc="the smoothing noise is clipped to +-this, in half ranges")


@dataclasses.dataclass
class SACConfig:
    """`sac:` soft actor-critic (Haarnoja et al., 2018) with automatic temperature on a Box
    action space: actor, twin critic and temperature heads reading `{obs, action}` (as for
    td3: the trunk holds no variables, `layers` are hidden layers); `train.steps` counts
    environment steps, `train.batch_size` is the replay minibatch."""

    task: ClassVar[str] = "sac"
    action_space: ClassVar[str] = "Box"
    runner: ClassVar[str] = "multihead.experiments.run.continuous"

    actor_head: str = _field("actor", doc="squashed Gaussian actor (mean, log std)")
    critic_heads: list[str] = _field(["q1", "q2"], doc="the twin critics Q1, Q2")
    temperature_head: str = _field("alpha", doc="holds log_alpha, its own objective; its "
                                                "layers are unused")
    initial_alpha: float = _field(1.0, maximum=MAGNITUDE_MAX, doc="alpha = exp(log_alpha) at the start, > 0")
    target_entropy: Union[float, None] = _field(None, doc="default: -(action dimensions)")
    buffer_size: int = _field(1_000_000, minimum=1)
    start_steps: int = _field(1000, minimum=0, doc="environment steps of uniform random actions")
    learning_starts: int = _field(1000, minimum=0, doc="environment steps before the first update")
    train_every: int = _field(1, minimum=1, doc="environment steps per gradient step")
    gamma: float = _field(0.99, minimum=0, maximum=1, doc="discount factor")
    tau: float = _field(0.005, doc="Polyak rate of the target critics, in (0, 1]")


#: `task:` value -> its section's class: the one list of RL tasks (the config's `task`
#: choices, which sections go with which task, the action spaces and the runners).
RL_TASKS: dict[str, type] = {cls.task: cls for cls in (DQNConfig, ActorCriticConfig, PPOConfig, TD3Config,
                                                        SACConfig)}
