"""Running an experiment in a run directory, fresh or resumed: what `multihead train` does,
as one library call.

`run_experiment` loads and checks the config, builds every object, creates (or checks, for
a resume) the run directory, takes its lock and runs the task under the run-directory rules
of `multihead.experiments.run.guard`: `status.json`, a stop at a step boundary on
SIGINT/SIGTERM, nothing deleted that a step wrote. Bad input raises (`ConfigError`,
`RunInputError`) before anything is written; a run that fails or is interrupted returns a
`RunResult` whose `exit_code` and one-line `message` say so.

Example:
    >>> result = mh.run_experiment("experiments/quickstart.yaml", run_dir="runs/q")  # doctest: +SKIP
    >>> result.exit_code, result.metrics["steps"]                                   # doctest: +SKIP
    >>> mh.run_experiment("experiments/quickstart.yaml", resume="runs/q",              # doctest: +SKIP
    ...                overrides=["train.steps=2000"])
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
from typing import Any, Sequence

from multihead.experiments.config.schema import ConfigError, ExperimentConfig, load_config, to_dict
from multihead.experiments.run.directory import default_run_dir
from multihead.experiments.run.resume import RunInputError, check_resume, latest_checkpoint

#: What messages call a config given as an object rather than a file.
_OBJECT_SOURCE = "CONFIG"


@dataclasses.dataclass(frozen=True)
class RunResult:
    """How a run ended.

    Attributes:
        status: `completed`, `failed` or `interrupted` (as `status.json` says).
        exit_code: 0, 1 (failed) or 128 + the signal (interrupted), as the CLI exits.
        run_dir: the run directory (None when a fresh run failed before its first step and
            its empty directory was removed).
        metrics: what `metrics.json` holds, for a completed run; else None.
        message: one line saying what happened to a failed or interrupted run; else None.
    """

    status: str
    exit_code: int
    run_dir: str | None
    metrics: dict[str, Any] | None = None
    message: str | None = None


def load_experiment(path: str, overrides: Sequence[str] = (), allow_import: Sequence[str] = (),
                    only_head: str | None = None, inside: str | None = None) -> ExperimentConfig:
    """The validated config of `path` with `overrides`, its `train.only_heads` alone; with
    `only_head` (a head, or heads `y1,y3`), those heads alone (one: its single-task baseline);
    with `inside`, `path` is read through the boundary of that directory (a sweep's trial:
    regular file, no symlink out, no FIFO).

    Raises:
        ConfigError: one line naming the file and the key.
    """
    from multihead.experiments.run.single_task import head_list, only_heads, selected_heads

    config = selected_heads(load_config(path, overrides, allow_import=allow_import, inside=inside),
                            path, allow_import)
    if only_head:
        config = only_heads(config, head_list(only_head), source=f"{path}: --only-head",
                            allow_import=allow_import)
    return config


def prepare_runner(config: ExperimentConfig, source: str) -> Any:
    """The task runner with every object built and checked (`runner.check()`), so bad input
    fails before anything is written.

    Raises:
        ConfigError: one line starting with `source`, for any rule the build or check finds.
    """
    from multihead.experiments.run import runner as tasks

    try:
        runner = tasks.prepare(config)
        runner.check()  # validate runs what train would run first
        return runner
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as err:
        # A rule no check states yet: still one line, exit 2, nothing written.
        line = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise ConfigError(f"{source}: cannot build the run from this config: "
                          f"{type(err).__name__}: {line}") from None


def print_parameters(runner: Any, stream: Any) -> None:
    """The parameters of the trunk and of each head of the runner's model, if it has one."""
    counts = getattr(getattr(runner, "model", None), "parameter_counts", None)
    if counts is not None and runner.model.built:
        print(f"parameters:\n{counts().table()}", file=stream)
        config = getattr(runner, "config", None)
        heads = config.model.heads if isinstance(config, ExperimentConfig) else {}
        blocks = runner.model.blocks_table({h: head.trains_trunk for h, head in heads.items()})
        if blocks is not None:  # trunk taps: which blocks each head trains
            print(f"trunk blocks:\n{blocks}", file=stream)


