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
import tempfile
import time
from typing import Any, Mapping, Sequence, TextIO

import yaml

from multihead._checks import describe, suggest
from multihead.experiments.config.schema import ConfigError, apply_override, from_dict, parse_yaml

INDEX = "sweep.json"
BASE_CONFIG = "config.yaml"
TRIALS = "trials"
LOGS = "logs"
DISTRIBUTIONS = ("choice", "uniform", "loguniform", "int")
#: Keys of `metrics.json` that are measurements of time, not results.
TIMING_KEYS = ("wall_time_s", "steps_per_s")


# -- axes and trials -------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Distribution:
    """One random axis: `choice` (values), or `uniform` / `loguniform` / `int` (low, high)."""

    kind: str
    values: tuple[Any, ...]

    def sample(self, rng: Any) -> Any:
        if self.kind == "choice":
            return self.values[int(rng.integers(len(self.values)))]
        low, high = self.values
        if self.kind == "uniform":
            return float(rng.uniform(low, high))
        if self.kind == "loguniform":
            return float(math.exp(rng.uniform(math.log(low), math.log(high))))
        return int(rng.integers(low, high + 1))


@dataclasses.dataclass
class SweepSpec:
    """The axes of a sweep: `grid` (product), `zip` (stepped together), `random` draws."""

    grid: dict[str, list[Any]] = dataclasses.field(default_factory=dict)
    zip: dict[str, list[Any]] = dataclasses.field(default_factory=dict)
    random: dict[str, Distribution] = dataclasses.field(default_factory=dict)
    count: int = 0
    seed: int = 0

    def keys(self) -> list[str]:
        return list(dict.fromkeys([*self.grid, *self.zip, *self.random]))


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
    return key.strip(), _distribution({kind: values}, f"--sample {text!r}")


def _distribution(raw: Any, path: str) -> Distribution:
    if isinstance(raw, list):
        raw = {"choice": raw}
    if not isinstance(raw, Mapping) or len(raw) != 1:
        raise ConfigError(f"{path}: expected a list of values or one of {{choice: [...]}}, "
                          f"{{uniform: [low, high]}}, {{loguniform: [low, high]}}, {{int: [low, high]}}; "
                          f"got {describe(raw)}")
    (kind, values), = raw.items()
    if kind not in DISTRIBUTIONS:
        raise ConfigError(f"{path}: unknown distribution {kind!r}{suggest(kind, DISTRIBUTIONS)}; "
                          f"use one of {', '.join(DISTRIBUTIONS)}")
    if not isinstance(values, list) or not values:
        raise ConfigError(f"{path}.{kind}: expected a non-empty list, got {describe(values)}")
    if kind != "choice":
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        if len(values) != 2 or not numbers or not values[0] < values[1]:
            raise ConfigError(f"{path}.{kind}: expected [low, high] numbers with low < high, "
                              f"got {values!r}")
        if kind == "loguniform" and values[0] <= 0:
            raise ConfigError(f"{path}.loguniform: low must be > 0, got {values[0]!r}")
        if kind == "int" and not all(isinstance(v, int) for v in values):
            raise ConfigError(f"{path}.int: expected integers [low, high], got {values!r}")
    return Distribution(kind, tuple(values))


def _axis_values(raw: Any, path: str) -> list[Any]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{path}: expected a non-empty list of values, got {describe(raw)}")
    return list(raw)


