"""What the RL tasks (`dqn`, `actor_critic`, `ppo`, `td3`, `sac`) share between their config and their loop.

Config -> objects: environments of `env:`, checks of the task's heads, each
head's `Objective` from `model.heads` with the task's research loss. The run:
`RLRun` owns the trainer, the environment driver, the episode log and the
evaluations, takes train steps (NaN check; the step itself updates the target networks), and ends the
run with the final checkpoint and the metrics. Needs `pip install multihead[rl]`.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import Any, Callable, ClassVar, Mapping, NamedTuple, Sequence

import keras
import numpy as np

from multihead.training.keras_model import MultiHeadModel
from multihead.objectives.objective import HeadLoss, Objective
from multihead.training.trainer import StepResult
from multihead.experiments.build.builders import build_model, build_objectives, build_trainer
from multihead.experiments.config.rl_section import RL_TASKS, EnvConfig
from multihead.experiments.config.schema import ConfigError, ExperimentConfig
from multihead.experiments.run.guard import stop_if_interrupted
from multihead.io.checkpoints import CheckpointManager, save_checkpoint
from multihead.monitoring.progress import Progress
from multihead.rl.driver import Driver, EnvFactory, EpisodeLog, Evaluations, Policy
from multihead.rl.host_state import HostState, from_json, generator_state, set_generator_state, to_json
from multihead.rl.replay import ReplayBuffer
from multihead.rl.target_network import TargetNetwork

#: Evaluation episode `i` starts from `reset(seed=EVAL_SEED_OFFSET + config.seed + i)`: start
#: states apart from the training environments' and the same in every evaluation of a run.
EVAL_SEED_OFFSET = 10_000


class EnvSpec(NamedTuple):
    """A factory of fresh environments and what the model needs to know of them.

    Attributes:
        make: makes one environment.
        obs_shape: the shape of one observation.
        num_actions: the number of actions of a Discrete action space (0 for a Box).
        action_low, action_high: the bounds of a Box action space, one per dimension
            (empty for a Discrete one).
    """

    make: EnvFactory
    obs_shape: tuple[int, ...]
    num_actions: int
    action_low: tuple[float, ...] = ()
    action_high: tuple[float, ...] = ()


#: The action space each RL task needs ("Any": a Discrete one or a finite Box).
_ACTION_SPACES = {task: section.action_space for task, section in RL_TASKS.items()}


def env_factory(config: EnvConfig, task: str = "dqn") -> EnvSpec:
    """The environments of `config` for task `task`; raises `ConfigError` naming `env.*` keys."""
    try:
        import gymnasium
    except ImportError:
        raise ConfigError("env: the RL tasks need gymnasium: pip install 'multihead[rl]'") from None

    def make() -> Any:
        kwargs = dict(config.kwargs)
        if config.max_episode_steps is not None:
            kwargs["max_episode_steps"] = config.max_episode_steps
        return gymnasium.make(config.id, **kwargs)

    if ":" not in config.id and config.id not in gymnasium.registry:
        # Checked before gymnasium.make, which would look the name up as a module path.
        from multihead._checks import suggest

        raise ConfigError(f"env.id: {config.id!r} is not a registered gymnasium environment"
                          f"{suggest(config.id, gymnasium.registry)}")
    try:
        env = make()
    except gymnasium.error.Error as err:
        raise ConfigError(f"env.id: cannot make {config.id!r}: {str(err).splitlines()[0]}") from None
    except TypeError as err:
        raise ConfigError(f"env.kwargs: {str(err).splitlines()[0]}") from None
    try:
        space = _ACTION_SPACES[task]
        box = _finite_box(gymnasium, env.action_space)
        discrete = isinstance(env.action_space, gymnasium.spaces.Discrete)
        if space == "Any" and not (box or discrete):
            raise ConfigError(f"env.id: {config.id!r} has action space {env.action_space}; task "
                              f"{task} needs a Discrete one or a Box (one-dimensional, finite bounds)")
        if space != "Any" and ((space == "Box") != box or (not box and not discrete)):
            tasks = " and ".join(t for t, s in _ACTION_SPACES.items() if s == space)
            raise ConfigError(f"env.id: {config.id!r} has action space {env.action_space}; "
                              f"the {tasks} tasks need a {space} one"
                              f"{' (one-dimensional, finite bounds)' if space == 'Box' else ''}")
        shape = env.observation_space.shape
        if not isinstance(env.observation_space, gymnasium.spaces.Box) or shape is None:
            raise ConfigError(f"env.id: {config.id!r} has observation space {env.observation_space}; "
                              "a Box (array) observation is needed")
        obs_shape = tuple(int(d) for d in shape)
        if box:
            return EnvSpec(make, obs_shape, 0, tuple(float(v) for v in env.action_space.low),
                           tuple(float(v) for v in env.action_space.high))
        return EnvSpec(make, obs_shape, int(env.action_space.n))
    finally:
        env.close()


def _finite_box(gymnasium: Any, space: Any) -> bool:
    """Whether `space` is a one-dimensional Box with finite bounds."""
    return (isinstance(space, gymnasium.spaces.Box) and len(space.shape) == 1
            and bool(np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high))))


# -- config checks ------------------------------------------------------------------------


def check_tau(tau: float | None, every: int | None, key: str) -> None:
    """Raises `ConfigError` if a Polyak rate is outside (0, 1] or given with a sync period."""
    if tau is not None and not 0.0 < tau <= 1.0:
        raise ConfigError(f"{key}_tau: must satisfy 0 < tau <= 1, got {tau!r} (typical: 0.005)")
    if tau is not None and every is not None:
        raise ConfigError(f"{key}_every and {key}_tau: give one of them (hard sync period or Polyak rate)")


def _check_task_heads(config: ExperimentConfig, heads: Mapping[str, str]) -> None:
    """Raises `ConfigError` unless the model's heads are exactly `heads` (config key -> head)."""
    for name, head in config.model.heads.items():
        if head.metrics:
            raise ConfigError(f"model.heads.{name}.metrics: not used by task {config.task} (no labels "
                              "to compare with); remove it, evaluation reports episode returns")
    for key, head in heads.items():
        if head not in config.model.heads:
            raise ConfigError(f"{key}: the model has no head {head!r}; "
                              f"its heads are {list(config.model.heads)}")
    if len(set(heads.values())) != len(heads):
        raise ConfigError(f"{', '.join(heads)}: name a different head each, got {list(heads.values())}")
    extra = [h for h in config.model.heads if h not in heads.values()]
    if extra:
        raise ConfigError(f"model.heads.{extra[0]}: task {config.task} trains the heads "
                          f"{list(heads.values())} only ({', '.join(heads)}); remove the other heads")