def run_experiment(config: str | os.PathLike[str] | ExperimentConfig, *,
                   run_dir: str | None = None, resume: str | None = None,
                   overrides: Sequence[str] = (), allow_import: Sequence[str] = (),
                   only_head: str | None = None, quiet: bool = False,
                   config_inside: str | None = None) -> RunResult:
    """Trains `config` in a new run directory, or continues the run in `resume`.

    Args:
        config: an experiment YAML file, or a validated `ExperimentConfig`.
        run_dir: where a new run goes (new or empty; default `runs/<config>-<time>`). With
            `resume`, it may only name the same directory.
        resume: a run directory to continue in place from its latest checkpoint.
        overrides: `key=value` strings applied to a config file (not to an object).
        allow_import: modules the config may import (`env.id`, `data.function`).
        only_head: train that head alone: the single-task baseline.
        quiet: no progress output.
        config_inside: read the config file through the boundary of this directory (a
            sweep's trial reads its sweep's config.yaml so).

    Returns:
        The `RunResult`; a failed or interrupted run keeps its directory.

    Raises:
        ConfigError: the config, an override or the build is bad (nothing written).
        RunInputError: the run directory is in use, not empty, or not resumable as asked.
    """
    if isinstance(config, ExperimentConfig):
        if overrides or only_head:
            raise RunInputError("overrides and only_head apply to a config file; apply them to "
                                "the ExperimentConfig object instead")
        source = _OBJECT_SOURCE
        from multihead.experiments.run.single_task import selected_heads

        config = selected_heads(config, source, allow_import)
    else:
        source = os.fspath(config)
        config = load_experiment(source, overrides, allow_import, only_head, inside=config_inside)
    runner = prepare_runner(config, source)
    run = _Run(config, runner, source, tuple(overrides), quiet)
    if resume:
        if run_dir and os.path.abspath(run_dir) != os.path.abspath(resume):
            raise RunInputError("--run-dir and --resume name different directories; --resume "
                                "RUN_DIR continues RUN_DIR in place")
        return run.resume(resume)
    return run.fresh(run_dir or default_run_dir(source if source != _OBJECT_SOURCE else "run"))


def _lock(run_dir: str) -> Any:
    from multihead.experiments.run.guard import RunLock, RunLocked, RunLockError

    try:
        return RunLock(run_dir)
    except (RunLocked, RunLockError) as err:
        raise RunInputError(str(err)) from None


def _write_config(run_dir: str, config: ExperimentConfig) -> None:
    from multihead._boundary import write_atomic
    from multihead.experiments.config.yaml12 import dump_yaml

    write_atomic(os.path.join(run_dir, "config.yaml"), dump_yaml(to_dict(config)))


def signal_name(signum: int) -> str:
    """`SIGINT` for 2."""
    import signal

    return signal.Signals(signum).name


@dataclasses.dataclass
class _Run:
    """One `run_experiment` call: the config, its runner and how messages name it."""

    config: ExperimentConfig
    runner: Any
    source: str
    overrides: tuple[str, ...]
    quiet: bool

    def fresh(self, run_dir: str) -> RunResult:
        from multihead.experiments.run.guard import LOCK_FILE

        if os.path.lexists(run_dir) and not os.path.isdir(run_dir):
            raise RunInputError(f"--run-dir {run_dir!r} exists and is not a directory; choose "
                                "another path")
        if os.path.exists(run_dir) and os.listdir(run_dir):
            raise RunInputError(f"--run-dir {run_dir!r} exists and is not empty; choose another "
                                "directory")
        try:
            os.makedirs(run_dir, exist_ok=True)
        except OSError as err:
            raise RunInputError(f"--run-dir {run_dir!r}: cannot create it ({err.strerror})") from None
        with _lock(run_dir):
            if set(os.listdir(run_dir)) - {LOCK_FILE}:  # another process wrote it meanwhile
                raise RunInputError(f"--run-dir {run_dir!r} exists and is not empty; choose "
                                    "another directory")
            _write_config(run_dir, self.config)
            if not self.quiet:
                print(f"run directory: {run_dir}", file=sys.stderr)
                print_parameters(self.runner, sys.stderr)
            return self._guarded(run_dir, resume=False)

    def resume(self, run_dir: str) -> RunResult:
        check_resume(run_dir, self.config, self.runner, self.source)  # reads only
        with _lock(run_dir):
            if not self.quiet:
                print(f"resuming {run_dir}", file=sys.stderr)
            return self._guarded(run_dir, resume=True)

    def _guarded(self, run_dir: str, resume: bool) -> RunResult:
        """Runs the runner in `run_dir` (locked by the caller) under the run-directory rules:
        status.json, a stop at a step boundary on SIGINT/SIGTERM, and nothing deleted that a
        step wrote."""
        import traceback

        from multihead.experiments.run.guard import (
            RunInterrupted, RunWatch, is_disk_full, write_status)

        takes = self.runner.resumable  # it stops at a step boundary and can be resumed
        watch = RunWatch(immediate=not takes, run_dir=run_dir)
        kwargs: dict[str, Any] = {"extra_callbacks": [watch]} if takes else {}
        if resume:
            kwargs["resume"] = True
        before = _status_bytes(run_dir) if resume else None
        hint = f"multihead train {self.source} --resume {run_dir}"
        try:
            with watch:  # the handlers are in place once the status says running
                write_status(run_dir, "running", step=watch.step)
                metrics = self.runner.run(run_dir, verbose=not self.quiet, **kwargs)
                if resume:
                    _write_config(run_dir, self.config)  # train.steps may have grown
                self._log_hparams(run_dir, metrics)
                _write_metrics(run_dir, metrics)
        except RunInterrupted as stop:
            step = stop.step if stop.step is not None else watch.step
            checkpoint = stop.checkpoint or latest_checkpoint(os.path.join(run_dir, "checkpoints"))
            name = signal_name(stop.signum)
            write_status(run_dir, "interrupted", step=step, checkpoint=checkpoint,
                         error=f"stopped by {name}", signal=name, exit_code=128 + stop.signum)
            saved = f"checkpoint {os.path.relpath(checkpoint, run_dir)}" if checkpoint else \
                "no checkpoint"
            how = f"resume with: {hint}" if checkpoint and takes else "start it again to rerun"
            return RunResult("interrupted", 128 + stop.signum, run_dir, message=(
                f"interrupted by {name} at step {step}; kept {run_dir} ({saved}); {how}"))
        except (ConfigError, RunInputError):
            if not resume and _disposable(run_dir, watch):
                shutil.rmtree(run_dir, ignore_errors=True)
            elif resume and watch.step is None and before is not None:
                _restore(run_dir, before)  # a refused resume leaves the status as it was
            else:
                write_status(run_dir, "failed", step=watch.step, error="bad input")
            raise
        except Exception as err:  # noqa: BLE001 - any failure: keep the run, say what happened
            text = str(err).strip()
            line = f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"
            if is_disk_full(err):
                line = f"disk full ({line})"
            if not resume and _disposable(run_dir, watch) and not is_disk_full(err):
                shutil.rmtree(run_dir, ignore_errors=True)
                return RunResult("failed", 1, None,
                                 message=f"error: the run failed before its first step: {line}")
            checkpoint = latest_checkpoint(os.path.join(run_dir, "checkpoints"))
            written = write_status(run_dir, "failed", step=watch.step, checkpoint=checkpoint,
                                   error=line, traceback=traceback.format_exc())
            kept = f"kept {run_dir}" + (" (status.json)" if written else " (status.json not written)")
            how = f"; resume with: {hint}" if checkpoint and takes else ""
            return RunResult("failed", 1, run_dir, message=(
                f"error: run failed at step {watch.step}: {line}; {kept}{how}"))
        write_status(run_dir, "completed", step=metrics.get("steps", watch.step),
                     checkpoint=_default_checkpoint(run_dir),
                     stopped=metrics.get("stopped"), stopped_heads=_stopped_heads(metrics))
        return RunResult("completed", 0, run_dir, metrics=metrics)

    def _log_hparams(self, run_dir: str, metrics: dict[str, Any]) -> None:
        """The run's hyperparameters (with its overrides) and final metrics for the HParams
        dashboard."""
        from multihead.experiments.run.hparams import log_run_hparams

        log_run_hparams(run_dir, self.config, self.runner, metrics, self.overrides)


