"""A one-line progress display for long runs: step, steps/s, ETA, per-head losses."""

from __future__ import annotations

import math
import sys
import time
from typing import Mapping, TextIO


class Progress:
    """Prints progress of a run of `total` steps to `stream`; with `per_epoch` (steps an
    epoch) the line starts with the epoch, `epoch e/E`.

    On a terminal the line is redrawn at most every `interval` seconds; in a log
    file (not a tty) a line is appended every `log_interval` seconds, so CI logs
    and `nohup` files stay readable.
    """

    def __init__(self, total: int, stream: TextIO | None = None, interval: float = 0.25,
                 log_interval: float = 10.0, per_epoch: int | None = None) -> None:
        self.total = total
        self.per_epoch = per_epoch
        self.stream = stream if stream is not None else sys.stderr
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._interval = interval if self._tty else log_interval
        self._start: float | None = None  # set at the first update: excludes tracing
        self._first = 0
        self._last = -math.inf
        self._losses: dict[str, float] = {}
        self._shown = -1

    def update(self, done: int, losses: Mapping[str, float], force: bool = False) -> None:
        """Records that `done` steps are finished, with the latest per-head losses."""
        self._losses.update(losses)
        now = time.perf_counter()
        if self._start is None:
            self._start, self._first = now, done
        if not force and now - self._last < self._interval:
            return
        self._last = now
        self._shown = done
        elapsed = max(now - self._start, 1e-9)
        rate = (done - self._first) / elapsed
        eta = (self.total - done) / rate if rate > 0 else float("inf")
        width = len(str(self.total))
        heads = "  ".join(f"{h}={v:.4g}" for h, v in self._losses.items())
        line = (f"{self._epoch(done)}step {done:>{width}}/{self.total}  {rate:7.1f} steps/s  "
                f"eta {_duration(eta)}  loss {heads}")
        if self._tty:
            self.stream.write("\r" + line + "\x1b[K")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def note(self, line: str) -> None:
        """Prints `line` on a line of its own (on a terminal, over the progress line, which
        the next update redraws below it)."""
        self.stream.write(("\r" + line + "\x1b[K\n") if self._tty else line + "\n")
        self.stream.flush()
        self._shown = -1

    def _epoch(self, done: int) -> str:
        """`epoch e/E  ` (the epoch the step `done` belongs to), or "" without epochs."""
        if not self.per_epoch:
            return ""
        epochs = -(-self.total // self.per_epoch)
        return f"epoch {max(1, -(-done // self.per_epoch))}/{epochs}  "

    def close(self, done: int) -> None:
        """Prints the final line (unless it is already shown)."""
        if self._shown != done:
            self.update(done, {}, force=True)
        if self._tty:
            self.stream.write("\n")
            self.stream.flush()


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "--"
    seconds = int(round(seconds))
    minutes, secs = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
