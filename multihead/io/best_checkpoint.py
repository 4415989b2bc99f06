"""`BestCheckpoint`: keeps one checkpoint, that of the best evaluation of a run.

At every evaluation that beats the best so far, the whole training state
(`save_checkpoint(path, model, trainer=trainer)`: model, optimizers, step, data
position) is written to `<directory>/best-<step>`; then `<directory>/best.json`,
which names it, is replaced atomically (`os.replace`); then the previous best is
deleted. A crash at any point leaves `best.json` naming a complete checkpoint.

`best.json` is data anyone can edit: its `path` must name a `best-<step>` checkpoint
directly in the directory (`multihead._boundary`), and deleting a previous best removes
only that checkpoint's own regular files there, never what a path outside names.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import tempfile
from typing import Any, Callable, Mapping, Sequence

from multihead._boundary import BoundaryError, read_json, temp_file, unlink_symlinks_at
from multihead._checks import check_float
from multihead.training.callbacks import Callback, Metrics, MonitoredQuantity
from multihead.io.checkpoints import save_checkpoint

_POINTER = "best.json"
_NAME = re.compile(r"best-[0-9]{1,18}")


def _own_files(directory: str, name: str) -> list[str]:
    """The regular files of checkpoint `name` (`name.index`, `name.data-*`) in `directory`."""
    try:
        entries = list(os.scandir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [e.path for e in entries if e.name.startswith(name + ".")
            and (e.name == name + ".index" or e.name.startswith(name + ".data-"))
            and e.is_file(follow_symlinks=False)]


class BestCheckpoint(Callback):
    """Keeps the checkpoint of the best evaluation in `directory` (only that one).

    The record in `<directory>/best.json` (path, step, value, monitor, mode) survives the
    process: a `BestCheckpoint` on the same directory, monitor and mode starts from the
    recorded best, so a resumed run replaces it only with a better evaluation.

    Example:
        >>> best = mh.BestCheckpoint("runs/x/best", monitor="eval/y1/loss")
        >>> trainer.fit(data, 10_000, eval_data=held_out, eval_every=500,
        ...             callbacks=[best])                               # doctest: +SKIP
        >>> mh.restore_checkpoint(best.path, fresh_model, parts=["trunk", "heads"])  # doctest: +SKIP

    Args:
        directory: where `best-<step>` and `best.json` are written.
        monitor: `"eval/<head>/<metric>"`, `"eval/mean_loss"` or a callable of the eval
            metrics (see `multihead.training.callbacks.MonitoredQuantity`).
        mode: `"min"`, `"max"` or `"auto"` (from the metric name).
        min_delta: the amount an evaluation must beat the best by (>= 0).
        parts: the checkpoint parts to save (see `save_checkpoint`); None saves all.
        targets: name -> target network saved with the trainer's state.

    Attributes:
        path: the prefix of the best checkpoint, or None before the first save.
        best_step, best_value: the evaluation it holds.
    """

    def __init__(self, directory: str | os.PathLike[str],
                 monitor: str | Callable[[Metrics], float] = "eval/mean_loss",
                 mode: str = "auto", min_delta: float = 0.0,
                 parts: Sequence[str] | None = None,
                 targets: Mapping[str, Any] | None = None) -> None:
        if not isinstance(directory, (str, os.PathLike)) or not os.fspath(directory):
            raise TypeError(f"BestCheckpoint: directory must be a path, got {directory!r}")
        self.directory = os.fspath(directory)
        self.quantity = MonitoredQuantity(monitor, mode, "BestCheckpoint")
        self.min_delta = check_float(min_delta, "BestCheckpoint.min_delta", minimum=0)
        self.parts = parts
        self.targets = targets
        self.path: str | None = None
        self.best_step: int | None = None
        self.best_value: float | None = None
        self._adopt_record()

    @staticmethod
    def read(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
        """The record in `<directory>/best.json` (with `path` made absolute), or None.

        Raises:
            BoundaryError: `best.json` is not a regular file holding a JSON object whose
                `path` is a `best-<step>` name in `directory` (one line naming the file).
        """
        directory = os.fspath(directory)
        pointer = os.path.join(directory, _POINTER)
        if not os.path.lexists(pointer):
            return None
        record = read_json(directory, _POINTER, limit=1 << 16)
        name = record.get("path")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise BoundaryError(f"{pointer}: path must name a best-<step> checkpoint in "
                                f"{directory!r}, got {name!r}")
        step = record.get("step")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise BoundaryError(f"{pointer}: step must be an integer >= 0, got {step!r}")
        value = record.get("value")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                not math.isfinite(value):
            # -Infinity would be a best no evaluation can beat: the run would never save again
            raise BoundaryError(f"{pointer}: value must be a finite number, got {value!r}")
        record["path"] = os.path.join(directory, name)
        return record

    def _adopt_record(self) -> None:
        record = self.read(self.directory)
        if record is None:
            return
        self.path = record["path"]  # replaced (and deleted) by the next save in any case
        if record.get("monitor") == self.quantity.name and record.get("mode") == self.quantity.mode \
                and isinstance(self.quantity.monitor, str):
            self.best_step, self.best_value = record["step"], record["value"]

    def on_eval_end(self, step: int, metrics: Metrics) -> None:
        value = self.quantity.value(metrics)
        if self.quantity.improves(value, self.best_value, self.min_delta):
            self._save(step, value)
            self.best_step, self.best_value = step, value

    def _save(self, step: int, value: float) -> None:
        trainer = self.trainer
        if not trainer.checkpoint_state().is_chief:
            # A non-chief worker of a multi-worker run takes part in the save (it may
            # involve collectives) into a scratch directory it deletes.
            scratch = tempfile.mkdtemp(prefix="multihead-worker-best-")
            try:
                save_checkpoint(os.path.join(scratch, "best"), trainer.model, self.parts,
                                trainer=trainer, targets=self.targets)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            return
        name = f"best-{step}"
        # The checkpoint writer follows a symlink at its names: none is left to follow.
        unlink_symlinks_at(os.path.join(self.directory, name))
        path = save_checkpoint(os.path.join(self.directory, name), trainer.model, self.parts,
                               trainer=trainer, targets=self.targets)
        record = {"path": name, "step": step, "value": value, "monitor": self.quantity.name,
                  "mode": self.quantity.mode}
        pointer = os.path.join(self.directory, _POINTER)
        fd, tmp = temp_file(self.directory, prefix=".best-", suffix=".json")
        with os.fdopen(fd, "w") as fh:
            json.dump(record, fh)
        os.replace(tmp, pointer)
        old, self.path = self.path, path
        if old is not None and os.path.abspath(old) != os.path.abspath(path):
            # Only the old checkpoint's own files in this directory (read() checked its name).
            for file in _own_files(self.directory, os.path.basename(old)):
                os.remove(file)
