"""Tasks run by `multihead train`, selected by the config's `task:` key.

A task module has `prepare(config) -> runner`: it builds and validates every
object (so bad input fails before anything is written) and returns an object
whose `run(run_dir, verbose) -> metrics dict` trains and writes the run. A runner whose
`run` takes `extra_callbacks` (and `resume`) lets `multihead train` stop it at a step
boundary on SIGINT/SIGTERM with a checkpoint (and resume it); see
`multihead.experiments.run.guard`.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol

from multihead.experiments.config.schema import ExperimentConfig


class Runner(Protocol):
    def run(self, run_dir: str, verbose: bool = True) -> dict[str, Any]: ...


def prepare(config: ExperimentConfig) -> Runner:
    """The runner of `config.task`, with everything built and validated."""
    module = importlib.import_module(f"multihead.experiments.run.{config.task}")
    return module.prepare(config)
