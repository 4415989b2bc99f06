"""Saving and restoring a gymnasium environment mid-episode, where that is possible.

A classic-control environment (CartPole, Pendulum, Acrobot, MountainCar) is its physical
state, a few counters and its `np_random` generator; the wrappers `gymnasium.make` adds hold
step counters and checker flags. `snapshot(env)` returns those values when every layer of the
environment is one of the known ones below (`restorable`), and None otherwise: an unknown
layer may hold state that a restore would miss, so such an environment is never restored,
it is restarted with a new episode (see `Driver.load_state`).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

#: Attributes that make up the mutable state of each known environment class, by the class's
#: module and name (the classes are not imported: gymnasium is optional).
_ENV_FIELDS: dict[tuple[str, str], tuple[str, ...]] = {
    ("gymnasium.envs.classic_control.cartpole", "CartPoleEnv"): ("state", "steps_beyond_terminated"),
    ("gymnasium.envs.classic_control.pendulum", "PendulumEnv"): ("state", "last_u"),
    ("gymnasium.envs.classic_control.acrobot", "AcrobotEnv"): ("state",),
    ("gymnasium.envs.classic_control.mountain_car", "MountainCarEnv"): ("state",),
    ("gymnasium.envs.classic_control.continuous_mountain_car", "Continuous_MountainCarEnv"): ("state",),
}

#: The same for the wrappers `gymnasium.make` adds.
_WRAPPER_FIELDS: dict[tuple[str, str], tuple[str, ...]] = {
    ("gymnasium.wrappers.common", "TimeLimit"): ("_elapsed_steps",),
    ("gymnasium.wrappers.common", "OrderEnforcing"): ("_has_reset",),
    ("gymnasium.wrappers.common", "PassiveEnvChecker"): ("checked_reset", "checked_step", "checked_render"),
}


def _key(obj: Any) -> tuple[str, str]:
    return type(obj).__module__, type(obj).__qualname__


def _layers(env: Any) -> list[Any]:
    """The wrappers of `env`, outermost first, then the environment itself."""
    layers = [env]
    while hasattr(layers[-1], "env") and layers[-1] is not getattr(layers[-1], "unwrapped", None):
        layers.append(layers[-1].env)
    return layers


def restorable(env: Any) -> bool:
    """True when every layer of `env` is a known environment or wrapper (its state is saved
    whole by `snapshot`)."""
    *wrappers, inner = _layers(env)
    return _key(inner) in _ENV_FIELDS and all(_key(w) in _WRAPPER_FIELDS for w in wrappers)


def snapshot(env: Any) -> dict[str, Any] | None:
    """The state of `env` (every layer's fields and the environment's generator state), or
    None when it is not `restorable`."""
    if not restorable(env):
        return None
    *wrappers, inner = _layers(env)
    layers = [{f: _copy(getattr(w, f)) for f in _WRAPPER_FIELDS[_key(w)]} for w in wrappers]
    fields = {f: _copy(getattr(inner, f, None)) for f in _ENV_FIELDS[_key(inner)]}
    return {"wrappers": layers, "env": fields, "np_random": inner.np_random.bit_generator.state}


def restore(env: Any, state: Mapping[str, Any]) -> None:
    """Puts `env` (built as the one `snapshot` saved) back in `state`.

    Raises:
        ValueError: `env` is not restorable or its layers differ from the saved ones.
    """
    if not restorable(env):
        raise ValueError(f"{env!r} cannot be restored (a layer of it is not a known environment or wrapper)")
    *wrappers, inner = _layers(env)
    if len(wrappers) != len(state["wrappers"]):
        raise ValueError(f"{env!r} has {len(wrappers)} wrappers, the saved environment "
                         f"{len(state['wrappers'])}")
    for wrapper, fields in zip(wrappers, state["wrappers"]):
        for name, value in fields.items():
            setattr(wrapper, name, _copy(value))
    for name, value in state["env"].items():
        setattr(inner, name, _copy(value))
    inner.np_random.bit_generator.state = dict(state["np_random"])


def _copy(value: Any) -> Any:
    return value.copy() if isinstance(value, np.ndarray) else value
