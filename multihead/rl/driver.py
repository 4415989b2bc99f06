"""The environment driver shared by every RL agent: it steps environments, keeps episode
bookkeeping, and evaluates a greedy policy on seeded episodes.

Environments come from a factory `make_env() -> Env` with the gymnasium API
(`reset(seed=) -> (obs, info)`, `step(action) -> (obs, reward, terminated,
truncated, info)`, `close()`), so nothing here knows a config. Agents stay apart:
the driver takes actions and returns what happened, the agent decides what to
act and what to learn from it.

The driver, the episode log and the evaluations each have `state()` (JSON-able values) and
`load_state(state)`, the parts of an RL run's checkpoint they own.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable, Mapping, NamedTuple, Protocol, Sequence

import numpy as np
import tensorflow as tf

from multihead import _keras_internals as internals
from multihead._checks import check_int
from multihead.rl import env_state
from multihead.training.keras_model import MultiHeadModel
from multihead.monitoring.monitor import Monitor
from multihead.monitoring.progress import Progress


class Env(Protocol):
    """The part of the gymnasium `Env` API the driver uses."""

    def reset(self, *, seed: int | None = None) -> tuple[Any, dict[str, Any]]: ...

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]: ...

    def close(self) -> None: ...


EnvFactory = Callable[[], Env]
Policy = Callable[[np.ndarray], np.ndarray]


# -- acting -------------------------------------------------------------------------------


def as_actions(actions: Sequence[Any] | np.ndarray) -> np.ndarray:
    """A batch of actions as the driver stores them: int64 `(K,)` for discrete actions,
    float32 `(K, *action_shape)` for continuous (Box) ones."""
    actions = np.asarray(actions)
    if np.issubdtype(actions.dtype, np.integer) or actions.dtype == bool:
        return actions.astype(np.int64)
    return actions.astype(np.float32)


def env_action(action: np.ndarray) -> Any:
    """One row of `as_actions` as the environment takes it: an int, or a float32 array."""
    return int(action) if action.dtype == np.int64 else action


class Inference:
    """`fn(batch)` compiled, for acting: a batch (an array or a tensor) is passed straight to
    the concrete function traced for its dtype and its shape after the batch dimension (the
    batch dimension left unknown), on its flat inputs (`_keras_internals.flat_call`): past
    `tf.function`'s per-call dispatch (280 -> 170 us per act call of a small network on one
    core) and the concrete function's binding to its signature (the DQN config's act call
    about 105 -> 78 us). Anything else (a dict of inputs, a list) goes through the
    `tf.function`."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self._function = tf.function(fn, reduce_retracing=True)
        self._concrete: dict[tuple[Any, ...], Callable[[list[tf.Tensor]], Any]] = {}

    def __call__(self, batch: Any) -> Any:
        if isinstance(batch, np.ndarray):
            batch = tf.convert_to_tensor(batch)  # the tensor tf.function would make of it
        if not isinstance(batch, tf.Tensor):
            return self._function(batch)
        key = (batch.dtype, tuple(batch.shape[1:]))
        call = self._concrete.get(key)
        if call is None:
            spec = tf.TensorSpec((None,) + key[1], batch.dtype)
            call = self._concrete[key] = internals.flat_call(
                self._function.get_concrete_function(spec))
        return call([batch])


def head_outputs(model: MultiHeadModel, head: str) -> Callable[[np.ndarray], tf.Tensor]:
    """Compiled inference of one head (no training-mode layers), for acting in environments."""
    return Inference(lambda x: model(x, training=False)[head])


def greedy_policy(outputs: Callable[[np.ndarray], tf.Tensor]) -> Policy:
    """The action of highest Q value / logit for each observation of a batch."""
    return lambda obs: np.argmax(outputs(obs).numpy(), axis=-1)