def sweep_spec(raw: Any, path: str = "sweep") -> SweepSpec:
    """The validated `sweep:` section of a config (see the module docstring)."""
    if raw is None:
        return SweepSpec()
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{path}: expected a mapping with grid, zip and/or random, got {describe(raw)}")
    known = ("grid", "zip", "random")
    for key in raw:
        if key not in known:
            raise ConfigError(f"{path}.{key}: unknown key{suggest(str(key), known)}; use grid, zip or random")
    spec = SweepSpec()
    for section in ("grid", "zip"):
        axes = raw.get(section) or {}
        if not isinstance(axes, Mapping):
            raise ConfigError(f"{path}.{section}: expected a mapping KEY.PATH -> [values], got {describe(axes)}")
        getattr(spec, section).update({str(k): _axis_values(v, f"{path}.{section}.{k}") for k, v in axes.items()})
    lengths = {k: len(v) for k, v in spec.zip.items()}
    if len(set(lengths.values())) > 1:
        raise ConfigError(f"{path}.zip: paired axes need equal lengths, got {lengths}")
    random = raw.get("random")
    if random is not None:
        where = f"{path}.random"
        if not isinstance(random, Mapping):
            raise ConfigError(f"{where}: expected {{count: N, seed: S, axes: {{...}}}}, got {describe(random)}")
        for key in random:
            if key not in ("count", "seed", "axes"):
                raise ConfigError(f"{where}.{key}: unknown key{suggest(str(key), ('count', 'seed', 'axes'))}")
        count, seed = random.get("count"), random.get("seed", 0)
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise ConfigError(f"{where}.count: expected an integer >= 1, got {describe(count)}")
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ConfigError(f"{where}.seed: expected an integer, got {describe(seed)}")
        axes = random.get("axes")
        if not isinstance(axes, Mapping) or not axes:
            raise ConfigError(f"{where}.axes: expected a mapping KEY.PATH -> distribution, got {describe(axes)}")
        spec.random = {str(k): _distribution(v, f"{where}.axes.{k}") for k, v in axes.items()}
        spec.count, spec.seed = count, seed
    seen: dict[str, str] = {}
    for section in ("grid", "zip", "random"):
        for key in getattr(spec, section):
            if key in seen:
                raise ConfigError(f"{path}.{section}.{key}: already an axis in {path}.{seen[key]}; "
                                  "give each key once")
            seen[key] = section
    return spec


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
class Objective:
    """What "best" means: `eval/mean_loss` or `eval/<head>/<metric>` of the final evaluation."""

    name: str = "eval/mean_loss"
    direction: str = "minimize"

    def value(self, evaluation: Mapping[str, Mapping[str, float]]) -> float | None:
        if self.name == "eval/mean_loss":
            losses = [v["loss"] for v in evaluation.values() if "loss" in v]
            return math.fsum(losses) / len(losses) if losses else None
        _, head, metric = self.name.split("/")
        value = evaluation.get(head, {}).get(metric)
        return None if value is None else float(value)

    def better(self, a: float, b: float) -> bool:
        return a < b if self.direction == "minimize" else a > b


def check_objective(name: str, direction: str, heads: Sequence[str]) -> Objective:
    if direction not in ("minimize", "maximize"):
        raise ConfigError(f"--direction {direction!r}: use minimize or maximize")
    parts = name.split("/")
    if name != "eval/mean_loss":
        if len(parts) != 3 or parts[0] != "eval" or not all(parts):
            raise ConfigError(f"--objective {name!r}: must be eval/<head>/<metric> or eval/mean_loss")
        if parts[1] not in heads:
            raise ConfigError(f"--objective {name!r}: the model has no head {parts[1]!r}"
                              f"{suggest(parts[1], heads)}; its heads are {list(heads)}")
    return Objective(name, direction)


# -- the index -------------------------------------------------------------------------


def _write_json(path: str, tree: Any) -> None:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".tmp-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(tree, fh, indent=2)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_index(sweep_dir: str) -> dict[str, Any]:
    path = os.path.join(sweep_dir, INDEX)
    if not os.path.isfile(path):
        raise ConfigError(f"--resume {sweep_dir!r}: no {INDEX} there; is it a multihead sweep directory?")
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


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
                  resume: bool, allow_import: Sequence[str] = ()) -> list[str]:
    """The `multihead train` command line of one trial (`allow_import`: the sweep's own
    `--allow-import` modules, passed on)."""
    cmd = [sys.executable, "-m", "multihead", "train", base_config, "--quiet"]
    cmd += ["--resume", run_dir] if resume else ["--run-dir", run_dir]
    for module in allow_import:
        cmd += ["--allow-import", module]
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
    return os.path.isfile(os.path.join(directory, "checkpoint"))


def trial_outcome(run_dir: str, returncode: int, log_text: str,
                  objective: Objective) -> dict[str, Any]:
    """status, error, metrics and objective of a finished trial process."""
    metrics_path = os.path.join(run_dir, "metrics.json")
    if returncode != 0 or not os.path.isfile(metrics_path):
        return {"status": "failed", "error": last_error(log_text) if returncode != 0 else
                "the trial exited without writing metrics.json", "metrics": None, "objective": None}
    with open(metrics_path, encoding="utf-8") as fh:
        metrics = json.load(fh)
    evaluation = metrics.get("eval") or {}
    for head, values in evaluation.items():
        for name, value in values.items():
            if isinstance(value, float) and not math.isfinite(value):
                return {"status": "failed", "error": f"eval/{head}/{name} is {value} (non-finite)",
                        "metrics": evaluation, "objective": None}
    return {"status": "done", "error": None, "metrics": evaluation, "objective": objective.value(evaluation)}


