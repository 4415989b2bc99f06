"""Sweeps: many `multihead train` runs from one config, in parallel, resumable.

A sweep is a set of trials; a trial is a list of config overrides (`KEY=VALUE`, as
`--set`). Trials come from axes given on the command line (`--grid KEY=V1,V2`) or in the
config's `sweep:` section:

```yaml
sweep:
  grid:                         # every combination
    train.trunk.aggregator: [sum, pcgrad]
    seed: [0, 1, 2]
  zip:                          # paired axes: stepped together (same lengths)
    model.heads.y1.optimizer.config.learning_rate: [1.0e-3, 1.0e-2]
    model.heads.y2.optimizer.config.learning_rate: [1.0e-3, 1.0e-2]
  random:                       # `count` draws with numpy's generator seeded by `seed`
    count: 4
    seed: 0
    axes:
      train.batch_size: [32, 64]                          # a choice
      model.heads.y1.weight: {uniform: [0.5, 2.0]}
      model.heads.y2.optimizer.config.learning_rate: {loguniform: [1.0e-4, 1.0e-2]}
      model.trunk.mlp.units: {choice: [[16], [32, 32]]}
      train.steps: {int: [100, 200]}                      # inclusive
```

The trials are the product grid x zip x random draws, numbered `t000`, `t001`, ... in that
order. The sweep directory holds `config.yaml` (the config with `--set` applied and the
`sweep:` section removed), `sweep.json` (the index: each trial's id, overrides, status,
error and final metrics), `trials/<id>/` (each a normal run directory) and `logs/<id>.log`
(each trial's output).

A sweep directory is a boundary (`multihead._boundary`): `config.yaml`, `sweep.json`,
`logs/<id>.log` and `trials/<id>` are read and written as regular files and directories
inside it, by the sweep and by each trial (`train --config-inside`), never through a
symlink and never opening a FIFO; `check_sweep_dir` refuses a malformed entry with one line
before a resume starts anything.

Thread pools: `--jobs N` trials run at once, each a process whose TensorFlow intra- and
inter-op pools have `max(1, cores // N)` threads (`cores`: the CPUs this process may run
on), so N trials together use the cores once rather than N times over.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from typing import Any, Mapping, Sequence, TextIO

import yaml

from multihead._boundary import (
    BoundaryError,
    expect_kind,
    inside,
    open_append,
    read_json,
    read_tail,
    read_text,
    write_atomic,
)
from multihead._checks import suggest
from multihead.experiments.sweep.index import INDEX, TRIALS
from multihead.monitoring.metric_key import FORMS, MEAN_LOSS, MetricKey
from multihead.experiments.config.schema import ConfigError, apply_override, from_dict, parse_yaml
from multihead.experiments.config.yaml12 import MAX_BYTES
from multihead.experiments.config.sweep_section import (
    DISTRIBUTIONS,
    Distribution,
    SweepSpec,
    distribution,
    sweep_spec,
)

BASE_CONFIG = "config.yaml"
LOGS = "logs"
#: Keys of `metrics.json` that are measurements of time, not results (`segments` holds each
#: segment's wall time).
TIMING_KEYS = ("wall_time_s", "steps_per_s", "segments")


# -- axes and trials -------------------------------------------------------------------


def _split_values(text: str) -> list[str]:
    """`a,[1,2],{x: 1}` -> `['a', '[1,2]', '{x: 1}']`: commas inside brackets stay."""
    parts, depth, current = [], 0, ""
    for char in text:
        if char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [p.strip() for p in parts]


def parse_grid_arg(text: str, flag: str = "--grid") -> tuple[str, list[Any]]:
    """`KEY=V1,V2,...` -> (KEY, [V1, V2, ...]), each value parsed as YAML."""
    key, sep, values = text.partition("=")
    if not sep or not key.strip() or not values.strip():
        raise ConfigError(f"{flag} {text!r}: expected KEY.PATH=VALUE1,VALUE2,...")
    parsed = [parse_yaml(v, source=f"{flag} {text!r}") for v in _split_values(values)]
    if any(v == "" for v in _split_values(values)):
        raise ConfigError(f"{flag} {text!r}: an empty value; separate values with single commas")
    return key.strip(), parsed


def parse_sample_arg(text: str) -> tuple[str, Distribution]:
    """`KEY=loguniform:LOW:HIGH` (or `uniform:`, `int:`, `choice:A,B`) -> (KEY, Distribution)."""
    key, sep, spec = text.partition("=")
    kind, colon, rest = spec.partition(":")
    if not sep or not key.strip() or not colon or kind not in DISTRIBUTIONS:
        raise ConfigError(f"--sample {text!r}: expected KEY.PATH=KIND:..., KIND one of "
                          f"{', '.join(DISTRIBUTIONS)} (e.g. lr=loguniform:1e-4:1e-1, b=choice:32,64)")
    if kind == "choice":
        values = [parse_yaml(v, source=f"--sample {text!r}") for v in _split_values(rest)]
    else:
        values = [parse_yaml(v, source=f"--sample {text!r}") for v in rest.split(":")]
    return key.strip(), distribution({kind: values}, f"--sample {text!r}")


def trial_overrides(spec: SweepSpec) -> list[dict[str, Any]]:
    """Every trial's overrides: grid product x zip rows x random draws, in that order."""
    import numpy as np

    grid = [dict(zip(spec.grid, values)) for values in itertools.product(*spec.grid.values())]
    rows = len(next(iter(spec.zip.values()))) if spec.zip else 1
    zipped = [{k: v[i] for k, v in spec.zip.items()} for i in range(rows)]
    rng = np.random.default_rng(spec.seed)
    draws = ([{k: d.sample(rng) for k, d in spec.random.items()} for _ in range(spec.count)]
             if spec.random else [{}])
    return [{**g, **z, **r} for g in grid for z in zipped for r in draws]


