"""TensorBoard monitoring of per-head training, written from inside the compiled step.

On steps that do not log, no summary op runs: summaries are gated with
`tf.summary.record_if` on the step counter, which is evaluated in the graph.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator, Mapping, Sequence

import keras
import tensorflow as tf
from tensorboard.plugins.scalar import metadata as scalar_metadata

_SCALAR_METADATA = scalar_metadata.create_summary_metadata(display_name=None, description=None)


def write_scalar(tag: str, value: tf.Tensor | float) -> None:
    """`tf.summary.scalar` with the tag taken literally.

    `tf.summary.scalar` prefixes the enclosing name scope, and inside the
    compiled step that includes `tf.cond` branch scopes (`cond/loss/a`); heads
    with `every > 1` update inside such a branch, so their tags would move.
    """
    tf.summary.write(tag, tf.cast(value, tf.float32), metadata=_SCALAR_METADATA)


class Monitor:
    """Writes per-head training summaries to `<log_dir>/train` and eval ones to `<log_dir>/eval`.

    Tags are grouped by kind then head (`loss/<head>`), so TensorBoard shows one
    card per head in each section and the train and eval runs overlay.

    Args:
        log_dir: the TensorBoard log directory of the run.
        every: scalars are written on steps `0, every, 2*every, ...`.
    """

    def __init__(self, log_dir: str, every: int = 100) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"log every must be an integer >= 1, got {every!r}")
        self.log_dir = os.fspath(log_dir)
        self.every = every
        self._train_writer = tf.summary.create_file_writer(os.path.join(self.log_dir, "train"))
        self._eval_writer: tf.summary.SummaryWriter | None = None

    @contextlib.contextmanager
    def recording(self, step: tf.Tensor) -> Iterator[None]:
        """Context for the body of one compiled step taken at counter value `step`."""
        with self._train_writer.as_default(step=step):
            with tf.summary.record_if(tf.equal(step % self.every, 0)):
                yield

    def head_update(
        self,
        head: str,
        loss: tf.Tensor,
        grads: Sequence[tf.Tensor | None],
        variables: Sequence[keras.Variable],
        optimizer: keras.optimizers.Optimizer,
    ) -> None:
        """Called inside `recording` right after head `head`'s optimizer applied `grads`."""
        del grads, variables, optimizer
        write_scalar(f"loss/{head}", loss)

    def write_eval(self, step: int, metrics: Mapping[str, Mapping[str, float]]) -> None:
        """Writes evaluation results `{head: {metric: value}}` at `step` (eagerly)."""
        if self._eval_writer is None:
            self._eval_writer = tf.summary.create_file_writer(os.path.join(self.log_dir, "eval"))
        with self._eval_writer.as_default(step=step):
            for head, values in metrics.items():
                for name, value in values.items():
                    tf.summary.scalar(f"{name}/{head}", value)
        self._eval_writer.flush()

    def flush(self) -> None:
        self._train_writer.flush()
        if self._eval_writer is not None:
            self._eval_writer.flush()

    def close(self) -> None:
        self._train_writer.close()
        if self._eval_writer is not None:
            self._eval_writer.close()

    def write_scalars(self, step: int, scalars: Mapping[str, float], run: str = "train") -> None:
        """Writes `{tag: value}` at `step` eagerly to the `train` or `eval` run (e.g. RL episode
        returns, whose x axis is environment steps rather than update steps)."""
        if run not in ("train", "eval"):
            raise ValueError(f"run must be 'train' or 'eval', got {run!r}")
        if run == "eval" and self._eval_writer is None:
            self._eval_writer = tf.summary.create_file_writer(os.path.join(self.log_dir, "eval"))
        writer = self._train_writer if run == "train" else self._eval_writer
        with writer.as_default(step=step):
            for tag, value in scalars.items():
                tf.summary.scalar(tag, value)
