"""What the RL tasks (`dqn`, `actor_critic`) share: environments, greedy evaluation,
episode bookkeeping for TensorBoard and progress lines. Needs `pip install multihead[rl]`."""

from __future__ import annotations

import collections
import dataclasses
import sys
import time
from typing import Any, Callable, TextIO

import numpy as np
import tensorflow as tf

from multihead.experiments.config import ConfigError, EnvConfig
from multihead.core.model import MultiHeadModel
from multihead.monitoring.monitor import Monitor

EnvFactory = Callable[[], Any]


def env_factory(config: EnvConfig) -> tuple[EnvFactory, tuple[int, ...], int]:
    """A function making fresh environments of `config`, the observation shape and the
    number of discrete actions; raises `ConfigError` naming `env.*` keys."""
    try:
        import gymnasium
    except ImportError:
        raise ConfigError("env: the RL tasks need gymnasium: pip install 'multihead[rl]'") from None

    def make() -> Any:
        kwargs = dict(config.kwargs)
        if config.max_episode_steps is not None:
            kwargs["max_episode_steps"] = config.max_episode_steps
        return gymnasium.make(config.id, **kwargs)

    try:
        env = make()
    except gymnasium.error.Error as err:
        raise ConfigError(f"env.id: cannot make {config.id!r}: {str(err).splitlines()[0]}") from None
    except TypeError as err:
        raise ConfigError(f"env.kwargs: {str(err).splitlines()[0]}") from None
    try:
        if not isinstance(env.action_space, gymnasium.spaces.Discrete):
            raise ConfigError(f"env.id: {config.id!r} has action space {env.action_space}; "
                              "the dqn and actor_critic tasks need a Discrete one")
        shape = env.observation_space.shape
        if not isinstance(env.observation_space, gymnasium.spaces.Box) or shape is None:
            raise ConfigError(f"env.id: {config.id!r} has observation space {env.observation_space}; "
                              "a Box (array) observation is needed")
        return make, tuple(int(d) for d in shape), int(env.action_space.n)
    finally:
        env.close()


def check_head_outputs(model: MultiHeadModel, head: str, units: int, what: str, key: str) -> None:
    """Raises `ConfigError` unless `model`'s head `head` outputs `units` values per example."""
    if head not in model.heads:
        raise ConfigError(f"{key}: the model has no head {head!r}; its heads are {list(model.head_names)}")
    shape = model.heads[head].compute_output_shape(model.trunk.compute_output_shape(
        model.trunk.get_build_config()["input_shape"]))
    if tuple(shape[1:]) != (units,):
        raise ConfigError(
            f"model.heads.{head}.layers: the {what} head must output {units} value{'s' if units != 1 else ''} "
            "per example, "
            f"it outputs shape {tuple(shape[1:])}; make its last layer Dense(units={units})"
        )


def reject_metrics(config: Any) -> None:
    """Raises `ConfigError` for head `metrics`: RL tasks have no labelled evaluation data."""
    for name, head in config.model.heads.items():
        if head.metrics:
            raise ConfigError(f"model.heads.{name}.metrics: not used by task {config.task} (no labels "
                              "to compare with); remove it, evaluation reports episode returns")


def check_tau(tau: float | None, every: int | None, key: str) -> None:
    """Raises `ConfigError` if a Polyak rate is outside (0, 1] or given with a sync period."""
    if tau is not None and not 0.0 < tau <= 1.0:
        raise ConfigError(f"{key}_tau: must satisfy 0 < tau <= 1, got {tau!r} (typical: 0.005)")
    if tau is not None and every is not None:
        raise ConfigError(f"{key}_every and {key}_tau: give one of them (hard sync period or Polyak rate)")


@dataclasses.dataclass(frozen=True)
class EvalResult:
    """Greedy evaluation: per-episode returns and lengths."""

    returns: np.ndarray
    lengths: np.ndarray

    @property
    def mean_return(self) -> float:
        return float(np.mean(self.returns))


