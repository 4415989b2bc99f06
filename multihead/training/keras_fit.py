"""Keras' `compile` / `fit` / `evaluate` on a `MultiHeadModel`, through multihead's per-head step.

`model.compile(optimizer={head: ...}, loss={head: ...}, metrics={head: [...]},
loss_weights={head: w})` builds a `multihead.Trainer` with one `Objective` per head.
Keras' own `fit` loop then runs unchanged (epochs, batches, `validation_data`,
callbacks, `History`); only what one of its compiled calls does is the trainer's:
`Trainer.run_steps` on Keras' data iterator, the same compiled step `Trainer.fit`
runs, so each head's optimizer updates exactly its var_list. `evaluate` is
`Trainer.evaluate`. Keras' single-optimizer `train_step` never runs (keras#21741).

`sample_weight` (a dict head -> weights, or one array for every head) and `class_weight`
(a dict head -> {class: weight}) weigh each head's examples as `Trainer.fit` does with
batches `(x, y, {head: weights})` (see `multihead.training.keras_weights`); a dataset may
yield such triples.

What has no per-head meaning is refused with one line at `compile` or `fit`: one
optimizer for several heads, a loss or metric dict that misses or invents a head,
`weighted_metrics`, `run_eagerly`, a `tf.distribute` strategy, and the Keras callbacks
that change `model.optimizer` (a `MultiHeadModel` has one optimizer per head and
`model.optimizer` is None). Array input is checked as a config's data is, before Keras' loop
runs: real dtypes (complex is refused), `batch_size >= 1`, at least one row, the model's input
width. Non-finite losses follow each head's `on_nonfinite` (skipped, then `fit` stops after
`max_nonfinite_steps`); an epoch whose every step of a head was skipped logs NaN, not 0.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import keras
import tensorflow as tf

from multihead import _keras_internals as internals
from multihead._checks import check_int
from multihead.training.callbacks import NonFiniteGuard
from multihead.datasets.multitask import as_dataset, check_array_data
from multihead.model.input_shape import check_input_width
from multihead.objectives.objective import Objective, check_weight, with_sample_weights
from multihead.training.keras_weights import keras_weights, weighted_labels
from multihead.training.results import StepResult
from multihead.training.trainer import Trainer

#: Keras callbacks that read or set `model.optimizer`, which has no per-head meaning.
_OPTIMIZER_CALLBACKS = (keras.callbacks.ReduceLROnPlateau, keras.callbacks.LearningRateScheduler,
                        keras.callbacks.SwapEMAWeights)

#: Keras' default batch size of `evaluate` for arrays.
_EVAL_BATCH_SIZE = 32


def per_head(value: Any, what: str, heads: Sequence[str], *, every_head: bool,
             shared_ok: bool) -> dict[str, Any]:
    """A `compile` argument as a dict head -> value, or a one-line error.

    Args:
        value: the argument: a dict head -> value, or one value.
        what: the argument's name, for messages.
        heads: the model's heads.
        every_head: the dict must name every head.
        shared_ok: one value may stand for every head (a loss name does; an optimizer
            object, whose state is built on one var_list, does not).
    """
    if isinstance(value, Mapping):
        unknown = [h for h in value if h not in heads]
        if unknown:
            raise ValueError(f"compile({what}=...) names head {unknown[0]!r}, but the model's "
                             f"heads are {list(heads)}")
        missing = [h for h in heads if h not in value]
        if every_head and missing:
            raise ValueError(f"compile({what}=...) has no entry for head {missing[0]!r}; give "
                             f"every head one (it names {list(value)})")
        return dict(value)
    if len(heads) == 1 or shared_ok:
        return {h: value for h in heads}
    example = ", ".join(f"{h!r}: ..." for h in heads)
    raise ValueError(f"compile({what}=...): one value for the heads {list(heads)} has no per-head "
                     f"meaning; give a dict head -> {what}, e.g. {what}={{{example}}}")


def objectives_from_compile(heads: Sequence[str], optimizer: Any, loss: Any, loss_weights: Any,
                            metrics: Any) -> dict[str, Objective]:
    """One `Objective` per head from Keras `compile`'s arguments (see `KerasTraining.compile`)."""
    if loss is None:
        raise ValueError("compile(loss=...) is required: give a dict head -> loss, e.g. "
                         f"loss={{{', '.join(f'{h!r}: ...' for h in heads)}}}")
    losses = per_head(loss, "loss", heads, every_head=True, shared_ok=True)
    optimizers = per_head(optimizer, "optimizer", heads, every_head=True, shared_ok=False)
    weights = per_head({} if loss_weights is None else loss_weights, "loss_weights", heads,
                       every_head=False, shared_ok=False)
    head_metrics = per_head({} if metrics is None else metrics, "metrics", heads,
                            every_head=False, shared_ok=False)
    return {h: Objective(loss=losses[h], optimizer=optimizers[h],
                         weight=check_weight(weights.get(h, 1.0), f"compile(loss_weights)[{h!r}]"),
                         metrics=head_metrics.get(h, ()))
            for h in heads}