@dataclasses.dataclass
class _Running:
    trial: dict[str, Any]
    proc: subprocess.Popen
    log: TextIO


class LocalBackend:
    """Runs each trial as a `multihead train` process on this machine."""

    def __init__(self, threads: int | None, allow_import: Sequence[str] = ()) -> None:
        self.threads = threads
        self.allow_import = tuple(allow_import)

    def start(self, base: str, run_dir: str, log_path: str, overrides: Mapping[str, Any],
              resume: bool) -> Any:
        command = trial_command(base, run_dir, overrides, resume, self.allow_import)
        log = open(log_path, "a", encoding="utf-8")
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
        self.objective = Objective(index["objective"], index["direction"])
        self.allow_import: tuple[str, ...] = ()  # modules the trials' configs may import

    # paths
    @property
    def base(self) -> str:
        return os.path.join(self.sweep_dir, BASE_CONFIG)

    def run_dir(self, trial: Mapping[str, Any]) -> str:
        return os.path.join(self.sweep_dir, trial["run_dir"])

    def log_path(self, trial: Mapping[str, Any]) -> str:
        return os.path.join(self.sweep_dir, LOGS, f"{trial['id']}.log")

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
        run_dir = self.run_dir(trial)
        resume = resumable(run_dir)
        if os.path.exists(run_dir) and not resume:
            shutil.rmtree(run_dir)  # an interrupted start with nothing to continue from
        trial.update(status="running", error=None, metrics=None, objective=None)
        return backend.start(self.base, run_dir, self.log_path(trial), trial["overrides"], resume)

    def run(self, backend: Any, jobs: int, poll_s: float = 0.2) -> dict[str, Any]:
        """Runs every trial that is not done, `jobs` at a time; returns the index."""
        os.makedirs(os.path.join(self.sweep_dir, LOGS), exist_ok=True)
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
                    with open(self.log_path(trial), encoding="utf-8", errors="replace") as fh:
                        text = fh.read()
                    trial.update(trial_outcome(self.run_dir(trial), code, text, self.objective))
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
        from multihead.experiments.config.schema import load_config
        from multihead.experiments.run.hparams import final_metrics, run_hparams, write_experiment

        seen: dict[str, list[Any]] = {}
        tags: set[str] = set()
        for trial in self.index["trials"]:
            if trial["status"] != "done":
                continue
            tags |= set(final_metrics({"eval": trial["metrics"]}))
            config = load_config(os.path.join(self.run_dir(trial), "config.yaml"),
                                 allow_import=self.allow_import)
            for key, value in run_hparams(config, as_sets(trial["overrides"])).items():
                seen.setdefault(key, []).append(value)
        if tags:
            write_experiment(self.sweep_dir, seen, sorted(tags))


def new_index(trials: Sequence[Mapping[str, Any]], objective: Objective, search: str = "grid") -> dict[str, Any]:
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
                 objective: Objective, stream: TextIO | None = None, search: str = "grid") -> Sweep:
    """Writes a new sweep directory (base config and index, nothing run yet)."""
    if os.path.exists(sweep_dir) and os.listdir(sweep_dir):
        raise ConfigError(f"--sweep-dir {sweep_dir!r} exists and is not empty; choose another "
                          "directory or --resume it")
    os.makedirs(os.path.join(sweep_dir, TRIALS), exist_ok=True)
    with open(os.path.join(sweep_dir, BASE_CONFIG), "w", encoding="utf-8") as fh:
        yaml.safe_dump(dict(base_raw), fh, sort_keys=False)
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


# -- the command -----------------------------------------------------------------------


def _default_sweep_dir(config_path: str) -> str:
    from multihead.experiments.run.directory import default_run_dir

    return default_run_dir(config_path, prefix="sweep-")