def format_value(value: Any) -> str:
    """An override value as `--set` reads it back (flow YAML; `repr` keeps floats exact)."""
    if isinstance(value, float):
        return repr(value)
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("\n...").strip()


def as_sets(overrides: Mapping[str, Any]) -> list[str]:
    return [f"{key}={format_value(value)}" for key, value in overrides.items()]


def split_sweep_section(raw: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """(the config without `sweep:`, the `sweep:` section)."""
    rest = {k: v for k, v in raw.items() if k != "sweep"}
    return rest, raw.get("sweep")


# -- objective -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SweepObjective:
    """What "best" means: `eval/mean_loss` or `eval/<head>/<metric>` of the final evaluation."""

    name: str = MEAN_LOSS
    direction: str = "minimize"

    def value(self, evaluation: Mapping[str, Mapping[str, float]]) -> float | None:
        key = MetricKey.parse(self.name)
        if key.is_mean_loss:
            losses = [v["loss"] for v in evaluation.values() if "loss" in v]
            return math.fsum(losses) / len(losses) if losses else None
        value = evaluation.get(key.head, {}).get(key.metric)
        return None if value is None else float(value)

    def better(self, a: float, b: float) -> bool:
        return a < b if self.direction == "minimize" else a > b


def check_objective(name: str, direction: str, heads: Sequence[str]) -> SweepObjective:
    if direction not in ("minimize", "maximize"):
        raise ConfigError(f"--direction {direction!r}: use minimize or maximize")
    try:
        key = MetricKey.parse(name)
    except ValueError:
        raise ConfigError(f"--objective {name!r}: must be {FORMS}") from None
    if not key.is_mean_loss and key.head not in heads:
        raise ConfigError(f"--objective {name!r}: the model has no head {key.head!r}"
                          f"{suggest(key.head, heads)}; its heads are {list(heads)}")
    return SweepObjective(name, direction)


# -- the index -------------------------------------------------------------------------


def _write_json(path: str, tree: Any) -> None:
    write_atomic(path, json.dumps(tree, indent=2) + "\n")


# -- running trials --------------------------------------------------------------------


def cores() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def threads_per_trial(jobs: int, available: int | None = None) -> int:
    """The thread-pool size of each of `jobs` concurrent trials: `max(1, cores // jobs)`."""
    return max(1, (available or cores()) // jobs)


def thread_env(threads: int | None) -> dict[str, str]:
    """Environment variables that size a TensorFlow process's thread pools (None: TF's default)."""
    if threads is None:
        return {}
    n = str(threads)
    return {"TF_NUM_INTRAOP_THREADS": n, "TF_NUM_INTEROP_THREADS": n, "OMP_NUM_THREADS": n}


def trial_command(base_config: str, run_dir: str, overrides: Mapping[str, Any],
                  resume: bool, allow_import: Sequence[str] = (), imports: Sequence[str] = ()) -> list[str]:
    """The `multihead train` command line of one trial (`allow_import`, `imports`: the sweep's
    own `--allow-import` and `--import` modules, passed on). The trial reads `base_config` as a file inside the
    sweep directory (`--config-inside`): no symlink followed, no FIFO opened."""
    cmd = [sys.executable, "-m", "multihead", "train", base_config, "--quiet",
           "--config-inside", os.path.dirname(base_config) or "."]
    cmd += ["--resume", run_dir] if resume else ["--run-dir", run_dir]
    for module in allow_import:
        cmd += ["--allow-import", module]
    for module in imports:
        cmd += ["--import", module]
    for assignment in as_sets(overrides):
        cmd += ["--set", assignment]
    return cmd


def _package_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def trial_env(threads: int | None) -> dict[str, str]:
    """The environment of a trial process: this process's, the same `multihead` importable,
    and the thread pools sized."""
    env = dict(os.environ)
    root = _package_root()
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.update(thread_env(threads))
    return env


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """A trial dies with its sweep (Linux): a killed sweep leaves no orphan trial writing."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def last_error(log_text: str) -> str:
    """The line of a failed trial's output that says why: its `multihead: error:` line, else
    the last line that is not TensorFlow's own logging (the exception of a traceback)."""
    lines = [line.strip() for line in log_text.splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith("multihead: error: "):
            return line.removeprefix("multihead: error: ")
    import re

    noise = re.compile(r"^([IWEF]\d{4} |WARNING: All log messages|WARNING:absl)")
    useful = [line for line in lines if not noise.match(line)]
    return useful[-1] if useful else "the trial failed without output"


def resumable(run_dir: str) -> bool:
    """A run directory with a periodic checkpoint to continue from."""
    directory = os.path.join(run_dir, "checkpoints")
    return not os.path.islink(directory) and os.path.isfile(os.path.join(directory, "checkpoint"))


def trial_outcome(run_dir: str, returncode: int, log_text: str,
                  objective: SweepObjective) -> dict[str, Any]:
    """status, error, metrics and objective of a finished trial process."""
    metrics_path = os.path.join(run_dir, "metrics.json")
    if returncode != 0 or not os.path.isfile(metrics_path):
        return {"status": "failed", "error": last_error(log_text) if returncode != 0 else
                "the trial exited without writing metrics.json", "metrics": None, "objective": None}
    try:
        metrics = read_json(run_dir, "metrics.json")
        evaluation = metrics.get("eval") or {}
        if not isinstance(evaluation, dict) or not all(
                isinstance(v, dict) and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                            for x in v.values()) for v in evaluation.values()):
            raise BoundaryError(f"{metrics_path}: eval must map heads to {{metric: number}}")
    except BoundaryError as err:
        return {"status": "failed", "error": str(err), "metrics": None, "objective": None}
    for head, values in evaluation.items():
        for name, value in values.items():
            if isinstance(value, float) and not math.isfinite(value):
                return {"status": "failed", "error": f"{MetricKey(head, name)} is {value} (non-finite)",
                        "metrics": evaluation, "objective": None}
    return {"status": "done", "error": None, "metrics": evaluation, "objective": objective.value(evaluation)}


@dataclasses.dataclass
class _Running:
    trial: dict[str, Any]
    proc: subprocess.Popen
    log: TextIO


class LocalBackend:
    """Runs each trial as a `multihead train` process on this machine."""

    def __init__(self, threads: int | None, allow_import: Sequence[str] = (),
                 imports: Sequence[str] = ()) -> None:
        self.threads = threads
        self.allow_import = tuple(allow_import)
        self.imports = tuple(imports)

    def start(self, base: str, run_dir: str, log_path: str, overrides: Mapping[str, Any],
              resume: bool) -> Any:
        command = trial_command(base, run_dir, overrides, resume, self.allow_import, self.imports)
        log = os.fdopen(open_append(log_path), "a", encoding="utf-8")
        log.write(f"$ {shlex.join(command)}\n")
        log.flush()
        proc = subprocess.Popen(command, stdout=log,
                                stderr=subprocess.STDOUT, env=trial_env(self.threads),
                                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
        return (proc, log)

    @staticmethod
    def poll(handle: Any) -> int | None:
        proc, log = handle
        code = proc.poll()
        if code is not None:
            log.close()
        return code

    @staticmethod
    def stop(handle: Any) -> None:
        proc, log = handle
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()

    def close(self) -> None:
        pass


class Sweep:
    """A sweep directory and its index; runs the pending trials with a backend.

    Args:
        sweep_dir: the sweep directory.
        index: the index tree (`sweep.json`).
        stream: where the progress line goes (None: nowhere).
    """

    def __init__(self, sweep_dir: str, index: dict[str, Any], stream: TextIO | None = None) -> None:
        self.sweep_dir = sweep_dir
        self.index = index
        self.stream = stream
        self.objective = SweepObjective(index["objective"], index["direction"])
        self.allow_import: tuple[str, ...] = ()  # modules the trials' configs may import

    # paths
    @property
    def base(self) -> str:
        return os.path.join(self.sweep_dir, BASE_CONFIG)

    def run_dir(self, trial: Mapping[str, Any]) -> str:
        return inside(self.sweep_dir, trial["run_dir"], where=f"trial {trial['id']}: run_dir")

    def log_path(self, trial: Mapping[str, Any]) -> str:
        return inside(self.sweep_dir, f"{LOGS}/{trial['id']}.log", where=f"trial {trial['id']}: log")

    def log_text(self, trial: Mapping[str, Any]) -> str:
        """The end of a trial's log (where its error is), read as a regular file."""
        return read_tail(self.log_path(trial)).decode("utf-8", errors="replace")

    def save(self) -> None:
        _write_json(os.path.join(self.sweep_dir, INDEX), self.index)

    # progress
    def best(self) -> dict[str, Any] | None:
        best = None
        for trial in self.index["trials"]:
            value = trial.get("objective")
            if trial["status"] == "done" and value is not None and \
                    (best is None or self.objective.better(value, best["objective"])):
                best = trial
        return best

    def progress(self) -> str:
        counts = {s: 0 for s in ("done", "running", "failed", "pruned", "pending")}
        for trial in self.index["trials"]:
            counts[trial["status"]] = counts.get(trial["status"], 0) + 1
        total = len(self.index["trials"])
        line = (f"sweep {self.sweep_dir}: {counts['done']}/{total} done, {counts['running']} running, "
                f"{counts['failed']} failed")
        if counts["pruned"]:
            line += f", {counts['pruned']} pruned"
        best = self.best()
        line += (f"; best {self.objective.name} {best['objective']:.6g} ({best['id']})" if best
                 else f"; best {self.objective.name} -")
        return line

    def report_progress(self) -> None:
        """Prints the progress line (done/running/failed, best so far) to the stream."""
        if self.stream is not None:
            print(self.progress(), file=self.stream, flush=True)

    def _todo(self) -> list[dict[str, Any]]:
        """Trials to run: pending, failed, or marked running by a sweep that was killed."""
        return [t for t in self.index["trials"] if t["status"] != "done"
                or not os.path.isfile(os.path.join(self.run_dir(t), "metrics.json"))]

    def launch(self, backend: Any, trial: dict[str, Any]) -> Any:
        """Starts `trial` on `backend` (resuming its run directory if it was interrupted)."""
        check_sweep_dir(self.sweep_dir, [trial])  # as the trial is started, not only at resume
        run_dir = self.run_dir(trial)  # checked inside the sweep (no symlink, no '..')
        resume = resumable(run_dir)
        if os.path.lexists(run_dir) and not resume:
            shutil.rmtree(run_dir)  # an interrupted start with nothing to continue from
        trial.update(status="running", error=None, metrics=None, objective=None)
        return backend.start(self.base, run_dir, self.log_path(trial), trial["overrides"], resume)

    def run(self, backend: Any, jobs: int, poll_s: float = 0.2) -> dict[str, Any]:
        """Runs every trial that is not done, `jobs` at a time; returns the index."""
        os.makedirs(expect_kind(self.sweep_dir, LOGS, directory=True), exist_ok=True)
        todo = self._todo()
        running: list[tuple[dict[str, Any], Any]] = []
        self.report_progress()
        try:
            while todo or running:
                while todo and len(running) < jobs:
                    trial = todo.pop(0)
                    running.append((trial, self.launch(backend, trial)))
                    self.save()
                    self.report_progress()
                time.sleep(poll_s)
                for trial, handle in list(running):
                    code = backend.poll(handle)
                    if code is None:
                        continue
                    running.remove((trial, handle))
                    trial.update(trial_outcome(self.run_dir(trial), code, self.log_text(trial),
                                               self.objective))
                    self.save()
                    self.report_progress()
        finally:
            for trial, handle in running:  # interrupted (Ctrl-C): stop the trials, resumable
                backend.stop(handle)
            backend.close()
        self.finish()
        return self.index

    def finish(self) -> None:
        """The HParams experiment summary of the done trials at the sweep directory: every
        hyperparameter their runs logged (with the values seen) and their final metrics."""
        from multihead.experiments.run.hparams import final_metrics, run_hparams, write_experiment
        from multihead.experiments.run.load import read_run_config

        seen: dict[str, list[Any]] = {}
        tags: set[str] = set()
        for trial in self.index["trials"]:
            if trial["status"] != "done":
                continue
            tags |= set(final_metrics({"eval": trial["metrics"]}))
            config = read_run_config(self.run_dir(trial), self.allow_import)
            for key, value in run_hparams(config, as_sets(trial["overrides"])).items():
                seen.setdefault(key, []).append(value)
        if tags:
            write_experiment(self.sweep_dir, seen, sorted(tags))


def check_sweep_dir(sweep_dir: str, trials: Sequence[Mapping[str, Any]]) -> None:
    """Raises `BoundaryError` (one line naming the entry) unless the sweep's own files are
    what they should be: `config.yaml` a regular file (read whole, bounded), `logs/` a
    directory, each trial's `logs/<id>.log` a regular file and `trials/<id>` a directory
    where they exist, none a symlink (what a symlink points at may be outside the sweep; a
    FIFO would block the reader or writer)."""
    read_text(sweep_dir, BASE_CONFIG, limit=MAX_BYTES)
    expect_kind(sweep_dir, LOGS, directory=True)
    for trial in trials:
        expect_kind(sweep_dir, f"{LOGS}/{trial['id']}.log", directory=False)
        expect_kind(sweep_dir, trial["run_dir"], directory=True)


def check_new_dir(sweep_dir: str) -> None:
    """A new sweep goes into a new or empty directory (its own lock file aside)."""
    from multihead.experiments.run.guard import LOCK_FILE

    if os.path.lexists(sweep_dir) and not os.path.isdir(sweep_dir):
        raise ConfigError(f"--sweep-dir {sweep_dir!r} exists and is not a directory; choose "
                          "another path")
    if os.path.exists(sweep_dir) and set(os.listdir(sweep_dir)) - {LOCK_FILE}:
        raise ConfigError(f"--sweep-dir {sweep_dir!r} exists and is not empty; choose another "
                          "directory or --resume it")


def new_index(trials: Sequence[Mapping[str, Any]], objective: SweepObjective, search: str = "grid") -> dict[str, Any]:
    keys = list(dict.fromkeys(k for t in trials for k in t))
    return {
        "version": 1,
        "config": BASE_CONFIG,
        "search": search,
        "objective": objective.name,
        "direction": objective.direction,
        "axes": keys,
        "trials": [{"id": f"t{i:03d}", "overrides": dict(o), "run_dir": f"{TRIALS}/t{i:03d}",
                    "status": "pending", "error": None, "metrics": None, "objective": None}
                   for i, o in enumerate(trials)],
    }


def create_sweep(sweep_dir: str, base_raw: Mapping[str, Any], trials: Sequence[Mapping[str, Any]],
                 objective: SweepObjective, stream: TextIO | None = None, search: str = "grid") -> Sweep:
    """Writes a new sweep directory (base config and index, nothing run yet)."""
    check_new_dir(sweep_dir)
    os.makedirs(os.path.join(sweep_dir, TRIALS), exist_ok=True)
    write_atomic(os.path.join(sweep_dir, BASE_CONFIG), yaml.safe_dump(dict(base_raw), sort_keys=False))
    sweep = Sweep(sweep_dir, new_index(trials, objective, search), stream)
    sweep.save()
    return sweep


def load_base(config_path: str, sets: Sequence[str],
              allow_import: Sequence[str] = ()) -> tuple[dict[str, Any], SweepSpec]:
    """The raw config with `sets` applied, without its `sweep:` section, and that section parsed."""
    try:
        with open(config_path, encoding="utf-8") as fh:
            raw = parse_yaml(fh.read(), config_path)
    except OSError as err:
        raise ConfigError(f"{config_path}: cannot read the config ({err.strerror})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{config_path}: the config must be a mapping at the top level")
    for assignment in sets:
        apply_override(raw, assignment)
    base, section = split_sweep_section(raw)
    try:
        spec = sweep_spec(section)
    except ConfigError as err:
        raise ConfigError(f"{config_path}: {err}") from None
    from_dict(base, config_path, allow_import)  # the base config itself must be valid
    return base, spec