def check_head_outputs(model: MultiHeadModel, head: str, units: int, what: str) -> None:
    """Raises `ConfigError` unless `model`'s head `head` outputs `units` values per example."""
    shape = model.heads[head].compute_output_shape(model.trunk.compute_output_shape(
        model.trunk.get_build_config()["input_shape"]))
    if tuple(shape[1:]) != (units,):
        raise ConfigError(
            f"model.heads.{head}.layers: the {what} head must output {units} value{'s' if units != 1 else ''} "
            "per example, "
            f"it outputs shape {tuple(shape[1:])}; make its last layer Dense(units={units})"
        )


def env_and_model(config: ExperimentConfig, heads: Mapping[str, str],
                  build: Callable[[EnvSpec], MultiHeadModel] | None = None,
                  ) -> tuple[EnvConfig, EnvSpec, MultiHeadModel]:
    """Seeds Keras, checks the task's heads, makes the environments and builds the model.

    Args:
        config: the experiment.
        heads: config key -> head the task trains, e.g. `{"dqn.head": "q"}`; the
            model must have exactly these heads.
        build: builds the model for the environments; None: `model:` as a supervised
            task builds it, on the observations.
    """
    keras.utils.set_random_seed(config.seed)
    _check_task_heads(config, heads)
    env_cfg = config.env or EnvConfig()
    spec = env_factory(env_cfg, config.task)
    if build is not None:
        return env_cfg, spec, build(spec)
    return env_cfg, spec, build_model(config, (None,) + spec.obs_shape)


