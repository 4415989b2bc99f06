"""A sweep's index, `SWEEP_DIR/sweep.json`, read as untrusted data.

Before a resume or `compare` acts on an index, each trial's `id` must be a plain name (it
names `logs/<id>.log`) and its `run_dir` a directory `trials/<name>` inside the sweep with no
symlink on the way (`multihead._boundary`): a crafted index must not make a resume delete,
write or train anywhere else. Every refusal is one line naming the file and the trial.
"""

from __future__ import annotations

import os
import re
from typing import Any, Mapping

from multihead._boundary import BoundaryError, inside, read_json
from multihead.experiments.config.schema import ConfigError

INDEX = "sweep.json"
TRIALS = "trials"

#: A trial id: a file name (`logs/<id>.log`), never a path.
_TRIAL_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
_STATUSES = ("pending", "running", "done", "failed", "pruned")


def read_index(sweep_dir: str) -> dict[str, Any]:
    """The sweep's `sweep.json`, checked before anything acts on it: each trial's `id` is a
    plain name and its `run_dir` a directory under `trials/` of this sweep (a crafted index
    must not make a resume delete or write elsewhere).

    Raises:
        ConfigError: no index, or an index that is not one (one line naming the file and trial).
    """
    path = os.path.join(sweep_dir, INDEX)
    if not os.path.isdir(sweep_dir) or not os.path.lexists(path):
        raise ConfigError(f"--resume {sweep_dir!r}: no {INDEX} there; is it a multihead sweep directory?")
    try:
        index = read_json(sweep_dir, INDEX)
        check_index(sweep_dir, index)
    except BoundaryError as err:
        raise ConfigError(str(err)) from None
    return index


def check_index(sweep_dir: str, index: Mapping[str, Any]) -> None:
    """Raises `BoundaryError` unless `index` is a sweep index whose trials stay in `sweep_dir`."""
    where = os.path.join(sweep_dir, INDEX)
    for key, kind in (("objective", str), ("direction", str), ("trials", list)):
        if not isinstance(index.get(key), kind):
            raise BoundaryError(f"{where}: {key} must be a {kind.__name__}, got {index.get(key)!r}")
    if index.get("search") == "optuna":
        for key, kind in (("space", dict), ("n_trials", int), ("search_seed", int)):
            if not isinstance(index.get(key), kind) or isinstance(index.get(key), bool):
                raise BoundaryError(f"{where}: {key} must be a {kind.__name__} in an Optuna "
                                    f"sweep, got {index.get(key)!r}")
    check_trial_dirs(sweep_dir, index["trials"])
    seen: set[str] = set()
    for i, trial in enumerate(index["trials"]):
        at = f"{where}: trials[{i}]"
        tid = trial.get("id")
        if not isinstance(tid, str) or not _TRIAL_ID.fullmatch(tid) or tid in seen:
            raise BoundaryError(f"{at}.id: must be a unique plain name (letters, digits, _ . -), "
                                f"got {tid!r}")
        seen.add(tid)
        if not isinstance(trial.get("overrides"), dict):
            raise BoundaryError(f"{at}.overrides: must be a mapping, got {trial.get('overrides')!r}")


def check_trial_dirs(sweep_dir: str, trials: Any) -> None:
    """Raises `BoundaryError` unless every trial is a mapping with a known `status` and a
    `run_dir` of the form `trials/<name>` inside `sweep_dir` (no symlink, no `..`)."""
    where = os.path.join(sweep_dir, INDEX)
    if not isinstance(trials, list):
        raise BoundaryError(f"{where}: trials must be a list, got {trials!r}")
    for i, trial in enumerate(trials):
        at = f"{where}: trials[{i}]"
        if not isinstance(trial, dict):
            raise BoundaryError(f"{at}: must be a mapping, got {trial!r}")
        run_dir = trial.get("run_dir")
        if not isinstance(run_dir, str) or run_dir.replace("\\", "/").strip("/").split("/")[:1] \
                != [TRIALS] or len([p for p in run_dir.split("/") if p not in ("", ".")]) != 2:
            raise BoundaryError(f"{at}.run_dir: must be {TRIALS}/<name> inside the sweep, "
                                f"got {run_dir!r}")
        inside(sweep_dir, run_dir, where=f"{at}.run_dir")
        if trial.get("status") not in _STATUSES:
            raise BoundaryError(f"{at}.status: must be one of {list(_STATUSES)}, "
                                f"got {trial.get('status')!r}")
