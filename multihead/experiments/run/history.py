"""One history per run: `RUN_DIR/history.json`, every evaluation and every segment of the
run, whatever stopped it.

A run trained in one go has one segment; each `multihead train --resume` adds one,
starting at the step of the checkpoint it resumed from. The file is rewritten
atomically after every evaluation, at the end of each `fit`, at each checkpoint step and
at least every `SAVE_EVERY_S` seconds of training, so a segment killed outright
(SIGKILL, power loss) ends at the last step it recorded: at or past the checkpoint a
resume starts from, within seconds of the last step run. On a full disk, where no new
file can be created, the history is rewritten in place within the blocks of the file
(created when the run's first segment starts), so a failed segment is kept.
A resume keeps the evaluations up to the step of its checkpoint (those after it are
made again by the resumed run), so `metrics.json` lists every evaluation from the
first step, each once, as in an uninterrupted run.

Example:
    >>> history = RunHistory.begin("runs/x", start_step=800,                # doctest: +SKIP
    ...                            resumed_from="checkpoints/ckpt-800")
    >>> trainer.fit(..., callbacks=[history])                                # doctest: +SKIP
    >>> history.wall_time_s, [step for step, _ in history.evals]            # doctest: +SKIP
"""

from __future__ import annotations

import errno
import json
import os
import time
from typing import Any, Sequence

from multihead._boundary import BoundaryError, read_json, rewrite_in_place, write_atomic
from multihead._checks import check_float, check_int, describe
from multihead.training.callbacks import Callback, Metrics

#: The run's history file, in the run directory.
HISTORY_FILE = "history.json"
#: The longest a segment's record lags behind its training, in seconds of training.
SAVE_EVERY_S = 2.0


class HistoryError(ValueError):
    """The run's history file cannot be read back (not written by multihead)."""


