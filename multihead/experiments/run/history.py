"""One history per run: `RUN_DIR/history.json`, every evaluation and every segment of the
run, whatever stopped it.

A run trained in one go has one segment; each `multihead train --resume` adds one,
starting at the step of the checkpoint it resumed from. The file is rewritten
atomically after every evaluation and at the end of each `fit`, so a run killed
outright (SIGKILL, power loss) leaves the history of its last evaluation on disk.
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

import json
import os
import time
from typing import Any

from multihead._boundary import BoundaryError, read_json, write_atomic
from multihead.training.callbacks import Callback, Metrics

#: The run's history file, in the run directory.
HISTORY_FILE = "history.json"


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
    """

    def __init__(self, path: str | None, evals: list[tuple[int, Metrics]],
                 segments: list[dict[str, Any]], start_step: int,
                 resumed_from: str | None) -> None:
        self.path = path
        self.evals = list(evals)
        self._earlier = list(segments)
        self.segment: dict[str, Any] = {"start_step": start_step, "resumed_from": resumed_from,
                                        "end_step": start_step, "wall_time_s": 0.0}
        self._started: float | None = None
        self._before = 0.0  # this segment's wall time of its earlier `fit` calls

    @classmethod
    def begin(cls, run_dir: str, start_step: int, resumed_from: str | None = None,
              write: bool = True) -> RunHistory:
        """The history of a run (re)starting at `start_step`.

        Args:
            run_dir: the run directory.
            start_step: the trainer's step now (that of the checkpoint resumed from).
            resumed_from: the checkpoint's path relative to `run_dir`, or None for a new run
                (whose earlier history, if any, is not read).
            write: False for a process that writes nothing (a non-chief worker).

        Raises:
            HistoryError: a resumed run's history file is not one multihead wrote.
        """
        path = os.path.join(run_dir, HISTORY_FILE)
        evals: list[tuple[int, Metrics]] = []
        segments: list[dict[str, Any]] = []
        if resumed_from is not None and os.path.lexists(path):
            evals, segments = _read(run_dir)
            evals = [(step, metrics) for step, metrics in evals if step <= start_step]
        return cls(path if write else None, evals, segments, start_step, resumed_from)

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

    def on_step_end(self, step: int, result: Any) -> None:
        self.segment["end_step"] = step

    def on_eval_end(self, step: int, metrics: Metrics) -> None:
        self.evals.append((step, {h: dict(v) for h, v in metrics.items()}))
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
        tree = {"evals": [{"step": step, "eval": metrics} for step, metrics in self.evals],
                "segments": self.segments}
        write_atomic(self.path, json.dumps(tree, indent=1) + "\n")


def _read(run_dir: str) -> tuple[list[tuple[int, Metrics]], list[dict[str, Any]]]:
    """The evaluations and segments of `RUN_DIR/history.json`."""
    where = os.path.join(run_dir, HISTORY_FILE)
    try:
        tree = read_json(run_dir, HISTORY_FILE)
        evals = [(_int(e["step"]), {str(h): {str(m): float(v) for m, v in values.items()}
                                    for h, values in e["eval"].items()})
                 for e in tree["evals"]]
        segments = [{"start_step": _int(s["start_step"]), "resumed_from": s["resumed_from"],
                     "end_step": _int(s["end_step"]), "wall_time_s": float(s["wall_time_s"])}
                    for s in tree["segments"]]
    except BoundaryError as err:
        raise HistoryError(str(err)) from None
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise HistoryError(f"{where}: not a run history written by multihead ({err}); "
                           "remove it to resume without the earlier evaluations") from None
    return evals, segments


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"step {value!r} is not an integer")
    return value
