"""`Trainer`: per-head optimizers on exact var_lists, driven step by step or by `fit`."""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Iterator, Mapping, NamedTuple, Protocol, Sequence

import keras
import numpy as np
import tensorflow as tf

from multihead import _keras_internals as internals
from multihead._checks import check_choice, check_int
from multihead.core import distribute
from multihead.core.data import DataPosition, StreamPosition, as_dataset
from multihead.core.evaluation import Evaluator
from multihead.core.model import MultiHeadModel
from multihead.monitoring.monitor import Monitor
from multihead.core.objectives import (
    Objective,
    check_weight,
    needs_own_targets,
    resolve_loss,
    resolve_optimizer,
)
from multihead.core.callbacks import Callback, CallbackList, NonFiniteGuard, ProgressCallback
from multihead.core.step import SCHEDULES, TrainStep, check_targets
from multihead.core.addresses import variable_addresses
from multihead.core.sampling import TaskSampling, as_sampling
from multihead.core.trunk_rule import HeadSpec, PerHeadTrunk
from multihead.core.trunk_update import TrunkPolicy, TrunkUpdate


class StepResult(NamedTuple):
    """The outcome of one training step.

    Attributes:
        step: the step counter value the update was taken at (0 for the first).
        losses: head -> (unweighted) loss, for the heads that were due this step.
        updated: the names of the heads whose optimizer applied an update.
        skipped: the due heads whose update was dropped because their loss or a
            gradient was not finite (`Objective(on_nonfinite="skip")`).
    """

    step: int
    losses: dict[str, float]
    updated: tuple[str, ...]
    skipped: tuple[str, ...] = ()


@dataclasses.dataclass
class History:
    """What `Trainer.fit` recorded.

    Attributes:
        train: head -> list of `(step, loss)` for every step the head was updated.
        eval: list of `(step, {head: {metric: value}})` for every evaluation.
        wall_time: seconds spent in `fit`.
    """

    train: dict[str, list[tuple[int, float]]] = dataclasses.field(default_factory=dict)
    eval: list[tuple[int, dict[str, dict[str, float]]]] = dataclasses.field(default_factory=list)
    wall_time: float = 0.0

    def losses(self, head: str) -> np.ndarray:
        """The training losses of `head`, one per update, as an array."""
        return np.array([loss for _, loss in self.train.get(head, [])])


def _zeros_for_spec(spec: tf.TensorSpec) -> tf.Tensor:
    """A one-example zero batch for a tensor spec (unknown dimensions become 1)."""
    return tf.zeros([1 if d is None else d for d in spec.shape], spec.dtype)


def _is_empty(dataset: tf.data.Dataset) -> bool:
    """Whether `dataset` yields nothing: from its cardinality when TF knows it (no pipeline
    start), else by taking one element."""
    known = int(dataset.cardinality())
    if known != int(tf.data.UNKNOWN_CARDINALITY):
        return known == 0
    return next(iter(dataset.take(1)), None) is None


def _split_batch(batch: Any) -> tuple[Any, Any]:
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return batch[0], batch[1]
    raise TypeError(
        "a batch must be a pair (inputs, targets) with targets a dict head -> labels, "
        f"got {type(batch).__name__}"
    )


def _is_sparse(loss: Any) -> bool:
    """Whether a Keras loss spec takes class indices as labels (one value per example)."""
    name = loss if isinstance(loss, str) else (
        loss.get("class_name", "") if isinstance(loss, Mapping) else type(loss).__name__)
    return "sparse" in str(name).lower()


def check_label_shape(head: str, loss: Any, label: tf.TensorShape, output: tf.TensorShape,
                      batch: int | None) -> None:
    """Raises unless labels of shape `label` fit the output of `head` for its Keras loss:
    the output's shape (a `(batch,)` label also fits a `(batch, 1)` output), or, for a
    sparse loss, the output's shape without its class axis. Custom loss callables are not
    checked: they define their own shapes."""
    if not (isinstance(loss, (str, Mapping)) or isinstance(loss, keras.losses.Loss)):
        return
    out = output.as_list()
    expected = [out[:-1], out[:-1] + [1]] if _is_sparse(loss) else [out]
    if not _is_sparse(loss) and out[-1:] == [1]:
        expected.append(out[:-1])
    dims = label.as_list() if label.rank is not None else None

    def fits(shape: list[int | None]) -> bool:
        return dims is not None and len(dims) == len(shape) and all(
            a is None or b is None or a == b for a, b in zip(dims, shape))

    matched = any(fits(e) for e in expected)
    if matched and dims and batch is not None and dims[0] is not None and dims[0] != batch:
        matched = False
    if not matched:
        got = tuple(dims) if dims is not None else "unknown"
        raise ValueError(
            f"head {head!r}: labels of shape {got} do not fit its output of shape "
            f"{tuple(out[:1] and [batch] + out[1:])} for loss {loss!r} (they would broadcast); "
            "give one label row per example, shaped like the output")


