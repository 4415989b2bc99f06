"""The records of a run directory, checked before `--resume` writes anything.

A resume adopts what the run recorded: `status.json` (restored if the resume is refused
later), `history.json` (its evaluations and segments go on into `metrics.json`),
`head_stopping.json` (replayed by per-head early stopping) and `best/best.json` (the best
value to beat). A run directory is data anyone may have edited, so each is checked here,
through the one boundary helper (`multihead._boundary`: no symlink, regular files only,
bounded size): types, heads of this config, finite numbers, steps in order. A bad record is
one `RecordError` naming the file and the field, raised before the lock is taken.

Each file's own rules live with its reader (`guard.check_status`, `history.read_history`,
`BestCheckpoint.read`); this module only calls them, plus the check of
`head_stopping.json`, whose reader is the training callback.

Example:
    >>> check_records("runs/x", ["a", "b"])          # doctest: +SKIP
"""

from __future__ import annotations

import os
from typing import Sequence

from multihead._boundary import BoundaryError, read_json
from multihead._checks import check_float, check_int, describe

#: Per-head early stopping's record (`multihead.experiments.build.builders.HEAD_STOPPING_FILE`).
HEAD_STOPPING_FILE = "head_stopping.json"


class RecordError(ValueError):
    """A run's record is not one this run could have written (one line naming the file and
    the field)."""


def check_records(run_dir: str, heads: Sequence[str]) -> None:
    """Checks every record `--resume` adopts; reads only.

    Args:
        run_dir: the run directory.
        heads: the heads of the config the run resumes with.

    Raises:
        RecordError: a record is not one this run could have written (one line naming the
            file and the field).
    """
    # Where each record's rules live; imported here, as they load Keras, so that the
    # CLI's module-level imports stay free of it.
    from multihead.experiments.run.guard import STATUS_FILE, check_status
    from multihead.experiments.run.history import HISTORY_FILE, HistoryError, read_history
    from multihead.io.best_checkpoint import BestCheckpoint

    try:
        if os.path.lexists(os.path.join(run_dir, STATUS_FILE)):
            check_status(read_json(run_dir, STATUS_FILE, limit=1 << 20),
                         os.path.join(run_dir, STATUS_FILE))
        if os.path.lexists(os.path.join(run_dir, HISTORY_FILE)):
            read_history(run_dir, heads)
        if os.path.lexists(os.path.join(run_dir, HEAD_STOPPING_FILE)):
            _check_head_stopping(run_dir, heads)
        best = os.path.join(run_dir, "best")
        for directory in [best, *(os.path.join(best, h) for h in heads)]:
            if os.path.isdir(directory) and not os.path.islink(directory):
                BestCheckpoint.read(directory)
    except (BoundaryError, HistoryError) as err:
        raise RecordError(str(err)) from None


def _check_head_stopping(run_dir: str, heads: Sequence[str]) -> None:
    """`{"evaluations": [{"step": int, "values": {head: finite number}}]}`, every head of the
    config in each entry, steps increasing."""
    where = os.path.join(run_dir, HEAD_STOPPING_FILE)
    tree = read_json(run_dir, HEAD_STOPPING_FILE, limit=1 << 24)
    entries = tree.get("evaluations")
    if not isinstance(entries, list):
        raise BoundaryError(f"{where}: evaluations must be a list, got {describe(entries)}")
    last = 0
    for i, entry in enumerate(entries):
        field = f"{where}: evaluations[{i}]"
        if not isinstance(entry, dict):
            raise BoundaryError(f"{field} must be an object, got {describe(entry)}")
        last = check_int(entry.get("step"), f"{field}.step", minimum=last + 1,
                         hint="steps in order", error=BoundaryError)
        values = entry.get("values")
        if not isinstance(values, dict) or sorted(values) != sorted(heads):
            shown = sorted(values) if isinstance(values, dict) else describe(values)
            raise BoundaryError(f"{field}.values must hold one value per head {list(heads)}, "
                                f"got {shown}")
        for head, value in values.items():
            check_float(value, f"{field}.values.{head}", error=BoundaryError)
