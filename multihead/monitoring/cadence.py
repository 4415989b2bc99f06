"""When the monitor writes: the cadences of scalars, histograms and inter-task affinities.

A step taken at counter value `step` is written at `done = step + 1`, the number of
updates done after it: evaluations and checkpoints count steps the same way. Each kind
is written after update 1 and every multiple of its period; the scalars also after the
last update of a `fit` (`log_last`). The host decides which compiled variant a step runs
(`logs_at`, `quiet_steps_from`); in the graph, each piece of a logging step is gated on
its own cadence (`scalars_due`, `histograms_due`, `affinity_due`).

Example:
    >>> cadence = Cadence(every=10, histograms_every=0, affinity_every=4)
    >>> [step for step in range(12) if cadence.logs_at(step)]
    [0, 3, 7, 9, 11]
    >>> cadence.quiet_steps_from(4)
    3
"""

from __future__ import annotations

import tensorflow as tf

from multihead._checks import check_int


class Cadence:
    """The periods of a monitor's summaries, and the last update of the running `fit`.

    Args:
        every: scalars every this many updates (>= 1).
        histograms_every: histograms every this many updates; 0: never.
        affinity_every: inter-task affinities every this many updates; 0: never.
    """

    def __init__(self, every: int = 100, histograms_every: int = 1000,
                 affinity_every: int = 0) -> None:
        self.every = check_int(every, "every", minimum=1,
                               hint="scalars are written every this many steps")
        self.histograms_every = check_int(histograms_every, "histograms_every", minimum=0,
                                          hint="0 disables histograms")
        self.affinity_every = check_int(affinity_every, "affinity_every", minimum=0,
                                        hint="0 disables the inter-task affinities")
        with tf.init_scope():  # read by the compiled step: the step `log_last` names
            self._last = tf.Variable(tf.constant(-1, tf.int64), trainable=False, name="monitor_last")
        self._last_step = -1

    def log_last(self, step: int) -> None:
        """Also writes the scalars of update `step` (the last of a `fit`), whatever `every`."""
        self._last_step = int(step)
        self._last.assign(self._last_step)

    def scalars_due(self, done: tf.Tensor) -> tf.Tensor:
        """In the graph: whether update `done` writes scalars."""
        return (tf.equal(done % self.every, 0) | tf.equal(done, 1)
                | tf.equal(done, self._last.read_value()))

    def histograms_due(self, done: tf.Tensor) -> tf.Tensor:
        """In the graph: whether update `done` writes histograms."""
        return _due(done, self.histograms_every)

    def affinity_due(self, done: tf.Tensor) -> tf.Tensor:
        """In the graph: whether update `done` writes affinities."""
        return _due(done, self.affinity_every)

    def logs_at(self, step: int) -> bool:
        """Whether the step taken at counter value `step` writes anything."""
        done = step + 1
        return (done in (1, self._last_step)
                or any(every and done % every == 0 for every in self._periods()))

    def quiet_steps_from(self, step: int) -> int:
        """How many consecutive steps from `step` (a step that does not log) do not log."""
        done = step + 1
        gaps = [every - done % every for every in self._periods() if every]
        if self._last_step > done:
            gaps.append(self._last_step - done)
        return min(gaps)

    def _periods(self) -> tuple[int, int, int]:
        return self.every, self.histograms_every, self.affinity_every


def _due(done: tf.Tensor, every: int) -> tf.Tensor:
    if not every:
        return tf.constant(False)
    return tf.equal(done % every, 0) | tf.equal(done, 1)