def check_callbacks(callbacks: Any) -> None:
    """Refuses the Keras callbacks that need one `model.optimizer`."""
    for i, callback in enumerate(callbacks or ()):
        steps_per_second = isinstance(callback, keras.callbacks.TensorBoard) and \
            callback.write_steps_per_second
        if isinstance(callback, _OPTIMIZER_CALLBACKS) or steps_per_second:
            raise ValueError(
                f"fit(callbacks[{i}]): {type(callback).__name__}"
                f"{'(write_steps_per_second=True)' if steps_per_second else ''} reads "
                "model.optimizer, which a MultiHeadModel does not have (one optimizer per head); "
                "give each head's optimizer a learning-rate schedule, or train with "
                "multihead.Trainer.fit and multihead.ReduceLROnPlateau(head=...)")


class KerasRun:
    """What Keras' loops call on a compiled `MultiHeadModel`: the train function and the
    logs, per-head, of the current epoch.

    Training logs are `"<head>_loss"` (the mean of the head's step losses since Keras
    last reset the metrics, i.e. over the epoch so far) and `"loss"`, the sum of
    `loss_weight x <head>_loss`; evaluation logs add each head's metrics as
    `"<head>_<metric>"`.

    Args:
        trainer: the trainer `compile` built.
        loss_weights: head -> constant loss weight.
        steps_per_execution: steps per compiled call (Keras' `steps_per_execution`).
    """

    def __init__(self, trainer: Trainer, loss_weights: Mapping[str, float],
                 steps_per_execution: int) -> None:
        self.trainer = trainer
        self._weights = dict(loss_weights)
        self._steps_per_execution = steps_per_execution
        self._guard = self._new_guard()
        self.reset()

    def _new_guard(self) -> NonFiniteGuard:
        guard = NonFiniteGuard(self.trainer.max_nonfinite_steps)
        guard.set_trainer(self.trainer)
        return guard

    def start_fit(self) -> None:
        """A new `fit`: non-finite losses are counted from zero, as by `Trainer.fit`."""
        self._guard = self._new_guard()

    def reset(self) -> None:
        """Forgets the losses summed so far (Keras resets its metrics at each epoch)."""
        self._sums = {h: 0.0 for h in self.trainer.model.head_names}
        self._counts = {h: 0 for h in self.trainer.model.head_names}
        self._skips = {h: 0 for h in self.trainer.model.head_names}

    def train_function(self, iterator: Any) -> dict[str, float]:
        """Keras' `train_function`: up to `steps_per_execution` steps on `iterator`'s batches.

        Raises:
            StopIteration: the iterator was exhausted (Keras ends the epoch).
        """
        if isinstance(iterator, tf.data.Iterator):
            spec = iterator.element_spec
            _check_pair(spec)
            check_array_data(spec[0], "fit(x=...)")
            results = self.trainer.run_steps(iterator, self._steps_per_execution)
        else:  # train_on_batch: a Python iterator of (x, y, sample_weight)
            results = [self.trainer.step(_pair(batch)) for batch in iterator]
        if not results:
            raise StopIteration
        for result in results:
            self._guard.on_step_end(result.step + 1, result)
            self._add(result)
        return self.train_logs()

    def _add(self, result: StepResult) -> None:
        for head in result.updated:
            self._sums[head] += result.losses[head]
            self._counts[head] += 1
        for head in result.skipped:
            self._skips[head] += 1

    def train_logs(self) -> dict[str, float]:
        """`{"loss": ..., "<head>_loss": ...}` of the steps since the last `reset`. A head
        whose every step was skipped as non-finite (`Objective.on_nonfinite`) logs NaN, and
        so does the total: nothing was learned, which a 0 would hide."""
        means = {h: self._sums[h] / self._counts[h] for h in self._sums if self._counts[h]}
        means.update({h: float("nan") for h in self._sums
                      if not self._counts[h] and self._skips[h]})
        return self._with_total({f"{h}_loss": v for h, v in means.items()}, means)

    def eval_logs(self, results: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
        """`Trainer.evaluate`'s results as Keras logs: `"<head>_<name>"` and the total `"loss"`."""
        flat = {f"{h}_{name}": float(v) for h, values in results.items() for name, v in values.items()}
        return self._with_total(flat, {h: values["loss"] for h, values in results.items()})

    def _with_total(self, logs: dict[str, float], losses: Mapping[str, float]) -> dict[str, float]:
        total = float(sum(self._weights[h] * v for h, v in losses.items()))
        return {"loss": total, **logs}

    def evaluation_data(self, x: Any, y: Any, batch_size: int | None,
                        steps: int | None) -> tf.data.Dataset:
        """Keras `evaluate`'s data as batches in order: a dataset as is (triples with their
        weights folded into the labels, see `weighted_dataset`), arrays batched."""
        if isinstance(x, tf.data.Dataset):
            if y is not None:
                raise ValueError("evaluate(y=...) must be None when x is a tf.data.Dataset (its "
                                 "elements hold the labels)")
            dataset = self.weighted_dataset(x)
        else:
            size = _EVAL_BATCH_SIZE if batch_size is None else batch_size
            dataset = as_dataset((x, self.labels_dict(y, "evaluate")), size, shuffle=False)
        if steps is not None:
            dataset = dataset.take(check_int(steps, "evaluate(steps=...)", minimum=1))
        return dataset

    def weighted(self, x: Any, y: Any, sample_weight: Any, class_weight: Any,
                 where: str) -> Any:
        """Array labels `y` as a dict head -> labels, each weighted head's as
        `Weighted(labels, weights)` (see `keras_weights`)."""
        y = self.labels_dict(y, where)
        if sample_weight is None and class_weight is None:
            return y
        if isinstance(x, tf.data.Dataset) or y is None:
            raise ValueError(f"{where}(sample_weight=/class_weight=...) takes array data; a "
                             "dataset gives the weights in its elements: (x, {head: labels}, "
                             "{head: weights})")
        rows = len(tf.nest.flatten(x)[0])
        weights = keras_weights(self.trainer.model.head_names, y, rows, sample_weight,
                                class_weight, where)
        return weighted_labels(y, weights)

    def weighted_dataset(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        """A dataset of triples `(x, y, sample_weight)` as pairs whose weighted heads' labels
        are `Weighted`, as `Trainer.fit` maps them; `sample_weight` a dict head -> weights,
        or one tensor for every head. Other datasets as they are."""
        spec = dataset.element_spec
        if not (isinstance(spec, tuple) and len(spec) == 3):
            return dataset

        def fold(y: Any, w: Any) -> Any:
            y = self.labels_dict(y, "fit")
            return with_sample_weights(y, w if isinstance(w, Mapping) else {h: w for h in y})

        fold(spec[1], spec[2])  # checked here, once, on the spec
        return dataset.map(lambda x, y, w: (x, fold(y, w)))

    def labels_dict(self, y: Any, where: str) -> Any:
        """`y` as a dict head -> labels: a single head's bare labels are wrapped."""
        heads = self.trainer.model.head_names
        if isinstance(y, Mapping) or y is None:
            return y
        if len(heads) == 1:
            return {heads[0]: y}
        raise ValueError(f"{where}: y must be a dict head -> labels for the heads {list(heads)}, "
                         f"got {type(y).__name__}")


def _check_arrays(model: Any, x: Any, y: Any, x_name: str, y_name: str) -> None:
    """Array inputs and labels as the step takes them (real, at least one row, the model's
    input width), checked before Keras' loop runs; a dataset is checked by its spec."""
    if x is None or isinstance(x, tf.data.Dataset):
        return
    check_array_data(x, x_name)
    check_array_data(y, y_name)
    check_input_width(model, x, x_name)


def _check_pair(spec: Any) -> None:
    if not (isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[1], Mapping)):
        raise ValueError("fit: the data must yield (x, {head: labels}); its elements are "
                         f"{spec}")


def _pair(batch: Any) -> tuple[Any, Any]:
    """`(x, y)` of Keras' `(x, y, sample_weight)` from `train_on_batch`, whose weights
    `KerasTraining.train_on_batch` already folded into `y`."""
    x, y = tuple(batch)[:2]
    return x, y


def _under_strategy(model: keras.Model) -> bool:
    """Whether the model was created under, or is compiled in, a `tf.distribute` scope."""
    return tf.distribute.has_strategy() or model.distribute_strategy is not tf.distribute.get_strategy()


class KerasTraining:
    """Keras' `compile` / `fit` / `evaluate` for `MultiHeadModel`, through `multihead.Trainer`.

    See the module docstring and docs/keras.md. `model.trainer` is the `Trainer`
    `compile` built (for checkpoints, `Trainer.fit`, `Trainer.step`); `model.optimizer`
    is None.
    """

    #: What the Keras loops call, set by `compile`.
    _keras_run: KerasRun | None = None

    @property
    def trainer(self) -> Trainer | None:
        """The `multihead.Trainer` the last `compile` built, None before."""
        return self._keras_run.trainer if self._keras_run is not None else None

    def compile(self, optimizer: Any = "rmsprop", loss: Any = None, loss_weights: Any = None,
                metrics: Any = None, weighted_metrics: Any = None, run_eagerly: bool = False,
                steps_per_execution: int = 1, jit_compile: bool | str = "auto",
                auto_scale_loss: bool = True, **trainer_options: Any) -> None:
        """Configures per-head training for Keras' `fit` and `evaluate`.

        Args:
            optimizer: a dict head -> optimizer (object, name or Keras config), one
                object per head; a single optimizer only for a one-head model.
            loss: a dict head -> loss, naming every head (one loss spec stands for
                every head).
            loss_weights: a dict head -> constant weight on the head's loss (default 1).
            metrics: a dict head -> list of metrics, reported by `evaluate` and for
                `validation_data`.
            weighted_metrics: refused: `metrics` are weighted by the sample weights.
            run_eagerly: refused when True (the per-head step is always compiled).
            steps_per_execution: steps per compiled call.
            jit_compile: True XLA-compiles the step; `"auto"` and False do not.
            auto_scale_loss: unused (a `LossScaleOptimizer` is refused).
            **trainer_options: further `multihead.Trainer` arguments (`schedule`, `trunk`,
                `log_dir`, `max_nonfinite_steps`, ...).
        """
        del auto_scale_loss
        self._keras_run = None  # the last compile's trainer releases its optimizers
        self.train_function = None
        if weighted_metrics is not None:
            raise ValueError("compile(weighted_metrics=...): give metrics={head: [...]}; a "
                             "MultiHeadModel weighs them by the sample weights")
        if run_eagerly:
            raise ValueError("compile(run_eagerly=True): the per-head step is always compiled; "
                             "to debug, call model.trainer.step(batch) or run the model eagerly")
        if _under_strategy(self):
            raise ValueError("compile: a MultiHeadModel under a tf.distribute strategy trains with "
                             "multihead.Trainer(model, objectives, strategy=...), not Keras' fit")
        if "strategy" in trainer_options or "jit_compile" in trainer_options:
            raise ValueError("compile: give jit_compile as compile's own argument; a strategy "
                             "needs multihead.Trainer(strategy=...)")
        steps_per_execution = check_int(steps_per_execution, "compile(steps_per_execution=...)",
                                        minimum=1)
        if jit_compile not in (True, False, "auto"):
            raise ValueError(f"compile(jit_compile=...): expected True, False or 'auto', got "
                             f"{jit_compile!r}")
        objectives = objectives_from_compile(self.head_names, optimizer, loss, loss_weights, metrics)
        trainer = Trainer(self, objectives, jit_compile=jit_compile is True, **trainer_options)
        super().compile(optimizer=None, loss=None, metrics=None, run_eagerly=False,  # type: ignore[misc]
                        steps_per_execution=steps_per_execution, jit_compile=jit_compile is True)
        self._keras_run = KerasRun(trainer, {h: o.weight for h, o in objectives.items()},
                                   steps_per_execution)

    def _run(self, method: str) -> KerasRun:
        if self._keras_run is None:
            raise ValueError(f"{method}: compile the model first, e.g. model.compile("
                             "optimizer={head: 'adam', ...}, loss={head: 'mse', ...})")
        return self._keras_run

    def make_train_function(self, force: bool = False) -> Any:
        """Keras' train function: `KerasRun.train_function` (the trainer's compiled step)."""
        self.train_function = self._run("fit").train_function
        return self.train_function

    def reset_metrics(self) -> None:
        """Keras' metrics and the per-head losses of the epoch so far."""
        super().reset_metrics()  # type: ignore[misc]
        if self._keras_run is not None:
            self._keras_run.reset()

    def fit(self, x: Any = None, y: Any = None, batch_size: int | None = None, epochs: int = 1,
            verbose: Any = "auto", callbacks: Sequence[Any] | None = None,
            validation_split: float = 0.0, validation_data: Any = None, shuffle: bool = True,
            class_weight: Any = None, sample_weight: Any = None, initial_epoch: int = 0,
            steps_per_epoch: int | None = None, validation_steps: int | None = None,
            validation_batch_size: int | None = None, validation_freq: int = 1) -> Any:
        """Keras' `fit`, each step the trainer's per-head step (see `KerasTraining`).

        `y` is a dict head -> labels (a one-head model may take bare labels);
        `sample_weight` a dict head -> one weight per example, or one array for every head;
        `class_weight` a dict head -> {class index: weight} (see `keras_weights`);
        `validation_data` is `(x_val, y_val)`, `(x_val, y_val, {head: weights})` or a dataset.
        Returns Keras' `History`.
        """
        run = self._run("fit")
        check_callbacks(callbacks)
        if batch_size is not None:
            check_int(batch_size, "fit(batch_size=...)", minimum=1)
        _check_arrays(self, x, run.labels_dict(y, "fit"), "fit(x=...)", "fit(y=...)")
        y = run.weighted(x, y, sample_weight, class_weight, "fit")
        if isinstance(x, tf.data.Dataset):
            x = run.weighted_dataset(x)
        if isinstance(validation_data, (tuple, list)):
            if len(validation_data) not in (2, 3):
                raise ValueError("fit(validation_data=...): give (x_val, y_val), (x_val, y_val, "
                                 "{head: weights}) or a dataset")
            x_val, y_val = validation_data[:2]
            _check_arrays(self, x_val, run.labels_dict(y_val, "fit"),
                          "fit(validation_data=...) x_val", "fit(validation_data=...) y_val")
            weights = validation_data[2] if len(validation_data) == 3 else None
            validation_data = (x_val, run.weighted(x_val, y_val, weights, None,
                                                   "fit(validation_data=...)"))
        elif isinstance(validation_data, tf.data.Dataset):
            validation_data = run.weighted_dataset(validation_data)
        run.start_fit()
        try:
            return super().fit(  # type: ignore[misc]
                x, y, batch_size=batch_size, epochs=epochs, verbose=verbose, callbacks=callbacks,
                validation_split=validation_split, validation_data=validation_data,
                shuffle=shuffle, initial_epoch=initial_epoch, steps_per_epoch=steps_per_epoch,
                validation_steps=validation_steps, validation_batch_size=validation_batch_size,
                validation_freq=validation_freq)
        finally:
            if run.trainer.monitor is not None:
                run.trainer.monitor.flush()

    def evaluate(self, x: Any = None, y: Any = None, batch_size: int | None = None,
                 verbose: Any = "auto", sample_weight: Any = None, steps: int | None = None,
                 callbacks: Any = None, return_dict: bool = False, **kwargs: Any) -> Any:
        """Keras' `evaluate` as `Trainer.evaluate`: per head, the loss (mean over examples)
        and metrics, in one compiled call.

        Returns:
            With `return_dict`, `{"loss": sum of weighted head losses, "<head>_loss": ...,
            "<head>_<metric>": ...}`; otherwise those values as a list, in that order.
        """
        del verbose
        for name in internals.FIT_EVALUATE_KWARGS:  # Keras' fit passes them; the data is rebuilt
            kwargs.pop(name, None)
        if kwargs:
            raise TypeError(f"evaluate() got unexpected arguments {sorted(kwargs)}")
        run = self._run("evaluate")
        if sample_weight is not None:
            y = run.weighted(x, y, sample_weight, None, "evaluate")
        dataset = run.evaluation_data(x, y, batch_size, steps)
        if not isinstance(callbacks, keras.callbacks.CallbackList):
            callbacks = keras.callbacks.CallbackList(callbacks, model=self)
        callbacks.on_test_begin()
        logs = run.eval_logs(run.trainer.evaluate(dataset))
        callbacks.on_test_end(logs)
        return logs if return_dict else list(logs.values())

    def train_on_batch(self, x: Any, y: Any = None, sample_weight: Any = None,
                       class_weight: Any = None, return_dict: bool = False) -> Any:
        """Keras' `train_on_batch`: one `Trainer.step`, the weights as in `fit`."""
        y = self._run("train_on_batch").weighted(x, y, sample_weight, class_weight,
                                                 "train_on_batch")
        return super().train_on_batch(x, y, return_dict=return_dict)  # type: ignore[misc]

    def test_on_batch(self, *args: Any, **kwargs: Any) -> Any:
        """Refused: `evaluate` gives the per-head losses and metrics."""
        raise NotImplementedError("test_on_batch is not supported by a MultiHeadModel; use "
                                  "model.evaluate(x, y)")

    def get_compile_config(self) -> dict[str, Any]:
        """Nothing: a saved model is loaded uncompiled (compile it again; the optimizers'
        state lives in multihead checkpoints, see docs/keras.md)."""
        return {}

