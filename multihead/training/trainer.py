"""`Trainer`: per-head optimizers on exact var_lists, driven step by step or by `fit`.

The trainer holds the training state and drives; what it drives lives beside it: the
step is assembled by `multihead.step.assemble` from the objectives and the step's
options (`multihead.step.options`) and run on checked batches by `step_runner`;
`fit_loop` is `fit`'s loop over compiled calls, `callbacks` what it calls around
them; `streams` (the batches of the user's data), `evaluation`, `results`
(`StepResult`, `History`), `execution` (steps per compiled call) and
`training_state` (what a checkpoint holds).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any, Mapping, Protocol, Sequence

import numpy as np
import tensorflow as tf

from multihead._checks import check_int
from multihead.settings import PYTHON, check_affinity
from multihead.datasets.multitask import DataPosition
from multihead.model.model_view import HeadsModel
from multihead.monitoring.monitor import Monitor
from multihead.objectives.labels import LabelCheck
from multihead.objectives.objective import Objective, claim_optimizers
from multihead.objectives.parts import prediction_fn
from multihead.step import distribute
from multihead.step.assemble import StepAssembly
from multihead.step.options import StepOptions
from multihead.step.trunk_policy import TrunkPolicy
from multihead.step.trunk_rule import TrunkRule
from multihead.training.callbacks import Callback, CallbackList, NonFiniteGuard, ProgressCallback
from multihead.training.evaluation import Evaluations
from multihead.training.execution import ExecutionSize, fit_length
from multihead.training.fit_loop import run_fit
from multihead.training.results import History, StepResult
from multihead.training.sampling import TaskSampling
from multihead.training.step_runner import StepRunner
from multihead.training.streams import DataFeed
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
        affinity_every, affinity_lookahead: inter-task affinities (`Monitor`, docs/affinity.md).
        trunk: `"per_head"` (each head's optimizer updates the trunk with its own slots);
            a `TrunkPolicy` (or a dict of its fields): one trunk optimizer applies an
            aggregate of the heads' trunk gradients, each head's its own variables only
            (`multihead.step.trunk_update`; needs `schedule="simultaneous"`); or a
            `TrunkRule` of your own (docs/own-methods.md).
        strategy: a `tf.distribute` strategy (`MirroredStrategy`,
            `MultiWorkerMirroredStrategy`; see `multihead.step.distribute.make_strategy`),
            or None for one device. Build the model and create optimizer objects
            (and target networks) inside `strategy.scope()`; optimizers given by
            name are created there by the trainer. Call `step` and `fit` outside
            the scope. Each batch is the *global* batch, split across replicas;
            losses are batch means, so results match single-device training on
            the same global batch. Only the chief logs to TensorBoard and writes
            checkpoints. Not supported with a strategy: XLA, trunk aggregation with
            `rep_grad` or a loss weighting, inter-task affinity.
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
        histograms_every: int = 1000, log_variable_norms: bool = False,
        affinity_every: int = 0, affinity_lookahead: str = "optimizer",
        trunk: str | TrunkPolicy | TrunkRule | Mapping[str, Any] = "per_head",
        strategy: tf.distribute.Strategy | None = None,
        max_nonfinite_steps: int = 10, target_networks: Sequence[Any] = (),
        **options: Any,
    ) -> None:
        if not isinstance(model, HeadsModel):
            raise TypeError(f"model must be a MultiHeadModel, got {type(model).__name__}")
        #: How the step runs (`StepOptions`), built once from the keywords.
        self.options = StepOptions.from_keywords(schedule=schedule, **options)
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
        predictions = {n: prediction_fn(model, n, o) for n, o in self.objectives.items()}
        self.step_variable = parts.step_variable
        with distribute.scope(strategy):
            #: Position of `fit` in its data stream (checkpointed, so a resume sees the same batches).
            self.data_position = DataPosition(heads=self.names)
        self._frozen = parts.frozen
        #: Each objective's dynamic loss scale (float16), or None.
        self.loss_scales = parts.loss_scales
        #: False on the non-chief workers of a multi-worker run (they neither log nor save).
        self.is_chief = distribute.is_chief(strategy)
        labels = LabelCheck(model, self.objectives, self.loss_fns, predictions)
        self._runner = StepRunner(parts, labels)
        self._feed = DataFeed(model, self.names, labels, self._runner.ensure_built,
                              self.data_position, self.step_variable, strategy, parts.rep_grad)
        # Built now so a bad metric name fails at construction.
        self._evaluations = Evaluations(model, self.objectives, self.loss_fns, predictions, self._feed)
        self.monitor, self._scratch_logs = _monitor(
            log_dir, strategy, self._evaluations.metric_names(), log_every, histograms_every,
            log_variable_norms, affinity_every, affinity_lookahead)
        self._runner.monitor = self.monitor
        #: Set by a callback to end `fit` after the current compiled call.
        self.stop_training = False
        #: Why the last `fit` stopped early (set through `Callback.request_stop`), or None.
        self.stop_reason: str | None = None
        #: One-line notices of the last `fit`'s callbacks (`Callback.announce`), in order.
        self.notices: list[str] = []
        # Last: a trainer whose construction failed claims no optimizer.
        claim_optimizers(self, self.optimizers, self.trunk_optimizer)
        if model.built:
            self._runner.ensure_built(None)

    @property
    def schedule(self) -> str:
        """`"simultaneous"` or `"sequential"` (`StepOptions.schedule`)."""
        return self.options.schedule

    # -- construction -------------------------------------------------------------------

    def build_optimizers(self) -> None:
        """Builds every optimizer on its var_list now (the model must be built), so their
        slots exist, e.g. before restoring a checkpoint into them. Idempotent."""
        if not self.model.built:
            raise ValueError("build the model first (model.build(input_shape) or one call)")
        self._runner.ensure_built(None)

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

    # -- training -----------------------------------------------------------------------

    @property
    def global_step(self) -> int:
        """Number of steps taken so far."""
        return int(self.step_variable.numpy())

    @property
    def trace_count(self) -> int:
        """How many times the train step was traced (stays small: no per-step retracing)."""
        step = self._runner.train_step
        return step.trace_count if step is not None else 0

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
            heads = _head_subset(heads, self.names)
        return self._runner.step(batch, heads)

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
        _head_subset([head], self.names)
        self._frozen.set(head, True)

    def unfreeze(self, head: str) -> None:
        """Lets a frozen `head` update again from the next step on (see `freeze`)."""
        _head_subset([head], self.names)
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
        return self._runner.run(iterator, max_steps)

    @property
    def max_nonfinite_steps(self) -> int:
        """Non-finite steps in a row of one head after which `fit` stops with an error."""
        return self._nonfinite_limit

    def fit(self, data: Any, steps: int | None = None, *, epochs: int | None = None,
            batch_size: int | None = None, eval_data: Any = None, eval_every: int | None = None,
            verbose: bool = True, seed: int | None = 0, checkpoints: SavesCheckpoints | None = None,
            steps_per_execution: int | str = "auto", callbacks: Sequence[Callback] = (),
            sampling: str | TaskSampling | Mapping[str, Any] = "all") -> History:
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
                small models; `"auto"` sizes each call to take about 50 ms (1 to 1000
                steps; 20 under a multi-worker strategy, whose workers must run alike). Results,
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
        steps, per_epoch = fit_length(data, steps, epochs, batch_size)
        call_size = ExecutionSize(steps_per_execution,
                                  clocked=not distribute.is_multi_worker(self.strategy))
        if eval_every is not None:
            eval_every = check_int(eval_every, "eval_every", minimum=1, hint="or None: only at the end")
        stream = self._feed.stream(data, batch_size, seed, sampling)
        evaluate = None
        if eval_data is not None:  # a metric that cannot be computed fails before the first step
            self._evaluations.check(eval_data, batch_size)
            evaluate = lambda: self.evaluate(eval_data, batch_size=batch_size)  # noqa: E731
        extra: list[Any] = [NonFiniteGuard(self._nonfinite_limit)]
        if checkpoints is not None:
            extra.append(checkpoints.callback())
        if verbose:
            extra.append(ProgressCallback(self.global_step + steps, start=self.global_step,
                                          per_epoch=per_epoch))
        hooks = CallbackList([*callbacks, *extra], self)
        return run_fit(self, stream, steps, call_size, hooks, self._runner.sync_weights, evaluate,
                       eval_every)

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
        results = self._evaluations.evaluate(data, batch_size)
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


def _monitor(log_dir: str | os.PathLike[str] | None, strategy: tf.distribute.Strategy | None,
             eval_metrics: Mapping[str, Sequence[str]], every: int, histograms_every: int,
             variable_norms: bool, affinity_every: int, affinity_lookahead: str,
             ) -> tuple[Monitor | None, str | None]:
    """The TensorBoard monitor (None without `log_dir`), told the metrics `evaluate` writes
    (`eval_metrics`, for its Custom Scalars layout), and the scratch directory it writes to on a
    non-chief worker (`close` removes it), or None; the cadences are checked first.

    Every worker of a multi-worker run monitors, so all of them trace the same step
    variants at the same steps (their all-reduces pair up only then); the others write
    to a scratch directory, as Keras' TensorBoard callback does.
    """
    check_int(every, "log_every", minimum=1, hint="scalars are written every this many steps")
    check_affinity(check_int(affinity_every, "affinity_every", minimum=0), log_dir is not None,
                   strategy and f"a strategy ({type(strategy).__name__})", PYTHON)
    if log_dir is None:
        return None, None
    scratch = None if distribute.is_chief(strategy) else tempfile.mkdtemp(prefix="multihead-worker-logs-")
    monitor = Monitor(os.fspath(scratch or log_dir), every=every, histograms_every=histograms_every,
                      variable_norms=variable_norms, eval_metrics=eval_metrics,
                      affinity_every=affinity_every, affinity_lookahead=affinity_lookahead)
    return monitor, scratch


def _head_subset(heads: Sequence[str], names: Sequence[str]) -> tuple[str, ...]:
    """`heads`, checked to be a non-empty list of the objectives `names`."""
    if isinstance(heads, str) or not heads:
        raise ValueError(f"heads must be a non-empty list of head names, got {heads!r}")
    unknown = [h for h in heads if h not in names]
    if unknown:
        raise ValueError(f"heads names head {unknown[0]!r}, but the model's heads are "
                         f"{list(names)}")
    return tuple(heads)

