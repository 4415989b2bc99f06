"""`Trainer`: per-head optimizers on exact var_lists, driven step by step or by `fit`.

The trainer drives; what it drives lives beside it: `streams` (the batches of the
user's data), `labels` (label checks), `results` (`StepResult`, `History`),
`execution` (steps per compiled call), `loss_weights`, `rules` (rules between
settings) and `training_state` (what a checkpoint holds).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import time
from typing import Any, Mapping, Protocol, Sequence

import numpy as np
import tensorflow as tf

from multihead._checks import check_int
from multihead.datasets.multitask import DataPosition
from multihead.model.model_view import HeadsModel
from multihead.monitoring.monitor import Monitor
from multihead.objectives.labels import LabelCheck, split_batch
from multihead.objectives.loss_weights import LossWeight, sync_weights
from multihead.objectives.objective import Objective, claim_optimizers, with_sample_weights
from multihead.objectives.parts import prediction_fn
from multihead.step import distribute
from multihead.step.assemble import StepAssembly
from multihead.step.options import StepOptions
from multihead.step.train_step import TrainStep
from multihead.step.trunk_policy import TrunkPolicy
from multihead.training.callbacks import Callback, CallbackList, NonFiniteGuard, ProgressCallback
from multihead.training.evaluation import Evaluator
from multihead.training.execution import ExecutionSize
from multihead.training.results import History, StepResult, step_result
from multihead.training.sampling import TaskSampling
from multihead.training.streams import DataFeed, batches_per_epoch, zeros_for_spec
from multihead.training.training_state import TrainingState

__all__ = ["History", "SavesCheckpoints", "StepResult", "Trainer"]


class SavesCheckpoints(Protocol):
    """What `fit(checkpoints=...)` takes: a `multihead.CheckpointManager`."""

    def callback(self) -> Callback:
        """The callback that saves on the manager's cadence."""