class RunHistory(Callback):
    """A `fit` callback that records the run's evaluations and this segment's wall time,
    rewriting `RUN_DIR/history.json` after each evaluation and at the end of `fit`.

    Build it with `begin`, which reads the history of the earlier segments.

    Args:
        path: the history file; None writes nothing (a non-chief worker).
        evals: the evaluations kept from earlier segments, `(step, metrics)`.
        segments: the earlier segments, as recorded.
        start_step: the step this segment starts from.
        resumed_from: the checkpoint it resumed from (relative to the run directory),
            None for a run's first segment.
        checkpoint_every: the run's checkpoint cadence (0: none): the history is rewritten
            at these steps too, before the checkpoint, so a resume never starts past the
            end of the segment it continues.
    """

    def __init__(self, path: str | None, evals: list[tuple[int, Metrics]],
                 segments: list[dict[str, Any]], start_step: int,
                 resumed_from: str | None, checkpoint_every: int = 0) -> None:
        self.path = path
        self.evals = list(evals)
        self._earlier = list(segments)
        self.segment: dict[str, Any] = {"start_step": start_step, "resumed_from": resumed_from,
                                        "end_step": start_step, "wall_time_s": 0.0}
        self._started: float | None = None
        self._before = 0.0  # this segment's wall time of its earlier `fit` calls
        self.checkpoint_every = checkpoint_every
        self._saved: tuple[float, int] = (time.perf_counter(), start_step)  # when, at which step

    @classmethod
    def begin(cls, run_dir: str, start_step: int, resumed_from: str | None = None,
              write: bool = True, checkpoint_every: int = 0) -> RunHistory:
        """The history of a run (re)starting at `start_step`.

        Args:
            run_dir: the run directory.
            start_step: the trainer's step now (that of the checkpoint resumed from).
            resumed_from: the checkpoint's path relative to `run_dir`, or None for a new run
                (whose earlier history, if any, is not read).
            write: False for a process that writes nothing (a non-chief worker).
            checkpoint_every: the run's checkpoint cadence (see the class).

        Raises:
            HistoryError: a resumed run's history file is not one multihead wrote.
        """
        path = os.path.join(run_dir, HISTORY_FILE)
        evals: list[tuple[int, Metrics]] = []
        segments: list[dict[str, Any]] = []
        if resumed_from is not None and os.path.lexists(path):
            evals, segments = read_history(run_dir)
            evals = [(step, metrics) for step, metrics in evals if step <= start_step]
        return cls(path if write else None, evals, segments, start_step, resumed_from,
                   checkpoint_every)

    @property
    def segments(self) -> list[dict[str, Any]]:
        """Every segment of the run, this one last: start step, checkpoint resumed from,
        last step recorded, wall time in seconds."""
        return [*self._earlier, dict(self.segment)]

    @property
    def wall_time_s(self) -> float:
        """Seconds spent training, summed over the segments."""
        return sum(s["wall_time_s"] for s in self.segments)

    @property
    def steps_per_s(self) -> float | None:
        """Steps run per second of training, over every segment (the steps a crashed segment
        ran past its last checkpoint count: they were run), or None before any step."""
        steps = sum(s["end_step"] - s["start_step"] for s in self.segments)
        wall = self.wall_time_s
        return steps / wall if wall and steps else None

    def on_train_begin(self) -> None:
        self._started = time.perf_counter()
        if self.path is not None and not os.path.lexists(self.path):
            self.save()  # from the first step on, the file has blocks to rewrite on a full disk

    def on_step_end(self, step: int, result: Any) -> None:
        self.segment["end_step"] = step

    def on_eval_end(self, step: int, metrics: Metrics) -> None:
        self.evals.append((step, {h: dict(v) for h, v in metrics.items()}))
        self.save()

    def on_call_end(self, step: int) -> None:
        when, at = self._saved
        every = self.checkpoint_every
        if (every and step // every > at // every) or \
                time.perf_counter() - when >= SAVE_EVERY_S:
            self.save()

    def on_train_end(self) -> None:
        self._clock()
        self._before, self._started = self.segment["wall_time_s"], None
        if self.segment["end_step"] > self.segment["start_step"]:
            self.save()

    def _clock(self) -> None:
        if self._started is not None:
            self.segment["wall_time_s"] = self._before + time.perf_counter() - self._started

    def save(self) -> None:
        """Rewrites the history file (atomically) with what is known now."""
        self._clock()
        if self.path is None:
            return
        self._saved = (time.perf_counter(), self.segment["end_step"])
        tree = {"evals": [{"step": step, "eval": metrics} for step, metrics in self.evals],
                "segments": self.segments}
        try:
            write_atomic(self.path, json.dumps(tree, indent=1) + "\n")
        except OSError as err:
            # No room for a new file: the same record, compact, in the file's own blocks. The
            # disk stays full, so the run fails at its next write of another file.
            if err.errno not in (errno.ENOSPC, errno.EDQUOT) or \
                    not rewrite_in_place(self.path, json.dumps(tree, separators=(",", ":"))):
                raise


def read_history(run_dir: str, heads: Sequence[str] | None = None,
                 ) -> tuple[list[tuple[int, Metrics]], list[dict[str, Any]]]:
    """The evaluations and segments of `RUN_DIR/history.json`, checked field by field:
    evaluations at increasing steps of `heads` only (when given), with finite values;
    segments that end at or after they start, start in order, and took a finite,
    non-negative wall time.

    Raises:
        HistoryError: one line naming the file and the field.
    """
    where = os.path.join(run_dir, HISTORY_FILE)
    try:
        tree = read_json(run_dir, HISTORY_FILE)
        return _evals(tree, where, heads), _segments(tree, where)
    except BoundaryError as err:
        raise HistoryError(str(err)) from None


def _list(tree: dict[str, Any], key: str, where: str) -> list[Any]:
    value = tree.get(key)
    if not isinstance(value, list):
        raise BoundaryError(f"{where}: {key} must be a list, got {describe(value)}")
    return value


def _object(value: Any, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BoundaryError(f"{field} must be an object, got {describe(value)}")
    return value


def _evals(tree: dict[str, Any], where: str, heads: Sequence[str] | None,
           ) -> list[tuple[int, Metrics]]:
    evals, last = [], 0
    for i, entry in enumerate(_list(tree, "evals", where)):
        field = f"{where}: evals[{i}]"
        entry = _object(entry, field)
        last = check_int(entry.get("step"), f"{field}.step", minimum=last + 1,
                         hint="steps in order", error=BoundaryError)
        metrics = {}
        for head, values in _object(entry.get("eval"), f"{field}.eval").items():
            if heads is not None and head not in heads:
                raise BoundaryError(f"{field}.eval: head {head!r} is not a head of this run "
                                    f"({', '.join(heads)})")
            metrics[head] = {str(name): check_float(value, f"{field}.eval.{head}.{name}",
                                                    error=BoundaryError)
                             for name, value in _object(values, f"{field}.eval.{head}").items()}
        evals.append((last, metrics))
    return evals


def _segments(tree: dict[str, Any], where: str) -> list[dict[str, Any]]:
    segments, last = [], 0
    for i, entry in enumerate(_list(tree, "segments", where)):
        field = f"{where}: segments[{i}]"
        entry = _object(entry, field)
        start = check_int(entry.get("start_step"), f"{field}.start_step", minimum=last,
                          hint="segments in order", error=BoundaryError)
        end = check_int(entry.get("end_step"), f"{field}.end_step", minimum=start,
                        hint="a segment ends at or after its start_step", error=BoundaryError)
        resumed_from = entry.get("resumed_from")
        if not isinstance(resumed_from, (str, type(None))):
            raise BoundaryError(f"{field}.resumed_from must be a checkpoint path or null, got "
                                f"{describe(resumed_from)}")
        wall = check_float(entry.get("wall_time_s"), f"{field}.wall_time_s", minimum=0,
                           error=BoundaryError)
        segments.append({"start_step": start, "resumed_from": resumed_from, "end_step": end,
                         "wall_time_s": wall})
        last = start
    return segments
