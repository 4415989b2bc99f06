"""`multihead sweep --search optuna`: an Optuna study over the random axes, with pruning.

Each Optuna trial is a sweep trial (a `multihead train` process, `trials/<id>/`). While it
runs, the sweep reads the evaluations it writes (`<run>/eval` events, flushed at each
evaluation) and reports the objective at each evaluation step to Optuna; a trial the
pruner (median rule: worse than the median of earlier trials at the same step) stops is
terminated and recorded as `pruned`. The sampler is TPE seeded with `--search-seed`.

`pip install 'multihead[optuna]'`.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

from multihead._boundary import expect_kind
from multihead.experiments.config.schema import ConfigError
from multihead.experiments.config.sweep_section import SweepSpec
from multihead.experiments.sweep.sweep import LOGS, Sweep, trial_outcome
from multihead.monitoring.metric_key import MetricKey


def save_space(sweep: Sweep, spec: SweepSpec, n_trials: int, seed: int) -> None:
    """Records the search in the sweep's index (what `--resume` continues)."""
    for key, dist in spec.random.items():
        if dist.kind == "choice" and not all(isinstance(v, (bool, int, float, str)) for v in dist.values):
            raise ConfigError(f"--search optuna: {key}: choices must be numbers or strings for Optuna, "
                              f"got {list(dist.values)!r}")
    sweep.index["space"] = {k: {"kind": d.kind, "values": list(d.values)} for k, d in spec.random.items()}
    sweep.index["n_trials"] = n_trials
    sweep.index["search_seed"] = seed
    sweep.save()


def _distributions(space: dict[str, Any]) -> dict[str, Any]:
    import optuna

    out = {}
    for key, entry in space.items():
        kind, values = entry["kind"], entry["values"]
        if kind == "choice":
            out[key] = optuna.distributions.CategoricalDistribution(values)
        elif kind == "int":
            out[key] = optuna.distributions.IntDistribution(values[0], values[1])
        else:
            out[key] = optuna.distributions.FloatDistribution(values[0], values[1], log=kind == "loguniform")
    return out


def intermediate_values(run_dir: str, objective: str) -> dict[int, float]:
    """The objective at each evaluation a (running) trial has written so far."""
    from multihead.monitoring.report import read_scalars

    directory = os.path.join(run_dir, "eval")
    if not os.path.isdir(directory):
        return {}
    try:
        scalars = read_scalars(directory)
    except Exception:  # noqa: BLE001 - a record being written; read again at the next poll
        return {}
    key = MetricKey.parse(objective)
    if key.is_mean_loss:
        series = [s for tag, s in scalars.items() if tag.startswith("loss/")]
        if not series:
            return {}
        steps = set.intersection(*[{int(x) for x in s.steps} for s in series])
        return {step: math.fsum(float(s.values[list(s.steps).index(step)]) for s in series) / len(series)
                for step in sorted(steps)}
    found = scalars.get(key.tag)
    return {} if found is None else {int(s): float(v) for s, v in zip(found.steps, found.values)}


def run_optuna(sweep: Sweep, backend: Any, jobs: int, poll_s: float = 0.25) -> dict[str, Any]:
    """Runs (or, on `--resume`, continues) the Optuna search recorded in the sweep's index."""
    try:
        import optuna
    except ImportError:
        raise ConfigError("--search optuna needs Optuna: pip install 'multihead[optuna]'") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    index = sweep.index
    dists = _distributions(index["space"])
    study = optuna.create_study(
        direction=index["direction"],
        sampler=optuna.samplers.TPESampler(seed=index["search_seed"]),
        pruner=optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0),
    )
    requeue = _known_trials(optuna, study, index["trials"], dists)
    os.makedirs(expect_kind(sweep.sweep_dir, LOGS, directory=True), exist_ok=True)
    running: list[tuple[dict[str, Any], Any, Any]] = []
    sweep.report_progress()
    try:
        while requeue or running or len(index["trials"]) < index["n_trials"]:
            while len(running) < jobs and (requeue or len(index["trials"]) < index["n_trials"]):
                if requeue:
                    entry = requeue.pop(0)
                    study.enqueue_trial(entry["overrides"])
                    trial = study.ask(dists)
                else:
                    trial = study.ask(dists)
                    n = len(index["trials"])
                    entry = {"id": f"t{n:03d}", "overrides": dict(trial.params),
                             "run_dir": f"trials/t{n:03d}", "status": "pending", "error": None,
                             "metrics": None, "objective": None}
                    index["trials"].append(entry)
                entry["intermediate"] = {}
                running.append((entry, trial, sweep.launch(backend, entry)))
                sweep.save()
                sweep.report_progress()
            time.sleep(poll_s)
            for item in list(running):
                if _follow(optuna, study, sweep, backend, item):
                    running.remove(item)
                    sweep.save()
                    sweep.report_progress()
    finally:
        for entry, _, handle in running:
            backend.stop(handle)
        backend.close()
    sweep.finish()
    return index


def _known_trials(optuna: Any, study: Any, trials: list[dict[str, Any]], dists: Any) -> list[dict[str, Any]]:
    """A resumed search: the done and pruned trials go back into the study; returns the others
    (failed, or running when the sweep was killed), to run again."""
    requeue = []
    for entry in trials:
        steps = {int(k): v for k, v in (entry.get("intermediate") or {}).items()}
        if entry["status"] == "done":
            study.add_trial(optuna.trial.create_trial(params=entry["overrides"], distributions=dists,
                                                      value=entry["objective"], intermediate_values=steps))
        elif entry["status"] == "pruned":
            study.add_trial(optuna.trial.create_trial(params=entry["overrides"], distributions=dists,
                                                      state=optuna.trial.TrialState.PRUNED,
                                                      intermediate_values=steps))
        else:
            requeue.append(entry)
    return requeue


def _follow(optuna: Any, study: Any, sweep: Sweep, backend: Any, item: tuple[dict[str, Any], Any, Any]) -> bool:
    """Reports a running trial's new evaluations to Optuna; prunes it, or records its outcome
    when it ended. True when the trial is over (pruned or ended)."""
    entry, trial, handle = item
    run_dir = sweep.run_dir(entry)
    for step, value in intermediate_values(run_dir, sweep.objective.name).items():
        if str(step) not in entry["intermediate"]:
            entry["intermediate"][str(step)] = value
            trial.report(value, step)
            if trial.should_prune():
                backend.stop(handle)
                entry.update(status="pruned", error=f"pruned at step {step}")
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                return True
    code = backend.poll(handle)
    if code is None:
        return False
    entry.update(trial_outcome(run_dir, code, sweep.log_text(entry), sweep.objective))
    if entry["status"] == "done" and entry["objective"] is not None:
        study.tell(trial, entry["objective"])
    else:
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
    return True