class _LossWeight:
    """A head's loss weight as the compiled step reads it: a variable for a number, so
    a new number assigned to the objective takes effect on the next step without a
    retrace; the schedule (or callable of the step) itself otherwise."""

    def __init__(self, head: str, spec: Any) -> None:
        self.head = head
        self._name = f"objectives[{head!r}].weight"
        self.spec = spec
        self.variable = None if callable(spec) else tf.Variable(
            check_weight(spec, self._name), dtype=tf.float32, trainable=False, name="loss_weight")

    def __call__(self, step: tf.Tensor) -> tf.Tensor:
        if self.variable is not None:
            return self.variable.read_value()
        return tf.cast(self.spec(step), tf.float32)

    def sync(self, spec: Any) -> None:
        """Takes the objective's current weight; raises if the step cannot."""
        if spec is self.spec or (not callable(spec) and not callable(self.spec) and spec == self.spec):
            return
        if self.variable is None or callable(spec):
            raise ValueError(
                f"{self._name} changed from {self.spec!r} to {spec!r} after the "
                "step was built: a number can be replaced by another number, a schedule not at "
                "all; build a new Trainer for that")
        self.variable.assign(check_weight(spec, self._name))
        self.spec = spec


class SavesCheckpoints(Protocol):
    """What `fit(checkpoints=...)` takes: a `multihead.CheckpointManager`."""

    def callback(self) -> Callback:
        """The callback that saves on the manager's cadence."""


class _DataKey:
    """Identifies the data of a `fit` call: the same dataset object, or the same array
    objects with the same batch size and seed."""

    def __init__(self, data: Any, batch_size: int | None, seed: int | None) -> None:
        self.leaves = [data] if isinstance(data, tf.data.Dataset) else tf.nest.flatten(data)
        self.settings = (batch_size, seed)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, _DataKey) and self.settings == other.settings
                and len(self.leaves) == len(other.leaves)
                and all(a is b for a, b in zip(self.leaves, other.leaves)))


class _Steps(NamedTuple):
    """What one call of a stream ran: `count` steps from `first`; per step (rows) and head
    (columns) the loss, whether the head updated and whether its update was dropped."""

    first: int
    count: int
    losses: np.ndarray
    updated: np.ndarray
    skipped: np.ndarray


class _Stream:
    """The batches `fit` takes from one dataset: the current epoch's iterator and the next
    epochs, run through the compiled step several steps per call."""

    def __init__(self, key: Any, train_step: TrainStep, position: DataPosition,
                 dataset: Any, per_epoch: int | None) -> None:
        self.key = key
        self.train_step = train_step
        self._position = position
        self._epochs: Iterator[Any] | None = None
        if per_epoch:  # a known length: the epochs as one repeated stream
            self._iterator = position.repeated(dataset, per_epoch)
        else:
            self._epochs = position.epochs(dataset)
            self._iterator = next(self._epochs)

    def run(self, steps: int) -> _Steps:
        """Up to `steps` steps; 0 at the end of an epoch (the next call starts the next)."""
        out = self.train_step.run(self._iterator, steps)
        count = int(out.count)
        if count == 0:
            if self._epochs is None:
                raise ValueError("the training data yielded no batch")
            self._iterator = next(self._epochs)  # raises if an epoch yields no batch
        else:
            self._position.advance(count)
        return _Steps(int(out.first_step), count, out.losses.numpy(), out.updated.numpy(),
                      out.skipped.numpy())