# -- evaluation ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class EvalResult:
    """Greedy evaluation: per-episode returns and lengths."""

    returns: np.ndarray
    lengths: np.ndarray

    @property
    def mean_return(self) -> float:
        return float(np.mean(self.returns))


def evaluate(make_env: EnvFactory, act: Policy, episodes: int, seed: int) -> EvalResult:
    """Runs `episodes` episodes side by side (one batched `act` call per step).

    Args:
        make_env: makes one environment.
        act: observations `(n, *obs_shape)` -> actions `(n,)` (discrete) or
            `(n, *action_shape)` (continuous), deterministic for a greedy evaluation.
        episodes: number of episodes.
        seed: episode `i` starts from `reset(seed=seed + i)`, so every evaluation of a
            run sees the same start states.
    """
    envs = [make_env() for _ in range(episodes)]
    obs = np.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(envs)]).astype(np.float32)
    returns, lengths = np.zeros(episodes), np.zeros(episodes, np.int64)
    active = np.ones(episodes, bool)
    while active.any():
        idx = np.flatnonzero(active)
        actions = as_actions(act(obs[idx]))
        for j, i in enumerate(idx):
            o, r, term, trunc, _ = envs[i].step(env_action(actions[j]))
            obs[i] = o
            returns[i] += r
            lengths[i] += 1
            if term or trunc:
                active[i] = False
    for env in envs:
        env.close()
    return EvalResult(returns, lengths)


# -- episode log --------------------------------------------------------------------------


class EpisodeLog:
    """Where finished episodes and evaluations go: TensorBoard scalars and progress lines.

    Episode scalars are `episode/return` and `episode/length` with environment
    steps on the x axis, training episodes in the `train` run, evaluations (their
    means) in the `eval` run. Progress lines are `progress`'s (environment steps,
    rate, ETA, per-head losses); an evaluation adds a line of its own with the
    training episodes' recent mean return.

    Args:
        monitor: the TensorBoard monitor, or None.
        progress: the progress display over environment steps, or None for silence.
        window: how many recent training episodes the recent mean return covers.
    """

    def __init__(self, monitor: Monitor | None, progress: Progress | None, window: int = 20) -> None:
        self.monitor = monitor
        self.progress = progress
        self.count = 0
        self.recent: collections.deque[float] = collections.deque(maxlen=window)

    @property
    def recent_mean(self) -> float:
        """Mean return of the last `window` training episodes (nan before the first)."""
        return float(np.mean(self.recent)) if self.recent else float("nan")

    def state(self) -> dict[str, Any]:
        """The episode count and the recent returns, for a checkpoint."""
        return {"count": self.count, "recent": list(self.recent)}

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Puts back what `state()` returned."""
        self.count = int(state["count"])
        self.recent.clear()
        self.recent.extend(float(r) for r in state["recent"])

    def finished(self, env_step: int, episode_return: float, length: int) -> None:
        """Records a training episode that ended at environment step `env_step`."""
        self.count += 1
        self.recent.append(episode_return)
        if self.monitor is not None:
            self.monitor.write_scalars(env_step, {"episode/return": episode_return,
                                                  "episode/length": float(length)})

    def evaluated(self, env_step: int, result: EvalResult) -> None:
        """Records a greedy evaluation made at environment step `env_step`."""
        if self.monitor is not None:
            self.monitor.write_scalars(env_step, {"episode/return": result.mean_return,
                                                  "episode/length": float(np.mean(result.lengths))},
                                       run="eval")
        if self.progress is not None:
            self.progress.close(env_step)  # ends the progress line: the evaluation's stands below it
            self.progress.stream.write(
                f"eval at env step {env_step}: mean return {result.mean_return:.1f} over "
                f"{len(result.returns)} episodes; {self.count} training episodes, recent mean "
                f"return {self.recent_mean:.1f}\n")
            self.progress.stream.flush()

    def stepped(self, env_step: int, losses: Mapping[str, float]) -> None:
        """Shows progress after environment step `env_step` (throttled by `progress`)."""
        if self.progress is not None:
            self.progress.update(env_step, losses)

    def close(self, env_step: int) -> None:
        """Shows the final progress line."""
        if self.progress is not None:
            self.progress.close(env_step)


class Evaluations:
    """Greedy evaluations every `every` environment steps and at the end of the budget.

    Args:
        make_env: makes one environment.
        act: the greedy policy evaluated.
        episodes: episodes per evaluation.
        seed: evaluation episode `i` starts from `reset(seed=seed + i)`.
        every: evaluation period in environment steps; when a driver step passes a
            due point, the evaluation runs at the first step after it.
        total: the environment-step budget; reaching it always evaluates.
        stop_return: a mean return that ends the run, or None.
        log: where results go.
    """

    def __init__(self, make_env: EnvFactory, act: Policy, episodes: int, seed: int, every: int,
                 total: int, stop_return: float | None, log: EpisodeLog) -> None:
        self._make_env, self._act = make_env, act
        self.episodes, self.seed, self.every, self.total = episodes, seed, every, total
        self.stop_return = stop_return
        self._log = log
        self._next = every
        self.history: list[tuple[int, float]] = []
        self.solved_at: int | None = None

    def __call__(self, env_steps: int) -> bool:
        """Evaluates if due at `env_steps`; True when the result reaches `stop_return`."""
        if env_steps < self._next and env_steps < self.total:
            return False
        self._next += self.every
        result = evaluate(self._make_env, self._act, self.episodes, self.seed)
        self.history.append((env_steps, result.mean_return))
        self._log.evaluated(env_steps, result)
        if self.stop_return is not None and result.mean_return >= self.stop_return:
            self.solved_at = env_steps
            return True
        return False

    def state(self) -> dict[str, Any]:
        """The next due step, the history and the solving step, for a checkpoint."""
        return {"next": self._next, "history": [list(h) for h in self.history], "solved_at": self.solved_at}

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Puts back what `state()` returned."""
        self._next = int(state["next"])
        self.history = [(int(s), float(r)) for s, r in state["history"]]
        self.solved_at = state["solved_at"]

    @property
    def last_mean_return(self) -> float | None:
        """The latest evaluation's mean return, or None before the first."""
        return self.history[-1][1] if self.history else None