class Trainer:
    """Trains a `MultiHeadModel`, each head with its own loss and optimizer.

    Each head's optimizer is built once, eagerly, on exactly
    `model.var_list(head)` (trunk + head, or the head only when
    `trains_trunk=False`), so a head can never change another head's variables.

    Example:
        >>> import keras, numpy as np, multihead as mh
        >>> model = mh.MultiHeadModel(keras.layers.Dense(8), {"a": keras.layers.Dense(1),
        ...                                                    "b": keras.layers.Dense(1)})
        >>> trainer = mh.Trainer(model, {"a": mh.Objective("mse"),
        ...                              "b": mh.Objective("mae", every=2)})
        >>> x = np.ones((4, 3), "float32"); y = {"a": np.ones((4, 1)), "b": np.zeros((4, 1))}
        >>> trainer.step((x, y)).updated
        ('a', 'b')

    Args:
        model: the model; it may be unbuilt (the first batch builds it).
        objectives: head name -> `Objective`, one for every head of the model.
        schedule: `"simultaneous"` or `"sequential"` (`StepOptions.schedule`).
        log_dir: TensorBoard log directory; None disables logging.
        log_every: write scalars every this many steps.
        histograms_every: write gradient histograms every this many steps (0: never).
        log_variable_norms: also write each variable's gradient norm.
        trunk: `"per_head"` (each head's optimizer updates the trunk with its own
            slots), or a `TrunkPolicy` (or a dict of its fields): one trunk
            optimizer applies an aggregate of the heads' trunk gradients and each
            head's optimizer is built on its own variables only (see
            `multihead.step.trunk_update`). Needs `schedule="simultaneous"`.
        strategy: a `tf.distribute` strategy (`MirroredStrategy`,
            `MultiWorkerMirroredStrategy`; see `multihead.step.distribute.make_strategy`),
            or None for one device. Build the model and create optimizer objects
            (and target networks) inside `strategy.scope()`; optimizers given by
            name are created there by the trainer. Call `step` and `fit` outside
            the scope. Each batch is the *global* batch, split across replicas;
            losses are batch means, so results match single-device training on
            the same global batch. Only the chief logs to TensorBoard and writes
            checkpoints. Not supported with a strategy: XLA, trunk aggregation with
            `rep_grad` or a loss weighting.
        target_networks: `multihead.TargetNetwork`s whose `update()` runs inside the
            compiled train step, after the optimizers applied (never in `evaluate`).
        max_nonfinite_steps: `fit` stops with an error naming the head when a head's
            loss or gradient is non-finite this many steps in a row (its updates
            were skipped meanwhile, see `Objective(on_nonfinite=...)`).
        **options: the step's options, each keyword the field of its name of
            `multihead.StepOptions` (XLA, fused updates, the batched backward pass, loss
            scaling), documented there; an unknown keyword is a `TypeError`.
    """

    def __init__(
        self,
        model: HeadsModel,
        objectives: Mapping[str, Objective],
        schedule: str = "simultaneous",
        log_dir: str | os.PathLike[str] | None = None,
        log_every: int = 100,
        *,
        histograms_every: int = 1000,
        log_variable_norms: bool = False,
        trunk: str | TrunkPolicy | Mapping[str, Any] = "per_head",
        strategy: tf.distribute.Strategy | None = None,
        max_nonfinite_steps: int = 10,
        target_networks: Sequence[Any] = (),
        **options: Any,
    ) -> None:
        if not isinstance(model, HeadsModel):
            raise TypeError(f"model must be a MultiHeadModel, got {type(model).__name__}")
        #: How the step runs (`StepOptions`), built once from the keywords.
        self.options = StepOptions.from_keywords(schedule=schedule, **options)
        check_int(log_every, "log_every", minimum=1, hint="scalars are written every this many steps")
        self._nonfinite_limit = check_int(max_nonfinite_steps, "max_nonfinite_steps", minimum=1)
        self._assembly = parts = StepAssembly(
            model, objectives, self.options, trunk=trunk, strategy=strategy,
            target_networks=target_networks, logging=log_dir is not None)
        self.model = model
        #: Updated inside each compiled train step, after the optimizers.
        self.target_networks = parts.target_networks
        #: Objective name -> objective: those named for heads in head order, then the others.
        self.objectives = parts.objectives
        #: The objectives' names, in the order steps report them.
        self.names = tuple(self.objectives)
        self.loss_fns = parts.loss_fns
        #: The `tf.distribute` strategy, or None.
        self.strategy = strategy
        self.optimizers = parts.optimizers
        #: The aggregated trunk update (trunk optimizer, loss weighting, RNG), None for per_head.
        self.trunk_update = parts.trunk_update
        #: The trunk optimizer under trunk aggregation, None for per_head.
        self.trunk_optimizer = self.trunk_update.optimizer if self.trunk_update else None
        # Built now so a bad metric name fails at construction.
        self._predictions = {n: prediction_fn(model, n, o) for n, o in self.objectives.items()}
        self._evaluator = self._evaluator_of(self.names)
        self.step_variable = parts.step_variable
        with distribute.scope(strategy):
            #: Position of `fit` in its data stream (checkpointed, so a resume sees the same batches).
            self.data_position = DataPosition(heads=self.names)
        self._frozen = parts.frozen
        #: Each objective's dynamic loss scale (float16), or None.
        self.loss_scales = parts.loss_scales
        #: False on the non-chief workers of a multi-worker run (they neither log nor save).
        self.is_chief = distribute.is_chief(strategy)
        self.monitor = self._monitor(log_dir, log_every, histograms_every, log_variable_norms)
        self._labels = LabelCheck(model, self.objectives, self.loss_fns, self._predictions)
        self._train_step: TrainStep | None = None
        self._weights: dict[str, LossWeight] = parts.weights
        self._feed = DataFeed(model, self.names, self._labels, self._ensure_built, self.data_position,
                              self.step_variable, strategy, parts.rep_grad)
        self._head_evaluators: dict[str, Evaluator] = {}
        #: Set by a callback to end `fit` after the current compiled call.
        self.stop_training = False
        #: Why the last `fit` stopped early (set through `Callback.request_stop`), or None.
        self.stop_reason: str | None = None
        #: One-line notices of the last `fit`'s callbacks (`Callback.announce`), in order.
        self.notices: list[str] = []
        # Last: a trainer whose construction failed claims no optimizer.
        claim_optimizers(self, self.optimizers, self.trunk_optimizer)
        if model.built:
            self._build()

    def _monitor(self, log_dir: str | os.PathLike[str] | None, every: int, histograms_every: int,
                 variable_norms: bool) -> Monitor | None:
        """The TensorBoard monitor, or None without `log_dir`.

        Every worker of a multi-worker run monitors, so all of them trace the same step
        variants at the same steps (their all-reduces pair up only then); the others
        write to a scratch directory removed by `close`, as Keras' TensorBoard callback does.
        """
        self._scratch_logs: str | None = None
        if log_dir is None:
            return None
        if not self.is_chief:
            log_dir = self._scratch_logs = tempfile.mkdtemp(prefix="multihead-worker-logs-")
        return Monitor(os.fspath(log_dir), every=every, histograms_every=histograms_every,
                       variable_norms=variable_norms)

    @property
    def schedule(self) -> str:
        """`"simultaneous"` or `"sequential"` (`StepOptions.schedule`)."""
        return self.options.schedule

    # -- construction -------------------------------------------------------------------

    def build_optimizers(self) -> None:
        """Builds every optimizer on its var_list now (the model must be built), so their
        slots exist, e.g. before restoring a checkpoint into them. Idempotent."""
        if self._train_step is None:
            if not self.model.built:
                raise ValueError("build the model first (model.build(input_shape) or one call)")
            self._build()

    def checkpoint_state(self) -> TrainingState:
        """What a checkpoint holds of this trainer (see `TrainingState`); the optimizers'
        slots exist once `build_optimizers` (or the first step) ran."""
        monitor = self.monitor
        return TrainingState(
            optimizers=dict(self.optimizers), trunk_update=self.trunk_update,
            step=self.step_variable, data_position=self.data_position, frozen=self._frozen,
            log_dir=monitor.log_dir if monitor is not None and self.is_chief else None,
            is_chief=self.is_chief,
            flush_logs=monitor.flush if monitor is not None else _nothing,
            loss_scales=self.loss_scales)

    def _build(self) -> None:
        """Partitions the variables and builds each optimizer eagerly on its var_list."""
        self._train_step = self._assembly.build(self.monitor)

    def _ensure_built(self, inputs: Any) -> TrainStep:
        if self._train_step is None:
            if not self.model.built:
                with distribute.scope(self.strategy):
                    self.model(inputs)  # eager call creates the variables before any trace
            self._build()
        assert self._train_step is not None
        return self._train_step


    # -- training -----------------------------------------------------------------------

    @property
    def global_step(self) -> int:
        """Number of steps taken so far."""
        return int(self.step_variable.numpy())

    @property
    def trace_count(self) -> int:
        """How many times the train step was traced (stays small: no per-step retracing)."""
        return self._train_step.trace_count if self._train_step else 0

    def step(self, batch: Any, heads: Sequence[str] | None = None) -> StepResult:
        """Runs one compiled update on `batch = (inputs, targets)`.

        Args:
            batch: `(inputs, {head: labels})`.
            heads: update only these heads (those of them due at this step); the other
                heads' variables and optimizer slots are untouched. Each distinct set
                is compiled once. None: every head.

        Returns:
            The per-head losses of the heads that were due.
        """
        if heads is not None:
            heads = self._check_head_subset(heads)
        inputs, targets, sample_weight = split_batch(batch)
        targets = self._labels.as_dict(targets)
        if sample_weight is not None:
            targets = with_sample_weights(targets, self._labels.as_dict(sample_weight))
        if tf.nest.flatten(inputs) and np.shape(tf.nest.flatten(inputs)[0])[:1] == (0,):
            raise ValueError("the batch is empty (its inputs have 0 examples); give a batch "
                             "with at least one example")
        train_step = self._ensure_built(inputs)
        self._labels(targets, heads, inputs)
        sync_weights(self._weights, self.objectives)
        output = train_step(inputs, targets, heads)
        return step_result(self.names, int(output.step), output.losses.numpy(),
                           output.updated.numpy(), output.skipped.numpy())

    @property
    def frozen(self) -> tuple[str, ...]:
        """The frozen heads, in head order (see `freeze`)."""
        return self._frozen.names

    def freeze(self, head: str) -> None:
        """Freezes `head`: from the next step on, its optimizer does not update (its
        variables, iterations and slots stay as they are) and none of its gradient
        reaches the trunk (`StepResult.updated` leaves it out). Under trunk aggregation the
        trunk moves as without the frozen heads: with one frozen head it is dropped in the
        graph as a non-finite head is, and the step is not retraced; with two or more,
        `step`, `fit` and `run_steps` run the step compiled for the other heads (one trace
        per distinct frozen set; under a loss weighting the trunk does not move while a
        head is frozen; see `multihead.step.trunk_update`). Checkpoints save the flags
        (part `frozen`). Freezing a frozen head does nothing.

        Example:
            >>> trainer.freeze("b"); trainer.frozen                      # doctest: +SKIP
            ('b',)
        """
        self._check_head_subset([head])
        self._frozen.set(head, True)

    def unfreeze(self, head: str) -> None:
        """Lets a frozen `head` update again from the next step on (see `freeze`)."""
        self._check_head_subset([head])
        self._frozen.set(head, False)

    def run_steps(self, iterator: Any, max_steps: int) -> list[StepResult]:
        """Runs up to `max_steps` compiled steps on batches drawn from `iterator`, as `fit` does.

        For a loop that owns the data (Keras' `fit` through `MultiHeadModel.compile`):
        the batches are `(inputs, {head: labels})`; the first call of an element spec
        builds the model and checks the labels. No data position is counted and no
        callback is run.

        Args:
            iterator: a `tf.data` iterator of batches.
            max_steps: at most this many steps in one compiled call.

        Returns:
            One `StepResult` per step run: fewer than `max_steps` at the end of the
            data, none when it was exhausted already.
        """
        inputs_spec, targets_spec = iterator.element_spec
        zeros = tf.nest.map_structure(zeros_for_spec, inputs_spec)
        train_step = self._ensure_built(zeros)
        self._labels(targets_spec, None, zeros)
        sync_weights(self._weights, self.objectives)
        out = train_step.run(iterator, max_steps)
        first, losses, updated, skipped = (int(out.first_step), out.losses.numpy(),
                                           out.updated.numpy(), out.skipped.numpy())
        return [step_result(self.names, first + i, losses[i], updated[i], skipped[i])
                for i in range(int(out.count))]

    @property
    def max_nonfinite_steps(self) -> int:
        """Non-finite steps in a row of one head after which `fit` stops with an error."""
        return self._nonfinite_limit

    def _check_head_subset(self, heads: Sequence[str]) -> tuple[str, ...]:
        if isinstance(heads, str) or not heads:
            raise ValueError(f"heads must be a non-empty list of head names, got {heads!r}")
        unknown = [h for h in heads if h not in self.names]
        if unknown:
            raise ValueError(f"heads names head {unknown[0]!r}, but the model's heads are "
                             f"{list(self.names)}")
        return tuple(heads)

    def fit(
        self,
        data: Any,
        steps: int | None = None,
        *,
        epochs: int | None = None,
        batch_size: int | None = None,
        eval_data: Any = None,
        eval_every: int | None = None,
        verbose: bool = True,
        seed: int | None = 0,
        checkpoints: SavesCheckpoints | None = None,
        steps_per_execution: int | str = "auto",
        callbacks: Sequence[Callback] = (),
        sampling: str | TaskSampling | Mapping[str, Any] = "all",
    ) -> History:
        """Trains for `steps` more steps (or `epochs` more epochs), cycling through `data`
        as often as needed.

        A second `fit` on the same data (the same dataset object, or the same arrays
        with the same batch size and seed) continues the stream where the last one
        stopped, so `fit(20)` then `fit(20)` trains exactly as `fit(40)`. Other data
        starts from its beginning.

        Args:
            data: a batched `tf.data.Dataset` of `(inputs, targets)`, or a tuple of
                arrays `(inputs, {head: labels})` with `batch_size`; or a dict head ->
                that head's own data (a dataset or arrays `(inputs, labels)`), drawn
                as `sampling` says. Each head's data has a checkpointed position of
                its own; a per-head run takes one compiled call per step.
            steps: number of training steps; give this or `epochs`.
            epochs: number of epochs, `epochs * batches_per_epoch(data, batch_size)`
                steps: an epoch is one pass over `data` (`ceil(rows / batch_size)`
                batches for arrays; a dataset's cardinality, which must be known and
                finite). For per-head data it is one pass over the largest head's data
                (the head with the most batches), the others cycling meanwhile. The
                progress line shows `epoch e/E`.
            batch_size: batch size for array data.
            eval_data: data for `evaluate`, run every `eval_every` steps and at the end
                (a dict head -> data evaluates each head on its own).
            eval_every: evaluation period in (global) steps (None: only at the end).
            verbose: print a progress line (steps/s, ETA, per-head losses) to stderr.
            seed: shuffle seed for array data.
            checkpoints: a `CheckpointManager`: saves a checkpoint whenever the global
                step is a multiple of its `every` (after that step's evaluation). After
                `checkpoints.restore_latest()`, `fit` continues the data stream where
                the checkpoint left it, so the resumed run is exact.
            steps_per_execution: steps run inside one compiled call (a loop over the
                data iterator in the graph), so Python dispatch does not dominate
                small models; `"auto"` sizes each call to take about 50 ms (one step
                per call for a slow model, up to 1000 for a fast one). Results,
                logging, evaluation, checkpoint steps and what callbacks observe are
                exactly those of `steps_per_execution=1`: calls end at those steps.
            callbacks: `multihead.Callback`s (or Keras callbacks that read `logs` and
                set `stop_training`, see `multihead.training.callbacks`). A callback
                stops training by setting `trainer.stop_training = True`.
            sampling: with per-head data, `"all"` (every head takes a batch of its own
                data each step) or one head drawn per step: `"uniform"`,
                `"proportional"`, `"temperature"`, or a `multihead.TaskSampling` (its
                seed defaults to `seed`).

        Returns:
            The per-head history of training losses and evaluations of this call.
        """
        per_epoch = None
        if (steps is None) == (epochs is None):
            raise ValueError(f"fit: give exactly one of steps and epochs, got steps={steps!r} "
                             f"and epochs={epochs!r}")
        if epochs is not None:
            epochs = check_int(epochs, "epochs", minimum=1)
            per_epoch = batches_per_epoch(data, batch_size)
            steps = epochs * per_epoch
        steps = check_int(steps, "steps", minimum=1)
        call_size = ExecutionSize(steps_per_execution)
        if eval_every is not None:
            eval_every = check_int(eval_every, "eval_every", minimum=1, hint="or None: only at the end")
        stream = self._feed.stream(data, batch_size, seed, sampling)
        if eval_data is not None:  # a metric that cannot be computed fails before the first step
            for evaluator, dataset in self._evaluations(eval_data, batch_size):
                evaluator.check_dataset(dataset)
        history = History(train={h: [] for h in self.objectives})
        extra: list[Any] = [NonFiniteGuard(self._nonfinite_limit)]
        if checkpoints is not None:
            extra.append(checkpoints.callback())
        if verbose:
            extra.append(ProgressCallback(self.global_step + steps, start=self.global_step,
                                          per_epoch=per_epoch))
        hooks = CallbackList([*callbacks, *extra], self)
        periods = hooks.periods() + ([eval_every] if eval_data is not None and eval_every else [])
        self.stop_training, self.stop_reason, self.notices = False, None, []
        if self.monitor:  # the last step is logged, whatever the cadence
            self.monitor.log_last(self.global_step + steps)
        start = time.perf_counter()
        done = 0
        hooks.on_train_begin()
        try:
            while done < steps and not self.stop_training:
                chunk = min([steps - done, call_size.next]
                            + [p - self.global_step % p for p in periods])
                sync_weights(self._weights, self.objectives)
                called = time.perf_counter()
                out = stream.run(chunk)
                count = out.count
                call_size.observe(count, time.perf_counter() - called)
                if count == 0:
                    continue  # the end of an epoch
                for i in range(count):
                    result = step_result(self.names, out.first + i, out.losses[i],
                                         out.updated[i], out.skipped[i])
                    for head in result.updated:
                        history.train[head].append((result.step, result.losses[head]))
                    hooks.on_step_end(result.step + 1, result)
                done += count
                if eval_data is not None and (
                        done == steps or (eval_every and self.global_step % eval_every == 0)):
                    metrics = self.evaluate(eval_data, batch_size=batch_size)
                    history.eval.append((self.global_step, metrics))
                    hooks.on_eval_end(self.global_step, metrics)
                hooks.on_call_end(self.global_step)
        finally:
            hooks.on_train_end()
            history.wall_time = time.perf_counter() - start
            if self.monitor:
                self.monitor.flush()
        return history

    # -- evaluation ---------------------------------------------------------------------

    def evaluate(self, data: Any, batch_size: int | None = None, log: bool = True,
                 ) -> dict[str, dict[str, float]]:
        """Per-head loss (mean over all examples) and metrics on `data`, without training.

        One compiled call runs the whole dataset (losses and metrics accumulated in
        the graph); the model runs with `training=False` and research losses get
        `training=False`. Target networks are not updated.

        Args:
            data: a batched `tf.data.Dataset` or a tuple `(inputs, {head: labels})`;
                or a dict head -> that head's own data, on which that head alone is
                evaluated.
            batch_size: batch size for array data (default 1024).
            log: write the results to TensorBoard's `eval` run (when logging is on);
                False for data that is not the evaluation set.

        Returns:
            `{head: {"loss": value, <metric name>: value, ...}}`.
        """
        results: dict[str, dict[str, float]] = {}
        for evaluator, dataset in self._evaluations(data, batch_size):
            results.update(evaluator.evaluate(dataset))
        if self.monitor and log:
            self.monitor.write_eval(self.global_step, results)
        return results

    def predict(self, data: Any, batch_size: int | None = None,
                heads: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """The model's inference outputs on `data`, `{head: array}` (see `MultiHeadModel.predict`).

        Args:
            data: inputs (an array or a dict of arrays), a pair `(inputs, targets)` whose
                targets are ignored, or a batched `tf.data.Dataset` of either.
            batch_size: examples per call for array data (default 1024).
            heads: the heads to return (default all).
        """
        if isinstance(data, tuple) and len(data) == 2:
            data = data[0]
        return self.model.predict(data, batch_size=batch_size, heads=heads)

    def _evaluations(self, data: Any, batch_size: int | None,
                     ) -> list[tuple[Evaluator, tf.data.Dataset]]:
        """What evaluating `data` runs: the evaluator of every head on `data`, or, for a
        dict head -> data, each head's own evaluator on its own data."""
        if not isinstance(data, Mapping):
            return [(self._evaluator, self._feed.eval_dataset(data, batch_size))]
        self._feed.check_head_data(data, "eval_data")
        runs = []
        for head in self.names:
            evaluator = self._head_evaluators.get(head)
            if evaluator is None:
                evaluator = self._head_evaluators[head] = self._evaluator_of((head,))
            runs.append((evaluator, self._feed.head_dataset(head, data[head], batch_size or 1024,
                                                            False, None)))
        return runs

    def _evaluator_of(self, names: Sequence[str]) -> Evaluator:
        """The evaluator of the objectives `names`."""
        return Evaluator(self.model, {n: self.loss_fns[n] for n in names},
                         metrics={n: self.objectives[n].metrics for n in names},
                         loss_specs={n: self.objectives[n].loss for n in names},
                         predictions={n: self._predictions[n] for n in names})

    def close(self) -> None:
        """Flushes and closes the TensorBoard writers and ends the last `fit`'s data
        iterators. A later `fit` continues from the data position, as after a restore:
        exactly the uninterrupted run's batches for arrays, or for a dataset built anew
        (a dataset object already iterated has drawn its reshuffle seeds)."""
        self._feed.release()
        if self.monitor:
            self.monitor.close()
        if self._scratch_logs is not None:
            shutil.rmtree(self._scratch_logs, ignore_errors=True)


def _nothing() -> None:
    """Flushes no logs (a trainer without TensorBoard)."""