def research_objectives(config: ExperimentConfig, make_losses: Callable[[], Mapping[str, HeadLoss]],
                        losses_set_by_task: Sequence[str] = ()) -> dict[str, Objective]:
    """Each head's `Objective` from `model.heads` (optimizer, weight, every,
    trains_trunk), with the task's research loss in place of the config's loss.

    The config's loss and optimizer names are checked first, so a bad name is a
    `ConfigError` naming its key before `make_losses` resolves it.

    Args:
        config: the experiment.
        make_losses: returns head -> research loss, for every head of the model.
        losses_set_by_task: heads whose config `loss` is not a Keras loss (the task
            sets it), so it is not checked.
    """
    heads = {h: dataclasses.replace(c, loss="mse") if h in losses_set_by_task else c
             for h, c in config.model.heads.items()}
    checked = build_objectives(dataclasses.replace(config, model=dataclasses.replace(config.model, heads=heads)))
    losses = make_losses()
    return {h: dataclasses.replace(checked[h], loss=losses[h]) for h in config.model.heads}


# -- the run ------------------------------------------------------------------------------


@dataclasses.dataclass
class RLTask:
    """What every RL task builds and validates in `prepare`, before anything is written.

    Attributes:
        config: the experiment.
        env: its `env:` section.
        env_spec: the environments.
        model: the online model.
        objectives: head -> objective with the task's research loss.
        targets: head -> the target network the task's losses read; the trainer runs
            each one's `update()` inside every train step, after the optimizers.
        trunk: `Trainer(trunk=...)`.
    """

    config: ExperimentConfig
    env: EnvConfig
    env_spec: EnvSpec
    model: MultiHeadModel
    objectives: dict[str, Objective]
    targets: dict[str, TargetNetwork]
    trunk: Any = "per_head"


@dataclasses.dataclass
class RLRunner:
    """Base of the RL runners: the `RLTask` that `prepare` built and validated; a subclass's
    `run(run_dir, verbose, resume, extra_callbacks)` trains for `train.steps` environment
    steps, or until a greedy evaluation reaches `env.stop_return`, writing events, periodic
    checkpoints (`checkpoint.every` environment steps) and the final checkpoint to `run_dir`
    (None writes nothing), and returns the metrics written to `metrics.json`. With `resume`
    it continues from the latest checkpoint in `run_dir` (`RLRun.start`)."""

    task: RLTask
    #: RL runs stop at a loop boundary (extra callbacks see every one) and resume; one device.
    resumable: ClassVar[bool] = True
    strategy: ClassVar[Any] = None

    def check(self) -> None:
        """Nothing left to check: `prepare` built the environments, model and objectives."""

    @property
    def model(self) -> MultiHeadModel:
        """The online model."""
        return self.task.model