def resolve_threads(text: str, jobs: int) -> int | None:
    """`--threads`: auto (`max(1, cores // jobs)`), none (TensorFlow's default) or a count."""
    if text == "auto":
        return threads_per_trial(jobs)
    if text == "none":
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"--threads {text!r}: use auto, none or a count >= 1")
    return value


def make_backend(name: str, threads: int | None, address: str | None = None,
                 num_cpus: int | None = None, allow_import: Sequence[str] = ()) -> Any:
    if name == "local":
        if address:
            raise ConfigError("--ray-address: only used with --backend ray")
        return LocalBackend(threads, allow_import)
    from multihead.experiments.sweep.ray_backend import RayBackend

    return RayBackend(threads, address=address, num_cpus=num_cpus, allow_import=allow_import)


def _heads(base: Mapping[str, Any]) -> list[str]:
    heads = (base.get("model") or {}).get("heads") or {}
    return [str(h) for h in heads]


def cmd_sweep(args: Any) -> int:
    """`multihead sweep` (see `multihead sweep --help` and docs/sweeps.md)."""
    stream = None if args.quiet else sys.stderr
    if args.jobs < 1:
        raise ConfigError(f"--jobs {args.jobs}: must be >= 1")
    threads = resolve_threads(args.threads, args.jobs)
    allow_import = tuple(getattr(args, "allow_import", None) or ())
    if args.resume:
        if args.config or args.grid or args.sample or args.set:
            raise ConfigError("--resume SWEEP_DIR: the trials are those of its sweep.json; give no "
                              "CONFIG, --grid, --sample or --set")
        sweep = Sweep(args.resume, read_index(args.resume), stream)
        search = sweep.index.get("search", "grid")
    else:
        if not args.config:
            raise ConfigError("a CONFIG is required (or --resume SWEEP_DIR)")
        base, spec = load_base(args.config, args.set or [], allow_import)
        for text in args.grid or []:
            key, values = parse_grid_arg(text)
            if key in spec.keys():
                raise ConfigError(f"--grid {text!r}: {key} is already an axis of the sweep")
            spec.grid[key] = values
        for text in args.sample or []:
            key, distribution = parse_sample_arg(text)
            if key in spec.keys():
                raise ConfigError(f"--sample {text!r}: {key} is already an axis of the sweep")
            spec.random[key] = distribution
        if args.sample:
            spec.count, spec.seed = args.trials or 10, args.search_seed
        objective = check_objective(args.objective, args.direction, _heads(base))
        search = args.search
        if search == "optuna":
            if not spec.random:
                raise ConfigError("--search optuna: give the search space with --sample KEY=KIND:... "
                                  "or sweep.random.axes")
            if spec.grid or spec.zip:
                raise ConfigError("--search optuna: searches the --sample / sweep.random axes only; "
                                  "remove --grid and sweep.grid/zip")
            trials: list[dict[str, Any]] = []
        else:
            if not spec.keys():
                raise ConfigError(f"{args.config}: no axes to sweep; give --grid KEY=V1,V2 "
                                  "(repeatable) or a sweep: section")
            trials = trial_overrides(spec)
        sweep = create_sweep(args.sweep_dir or _default_sweep_dir(args.config), base, trials,
                             objective, stream, search=search)
        if search == "optuna":
            from multihead.experiments.sweep.search import save_space

            save_space(sweep, spec, n_trials=args.trials or 10, seed=args.search_seed)
    if stream is not None:
        print(f"sweep directory: {sweep.sweep_dir} ({args.jobs} jobs, "
              f"{threads or 'default'} threads each)", file=stream)
    sweep.allow_import = allow_import
    backend = make_backend(args.backend, threads, args.ray_address, args.ray_cpus, allow_import)
    if search == "optuna":
        from multihead.experiments.sweep.search import run_optuna

        index = run_optuna(sweep, backend, args.jobs)
    else:
        index = sweep.run(backend, args.jobs)
    failed = [t for t in index["trials"] if t["status"] == "failed"]
    for trial in failed:
        print(f"{trial['id']} failed: {trial['error']}", file=sys.stderr)
    best = sweep.best()
    print(f"wrote {sweep.sweep_dir} ({len(index['trials'])} trials, {len(failed)} failed"
          + (f"; best {sweep.objective.name} {best['objective']:.6g}: {best['id']} "
             f"{' '.join(as_sets(best['overrides']))}" if best else "") + ")")
    return 1 if failed else 0
