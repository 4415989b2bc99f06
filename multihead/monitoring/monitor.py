"""TensorBoard monitoring of per-head training, written from inside the compiled step.

What is logged, per head (tags `kind/head/...`, so TensorBoard's Scalars page has
one section per kind with one card per head, and a Custom Scalars layout has one
section per head, one chart per tag: see `multihead.monitoring.layout`):

* `loss/<head>`: the head's loss (unweighted, without regularization).
* `grad_norm/<head>/trunk`, `grad_norm/<head>/head`: global L2 norm of the
  gradient the head's optimizer applied, split into its trunk part and its head
  part (no trunk part for a head with `trains_trunk=False`).
* `grad_norm/<head>/var/<address>`: per-variable norms (optional); `<address>` is
  the variable's stable address (`trunk/0/kernel`) when `bind` is given them,
  so two builds of one architecture log the same tags.
* `lr/<head>`: the learning rate the optimizer used for this update.
* `update_ratio/<head>`: `||w_after - w_before|| / ||w_before||` over the head's
  var_list, the relative size of the update the optimizer applied.
* `grad_cosine/<a>/<b>`: cosine similarity of heads a and b's trunk gradients
  (gradient conflict when negative), for every pair of heads updated at that
  step, `a` before `b` in head order. Under the `simultaneous` schedule both
  gradients are taken at the same parameters (the gradient conflict of PCGrad,
  Yu et al. 2020). Under `sequential`, it is the cosine of the gradients *as
  applied*: b's gradient is taken at the parameters a's update left.
* `grad_hist/<head>/<address>`: gradient histograms, at their own cadence.
* `gate/<head>/expert_<i>`, `gate/<head>/entropy`, `gate_hist/<head>`: for a trunk
  with gates (MMoE, PLE, ...), the mean weight each head's gate gives each expert
  on the step's batch (expert utilisation), the mean entropy of its gate weights,
  and their histogram (at the histogram cadence); computed at the parameters the
  step starts from (`Monitor.gates`).
* `affinity/<i>/<j>`: with `affinity_every`, the inter-task affinity of head i onto head j
  (Fifty et al. 2021), computed by the step before its updates (`Monitor.affinity`).
* `config` (text, step 0): the resolved experiment config, via `write_config`.
* `trunk_blocks` (text, step 0): with trunk taps, the trunk blocks each head trains
  (`multihead.model.taps.blocks_table`), written by the `Trainer`.

Every tag is built by `multihead.monitoring.tags`, the schema `multihead report` reads.

How: the step measures, the monitor writes. A monitored step body records its
statistics into a `StepStats` (`multihead.monitoring.step_stats`): the per-head update
statistics (`multihead.monitoring.head_updates`), the gates, the affinities, the trunk
rule's aggregation and the step's own counters; values measured inside a conditional (a
head with `every > 1`, the non-finite guard) leave it as outputs. The step returns them,
and `write_stats` writes them after the step, eagerly, at the step's number of updates.
Nothing is written and no variable is assigned for monitoring inside the step.

Cost: on steps that do not log, no monitoring work runs at all. The train step is
compiled twice: a variant that measures, run on logging steps, and one without a
single monitoring op, run on the others; the choice is made in Python from the step
counter (`TrainStep.run` splits a multi-step call at logging steps). In the measuring
variant each piece is gated in the graph on its own cadence (scalars at `every`,
histograms at `histograms_every`). Under a `tf.distribute` strategy the measuring
variant runs every step, each piece gated in the graph (its all-reduces must be the
same ops on every worker). Summary writes by user code (`multihead.write_scalar` in a
research loss) follow the scalar cadence through `tf.summary.record_if`. The writer is
not flushed by the step (it flushes when its queue fills; `Trainer.fit` and `close`
flush).

The per-head update statistics (loss, gradient norms, lr, update ratio, cosines,
gradient histograms) are measured by `multihead.monitoring.head_updates`.
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence

import keras
import tensorflow as tf
from tensorboard.plugins.histogram import metadata as histogram_metadata
from tensorboard.plugins.scalar import metadata as scalar_metadata

from multihead import _keras_internals as internals
from multihead._checks import check_choice
from multihead.monitoring import tags
from multihead.monitoring.cadence import Cadence
from multihead.monitoring.gradient_stats import histogram_buckets
from multihead.monitoring.head_updates import HeadUpdateStats
from multihead.monitoring.layout import custom_scalars_layout
from multihead.monitoring.step_stats import StatsOutput, StepStats, present_entries

if TYPE_CHECKING:  # annotation only
    from tensorboard.plugins.custom_scalar import layout_pb2

_SCALAR_METADATA = scalar_metadata.create_summary_metadata(display_name=None, description=None)
_HISTOGRAM_METADATA = histogram_metadata.create_summary_metadata(display_name=None, description=None)
_SCALAR_BYTES = _SCALAR_METADATA.SerializeToString()
_HISTOGRAM_BYTES = _HISTOGRAM_METADATA.SerializeToString()
_MAX_STATS_WRITERS = 32  # sets of tags written whose writer is kept (a few in a run: every, heads' every)
_EAGER_WRITES = 2  # times a set of tags is written eagerly before it is compiled


def write_scalar(tag: str, value: tf.Tensor | float) -> None:
    """`tf.summary.scalar` with the tag taken literally.

    `tf.summary.scalar` prefixes the enclosing name scope, and inside the
    compiled step that includes `tf.cond` branch scopes (`cond/loss/a`); heads
    with `every > 1` update inside such a branch, so their tags would move.
    """
    tf.summary.write(tag, tf.cast(value, tf.float32), metadata=_SCALAR_METADATA)


class _InStepWriter(tf.summary.SummaryWriter):
    """The train writer as the default writer inside the compiled step, minus the flush.

    `SummaryWriter.as_default()` flushes the writer when the context exits, and
    inside a traced function that is a `FlushSummaryWriter` op run on *every*
    step, logging or not. The writer flushes itself when its queue fills, and
    the Trainer flushes at the end of `fit`.
    """

    def __init__(self, writer: tf.summary.SummaryWriter) -> None:
        self._resource = internals.summary_writer_resource(writer)

    def init(self) -> None:
        return None

    def flush(self) -> None:
        return None

    def close(self) -> None:
        return None


class Monitor:
    """Writes per-head training summaries to `<log_dir>/train` and eval ones to `<log_dir>/eval`.

    The train step uses it: `bind` once (eagerly, before tracing); inside the traced
    body of a monitored step, `start(step)` gives the step's `StepStats`, which the
    step measures into (`updates.before_update` / `updates.head_update` around each
    head's update, `gates`, `affinity`, `scalars`) and returns; after the step,
    `write_stats` writes what it returned. See the module docstring for the tags.

    Example:
        >>> import keras, numpy as np, tempfile, multihead as mh
        >>> model = mh.MultiHeadModel(keras.layers.Dense(8), {"a": keras.layers.Dense(1),
        ...                                                    "b": keras.layers.Dense(1)})
        >>> trainer = mh.Trainer(model, {"a": mh.Objective("mse"), "b": mh.Objective("mse")},
        ...                      log_dir=tempfile.mkdtemp(), log_every=10, histograms_every=0)
        >>> x = np.ones((4, 3), "float32"); y = {"a": np.ones((4, 1)), "b": np.zeros((4, 1))}
        >>> trainer.step((x, y)).step            # the first update is logged, at step 1
        0
        >>> trainer.close()
        >>> sorted(mh.load_report(trainer.monitor.log_dir).conflict["a"])
        ['a', 'b']

    Args:
        log_dir: the TensorBoard log directory of the run.
        every: scalars (losses, norms, lr, update ratios, cosines) are written after
            updates `1, every, 2*every, ...` and after the last update of a `fit`
            (`log_last`). A step's summaries are written at the number of updates
            done, the step axis of evaluations and checkpoints: the first update is
            step 1.
        histograms_every: gradient histograms are written after updates
            `1, histograms_every, ...`; 0 disables them. A histogram step costs
            a few times a plain step, so keep this a multiple of `every`.
        variable_norms: also write each variable's gradient norm.
        grad_cosine: write the cosine of every pair of heads' trunk gradients.
        affinity_every: write the inter-task affinities `affinity/<i>/<j>` after updates
            `1, affinity_every, ...` (`multihead.step.affinity`, docs/affinity.md); 0: never.
        affinity_lookahead: `"optimizer"` (each head's own planned trunk update) or `"sgd"`.
        eval_metrics: head -> the names of the metrics `write_eval` will write for it (the
            loss aside; `Trainer` passes its objectives' metrics): each gets a chart in the
            head's Custom Scalars section, after its loss.
    """

    def __init__(
        self,
        log_dir: str | os.PathLike[str],
        every: int = 100,
        histograms_every: int = 1000,
        variable_norms: bool = False,
        grad_cosine: bool = True,
        affinity_every: int = 0,
        affinity_lookahead: str = "optimizer",
        eval_metrics: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        #: When it writes (scalars, histograms, affinities): `multihead.monitoring.cadence`.
        self.cadence = Cadence(every, histograms_every, affinity_every)
        self.every, self.histograms_every = self.cadence.every, self.cadence.histograms_every
        self.affinity_every = self.cadence.affinity_every
        self.variable_norms = bool(variable_norms)
        self.grad_cosine = bool(grad_cosine)
        self.affinity_lookahead = check_choice(affinity_lookahead, "affinity_lookahead",
                                               ("optimizer", "sgd"))
        self.log_dir = os.fspath(log_dir)
        self._eval_metrics = {h: list(names) for h, names in (eval_metrics or {}).items()}
        self._train_writer = tf.summary.create_file_writer(os.path.join(self.log_dir, "train"))
        #: The train writer's resource handle (None: a writer without one), read once.
        self._train_resource = internals.summary_writer_resource(self._train_writer)
        self._step_writer = (_InStepWriter(self._train_writer)
                             if self._train_resource is not None else self._train_writer)
        self._eval_writer: tf.summary.SummaryWriter | None = None
        #: The per-head update statistics, created by `bind`.
        self._updates: HeadUpdateStats | None = None
        self._stats_writers: dict[Any, Any] = {}  # a set of tags -> its compiled writer
        self._stats_seen: dict[Any, int] = {}  # a set of tags -> how often written eagerly

    # -- set-up (eager) ------------------------------------------------------------------

    def bind(
        self,
        var_lists: Mapping[str, Sequence[keras.Variable]],
        trunk_variables: Sequence[keras.Variable],
        optimizers: Mapping[str, keras.optimizers.Optimizer],
        addresses: Mapping[int, str] | None = None,
        other_tags: Sequence[str] = (),
    ) -> None:
        """Binds the monitor to these heads; call once, eagerly, before tracing.

        Args:
            var_lists: head -> the variables its optimizer is built on, in head order.
            trunk_variables: the trunk's trainable variables; a head's gradient is
                split into its trunk part and its head part by variable identity.
            optimizers: head -> its optimizer (for the learning rate it applies).
            addresses: `id(variable)` -> its stable address (`trunk/0/kernel`), the
                name per-variable tags use; from
                `{id(v): a for a, v in variable_addresses(model).items()}`. A variable
                without one is named by its Keras path (`multi_head_model/dense/kernel`),
                which depends on how many layers the process built before.
            other_tags: scalar tags that others write into the train run at logging
                steps (the trunk rule's `summary_tags()`), for the Custom Scalars layout.
        """
        self._updates = HeadUpdateStats(
            var_lists, trunk_variables, optimizers, addresses, self.cadence,
            variable_norms=self.variable_norms, grad_cosine=self.grad_cosine)
        written = self._updates.scalar_tags() + list(other_tags)
        self._write_layout(custom_scalars_layout(self._updates.heads, written, self._eval_metrics))

    def _write_layout(self, layout: layout_pb2.Layout) -> None:
        """Writes the Custom Scalars layout (see `multihead.monitoring.layout`) at step 0."""
        from tensorboard.plugins.custom_scalar import summary as cs_summary

        layout = cs_summary.pb(layout)
        with self._train_writer.as_default():
            tf.summary.experimental.write_raw_pb(layout.SerializeToString(), step=0)
        self._train_writer.flush()

    def write_config(self, text: str, step: int = 0) -> None:
        """Writes the resolved experiment config (YAML text) as the `config` text summary."""
        self.write_text(tags.CONFIG, text, step)

    def write_text(self, tag: str, text: str, step: int = 0) -> None:
        """Writes plain `text` (a config, a table) as a text summary `tag`, shown verbatim."""
        markdown = "\n".join("    " + line for line in text.splitlines())  # a code block
        with self._train_writer.as_default(step=step):
            tf.summary.text(tag, markdown)
        self._train_writer.flush()

    # -- the cadence ----------------------------------------------------------------------

    def log_last(self, step: int) -> None:
        """Also writes the scalars of update `step` (the last of a `fit`), whatever `every`."""
        self.cadence.log_last(step)

    def logs_at(self, step: int) -> bool:
        """Whether the step taken at counter value `step` writes anything (`Cadence`)."""
        return self.cadence.logs_at(step)

    def quiet_steps_from(self, step: int) -> int:
        """How many consecutive steps from `step` (a step that does not log) do not log."""
        return self.cadence.quiet_steps_from(step)

    # -- inside the traced step: what a monitored step measures ---------------------------

    @property
    def updates(self) -> HeadUpdateStats:
        """The per-head update statistics a monitored step measures (after `bind`)."""
        if self._updates is None or not self._updates.heads:
            raise RuntimeError("Monitor.bind(var_lists, trunk_variables) must be called "
                               "(eagerly) before the step is traced")
        return self._updates

    def start(self, step: tf.Tensor, functional: bool = True) -> StepStats:
        """The measurements of a monitored step taken at counter value `step` (a tensor),
        written at `step + 1`, the number of updates done after it."""
        self.updates  # noqa: B018  (bound: checked before any trace)
        done = step + 1
        return StepStats(done, self.cadence.scalars_due(done), functional)

    @contextlib.contextmanager
    def user_summaries(self, stats: StepStats | None) -> Iterator[None]:
        """Inside a step body: summaries that user code writes (`multihead.write_scalar` in a
        research loss) go to the train run at the step's number of updates, on scalar logging
        steps; with `stats` None (a step that does not log), nowhere."""
        if stats is None:
            with tf.summary.record_if(False):
                yield
            return
        due = stats.scalars_due
        with self._step_writer.as_default(step=stats.done), tf.summary.record_if(lambda: due):
            yield

    @tf.autograph.experimental.do_not_convert  # graph building only
    def gates(self, stats: StepStats, gate_weights: Callable[[], Mapping[str, tf.Tensor]]) -> None:
        """Before the step's updates: per head, the mean gate weight per expert and the mean
        entropy of the gate weights (scalar cadence), and a histogram of the gate weights
        (histogram cadence). `gate_weights()` returns head -> `(batch, experts)` mixture
        weights; it runs only on steps that measure them."""
        def weights() -> dict[str, tf.Tensor]:
            return {h: tf.cast(w, tf.float32) for h, w in gate_weights().items()}

        def scalars() -> None:
            for head, w in weights().items():
                mean = tf.reduce_mean(w, axis=0)
                for i in range(int(mean.shape[0])):
                    stats.record(tags.gate_expert(head, i), mean[i])
                # 0 log 0 = 0: a gate that gives an expert no weight adds nothing.
                stats.record(tags.gate_entropy(head), tf.reduce_mean(
                    -tf.reduce_sum(tf.math.multiply_no_nan(tf.math.log(w), w), -1)))

        def histograms() -> None:
            for head, w in weights().items():
                stats.record(tags.gate_hist(head), histogram_buckets(w), histogram=True)

        stats.gated(stats.scalars_due, scalars)
        if self.histograms_every:
            stats.gated(self.cadence.histograms_due(stats.done), histograms)

    def affinity(self, stats: StepStats, compute: Callable[[], Mapping[str, tf.Tensor]]) -> None:
        """Before the step's updates: on affinity steps (`affinity_every`) the scalars
        `compute()` returns, tag -> value (`affinity/<i>/<j>`); `compute` runs only then."""
        if not self.affinity_every:
            return

        def measure() -> None:
            for tag, value in compute().items():
                stats.record(tag, value)

        stats.gated(self.cadence.affinity_due(stats.done), measure)

    def scalars(self, stats: StepStats, values: Sequence[tuple[str, Callable[[], Any]]]) -> None:
        """On scalar logging steps, `(tag, value())` of each of `values`."""
        for tag, value in values:
            stats.record(tag, value(), present=stats.scalars_due)

    # -- after the step ---------------------------------------------------------------------

    def write_stats(self, step: int, stats: StatsOutput) -> None:
        """Writes what a monitored step measured (`StepStats.outputs()`, eager values) at
        `step`, its number of updates done: each present entry. A set of tags seen a few
        times is then written by one compiled call (its trace costs about as much as a
        hundred eager writes of it: not worth it for the first steps of a run)."""
        scalars, histograms = present_entries(stats)
        key = (tuple(scalars.items()), tuple(histograms.items()))
        write = self._stats_writers.get(key)
        if write is None:
            seen = self._stats_seen[key] = self._stats_seen.get(key, 0) + 1
            if seen <= _EAGER_WRITES or len(self._stats_writers) >= _MAX_STATS_WRITERS:
                self._write_stats(tf.constant(step, tf.int64), stats.scalars.numpy(),
                                  stats.histograms.numpy(), scalars, histograms)
                return
            write = self._stats_writers[key] = tf.function(
                lambda s, v, h: self._write_stats(s, v, h, scalars, histograms), autograph=False)
        write(tf.constant(step, tf.int64), stats.scalars, stats.histograms)

    def _write_stats(self, step: tf.Tensor, scalar_values: Any, histogram_values: Any,
                     scalars: Mapping[int, str], histograms: Mapping[int, str]) -> None:
        """Writes the scalars and histograms at these positions (position -> tag) at `step`."""
        resource = self._train_resource
        for values, tags_at, metadata, serialized in (
                (scalar_values, scalars, _SCALAR_METADATA, _SCALAR_BYTES),
                (histogram_values, histograms, _HISTOGRAM_METADATA, _HISTOGRAM_BYTES)):
            for i, tag in tags_at.items():
                if resource is None:  # a writer without the handle: the public path
                    with self._train_writer.as_default(step=step):
                        tf.summary.write(tag, values[i], metadata=metadata)
                else:  # straight to the writer: no `record_if` conditional per tag
                    tf.raw_ops.WriteSummary(writer=resource, step=step, tensor=values[i], tag=tag,
                                            summary_metadata=serialized)

    # -- eager ---------------------------------------------------------------------------

    def write_eval(self, step: int, metrics: Mapping[str, Mapping[str, float]]) -> None:
        """Writes evaluation results `{head: {metric: value}}` at `step` (eagerly)."""
        if self._eval_writer is None:
            self._eval_writer = tf.summary.create_file_writer(os.path.join(self.log_dir, "eval"))
        with self._eval_writer.as_default(step=step):
            for head, values in metrics.items():
                for name, value in values.items():
                    tf.summary.scalar(tags.eval_metric(name, head), value)
        self._eval_writer.flush()

    def write_scalars(self, step: int, scalars: Mapping[str, float], run: str = "train") -> None:
        """Writes `{tag: value}` at `step` eagerly to the `train` or `eval` run (e.g. RL episode
        returns, whose x axis is environment steps rather than update steps)."""
        check_choice(run, "run", ("train", "eval"))
        if run == "eval" and self._eval_writer is None:
            self._eval_writer = tf.summary.create_file_writer(os.path.join(self.log_dir, "eval"))
        writer = self._train_writer if run == "train" else self._eval_writer
        with writer.as_default(step=step):
            for tag, value in scalars.items():
                tf.summary.scalar(tag, value)

    def flush(self) -> None:
        """Writes buffered events to disk."""
        self._train_writer.flush()
        if self._eval_writer is not None:
            self._eval_writer.flush()

    def close(self) -> None:
        """Flushes and closes the event files."""
        self._train_writer.close()
        if self._eval_writer is not None:
            self._eval_writer.close()
