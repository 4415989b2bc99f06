"""Every task's runner answers the one `Runner` protocol `multihead train` calls: the same
`run` parameters, `resumable` saying what it supports, refusals for what it does not."""

from __future__ import annotations

import dataclasses
import importlib
import inspect

import pytest

from multihead.experiments.config.schema import ExperimentConfig
from multihead.experiments.run.runner import TASKS, Runner

RUNNER_CLASSES = {"supervised": "SupervisedRunner", "dqn": "DQNRunner", "actor_critic": "ActorCriticRunner",
                  "ppo": "PPORunner",
                  "td3": "ContinuousRunner", "sac": "ContinuousRunner"}


def test_every_task_of_the_config_schema_has_a_runner_module():
    field = next(f for f in dataclasses.fields(ExperimentConfig) if f.name == "task")
    assert sorted(field.metadata["choices"]) == sorted(TASKS) == sorted(RUNNER_CLASSES)


@pytest.mark.parametrize("task", sorted(RUNNER_CLASSES))
def test_each_runner_has_the_protocols_run_parameters(task):
    cls = getattr(importlib.import_module(TASKS[task]), RUNNER_CLASSES[task])
    expected = inspect.signature(Runner.run).parameters
    got = inspect.signature(cls.run).parameters
    assert list(got) == list(expected)
    assert [p.default for p in got.values()] == [p.default for p in expected.values()]
    assert isinstance(cls.resumable, bool) and callable(cls.check)
    assert cls.resumable  # every task stops at a step boundary and resumes
