"""`Evaluator`: per-head losses and metrics over a whole dataset in one compiled call;
`Evaluations`: which evaluators a trainer runs on which data.

A head's evaluation loss is the example-weighted mean of its batch losses:
`sum_b loss_b * n_b / sum_b n_b`, where `loss_b` is the head's loss (a batch
mean) on batch `b` of `n_b` examples; so a short last batch counts for its size.
For a head with a missing-label marker (`Objective.missing_label`), `n_b` counts
the rows with a present label, its metrics see those rows only, and with no
present label at all its results are NaN.
The sum is kept in float64. Metrics are Keras metric objects owned by one
`Evaluator` each, reset at the start of every evaluation.

The loop over the batches runs in the graph (`multihead.step.compiled.fold_batches`,
the in-graph loop over a data iterator that `multihead.step.compiled` gives the train
step too), so an evaluation is one call, traced once per dataset element spec, and
the host reads one vector at the end.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping, Sequence

import keras
import tensorflow as tf

from multihead._autograph import converted, plain
from multihead.step.compiled import fold_batches
from multihead.model.model_view import HeadsModel
from multihead.objectives.objective import (
    HeadLoss,
    LossSpec,
    MetricSpec,
    label_marker,
    present_labels,
    resolve_metric,
    split_weighted,
)
from multihead.model.taps import with_trunk_reads

#: `{head: {"loss": value, <metric name>: value}}`.
EvalResults = dict[str, dict[str, float]]


def accepts_training(loss: HeadLoss) -> bool:
    """Whether `loss` takes a `training` keyword argument (an explicit parameter of
    that name, as Keras decides for a layer's `call`)."""
    try:
        parameter = inspect.signature(loss).parameters.get("training")
    except (TypeError, ValueError):
        return False
    return parameter is not None and parameter.kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _shape(value: Any) -> tuple[int | None, ...] | str:
    shape = getattr(value, "shape", None)
    return tuple(shape) if shape is not None else type(value).__name__


def check_metrics(outputs: Mapping[str, Any], targets: Any,
                  metrics: Mapping[str, Sequence[keras.metrics.Metric]]) -> None:
    """Runs every metric once on one batch, eagerly, and resets it.

    Call it on the first batch before training, so that a metric that cannot be
    computed on its head's outputs fails then rather than at the first evaluation.

    Args:
        outputs: the model's outputs on the batch, head -> output.
        targets: the batch's targets, head -> labels.
        metrics: head -> the metric objects to check (their state is reset after).

    Raises:
        ValueError: naming the metric and head, with the shapes of outputs and
            labels and the first line of the error the metric raised; or a head
            with metrics and no labels in `targets`; or a metric whose result is
            not a scalar.
    """
    for head, head_metrics in metrics.items():
        if not head_metrics:
            continue
        names = [m.name for m in head_metrics]
        if not isinstance(targets, Mapping) or head not in targets:
            keys = sorted(targets) if isinstance(targets, Mapping) else type(targets).__name__
            raise ValueError(
                f"head {head!r} has metrics {names}, which compare its outputs with labels, but "
                f"the data has no labels for it (targets: {keys}); give targets[{head!r}] or "
                "drop the metrics")
        y_true, y_pred = split_weighted(targets[head])[0], outputs[head]
        for metric in head_metrics:
            try:
                metric.update_state(y_true, y_pred)
                result = metric.result()
            except (ValueError, TypeError, tf.errors.OpError) as err:
                raise ValueError(
                    f"metric {metric.name!r} of head {head!r} cannot be computed on its outputs "
                    f"(shape {_shape(y_pred)}) and labels (shape {_shape(y_true)}): "
                    f"{_first_line(err)}") from None
            finally:
                metric.reset_state()
            if not isinstance(result, Mapping) and tf.size(result) == 1:
                continue
            raise ValueError(
                f"metric {metric.name!r} of head {head!r} gives a result of shape "
                f"{_shape(result)}; only scalar metrics can be reported (e.g. set the metric's "
                "`average` argument, or use one metric per class)")


def _owned_copy(metric: keras.metrics.Metric, head: str) -> keras.metrics.Metric:
    """A new metric object equal to `metric`, so no two evaluators share state."""
    try:
        return type(metric).from_config(metric.get_config())
    except Exception as err:  # noqa: BLE001 - user metrics' get_config/from_config raise anything
        raise ValueError(
            f"head {head!r}: the metric object {metric.name!r} cannot be copied through "
            f"get_config/from_config ({_first_line(err)}); each evaluator needs its own metric "
            "state: give the metric as a name, a Keras serialization dict or a function "
            "(y_true, y_pred), or implement get_config") from None


class Evaluator:
    """Per-head losses and metrics of a model over a dataset, in one compiled call.

    The model is called with `training=False`; a head loss that takes a `training`
    keyword gets `training=False`. Results equal an eager loop over the batches
    that sums `float(loss) * batch_size` per head and divides by the number of
    examples, and updates each Keras metric on each batch.

    Example:
        >>> import keras, numpy as np, tensorflow as tf, multihead as mh
        >>> from multihead.objectives.objective import resolve_loss
        >>> model = mh.MultiHeadModel(keras.layers.Dense(4), {"y": keras.layers.Dense(1)})
        >>> model.build((None, 3))
        >>> evaluator = Evaluator(model, {"y": resolve_loss("mse", "y")}, metrics={"y": ["mae"]})
        >>> data = tf.data.Dataset.from_tensor_slices(
        ...     (np.ones((10, 3), "float32"), {"y": np.zeros((10, 1), "float32")})).batch(4)
        >>> sorted(evaluator.evaluate(data)["y"])
        ['loss', 'mean_absolute_error']

    Args:
        model: the model; built by the first evaluation or check if it is not yet.
        losses: head -> resolved loss `(inputs, targets, output) -> scalar batch mean`
            (see `multihead.objectives.objective.resolve_loss`); the heads evaluated, in
            the model's head order.
        metrics: head -> metric specs (names, dicts, functions or metric objects;
            a metric object is copied, never shared).
        loss_specs: head -> the loss spec the loss was resolved from, which decides
            what `"accuracy"` and `"crossentropy"` mean (see `resolve_metric`).
        predictions: objective name -> `(outputs, inputs) -> what its loss and metrics
            compare with its labels` (`multihead.objectives.parts.Prediction`), for the
            objectives that are not a head's own output; their names may be any.

    Raises:
        ValueError: a head that is not the model's, an unknown metric.
    """

    def __init__(
        self,
        model: HeadsModel,
        losses: Mapping[str, HeadLoss],
        metrics: Mapping[str, Sequence[MetricSpec]] | None = None,
        loss_specs: Mapping[str, LossSpec] | None = None,
        predictions: Mapping[str, Callable[[Mapping[str, Any], Any], Any]] | None = None,
    ) -> None:
        if not isinstance(model, HeadsModel):
            raise TypeError(f"model must be a MultiHeadModel, got {type(model).__name__}")
        metrics = dict(metrics or {})
        loss_specs = dict(loss_specs or {})
        self._predictions = dict(predictions or {})
        model.check_heads([n for n in losses if n not in self._predictions], "losses")
        for what, keys in [("metrics", metrics), ("loss_specs", loss_specs)]:
            model.check_heads([k for k in keys if k not in self._predictions], what)
            without_loss = [h for h in keys if h not in losses]
            if without_loss:
                raise ValueError(f"{what} names head {without_loss[0]!r}, which has no loss in "
                                 f"losses (heads evaluated: {list(losses)})")
        self._model = model
        self._heads = tuple([h for h in model.head_names if h in losses]
                            + [n for n in losses if n not in model.head_names])
        self._losses = {h: losses[h] for h in self._heads}
        self._loss_training = {h: accepts_training(losses[h]) for h in self._heads}
        self.metrics: dict[str, list[keras.metrics.Metric]] = {}
        for head in self._heads:
            specs = metrics.get(head, ())
            specs = [specs] if isinstance(specs, (str, Mapping, keras.metrics.Metric)) else specs
            self.metrics[head] = []
            for spec in specs:
                metric = resolve_metric(spec, head, loss_specs.get(head))
                self.metrics[head].append(_owned_copy(metric, head) if metric is spec else metric)
            names = [m.name for m in self.metrics[head]]
            repeated = sorted({n for n in names if names.count(n) > 1} | ({"loss"} & set(names)))
            if repeated:
                raise ValueError(f"head {head!r}: two results would be named {repeated[0]!r}; give "
                                 "the metrics distinct names (the loss is reported as 'loss')")
        #: How many times the evaluation was traced: once per dataset element spec.
        self.trace_count = 0
        self._checked: set[str] = set()
        self._run = tf.function(self._evaluate_all, reduce_retracing=True)

    @property
    def heads(self) -> tuple[str, ...]:
        """The heads evaluated, in the model's order."""
        return self._heads

    def check(self, batch: Any) -> None:
        """Runs the model (eagerly, building it if needed) and every metric once on
        `batch = (inputs, targets)`; see `check_metrics`. Metric state is reset after.

        Raises:
            ValueError: naming the head of a metric that cannot be computed.
        """
        inputs, targets = _split(batch)
        outputs = self._predicted(self._model(inputs, training=False), inputs)
        check_metrics(outputs, targets, self.metrics)

    def _predicted(self, outputs: Mapping[str, Any], inputs: Any) -> dict[str, Any]:
        """Evaluated name -> what its loss and metrics compare with the labels."""
        reads = [r for p in self._predictions.values() for r in getattr(p, "reads", ())]
        outputs = with_trunk_reads(self._model, inputs, outputs, reads, training=False)
        return {h: outputs[h] if h not in self._predictions else self._predictions[h](outputs, inputs)
                for h in self._heads}

    def check_dataset(self, dataset: tf.data.Dataset) -> None:
        """`check` on the first batch of `dataset`, once per dataset element spec: later
        calls (and `evaluate`) with data of the same spec do nothing.

        Raises:
            ValueError: the dataset yields no batch, or a metric cannot be computed.
        """
        if not isinstance(dataset, tf.data.Dataset):
            raise TypeError(f"dataset must be a tf.data.Dataset, got {type(dataset).__name__}; "
                            "turn arrays into one with multihead.as_dataset(..., shuffle=False)")
        spec = repr(dataset.element_spec)
        if spec in self._checked:
            return
        first = next(iter(dataset), None)
        if first is None:
            raise ValueError("the evaluation data yielded no batch")
        self.check(first)
        self._checked.add(spec)

    def evaluate(self, dataset: tf.data.Dataset) -> EvalResults:
        """Per-head loss and metrics over every batch of `dataset`.

        The first evaluation of a dataset element spec checks the metrics on its
        first batch (see `check_dataset`) and traces the compiled loop.

        Args:
            dataset: a finite batched dataset of `(inputs, targets)`, targets a dict
                head -> labels (heads with a research loss may have none).

        Returns:
            `{head: {"loss": value, <metric name>: value, ...}}`.

        Raises:
            ValueError: the dataset yields no batch, or a metric cannot be computed.
        """
        self.check_dataset(dataset)
        values = self._run(iter(dataset)).numpy().tolist()
        count, values = values[0], values[1:]
        if count == 0:
            raise ValueError("the evaluation data yielded no batch")
        results: EvalResults = {}
        for i, head in enumerate(self._heads):
            results[head] = {"loss": values[i]}
        rest = iter(values[len(self._heads):])
        for head in self._heads:
            results[head].update({m.name: next(rest) for m in self.metrics[head]})
        return results

    # -- compiled ---------------------------------------------------------------------

    def _evaluate_all(self, iterator: Any) -> tf.Tensor:
        """`[examples, loss per head..., metric result per head and metric...]`, float64."""
        self.trace_count += 1  # Python side effect: runs once per trace
        metrics = [m for h in self._heads for m in self.metrics[h]]
        for metric in metrics:
            metric.reset_state()

        k = len(self._heads)

        def add(batch: Any, carry: tuple[tf.Tensor, tf.Tensor, tf.Tensor],
                ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
            count, rows, totals = carry
            inputs, targets = _split(batch)
            n = tf.cast(tf.shape(tf.nest.flatten(inputs)[0])[0], tf.float64)
            losses, present = self._batch_losses(inputs, targets, n)
            return count + n, rows + present, totals + present * losses

        # Only the loop over the batches is autograph's; the evaluation's own code is plain
        # Python, a user's loss or metric converted as in the step (`multihead._autograph`).
        count, rows, totals = fold_batches(
            iterator, plain(add), (tf.constant(0.0, tf.float64), tf.zeros([k], tf.float64),
                            tf.zeros([k], tf.float64)))
        # a head without any present label: NaN, not 0
        losses = tf.where(rows > 0, totals / tf.maximum(rows, 1.0), float("nan"))
        results = [tf.cast(tf.reshape(m.result(), []), tf.float64) for m in metrics]
        return tf.concat([[count], losses, tf.stack(results) if results else tf.zeros([0], tf.float64)],
                         axis=0)

    def _batch_losses(self, inputs: Any, targets: Any, n: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """One batch of `n` examples: each head's loss and its number of present labels
        (float64, in head order); updates the metrics."""
        outputs = self._predicted(self._model(inputs, training=False), inputs)
        losses, counts = [], []
        for head in self._heads:
            output = outputs[head]
            if self._loss_training[head]:
                loss = self._losses[head](inputs, targets, output, training=False)
            else:
                loss = self._losses[head](inputs, targets, output)
            loss = tf.convert_to_tensor(loss)
            if loss.shape.rank != 0:
                raise ValueError(
                    f"the loss of head {head!r} must be a scalar, got shape {loss.shape}; "
                    "reduce it (e.g. tf.reduce_mean) inside the loss function")
            losses.append(tf.cast(loss, tf.float64))
            marker = label_marker(self._losses[head])
            if marker is None and not self.metrics[head]:
                counts.append(n)
                continue
            labels, weight = split_weighted(targets[head])
            if marker is None:
                counts.append(n)
                for metric in self.metrics[head]:
                    converted(metric.update_state)(labels, output, sample_weight=weight)
                continue
            present, labels = present_labels(labels, marker)
            counts.append(tf.reduce_sum(tf.cast(present, tf.float64)))
            kept = tf.cast(present, tf.float32)
            if weight is not None:
                kept = kept * tf.cast(tf.reshape(weight, [-1]), tf.float32)
            for metric in self.metrics[head]:
                converted(metric.update_state)(labels, output, sample_weight=kept)
        return tf.stack(losses), tf.stack(counts)


def _split(batch: Any) -> tuple[Any, Any]:
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return batch[0], batch[1]
    raise TypeError("a batch must be a pair (inputs, targets) with targets a dict head -> labels, "
                    f"got {type(batch).__name__}")


class Evaluations:
    """What evaluating data runs for a trainer: every objective's evaluator on one dataset,
    or, for a dict head -> data, each head's own evaluator on its own data.

    The evaluator of every objective is built at construction, so a bad metric name fails
    there; each head's own evaluator is built when first used.

    Args:
        model: the model.
        objectives: name -> `Objective`, in order.
        loss_fns: name -> its resolved loss.
        predictions: name -> what its loss and metrics see of the outputs.
        feed: turns data into checked datasets (`multihead.training.streams.DataFeed`).
    """

    def __init__(self, model: HeadsModel, objectives: Mapping[str, Any],
                 loss_fns: Mapping[str, HeadLoss], predictions: Mapping[str, Any],
                 feed: Any) -> None:
        self._model, self._objectives, self._feed = model, objectives, feed
        self._loss_fns, self._predictions = loss_fns, predictions
        self._names = tuple(objectives)
        self._all = self._evaluator_of(self._names)
        self._heads: dict[str, Evaluator] = {}

    def metric_names(self) -> dict[str, list[str]]:
        """Objective name -> the names of its metrics, as `evaluate` reports them (the loss
        aside): the `<metric>/<name>` tags of the eval run."""
        return {n: [m.name for m in self._all.metrics[n]] for n in self._names}

    def _evaluator_of(self, names: Sequence[str]) -> Evaluator:
        """The evaluator of the objectives `names`."""
        return Evaluator(self._model, {n: self._loss_fns[n] for n in names},
                         metrics={n: self._objectives[n].metrics for n in names},
                         loss_specs={n: self._objectives[n].loss for n in names},
                         predictions={n: self._predictions[n] for n in names})

    def runs(self, data: Any, batch_size: int | None) -> list[tuple[Evaluator, tf.data.Dataset]]:
        """Each evaluator `data` runs, with its dataset."""
        if not isinstance(data, Mapping):
            return [(self._all, self._feed.eval_dataset(data, batch_size))]
        self._feed.check_head_data(data, "eval_data")
        runs = []
        for head in self._names:
            evaluator = self._heads.get(head)
            if evaluator is None:
                evaluator = self._heads[head] = self._evaluator_of((head,))
            runs.append((evaluator, self._feed.head_dataset(head, data[head], batch_size or 1024,
                                                            False, None)))
        return runs

    def check(self, data: Any, batch_size: int | None) -> None:
        """Fails now if a loss or metric cannot be computed on `data`."""
        for evaluator, dataset in self.runs(data, batch_size):
            evaluator.check_dataset(dataset)

    def evaluate(self, data: Any, batch_size: int | None) -> EvalResults:
        """Per-head loss and metrics on `data` (see `Trainer.evaluate`)."""
        results: EvalResults = {}
        for evaluator, dataset in self.runs(data, batch_size):
            results.update(evaluator.evaluate(dataset))
        return results
