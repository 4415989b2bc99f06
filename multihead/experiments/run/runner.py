"""Tasks run by `multihead train`, selected by the config's `task:` key.

A task module has `prepare(config) -> Runner`: it builds and validates every object (so bad
input fails before anything is written) and returns a `Runner`. `multihead train` then calls
`check()` and `run(...)` on it, the same way for every task; what a task can do beyond
training (stop at a step boundary, resume) its runner says in `resumable`, not in its
signature. See `multihead.experiments.run.guard` for the run-directory rules.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol, Sequence

from multihead.experiments.config.rl_section import RL_TASKS
from multihead.experiments.config.schema import ExperimentConfig

#: `task:` value -> the module whose `prepare(config)` builds its runner (imported when used:
#: an RL task needs its environments' packages, a supervised one does not); the RL tasks'
#: come from their config sections (`RL_TASKS`).
TASKS = {"supervised": "multihead.experiments.run.supervised",
         **{task: section.runner for task, section in RL_TASKS.items()}}


class Runner(Protocol):
    """A prepared task: everything built and validated, nothing written yet.

    Attributes:
        resumable: True when `run` calls `extra_callbacks` at every step boundary (so a
            SIGINT/SIGTERM stops it there, with a checkpoint) and `resume=True` continues the
            run from its latest checkpoint. False: `run` takes neither (it refuses them).
        strategy: the `tf.distribute` strategy the run trains under, or None.
    """

    resumable: bool
    strategy: Any

    def check(self) -> None:
        """Checks what `prepare` could not without running anything: raises `ConfigError`
        (or a `ValueError`/`TypeError` of the library) before the run writes anything."""

    def run(self, run_dir: str, verbose: bool = True, resume: bool = False,
            extra_callbacks: Sequence[Any] = ()) -> dict[str, Any]:
        """Trains and writes the run in `run_dir`; returns the metrics of `metrics.json`."""


def prepare(config: ExperimentConfig) -> Runner:
    """The runner of `config.task`, with everything built and validated."""
    module = importlib.import_module(TASKS[config.task])
    return module.prepare(config)