class _HeadStreams:
    """The batches `fit` takes from per-head datasets: each head's own dataset, repeated
    forever, with a checkpointed count of the batches drawn (`StreamPosition`).

    With `sampling="all"` the heads' streams are zipped and run in the compiled loop,
    several steps per call, as one dataset is; a sampled head is drawn per step in
    Python (`TaskSampling.head_at`) and its step is one compiled call.
    """

    def __init__(self, key: Any, train_step: TrainStep, positions: Mapping[str, StreamPosition],
                 datasets: Mapping[str, tf.data.Dataset], sampling: TaskSampling,
                 probabilities: np.ndarray | None, step: tf.Variable) -> None:
        self.key = key
        self.train_step = train_step
        self._positions = {h: positions[h] for h in datasets}
        streams = {h: positions[h].stream(ds) for h, ds in datasets.items()}
        self._probabilities = probabilities
        self._sampling = sampling
        self._step = step
        if probabilities is None:
            zipped = tf.data.Dataset.zip(streams).map(
                lambda batches: ({h: b[0] for h, b in batches.items()},
                                 {h: b[1] for h, b in batches.items()}))
            self._zipped = iter(zipped)
        else:
            self._iterators = {h: iter(stream) for h, stream in streams.items()}

    def run(self, steps: int) -> _Steps:
        """`steps` steps."""
        if self._probabilities is None:
            out = self.train_step.run(self._zipped, steps, own_batches=True)
            count = int(out.count)  # the streams never end (each was checked to have a batch)
            for position in self._positions.values():
                position.advance(count)
            return _Steps(int(out.first_step), count, out.losses.numpy(), out.updated.numpy(),
                          out.skipped.numpy())
        first = int(self._step.numpy())
        heads = list(self._iterators)
        outputs = []
        for step in range(first, first + steps):
            head = heads[self._sampling.head_at(step, self._probabilities)]
            inputs, targets = next(self._iterators[head])
            self._positions[head].advance(1)
            outputs.append(self.train_step(inputs, targets, heads=(head,)))
        return _Steps(first, steps, *(np.stack([getattr(o, f).numpy() for o in outputs])
                                      for f in ("losses", "updated", "skipped")))