def evaluate(make_env: EnvFactory, act: Callable[[np.ndarray], np.ndarray], episodes: int,
             seed: int) -> EvalResult:
    """Runs `episodes` episodes side by side (one batched `act` call per step).

    Args:
        make_env: makes one environment.
        act: observations `(n, *obs_shape)` -> actions `(n,)`.
        episodes: number of episodes.
        seed: episode `i` starts from `reset(seed=seed + i)`.
    """
    envs = [make_env() for _ in range(episodes)]
    obs = np.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(envs)]).astype(np.float32)
    returns, lengths = np.zeros(episodes), np.zeros(episodes, np.int64)
    active = np.ones(episodes, bool)
    while active.any():
        idx = np.flatnonzero(active)
        actions = act(obs[idx])
        for j, i in enumerate(idx):
            o, r, term, trunc, _ = envs[i].step(int(actions[j]))
            obs[i] = o
            returns[i] += r
            lengths[i] += 1
            if term or trunc:
                active[i] = False
    for env in envs:
        env.close()
    return EvalResult(returns, lengths)


class Episodes:
    """Counts finished training episodes, logs them and prints progress lines.

    Args:
        monitor: where episode return/length go (tags `episode/return`,
            `episode/length`, x axis = environment steps); None disables.
        total_steps: the environment-step budget (for progress lines).
        verbose: print progress to `stream` every `interval` seconds.
    """

    def __init__(self, monitor: Monitor | None, total_steps: int, verbose: bool,
                 stream: TextIO | None = None, interval: float = 10.0, window: int = 20) -> None:
        self.monitor = monitor
        self.total_steps = total_steps
        self.verbose = verbose
        self.stream = stream if stream is not None else sys.stderr
        self.interval = interval
        self.count = 0
        self.recent: collections.deque[float] = collections.deque(maxlen=window)
        self.start = time.perf_counter()
        self._last_print = self.start
        self._last_step = 0

    def finished(self, env_step: int, episode_return: float, length: int) -> None:
        self.count += 1
        self.recent.append(episode_return)
        if self.monitor is not None:
            self.monitor.write_scalars(env_step, {"episode/return": episode_return,
                                                  "episode/length": float(length)})

    @property
    def recent_mean(self) -> float:
        return float(np.mean(self.recent)) if self.recent else float("nan")

    def evaluated(self, env_step: int, result: EvalResult) -> None:
        if self.monitor is not None:
            self.monitor.write_scalars(env_step, {"episode/return": result.mean_return,
                                                  "episode/length": float(np.mean(result.lengths))},
                                       run="eval")
        self.progress(env_step, force=True, extra=f"eval mean return {result.mean_return:.1f} "
                                                  f"over {len(result.returns)} episodes")

    def progress(self, env_step: int, force: bool = False, extra: str = "") -> None:
        now = time.perf_counter()
        if not self.verbose or (not force and now - self._last_print < self.interval):
            return
        # The rate over the last interval: the first interval includes tracing the step.
        rate = (env_step - self._last_step) / max(now - self._last_print, 1e-9)
        self._last_print, self._last_step = now, env_step
        line = (f"env step {env_step:>7}/{self.total_steps}  {rate:6.0f} steps/s  episodes {self.count:>5}  "
                f"recent mean return {self.recent_mean:6.1f}")
        print(line + (f"  {extra}" if extra else ""), file=self.stream, flush=True)


def head_outputs(model: MultiHeadModel, head: str) -> Callable[[np.ndarray], tf.Tensor]:
    """Compiled inference of one head (no training-mode layers), for acting in environments."""
    return tf.function(lambda x: model(x, training=False)[head], reduce_retracing=True)


def greedy_policy(outputs: Callable[[np.ndarray], tf.Tensor]) -> Callable[[np.ndarray], np.ndarray]:
    """The action of highest Q value / logit for each observation of a batch."""
    return lambda obs: np.argmax(outputs(obs).numpy(), axis=-1)