class RLRun:
    """One run of an `RLTask`: trainer, driver, episode log, evaluations and checkpoints.

    A runner builds the run, then its own host state (replay buffer, generators), then calls
    `start`, which sets up the checkpoints and, on a resume, restores everything; each pass
    of its loop ends with `after_steps`.

    Args:
        task: the prepared task.
        run_dir: where events and checkpoints go; None writes nothing.
        verbose: print progress lines over environment steps.
        act: the greedy policy that evaluations run.
        num_envs: environments stepped side by side.
        env_seed: training environment `i` first starts from `reset(seed=env_seed + i)`.
        resume: continue from the latest checkpoint in `run_dir` (`start` restores it).
        callbacks: see each loop boundary (`on_step_end(env_steps, None)`); a `RunWatch`
            among them that received a signal stops the run there with a checkpoint.
    """

    def __init__(self, task: RLTask, run_dir: str | None, verbose: bool, act: Policy, num_envs: int,
                 env_seed: int, resume: bool = False, callbacks: Sequence[Any] = ()) -> None:
        cfg = task.config
        if resume and run_dir is None:
            raise ValueError("RLRun: resume needs the run_dir to resume")
        self.task = task
        self.run_dir = run_dir
        self.resume = resume
        self.verbose = verbose
        self.callbacks = list(callbacks)
        self.total = cfg.train.steps
        # The compiled train step updates the target networks after its optimizers apply.
        self.trainer = build_trainer(cfg, task.model, task.objectives, run_dir, trunk=task.trunk,
                                     strategy=None, write_config=not resume,
                                     target_networks=list(task.targets.values()))
        self.log = EpisodeLog(self.trainer.monitor, Progress(self.total) if verbose else None)
        self.evaluations = Evaluations(task.env_spec.make, act, task.env.eval_episodes,
                                       EVAL_SEED_OFFSET + cfg.seed, cfg.train.eval_every or self.total,
                                       self.total, task.env.stop_return, self.log)
        self.driver = Driver(task.env_spec.make, num_envs, env_seed, on_episode_end=self.log.finished)
        self.losses: dict[str, list[float]] = {h: [] for h in task.objectives}
        self.checkpoints: CheckpointManager | None = None
        self.restored_envs: bool | None = None
        self._start = time.perf_counter()

    def start(self, generators: Mapping[str, np.random.Generator] | None = None,
              replay: ReplayBuffer | None = None, records: dict[str, Any] | None = None) -> None:
        """Sets up the checkpoints of everything the next update depends on and, on a resume,
        restores the latest.

        Args:
            generators: name -> the runner's numpy generators (exploration, sampling, noise).
            replay: the replay buffer, or None (on-policy tasks).
            records: a dict of JSON-able values the runner reports (restored in place).

        Raises:
            ConfigError: nothing to resume from, a checkpoint past `train.steps`, or one that
                does not fit the run.
        """
        if self.run_dir is None:
            return
        generators, records = dict(generators or {}), records if records is not None else {}

        def save_loop() -> dict[str, str]:
            return {"loop": to_json({
                "driver": self.driver.state(), "log": self.log.state(),
                "evaluations": self.evaluations.state(),
                "losses": {h: v[-100:] for h, v in self.losses.items()},
                "generators": {n: generator_state(g) for n, g in generators.items()},
                "records": records})}

        def load_loop(saved: Mapping[str, Any]) -> None:
            loop = from_json(saved["loop"])
            self.restored_envs = self.driver.load_state(loop["driver"])
            self.log.load_state(loop["log"])
            self.evaluations.load_state(loop["evaluations"])
            for head, values in loop["losses"].items():
                self.losses[head] = [float(v) for v in values]
            for name, rng in generators.items():
                set_generator_state(rng, loop["generators"][name])
            records.clear()
            records.update(loop["records"])

        host = {"loop": HostState(save_loop, load_loop)}
        if replay is not None:
            host["replay"] = HostState(replay.state, replay.load_state)
        cfg = self.task.config
        self.checkpoints = CheckpointManager(
            os.path.join(self.run_dir, "checkpoints"), self.task.model, self.trainer,
            every=cfg.checkpoint.every, keep=cfg.checkpoint.keep,
            targets=dict(self.task.targets) or None, host=host, counter=lambda: self.driver.env_steps)
        if self.resume:
            self._restore()

    def _restore(self) -> None:
        assert self.checkpoints is not None and self.run_dir is not None
        latest = self.checkpoints.latest_checkpoint
        if latest is None:
            raise ConfigError(f"--resume: no checkpoint in {self.checkpoints.directory!r} to resume from")
        if self.checkpoints.step_of(latest) > self.total:
            raise ConfigError(f"train.steps: {self.total} (environment steps) is below the latest "
                              f"checkpoint's ({self.checkpoints.step_of(latest)}); raise train.steps")
        try:
            self.checkpoints.restore_latest()
        except ValueError as err:  # mismatch or unreadable: bad input, not a crash
            raise ConfigError(f"--resume: {err}") from None
        if self.verbose:
            print(f"resuming from {os.path.relpath(latest, self.run_dir)} (env step "
                  f"{self.driver.env_steps}, update {self.trainer.global_step})", file=sys.stderr)
        if not self.restored_envs:
            # Always said (not only when verbose): the resumed run is not the uninterrupted one.
            print(f"multihead: environment {self.task.env.id} cannot be restored mid-episode; "
                  "its environments restart with new episodes (the resume is not exact)",
                  file=sys.stderr)

    def checkpoint_now(self) -> str | None:
        """A checkpoint of the current state (the latest if it is of this env step already)."""
        if self.checkpoints is None:
            return None
        latest = self.checkpoints.latest_checkpoint
        if latest is None or self.checkpoints.step_of(latest) != self.driver.env_steps:
            latest = self.checkpoints.save()
        return latest

    @property
    def running(self) -> bool:
        """True while the environment-step budget is not used up and no evaluation reached
        `env.stop_return` (a resumed run that had stopped there stays stopped)."""
        return self.driver.env_steps < self.total and self.evaluations.solved_at is None

    def train(self, inputs: Any, targets: Any) -> StepResult:
        """One train step on `(inputs, targets)`; the step ends with one `update()` of each
        target network.

        Raises:
            FloatingPointError: a head's loss is not finite.
        """
        result = self.trainer.step((inputs, targets))
        self._record(result)
        return result

    def train_steps(self, iterator: Any, max_steps: int) -> list[StepResult]:
        """Up to `max_steps` train steps on `iterator`'s batches in one compiled call
        (`Trainer.run_steps`; logging steps are calls of their own), each as `train` records it.

        Raises:
            FloatingPointError: a head's loss is not finite (after the call's steps ran).
        """
        results = self.trainer.run_steps(iterator, max_steps)
        for result in results:
            self._record(result)
        return results

    def _record(self, result: StepResult) -> None:
        """Appends a step's losses to `losses`, after checking they are finite."""
        for head, loss in result.losses.items():
            if not np.isfinite(loss):
                raise FloatingPointError(
                    f"the loss of head {head!r} became {loss} at env step {self.driver.env_steps}")
            self.losses[head].append(loss)

    def after_steps(self) -> bool:
        """Ends a pass of the loop: shows progress, evaluates when due, checkpoints on the
        cadence, and stops here with a checkpoint if a `RunWatch` received a signal.

        Returns:
            True when an evaluation reached `env.stop_return` and the run stops.

        Raises:
            RunInterrupted: a signal was received (the checkpoint is written first).
        """
        env_steps = self.driver.env_steps
        self.log.stepped(env_steps, {h: v[-1] for h, v in self.losses.items() if v})
        solved = self.evaluations(env_steps)
        if self.checkpoints is not None:
            self.checkpoints.maybe_save(env_steps)
        for callback in self.callbacks:
            if hasattr(callback, "on_step_end"):
                callback.on_step_end(env_steps, None)
        try:
            stop_if_interrupted(self.callbacks, self.checkpoint_now, env_steps)
        except BaseException:
            self.driver.close()
            self.trainer.close()
            raise
        return solved

    def finish(self) -> dict[str, Any]:
        """Writes a resumable checkpoint of the last step (if not written yet), closes the
        environments, writes the final checkpoint (model, optimizers, target networks) and
        closes the trainer.

        Returns:
            The metrics every RL task writes: environment steps, episodes, updates,
            target updates and syncs, every evaluation, wall time.
        """
        wall = time.perf_counter() - self._start
        env_steps = self.driver.env_steps
        self.checkpoint_now()  # the end of the run is always a resumable checkpoint
        self.driver.close()
        self.log.close(env_steps)
        if self.run_dir is not None:
            save_checkpoint(os.path.join(self.run_dir, "checkpoints", "final"), self.task.model,
                            trainer=self.trainer, targets=dict(self.task.targets) or None)
        self.trainer.close()
        target = next(iter(self.task.targets.values()), None)  # a task has at most one
        evals = self.evaluations
        return {
            "task": self.task.config.task,
            "env": self.task.env.id,
            "env_steps": env_steps,
            "episodes": self.log.count,
            "updates": self.trainer.global_step,
            "target_updates": int(target.counter.numpy()) if target is not None else None,
            "target_syncs": (target.num_syncs if target is not None and target.every and target.tau is None
                             else None),
            "eval_mean_return": evals.last_mean_return,
            "eval_episodes": evals.episodes,
            "evals": [{"env_steps": s, "mean_return": r} for s, r in evals.history],
            "solved_at_env_steps": evals.solved_at,
            "wall_time_s": wall,
        }