class _ExecutionSize:
    """How many steps `fit` runs in its next compiled call: a fixed number, or, for
    `"auto"`, as many as take about `TARGET_SECONDS`, from the time per step of the last
    call. A call costs ~0.2-0.7 ms of Python and graph setup whatever its size: at 50 ms
    that is about 1%, and the progress line still moves several times a second. The
    first call (which traces) measures slow, so it is followed by one step per call,
    then the size settles within a few calls.

    Args:
        steps_per_execution: an integer >= 1, or `"auto"`.
    """

    TARGET_SECONDS = 0.05
    MAX_STEPS = 1000

    def __init__(self, steps_per_execution: int | str) -> None:
        if isinstance(steps_per_execution, str) and steps_per_execution == "auto":
            self.auto, self.next = True, 1
        else:
            self.auto, self.next = False, check_int(
                steps_per_execution, "steps_per_execution", minimum=1,
                hint="give an integer >= 1 or 'auto'")

    def observe(self, steps: int, seconds: float) -> None:
        """Records that the last call ran `steps` steps in `seconds`."""
        if self.auto and steps > 0:
            per_step = seconds / steps
            fits = int(self.TARGET_SECONDS / per_step) if per_step > 0 else self.MAX_STEPS
            self.next = max(1, min(self.MAX_STEPS, fits))


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
        schedule: `"simultaneous"` or `"sequential"` (see `multihead.core.step`).
        log_dir: TensorBoard log directory; None disables logging.
        log_every: write scalars every this many steps.
        histograms_every: write gradient histograms every this many steps (0: never).
        log_variable_norms: also write each variable's gradient norm.
        jit_compile: XLA-compile the step (off by default: slower on CPU).
        trunk: `"per_head"` (each head's optimizer updates the trunk with its own
            slots), or a `TrunkPolicy` (or a dict of its fields): one trunk
            optimizer applies an aggregate of the heads' trunk gradients and each
            head's optimizer is built on its own variables only (see
            `multihead.core.trunk_update`). Needs `schedule="simultaneous"`.
        strategy: a `tf.distribute` strategy (`MirroredStrategy`,
            `MultiWorkerMirroredStrategy`; see `multihead.core.distribute.make_strategy`),
            or None for one device. Build the model and create optimizer objects
            (and target networks) inside `strategy.scope()`; optimizers given by
            name are created there by the trainer. Call `step` and `fit` outside
            the scope. Each batch is the *global* batch, split across replicas;
            losses are batch means, so results match single-device training on
            the same global batch. Only the chief logs to TensorBoard and writes
            checkpoints. Not supported with a strategy: `jit_compile`, trunk
            aggregation with `rep_grad` or a loss weighting.
        target_networks: `multihead.TargetNetwork`s whose `update()` runs inside the
            compiled train step, after the optimizers applied (never in `evaluate`).
        max_nonfinite_steps: `fit` stops with an error naming the head when a head's
            loss or gradient is non-finite this many steps in a row (its updates
            were skipped meanwhile, see `Objective(on_nonfinite=...)`).
    """

    def __init__(
        self,
        model: MultiHeadModel,
        objectives: Mapping[str, Objective],
        schedule: str = "simultaneous",
        log_dir: str | os.PathLike[str] | None = None,
        log_every: int = 100,
        jit_compile: bool = False,
        histograms_every: int = 1000,
        log_variable_norms: bool = False,
        trunk: str | TrunkPolicy | Mapping[str, Any] = "per_head",
        strategy: tf.distribute.Strategy | None = None,
        max_nonfinite_steps: int = 10,
        target_networks: Sequence[Any] = (),
    ) -> None:
        if not isinstance(model, MultiHeadModel):
            raise TypeError(f"model must be a MultiHeadModel, got {type(model).__name__}")
        check_choice(schedule, "schedule", SCHEDULES)
        check_int(log_every, "log_every", minimum=1, hint="scalars are written every this many steps")
        self._nonfinite_limit = check_int(max_nonfinite_steps, "max_nonfinite_steps", minimum=1)
        model.check_heads(objectives, "objectives")
        missing = [h for h in model.head_names if h not in objectives]
        if missing:
            raise ValueError(
                f"head {missing[0]!r} has no objective: give every head an Objective "
                f"(objectives cover {sorted(objectives)})"
            )
        for head, objective in objectives.items():
            if not isinstance(objective, Objective):
                raise TypeError(
                    f"objectives[{head!r}] must be a multihead.Objective, got {type(objective).__name__}"
                )
        for target in target_networks:
            if not callable(getattr(target, "update", None)):
                raise TypeError(f"target_networks must have an update() method, got {target!r}")
        #: Updated inside each compiled train step, after the optimizers.
        self.target_networks = tuple(target_networks)
        self.model = model
        self.objectives = {h: objectives[h] for h in model.head_names}
        self.schedule = schedule
        self.loss_fns = {h: resolve_loss(o.loss, h) for h, o in self.objectives.items()}
        if strategy is not None and not isinstance(strategy, tf.distribute.Strategy):
            raise TypeError(f"strategy must be a tf.distribute.Strategy or None, got {strategy!r}")
        if strategy is not None and jit_compile:
            raise ValueError("jit_compile=True is not supported with a strategy; set jit_compile=False")
        if log_dir is not None and jit_compile:
            raise ValueError(
                "jit_compile=True cannot be combined with TensorBoard logging (log_dir): XLA cannot "
                "compile the summary ops in the step; pass log_dir=None to train with XLA"
            )
        #: The `tf.distribute` strategy, or None.
        self.strategy = strategy
        with distribute.scope(strategy):  # optimizers given by name are created in the scope
            self.optimizers = {h: resolve_optimizer(o.optimizer, h) for h, o in self.objectives.items()}
            self._check_distinct_optimizers()
            #: The aggregated trunk update (trunk optimizer, loss weighting, RNG), None for per_head.
            self.trunk_update = TrunkUpdate.create(trunk, self.objectives, schedule, self.optimizers)
        if strategy is not None:
            self._check_strategy(strategy)
        if self.trunk_update is not None and self.trunk_update.policy.rep_grad and model.routes_heads:
            raise ValueError(
                f"trunk: rep_grad=True combines the heads' gradients at one shared trunk output, but "
                f"the trunk {type(model.trunk).__name__} gives each head its own features; "
                "use rep_grad=False (parameter space)")
        #: The trunk optimizer under trunk aggregation, None for per_head.
        self.trunk_optimizer = self.trunk_update.optimizer if self.trunk_update else None
        # Built now so a bad metric name fails at construction.
        self._evaluator = Evaluator(
            model, self.loss_fns,
            metrics={h: o.metrics for h, o in self.objectives.items()},
            loss_specs={h: o.loss for h, o in self.objectives.items()})
        with distribute.scope(strategy):
            self.step_variable = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
            #: Position of `fit` in its data stream (checkpointed, so a resume sees the same batches).
            self.data_position = DataPosition(heads=model.head_names)
        #: False on the non-chief workers of a multi-worker run (they neither log nor save).
        self.is_chief = distribute.is_chief(strategy)
        self.monitor = (
            Monitor(os.fspath(log_dir), every=log_every, histograms_every=histograms_every,
                    variable_norms=log_variable_norms)
            if log_dir is not None and self.is_chief else None
        )
        self._jit_compile = jit_compile
        self._needs_targets = {h: needs_own_targets(loss) for h, loss in self.loss_fns.items()}
        self._checked_keys: tuple[Any, ...] | None = None
        self._train_step: TrainStep | None = None
        self._weights: dict[str, _LossWeight] = {}
        self._last_stream: _Stream | _HeadStreams | None = None
        self._head_evaluators: dict[str, Evaluator] = {}
        #: Set by a callback to end `fit` after the current compiled call.
        self.stop_training = False
        #: Why the last `fit` stopped early (set through `Callback.request_stop`), or None.
        self.stop_reason: str | None = None
        if model.built:
            self._build()

    # -- construction -------------------------------------------------------------------

    def _check_strategy(self, strategy: tf.distribute.Strategy) -> None:
        for head, opt in self.optimizers.items():
            if internals.optimizer_strategy(opt) not in (None, strategy):
                raise ValueError(
                    f"the optimizer of head {head!r} was created outside strategy.scope(); create "
                    "it inside `with strategy.scope():` or give its name (e.g. 'adam')")
        policy = self.trunk_update.policy if self.trunk_update is not None else None
        if policy is not None and (policy.rep_grad or policy.is_loss_weighting):
            what = "rep_grad=True" if policy.rep_grad else f"loss_weighting={policy.loss_weighting!r}"
            raise ValueError(
                f"trunk aggregation with {what} is not supported with a strategy yet; use a "
                "gradient aggregator (sum, mean, weights, pcgrad, mgda, cagrad, upgrad, imtl) "
                "in parameter space, or train on one device")

    def _check_distinct_optimizers(self) -> None:
        seen: dict[int, str] = {}
        for head, opt in self.optimizers.items():
            if id(opt) in seen:
                raise ValueError(
                    f"heads {seen[id(opt)]!r} and {head!r} were given the same optimizer object; "
                    "each head needs its own (it is built on that head's var_list)"
                )
            seen[id(opt)] = head

    def build_optimizers(self) -> None:
        """Builds every optimizer on its var_list now (the model must be built), so their
        slots exist, e.g. before restoring a checkpoint into them. Idempotent."""
        if self._train_step is None:
            if not self.model.built:
                raise ValueError("build the model first (model.build(input_shape) or one call)")
            self._build()

    def _build(self) -> None:
        """Partitions the variables and builds each optimizer eagerly on its var_list."""
        if self.strategy is not None:
            distribute.check_created_in_scope(self.strategy, self.model.weights, "model")
        with distribute.scope(self.strategy):  # optimizer slots become mirrored variables
            heads = self._build_heads()
        rule: Any = PerHeadTrunk()
        if self.trunk_update is not None:
            with distribute.scope(self.strategy):
                self.trunk_update.build(self.model.trunk_variables)
            rule = self.trunk_update
        addresses = {id(v): a for a, v in variable_addresses(self.model).items()}
        self._train_step = TrainStep(
            self.model, heads, self.schedule, self.step_variable, rule, self.monitor,
            self._jit_compile, strategy=self.strategy, target_networks=self.target_networks,
            addresses=addresses,
        )

    def _build_heads(self) -> list[HeadSpec]:
        heads = []
        for head, objective in self.objectives.items():
            aggregated = self.trunk_update is not None  # then the trunk has its own optimizer
            var_list = self.model.var_list(head, trains_trunk=objective.trains_trunk and not aggregated)
            optimizer = self.optimizers[head]
            if optimizer.built:
                built_on = [id(v) for v in internals.built_variables(optimizer)]
                if built_on != [id(v) for v in var_list]:
                    raise ValueError(
                        f"the optimizer of head {head!r} was already built on other variables; "
                        "pass a fresh optimizer"
                    )
            else:
                optimizer.build(var_list)
            self._weights[head] = _LossWeight(head, objective.weight)
            heads.append(HeadSpec(
                name=head,
                loss=self.loss_fns[head],
                optimizer=optimizer,
                var_list=tuple(var_list),
                weight=self._weights[head],
                every=objective.every,
                trains_trunk=objective.trains_trunk,
                guarded=objective.on_nonfinite != "apply",
            ))
        return heads

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

    def _targets(self, targets: Any) -> Any:
        if not isinstance(targets, Mapping) and len(self.objectives) == 1:
            return {next(iter(self.objectives)): targets}
        return targets

    def _check_targets(self, targets: Any, heads: Sequence[str] | None, inputs: Any) -> None:
        """Raises a clear error if the targets do not match the heads: missing or extra
        keys, or labels whose shape does not fit the head's output (they would broadcast)."""
        keys = frozenset(targets) if isinstance(targets, Mapping) else None
        shapes = (tuple(tf.TensorShape(np.shape(v) if not hasattr(v, "shape") else v.shape))
                  for v in tf.nest.flatten(targets))
        key = (keys, heads, tuple(shapes), tuple(np.shape(x)[:1] for x in tf.nest.flatten(inputs)))
        if key == self._checked_keys:
            return  # this batch structure was validated already: keep the per-step path lean
        check_targets(targets, list(self.objectives), self._needs_targets,
                      strict=all(self._needs_targets.values()), required=heads)
        outputs = self._output_shapes(inputs)
        batch = np.shape(tf.nest.flatten(inputs)[0])[0] if tf.nest.flatten(inputs) else None
        for head in heads or self.objectives:
            if self._needs_targets[head] and isinstance(targets, Mapping):
                label = targets[head]
                label_shape = tf.TensorShape(label.shape if hasattr(label, "shape") else np.shape(label))
                check_label_shape(head, self.objectives[head].loss, label_shape, outputs[head], batch)
        self._checked_keys = key

    def _output_shapes(self, inputs: Any) -> dict[str, tf.TensorShape]:
        """Each head's output shape (batch dimension unknown), from one example."""
        one = tf.nest.map_structure(lambda x: tf.zeros([1] + list(np.shape(x))[1:], x.dtype)
                                    if hasattr(x, "dtype") else x, inputs)
        outputs = self.model(one, training=False)
        return {h: tf.TensorShape([None] + list(outputs[h].shape[1:])) for h in self.objectives}

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
        inputs, targets = _split_batch(batch)
        targets = self._targets(targets)
        if tf.nest.flatten(inputs) and np.shape(tf.nest.flatten(inputs)[0])[:1] == (0,):
            raise ValueError("the batch is empty (its inputs have 0 examples); give a batch "
                             "with at least one example")
        train_step = self._ensure_built(inputs)
        self._check_targets(targets, heads, inputs)
        self._sync_weights()
        output = train_step(inputs, targets, heads)
        return self._result(int(output.step), output.losses.numpy(), output.updated.numpy(),
                            output.skipped.numpy())

    def _check_head_subset(self, heads: Sequence[str]) -> tuple[str, ...]:
        if isinstance(heads, str) or not heads:
            raise ValueError(f"heads must be a non-empty list of head names, got {heads!r}")
        self.model.check_heads(heads, "heads")
        return tuple(heads)

    def _sync_weights(self) -> None:
        for head, weight in self._weights.items():
            weight.sync(self.objectives[head].weight)

    def _result(self, step: int, losses: np.ndarray, updated: np.ndarray,
                skipped: np.ndarray) -> StepResult:
        heads = list(self.objectives)
        done = tuple(h for h, flag in zip(heads, updated) if flag)
        dropped = tuple(h for h, flag in zip(heads, skipped) if flag)
        values = {h: float(v) for h, v, a, b in zip(heads, losses, updated, skipped) if a or b}
        return StepResult(step=step, losses=values, updated=done, skipped=dropped)

    def fit(
        self,
        data: Any,
        steps: int,
        *,
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
        """Trains for `steps` more steps, cycling through `data` as often as needed.

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
            steps: number of training steps.
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
                set `stop_training`, see `multihead.core.callbacks`). A callback
                stops training by setting `trainer.stop_training = True`.
            sampling: with per-head data, `"all"` (every head takes a batch of its own
                data each step) or one head drawn per step: `"uniform"`,
                `"proportional"`, `"temperature"`, or a `multihead.TaskSampling` (its
                seed defaults to `seed`).

        Returns:
            The per-head history of training losses and evaluations of this call.
        """
        steps = check_int(steps, "steps", minimum=1)
        call_size = _ExecutionSize(steps_per_execution)
        if eval_every is not None:
            eval_every = check_int(eval_every, "eval_every", minimum=1, hint="or None: only at the end")
        stream = self._stream(data, batch_size, seed, sampling)
        if eval_data is not None:  # a metric that cannot be computed fails before the first step
            for evaluator, dataset in self._evaluations(eval_data, batch_size):
                evaluator.check_dataset(dataset)
        history = History(train={h: [] for h in self.objectives})
        extra: list[Any] = [NonFiniteGuard(self._nonfinite_limit)]
        if checkpoints is not None:
            extra.append(checkpoints.callback())
        if verbose:
            extra.append(ProgressCallback(steps))
        hooks = CallbackList([*callbacks, *extra], self)
        periods = hooks.periods() + ([eval_every] if eval_data is not None and eval_every else [])
        self.stop_training, self.stop_reason = False, None
        start = time.perf_counter()
        done = 0
        hooks.on_train_begin()
        try:
            while done < steps and not self.stop_training:
                chunk = min([steps - done, call_size.next]
                            + [p - self.global_step % p for p in periods])
                self._sync_weights()
                called = time.perf_counter()
                out = stream.run(chunk)
                count = out.count
                call_size.observe(count, time.perf_counter() - called)
                if count == 0:
                    continue  # the end of an epoch
                for i in range(count):
                    result = self._result(out.first + i, out.losses[i], out.updated[i],
                                          out.skipped[i])
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

    def _stream(self, data: Any, batch_size: int | None, seed: int | None,
                sampling: str | TaskSampling | Mapping[str, Any]) -> _Stream | _HeadStreams:
        """The batch stream of `data`: the last `fit`'s, continued, when `data` is the
        same data (and no checkpoint moved the position since); a new one otherwise."""
        per_head = isinstance(data, Mapping)
        sampling = as_sampling(sampling, seed)
        if per_head:
            key: Any = (tuple((h, _DataKey(d, batch_size, seed)) for h, d in data.items()), sampling)
        else:
            if sampling.kind != "all":
                raise ValueError(f"sampling={sampling.kind!r} draws one head's dataset per step: "
                                 "give data as a dict head -> that head's data")
            key = _DataKey(data, batch_size, seed)
        stream = self._last_stream
        if stream is not None and stream.key == key and not self.data_position.restored:
            return stream
        self._last_stream = None
        if per_head:
            self._last_stream = self._head_streams(key, data, batch_size, seed, sampling)
            return self._last_stream
        dataset = self._labelled(as_dataset(data, batch_size, shuffle=True, seed=seed))
        inputs_spec, targets_spec = dataset.element_spec
        zeros = tf.nest.map_structure(_zeros_for_spec, inputs_spec)
        train_step = self._ensure_built(zeros)
        self._check_targets(targets_spec, None, zeros)
        per_epoch = int(dataset.cardinality())
        if self.strategy is not None:  # each global batch is split across the replicas
            dataset = self.strategy.experimental_distribute_dataset(dataset)
            per_epoch = 0
        self._last_stream = _Stream(key, train_step, self.data_position, dataset,
                                    per_epoch if per_epoch > 0 else None)
        return self._last_stream

    def _head_streams(self, key: Any, data: Mapping[str, Any], batch_size: int | None,
                      seed: int | None, sampling: TaskSampling) -> _HeadStreams:
        """Per-head streams: each head's data shuffled with its own seed (`seed` + the
        head's index), checked against that head alone."""
        self._check_head_data(data, "data")
        if self.strategy is not None:
            raise ValueError("per-head datasets are not supported with a strategy yet; give one "
                             "dataset of (inputs, {head: labels}), or train on one device")
        if self.trunk_update is not None and self.trunk_update.policy.rep_grad:
            raise ValueError("trunk aggregation with rep_grad=True needs one batch for all heads "
                             "(it combines gradients at the trunk output); give one dataset")
        datasets, sizes = {}, {}
        for i, head in enumerate(self.model.head_names):
            head_seed = None if seed is None else seed + i
            datasets[head] = self._head_dataset(head, data[head], batch_size, True, head_seed)
            if _is_empty(datasets[head]):
                raise ValueError(f"data[{head!r}] yields no batch; give that head some examples")
            leaves = [] if isinstance(data[head], tf.data.Dataset) else tf.nest.flatten(data[head])
            sizes[head] = len(leaves[0]) if leaves else None
        probabilities = sampling.probabilities(list(datasets), sizes) if sampling.samples else None
        train_step = self._train_step
        assert train_step is not None
        streams = _HeadStreams(key, train_step, self.data_position.heads, datasets, sampling,
                               probabilities, self.step_variable)
        self.data_position.clear_restored()  # the per-head positions carry the resume
        return streams

    def _check_head_data(self, data: Mapping[str, Any], what: str) -> None:
        self.model.check_heads(data, what)
        missing = [h for h in self.model.head_names if h not in data]
        if missing:
            raise ValueError(f"{what}: head {missing[0]!r} has no dataset; with per-head data "
                             f"every head needs its own (given: {sorted(data)})")

    def _head_dataset(self, head: str, data: Any, batch_size: int | None, shuffle: bool,
                      seed: int | None) -> tf.data.Dataset:
        """Head `head`'s own data as batches `(inputs, {head: labels})`, checked."""
        dataset = as_dataset(data, batch_size, shuffle=shuffle, seed=seed)
        spec = dataset.element_spec
        if not (isinstance(spec, tuple) and len(spec) == 2):
            raise TypeError(f"data[{head!r}] must yield pairs (inputs, labels); its elements "
                            f"are {spec}")
        if isinstance(spec[1], Mapping):
            if head not in spec[1]:
                raise ValueError(f"data[{head!r}] has no labels for head {head!r} (its target "
                                 f"keys are {sorted(spec[1])})")
            dataset = dataset.map(lambda x, y: (x, {head: y[head]}))
        else:
            dataset = dataset.map(lambda x, y: (x, {head: y}))
        inputs_spec, targets_spec = dataset.element_spec
        zeros = tf.nest.map_structure(_zeros_for_spec, inputs_spec)
        self._ensure_built(zeros)
        self._check_targets(targets_spec, (head,), zeros)
        return dataset

    def _labelled(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        """A single-head dataset with bare labels becomes `(inputs, {head: labels})`."""
        spec = dataset.element_spec
        if not (isinstance(spec, tuple) and len(spec) == 2):
            raise TypeError(
                "the training data must yield pairs (inputs, targets) with targets a dict "
                f"head -> labels; its elements are {spec}"
            )
        if not isinstance(spec[1], Mapping) and len(self.objectives) == 1:
            head = next(iter(self.objectives))
            return dataset.map(lambda x, y: (x, {head: y}))
        return dataset

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
            return [(self._evaluator, self._eval_dataset(data, batch_size))]
        self._check_head_data(data, "eval_data")
        runs = []
        for head in self.model.head_names:
            evaluator = self._head_evaluators.get(head)
            if evaluator is None:
                objective = self.objectives[head]
                evaluator = self._head_evaluators[head] = Evaluator(
                    self.model, {head: self.loss_fns[head]}, metrics={head: objective.metrics},
                    loss_specs={head: objective.loss})
            runs.append((evaluator, self._head_dataset(head, data[head], batch_size or 1024,
                                                       False, None)))
        return runs

    def _eval_dataset(self, data: Any, batch_size: int | None) -> tf.data.Dataset:
        dataset = self._labelled(as_dataset(data, batch_size or 1024, shuffle=False))
        inputs_spec, targets_spec = dataset.element_spec
        zeros = tf.nest.map_structure(_zeros_for_spec, inputs_spec)
        self._ensure_built(zeros)
        self._check_targets(targets_spec, None, zeros)
        return dataset

    def close(self) -> None:
        """Flushes and closes the TensorBoard writers."""
        if self.monitor:
            self.monitor.close()