def _status_bytes(run_dir: str) -> bytes | None:
    """The bytes of the run's `status.json` (checked by `check_resume`), or None."""
    from multihead._boundary import read_bytes
    from multihead.experiments.run.guard import STATUS_FILE

    try:
        return read_bytes(run_dir, STATUS_FILE, limit=1 << 20)
    except ValueError:
        return None


def _restore(run_dir: str, status: bytes) -> None:
    from multihead._boundary import write_atomic
    from multihead.experiments.run.guard import STATUS_FILE

    write_atomic(os.path.join(run_dir, STATUS_FILE), status)


def _write_metrics(run_dir: str, metrics: dict[str, Any]) -> None:
    from multihead._boundary import write_atomic

    write_atomic(os.path.join(run_dir, "metrics.json"), json.dumps(metrics, indent=2) + "\n")


def _disposable(run_dir: str, watch: Any) -> bool:
    """True when a fresh run wrote nothing worth keeping: no step done (as far as the
    runner reports steps) and no checkpoint, or nothing but its setup files."""
    from multihead.experiments.run.guard import LOCK_FILE, STATUS_FILE

    setup = {"config.yaml", LOCK_FILE, STATUS_FILE, "inputs.json"}
    if set(os.listdir(run_dir)) <= setup:
        return True
    ckpt_dir = os.path.join(run_dir, "checkpoints")
    return watch.tracks_steps and watch.step is None and \
        not (os.path.isdir(ckpt_dir) and os.listdir(ckpt_dir))


def _stopped_heads(metrics: dict[str, Any]) -> dict[str, Any] | None:
    """The heads per-head early stopping froze, `{head: {"step", "reason"}}`, or None."""
    watches = metrics.get("head_early_stopping")
    if not watches:
        return None
    return {h: {"step": w["stopped_step"], "reason": w["reason"]}
            for h, w in watches.items() if w["stopped_step"] is not None}


def _default_checkpoint(run_dir: str) -> str | None:
    """The checkpoint `predict`, `export` and `load_run` restore by default (`final`, else
    the newest periodic one), so `status.json` names the same one they print."""
    from multihead.experiments.run.load import run_checkpoint

    try:
        return run_checkpoint(run_dir)
    except ConfigError:
        return None