# -- driving ------------------------------------------------------------------------------


class Experience(NamedTuple):
    """One driver step in each of `K` environments (field `i` of every row is environment `i`).

    Attributes:
        obs: observations acted on, `(K, *obs_shape)` float32.
        action: actions taken, `(K,)` int64 (discrete) or `(K, *action_shape)` float32.
        reward: rewards, `(K,)` float32.
        next_obs: observations after the action, the final one where the episode
            ended (the environment is then already reset), `(K, *obs_shape)` float32.
        terminated: 1.0 where the episode reached a terminal state (no bootstrap), `(K,)`.
        ended: 1.0 where the episode terminated or was truncated, `(K,)`.
    """

    obs: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    next_obs: np.ndarray
    terminated: np.ndarray
    ended: np.ndarray


class Driver:
    """Steps `num_envs` environments side by side, resetting each when its episode ends.

    Args:
        make_env: makes one environment.
        num_envs: environments stepped per `step`.
        seed: environment `i` first starts from `reset(seed=seed + i)`; later resets
            continue each environment's own random stream.
        on_episode_end: called as `(env_steps, episode_return, length)` when an
            episode ends; `env_steps` counts environment steps up to and including
            that episode's last.

    Example:
        >>> import gymnasium, numpy as np
        >>> driver = Driver(lambda: gymnasium.make("CartPole-v1"), num_envs=2, seed=0)
        >>> step = driver.step(np.zeros(2, int))
        >>> step.next_obs.shape, driver.env_steps
        ((2, 4), 2)
        >>> driver.close()
    """

    def __init__(self, make_env: EnvFactory, num_envs: int, seed: int,
                 on_episode_end: Callable[[int, float, int], None] | None = None) -> None:
        num_envs = check_int(num_envs, "Driver.num_envs", minimum=1)
        self.seed = seed
        self.envs = [make_env() for _ in range(num_envs)]
        self.obs = np.stack([env.reset(seed=seed + i)[0]
                             for i, env in enumerate(self.envs)]).astype(np.float32)
        self.env_steps = 0
        self._on_episode_end = on_episode_end
        self._returns = np.zeros(num_envs)
        self._lengths = np.zeros(num_envs, np.int64)

    def step(self, actions: Sequence[Any] | np.ndarray) -> Experience:
        """Takes `actions[i]` in environment `i`, one environment after another.

        Args:
            actions: `K` ints (discrete actions) or a float array `(K, *action_shape)`
                (continuous actions).
        """
        actions = as_actions(actions)
        num_envs = len(self.envs)
        obs = self.obs.copy()
        next_obs = np.zeros_like(obs)
        reward, terminated, ended = (np.zeros(num_envs, np.float32) for _ in range(3))
        for i, env in enumerate(self.envs):
            o, r, term, trunc, _ = env.step(env_action(actions[i]))
            next_obs[i], reward[i], terminated[i], ended[i] = o, r, float(term), float(term or trunc)
            self._returns[i] += r
            self._lengths[i] += 1
            self.env_steps += 1
            if term or trunc:
                if self._on_episode_end is not None:
                    self._on_episode_end(self.env_steps, float(self._returns[i]), int(self._lengths[i]))
                self._returns[i], self._lengths[i] = 0.0, 0
                o, _ = env.reset()
            self.obs[i] = o
        return Experience(obs, actions, reward, next_obs, terminated, ended)

    @property
    def restorable(self) -> bool:
        """True when every environment can be saved and restored mid-episode
        (`multihead.rl.env_state.restorable`)."""
        return all(env_state.restorable(env) for env in self.envs)

    def state(self) -> dict[str, Any]:
        """The driver for a checkpoint: environment steps, the current observations, the
        episodes in progress (return, length) and each environment's `snapshot` (None for
        one that cannot be restored)."""
        return {"env_steps": self.env_steps, "obs": self.obs, "returns": self._returns,
                "lengths": self._lengths, "envs": [env_state.snapshot(env) for env in self.envs]}

    def load_state(self, state: Mapping[str, Any]) -> bool:
        """Puts the driver back in `state`.

        Where every environment was saved and can be restored, the environments continue
        their episodes exactly. Otherwise each restarts with a new episode from
        `reset(seed=...)`, seeds drawn from `SeedSequence([seed, env_steps])` (so a resumed
        run is still reproducible), and the episodes in progress are dropped unrecorded.

        Returns:
            True when the environments were restored exactly, False when they restarted.
        """
        if len(state["envs"]) != len(self.envs):
            raise ValueError(f"the checkpoint has {len(state['envs'])} environments, the run "
                             f"{len(self.envs)}; keep num_envs of the run")
        self.env_steps = int(state["env_steps"])
        exact = self.restorable and all(s is not None for s in state["envs"])
        if exact:
            for env, saved in zip(self.envs, state["envs"]):
                env_state.restore(env, saved)
            self.obs = np.array(state["obs"], np.float32)
            self._returns = np.array(state["returns"], np.float64)
            self._lengths = np.array(state["lengths"], np.int64)
            return True
        seeds = np.random.SeedSequence([self.seed, self.env_steps]).generate_state(len(self.envs))
        self.obs = np.stack([env.reset(seed=int(s))[0]
                             for env, s in zip(self.envs, seeds)]).astype(np.float32)
        self._returns = np.zeros(len(self.envs))
        self._lengths = np.zeros(len(self.envs), np.int64)
        return False

    def close(self) -> None:
        """Closes every environment."""
        for env in self.envs:
            env.close()
