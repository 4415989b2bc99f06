"""`ReplayBuffer`: a fixed-size ring buffer of transitions with seeded uniform sampling.

`state()` / `load_state()` are its checkpoint: the filled rows of each array (views, written
by `HostState` without a copy), the write position and the sampling generator's state.
"""

from __future__ import annotations

from typing import Mapping, NamedTuple

import numpy as np

from multihead._checks import check_int
from multihead.rl.host_state import from_json, generator_state, set_generator_state, to_json


class Transitions(NamedTuple):
    """A batch of transitions, one row per transition.

    Attributes:
        obs: observations `s`, shape `(n, *obs_shape)`.
        action: actions `a`, shape `(n, *action_shape)`: `(n,)` discrete, `(n, d)` continuous.
        reward: rewards `r`, shape `(n,)`.
        next_obs: observations `s'` after the action (the final observation if the
            episode ended there), shape `(n, *obs_shape)`.
        terminated: 1.0 where `s'` is terminal (no bootstrap), else 0.0; a
            time-limit truncation is not terminal, shape `(n,)`.
    """

    obs: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    next_obs: np.ndarray
    terminated: np.ndarray


class ReplayBuffer:
    """Keeps the last `capacity` transitions and samples minibatches uniformly.

    Args:
        capacity: number of transitions kept (older ones are overwritten).
        obs_shape: shape of one observation.
        seed: seed of the buffer's own random generator (no global RNG is used).
        obs_dtype: dtype of stored observations.
        action_shape: shape of one action: `()` for a discrete action, `(d,)` for a
            continuous one.
        action_dtype: dtype of stored actions (`"int64"` discrete, `"float32"` continuous).
    """

    def __init__(self, capacity: int, obs_shape: tuple[int, ...], seed: int | None = 0,
                 obs_dtype: str = "float32", action_shape: tuple[int, ...] = (),
                 action_dtype: str = "int64") -> None:
        capacity = check_int(capacity, "ReplayBuffer.capacity", minimum=1)
        self.capacity = capacity
        self._obs = np.zeros((capacity,) + tuple(obs_shape), obs_dtype)
        self._next_obs = np.zeros_like(self._obs)
        self._action = np.zeros((capacity,) + tuple(action_shape), action_dtype)
        self._reward = np.zeros((capacity,), np.float32)
        self._terminated = np.zeros((capacity,), np.float32)
        self._next = 0
        self._size = 0
        self._rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return self._size

    def add(self, obs: np.ndarray, action: int | np.ndarray, reward: float, next_obs: np.ndarray,
            terminated: bool) -> None:
        """Stores one transition, overwriting the oldest when full."""
        i = self._next
        self._obs[i], self._action[i], self._reward[i] = obs, action, reward
        self._next_obs[i], self._terminated[i] = next_obs, float(terminated)
        self._next = (i + 1) % self.capacity
        self._size = min(self._size + 1, self.capacity)

    def sample(self, batch_size: int) -> Transitions:
        """`batch_size` transitions drawn uniformly with replacement."""
        if self._size == 0:
            raise ValueError("ReplayBuffer.sample: the buffer is empty; add transitions first")
        idx = self._rng.integers(0, self._size, size=batch_size)
        return Transitions(self._obs[idx], self._action[idx], self._reward[idx],
                           self._next_obs[idx], self._terminated[idx])

    def state(self) -> dict[str, np.ndarray | str]:
        """The buffer as a checkpoint holds it: the filled rows of each array (views of the
        storage, `[:len(self)]`: below the write position, or all when full) and
        `position`, JSON of the write position, the size and the generator state."""
        n = self._size
        return {"obs": self._obs[:n], "next_obs": self._next_obs[:n], "action": self._action[:n],
                "reward": self._reward[:n], "terminated": self._terminated[:n],
                "position": to_json({"next": self._next, "size": n, "capacity": self.capacity,
                                     "rng": generator_state(self._rng)})}

    def load_state(self, saved: Mapping[str, np.ndarray | str]) -> None:
        """Puts the buffer back in the state `state()` returned.

        Raises:
            ValueError: the saved buffer has another capacity or other shapes of rows.
        """
        position = from_json(saved["position"])
        if position["capacity"] != self.capacity:
            raise ValueError(f"the checkpoint's replay buffer has capacity {position['capacity']}, "
                             f"this one {self.capacity}; keep the buffer size of the run")
        n = position["size"]
        for name, storage in (("obs", self._obs), ("next_obs", self._next_obs), ("action", self._action),
                              ("reward", self._reward), ("terminated", self._terminated)):
            rows = np.asarray(saved[name])
            if rows.shape != (n,) + storage.shape[1:]:
                raise ValueError(f"the checkpoint's replay {name} has shape {rows.shape}, this "
                                 f"buffer's rows {storage.shape[1:]}")
            storage[:n] = rows
        self._next, self._size = position["next"], n
        set_generator_state(self._rng, position["rng"])

    @staticmethod
    def as_targets(batch: Transitions) -> Mapping[str, np.ndarray]:
        """The batch's targets dict for a research loss (everything but `obs`)."""
        return {"action": batch.action, "reward": batch.reward, "next_obs": batch.next_obs,
                "terminated": batch.terminated}
