"""`Objective`: what one head is trained for (loss, optimizer, cadence), and its resolution."""

from __future__ import annotations

import dataclasses
import gc
import inspect
import re
import weakref
from typing import Any, Callable, Mapping, NamedTuple, Sequence, Union

import keras
import tensorflow as tf

from multihead import _keras_internals as internals
from multihead._autograph import converted
from multihead._checks import (
    check_choice,
    check_finite_numbers,
    check_float,
    check_int,
    check_missing_label,
)
from multihead.settings import REFUSED_OPTIMIZERS

LossSpec = Union[str, Mapping[str, Any], keras.losses.Loss, Callable[..., Any]]
OptimizerSpec = Union[str, Mapping[str, Any], keras.optimizers.Optimizer]
MetricSpec = Union[str, Mapping[str, Any], keras.metrics.Metric, Callable[..., Any]]

WeightSpec = Union[float, keras.optimizers.schedules.LearningRateSchedule, Callable[[Any], Any]]

#: What a step may do with a head whose loss or gradient is not finite.
NONFINITE_POLICIES = ("skip", "raise", "apply")


def check_weight(weight: Any, name: str = "weight") -> float:
    """A constant loss weight as a float; raises unless it is a finite number >= 0.

    Args:
        weight: the weight.
        name: the argument the error names (e.g. `objectives['a'].weight`).
    """
    return check_float(weight, name, minimum=0,
                       hint="a weight may also be a LearningRateSchedule or a callable of the step")


#: The element-wise combinations `Objective.combine` takes by name, of the outputs read.
COMBINERS: dict[str, Callable[[Sequence[Any]], Any]] = {
    "product": lambda outputs: _fold(tf.multiply, outputs),
    "sum": lambda outputs: _fold(tf.add, outputs),
    "mean": lambda outputs: _fold(tf.add, outputs) / float(len(outputs)),
}


def _fold(op: Callable[[Any, Any], Any], values: Sequence[Any]) -> Any:
    result = values[0]
    for value in values[1:]:
        result = op(result, value)
    return result


#: A resolved head loss: `(inputs, targets, head_output, training=False) -> scalar`, where
#: `targets` is the batch's whole targets structure.
HeadLoss = Callable[[Any, Any, Any], tf.Tensor]


@dataclasses.dataclass
class Objective:
    """The training objective of one head.

    Args:
        loss: a Keras loss name (`"mse"`), a Keras serialization dict
            (`{"class_name": "Huber", "config": {"delta": 1.0}}`), a Keras loss
            object, a callable `(y_true, y_pred)`, or a research callable
            `loss_fn(inputs, targets, outputs) -> scalar` that sees the whole batch
            (`targets` is the batch's full targets structure, `outputs` this head's
            output) for losses such as TD errors or policy gradients.
        optimizer: a Keras optimizer object, name (`"adam"`) or serialization dict
            (`{"class_name": "Adam", "config": {"learning_rate": 3e-4}}`). Each
            head needs its own optimizer object: it is built once on the head's
            var_list.
        weight: factor on this head's loss before its gradient is taken: a number,
            a `keras.optimizers.schedules.LearningRateSchedule` (or its Keras
            serialization dict) or a callable of the step (a scalar tensor),
            evaluated in the compiled step every step. A new number assigned
            between steps takes effect on the next step. `loss/<head>` stays the
            unweighted loss; `loss_weight/<head>` logs the weight.
        every: the head is updated on every `every`-th step (steps 0, n, 2n, ...).
        trains_trunk: if False the head's gradient stops at the trunk output and
            its optimizer is built on the head's variables only.
        metrics: extra Keras metrics reported by `Trainer.evaluate` for this head.
        on_nonfinite: what a step does when this head's loss or one of its
            gradients is NaN or Inf: `"skip"` drops the head's update for that
            step (the trunk, the other heads and every optimizer slot stay as
            without it) and counts it in `nonfinite_skips/<head>`; `"raise"`
            skips it too and `fit` raises at that step; `"apply"` applies it.
        missing_label: the label value that marks a row without a label for this head
            (`float("nan")`, or a number such as -1 for class indices); None: every
            row has one. A row whose label holds it anywhere contributes nothing to
            the head's loss, gradient or metrics: the loss is the mean over the rows
            present (Keras' convention for a masked loss). A batch with no row
            present gives the head no update (counted in
            `missing_label_skips/<head>`). Needs a Keras loss or a `(y_true, y_pred)`
            callable.
        reads: the outputs the loss reads: head names, `"trunk"` (the trunk's output) or
            a trunk tap `"trunk/<block>"`; None: the objective's own head (its key in
            `objectives` must then be a head). An objective whose key is not a head
            stands on its own and must give them; its labels are `targets[<its key>]`.
        combine: what the loss compares with the labels, from the outputs it reads: a
            callable `combine(outputs)` or `combine(outputs, inputs)`, `outputs` being
            the dict read -> output (ESMM: `lambda o: o["ctr"] * o["cvr"]`), or the name
            of an element-wise combination of all of them: `"product"`, `"sum"`,
            `"mean"`. None: the single output it reads.
        trains: the parts its optimizer trains, by address: `"trunk"` (the trunk
            variables its reads depend on: below a tap, only those), `"heads/<name>"`,
            or a trunk sublayer `"trunk/<index>"` (see `multihead.model.addresses`).
            None: the trunk and the heads it reads (the heads only with
            `trains_trunk=False` or `trunk_scale=0`). Its optimizer is built on exactly
            these variables; a part it reads but does not train gets no update from it,
            and its gradient is not computed. See docs/objectives.md.
        trunk_scale: factor on its gradient into the trunk, where that gradient enters
            the trunk's output: 1 as is, 0 none (as `trains_trunk=False`), negative
            reverses it (gradient reversal, as in domain-adversarial training). A
            number, a `LearningRateSchedule` (or its serialization dict) or a callable
            of the step, evaluated in the compiled step. The forward pass is unchanged.
    """

    loss: LossSpec
    optimizer: OptimizerSpec = "adam"
    weight: WeightSpec = 1.0
    every: int = 1
    trains_trunk: bool = True
    metrics: Sequence[MetricSpec] = ()
    on_nonfinite: str = "skip"
    missing_label: float | None = None
    reads: Sequence[str] | None = None
    combine: Union[str, Callable[..., Any], None] = None
    trains: Sequence[str] | None = None
    trunk_scale: WeightSpec = 1.0

    def __post_init__(self) -> None:
        for field in ("reads", "trains"):
            value = getattr(self, field)
            if value is None:
                continue
            value = (value,) if isinstance(value, str) else tuple(value)
            if not value or not all(isinstance(v, str) and v for v in value):
                raise ValueError(f"Objective.{field}: expected a non-empty list of names, "
                                 f"got {getattr(self, field)!r}")
            object.__setattr__(self, field, value)
        if self.combine is not None and not callable(self.combine):
            check_choice(self.combine, "Objective.combine", tuple(COMBINERS))
        self.trunk_scale = _schedule(self.trunk_scale, "Objective.trunk_scale")
        if not callable(self.trunk_scale):
            self.trunk_scale = check_float(
                self.trunk_scale, "Objective.trunk_scale",
                hint="a trunk_scale may also be a LearningRateSchedule or a callable of the step")
        if self.missing_label is not None:
            if isinstance(self.missing_label, bool) or not isinstance(self.missing_label,
                                                                      (int, float)):
                raise TypeError("Objective.missing_label: expected a number (float('nan') for "
                                f"NaN labels) or None, got {self.missing_label!r}")
            self.missing_label = check_missing_label(self.missing_label, "Objective.missing_label")
        self.every = check_int(self.every, "Objective.every", minimum=1)
        self.weight = _schedule(self.weight, "Objective.weight")
        if not callable(self.weight):
            check_weight(self.weight, "Objective.weight")
        check_choice(self.on_nonfinite, "Objective.on_nonfinite", NONFINITE_POLICIES)
        check_choice(self.trains_trunk, "Objective.trains_trunk", (True, False))
        if isinstance(self.metrics, (str, Mapping)):
            self.metrics = [self.metrics]


def _schedule(spec: Any, name: str) -> Any:
    """A weight or trunk_scale as the step reads it: a Keras schedule dict deserialized;
    a schedule (dict or object) whose config holds NaN or inf is refused, as a config's is."""
    if isinstance(spec, Mapping):
        check_finite_numbers(dict(spec).get("config"), f"{name}.config")
        return keras.optimizers.schedules.deserialize(dict(spec))
    if isinstance(spec, keras.optimizers.schedules.LearningRateSchedule):
        check_finite_numbers(spec.get_config(), f"{name}.config")
    return spec


def _positional_arity(fn: Callable[..., Any]) -> int | None:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(1 for p in params if p.kind in kinds and p.default is inspect.Parameter.empty)


def _takes_training(fn: Callable[..., Any]) -> bool:
    """Whether `fn` accepts a `training` keyword (research losses may: the train step
    passes True, evaluation False)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "training" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD
                                       for p in params.values())


def resolve_loss(spec: LossSpec, head: str, missing_label: float | None = None) -> HeadLoss:
    """Turns a loss spec into `(inputs, targets, output) -> scalar` for head `head`.

    Element-wise Keras losses and `(y_true, y_pred)` callables are wrapped in a
    Keras `Loss` that matches the ranks of `y_true` and `y_pred` (a `(batch,)`
    label against a `(batch, 1)` output would otherwise broadcast to
    `(batch, batch)`) and averages over the batch. With `missing_label`, the
    average is over the rows whose label is present (see `present_labels`); the
    resolved loss carries the marker as its `missing_label` attribute.

    Raises:
        ValueError: unknown loss name or bad serialization dict; `missing_label`
            with a research loss (it reads the labels its own way).
        TypeError: a callable with neither 2 nor 3 required positional arguments.
    """
    if isinstance(spec, (str, Mapping)):
        try:
            fn = keras.losses.get(dict(spec) if isinstance(spec, Mapping) else spec)
        except (ValueError, TypeError) as err:
            raise ValueError(f"head {head!r}: unknown loss {spec!r} ({_first_line(err)})") from None
        spec = fn
    if isinstance(spec, keras.losses.Loss):
        loss_obj = spec
    elif callable(spec):
        arity = _positional_arity(spec)
        if arity == 3:
            if missing_label is not None:
                raise ValueError(
                    f"head {head!r}: missing_label needs a Keras loss or a (y_true, y_pred) "
                    "callable; a research loss (inputs, targets, outputs) reads its labels "
                    "itself: mask them inside it")
            research: Callable[..., tf.Tensor] = converted(spec)  # may branch on tensors
            if _takes_training(spec):
                return lambda inputs, targets, output, training=False: research(
                    inputs, targets, output, training=training)
            return lambda inputs, targets, output, training=False: research(inputs, targets, output)
        if arity not in (2, None):
            raise TypeError(
                f"head {head!r}: a loss callable takes (y_true, y_pred) or "
                f"(inputs, targets, outputs); {getattr(spec, '__name__', spec)!r} takes {arity}"
            )
        loss_obj = _ElementwiseLoss(spec)
    else:
        raise TypeError(f"head {head!r}: loss must be a name, dict, Loss or callable, got {spec!r}")

    def head_loss(inputs: Any, targets: Any, output: Any, training: bool = False) -> tf.Tensor:
        del training  # a Keras loss is the same in training and evaluation
        del inputs
        labels, weight = split_weighted(targets[head])
        if missing_label is None and weight is None:
            return loss_obj(labels, output)
        if missing_label is None:
            present = tf.ones([tf.shape(output)[0]], tf.bool)
        else:
            present, labels = present_labels(labels, missing_label)
        return masked_mean(loss_obj, labels, output, present, weight)

    head_loss.elementwise = True  # type: ignore[attr-defined]
    head_loss.missing_label = missing_label  # type: ignore[attr-defined]
    return head_loss


class Weighted(NamedTuple):
    """A head's labels with their per-example sample weights, as a batch's targets hold them
    when the batch is `(inputs, targets, sample_weight)` (see `with_sample_weights`)."""

    labels: Any
    sample_weight: Any


def with_sample_weights(targets: Any, sample_weight: Any) -> Any:
    """`targets` (a dict head -> labels) with the labels of each head of `sample_weight`
    (a dict head -> one weight per example) as `Weighted`; `targets` itself when None.

    Raises:
        TypeError: `sample_weight` is not a dict.
        ValueError: it names a head the targets have no labels for.
    """
    if sample_weight is None:
        return targets
    if not isinstance(sample_weight, Mapping) or not isinstance(targets, Mapping):
        raise TypeError("sample_weight must be a dict head -> one weight per example (with "
                        f"targets a dict head -> labels), got {type(sample_weight).__name__}")
    for head in sample_weight:
        if head not in targets:
            raise ValueError(f"sample_weight names head {head!r}, but the batch has no labels "
                             f"for it (its targets are {sorted(targets)})")
    return {h: Weighted(y, sample_weight[h]) if h in sample_weight else y for h, y in targets.items()}


def split_weighted(labels: Any) -> tuple[Any, Any]:
    """`(labels, sample_weight)` of a head's entry in a batch's targets (weight None if none)."""
    if isinstance(labels, Weighted):
        return labels.labels, labels.sample_weight
    return labels, None


def present_labels(labels: Any, missing_label: float) -> tuple[tf.Tensor, tf.Tensor]:
    """Which rows of `labels` are present, and the labels with the missing ones zeroed.

    A row is missing when any of its entries equals `missing_label` (NaN: is NaN;
    integer labels hold no NaN, so with a NaN marker all their rows are present).

    Returns:
        `(present, labels)`: a `(batch,)` bool tensor, and `labels` with every entry of
        a missing row set to 0 (so no NaN reaches the loss or its gradient).
    """
    labels = tf.convert_to_tensor(labels)
    if missing_label != missing_label:  # NaN
        marked = (tf.math.is_nan(labels) if labels.dtype.is_floating
                  else tf.zeros_like(labels, tf.bool))
    else:
        marked = tf.equal(labels, tf.cast(missing_label, labels.dtype))
    rank = labels.shape.rank
    missing = tf.reduce_any(marked, axis=list(range(1, rank))) if rank and rank > 1 else marked
    present = tf.logical_not(tf.reshape(missing, [-1]))
    rows = tf.reshape(present, [-1] + [1] * max((rank or 1) - 1, 0))
    return present, tf.where(rows, labels, tf.zeros_like(labels))


def masked_mean(loss_obj: Callable[..., Any], labels: Any, output: Any,
                present: tf.Tensor, sample_weight: Any = None) -> tf.Tensor:
    """`sum_i p_i w_i l_i / max(sum_i p_i, 1)`: the mean of a Keras loss over the present
    rows (`p`), each weighted by `sample_weight` (`w`, 1 if None); 0 with no row present.

    This is Keras' own reduction of a masked loss (`sum_over_batch_size` scales the
    mask by `total / valid`); `loss_obj` must reduce by Keras' default,
    `sum_over_batch_size`, which divides by the batch size `n` undone here.
    """
    weight = tf.cast(present, tf.float32)
    if sample_weight is not None:
        weight = weight * tf.cast(tf.reshape(sample_weight, [-1]), tf.float32)
    loss = tf.cast(loss_obj(labels, output, sample_weight=weight), tf.float32)
    n = tf.cast(tf.shape(present)[0], tf.float32)
    return loss * n / tf.maximum(tf.reduce_sum(tf.cast(present, tf.float32)), 1.0)


def label_marker(loss: HeadLoss) -> float | None:
    """The missing-label marker a resolved loss masks (None: it masks nothing)."""
    return getattr(loss, "missing_label", None)


class _ElementwiseLoss(keras.losses.Loss):
    """A `(y_true, y_pred) -> per-example loss` function as a batch-averaging Keras Loss."""

    def __init__(self, fn: Callable[[Any, Any], Any]) -> None:
        name = getattr(fn, "__name__", "")
        # Keras uses the name as a root name scope: "<lambda>" or "_f" would be refused.
        super().__init__(name=name if re.match(r"^[A-Za-z0-9.][\w.\-]*$", name) else "loss")
        self._fn = fn

    def call(self, y_true: Any, y_pred: Any) -> Any:
        rank_true, rank_pred = len(y_true.shape), len(y_pred.shape)
        if rank_true == rank_pred - 1 and y_pred.shape[-1] == 1:
            y_true = tf.expand_dims(y_true, -1)
        elif rank_pred == rank_true - 1 and y_true.shape[-1] == 1:
            y_pred = tf.expand_dims(y_pred, -1)
        return self._fn(y_true, y_pred)


def needs_own_targets(loss: HeadLoss) -> bool:
    """True if the loss reads `targets[head]` (every non-research loss does)."""
    return getattr(loss, "elementwise", False)


def resolve_optimizer(spec: OptimizerSpec, head: str) -> keras.optimizers.Optimizer:
    """Turns an optimizer spec into a Keras optimizer object (the same object if given one).

    Raises:
        ValueError: an unknown optimizer, or a `LossScaleOptimizer` (see `_check_unwrapped`).
        TypeError: a spec of another type.
    """
    if isinstance(spec, keras.optimizers.Optimizer):
        return _check_unwrapped(spec, head)
    if isinstance(spec, (str, Mapping)):
        try:
            optimizer = keras.optimizers.get(dict(spec) if isinstance(spec, Mapping) else spec)
        except (ValueError, TypeError) as err:
            raise ValueError(
                f"head {head!r}: unknown optimizer {spec!r} ({_first_line(err)})"
            ) from None
        return _check_unwrapped(optimizer, head)
    raise TypeError(f"head {head!r}: optimizer must be a name, dict or Keras optimizer, got {spec!r}")


def _check_unwrapped(optimizer: keras.optimizers.Optimizer, head: str) -> keras.optimizers.Optimizer:
    """Refuses a `LossScaleOptimizer` (see `multihead.settings.REFUSED_OPTIMIZERS`)."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        raise ValueError(f"head {head!r}: a LossScaleOptimizer is refused: "
                         f"{REFUSED_OPTIMIZERS['LossScaleOptimizer']}")
    return optimizer


#: The attribute through which an optimizer object names the Trainer that uses it.
_OWNER = "_multihead_trainer"


def claim_optimizers(owner: Any, optimizers: Mapping[str, keras.optimizers.Optimizer],
                     trunk_optimizer: keras.optimizers.Optimizer | None = None) -> None:
    """Marks each optimizer as used by `owner` (a weak reference on the optimizer object,
    no registry); raises if another live trainer uses one already.

    Two trainers stepping one optimizer object would share its slots and iteration
    count, and each would apply the other's moments to its own variables.

    Args:
        owner: the trainer claiming the optimizers.
        optimizers: head -> that head's optimizer.
        trunk_optimizer: the trunk optimizer under trunk aggregation, or None.

    Raises:
        ValueError: naming the head (or the trunk) whose optimizer another trainer uses.
    """
    claims = dict(optimizers)
    if trunk_optimizer is not None:
        claims[None] = trunk_optimizer  # type: ignore[index]
    taken = _taken(claims, owner)
    if taken is not None:
        gc.collect()  # a trainer that is unreachable but not yet collected is no user
        taken = _taken(claims, owner)
    if taken is not None:
        what = "the trunk optimizer" if taken == () else f"objectives[{taken[0]!r}].optimizer"
        raise ValueError(
            f"{what} is used by another Trainer, which would share its state (slots, "
            "iteration count) with this one; give each Trainer its own optimizer objects "
            "(or an optimizer name such as 'adam'), or del the other trainer first")
    for opt in claims.values():
        object.__setattr__(opt, _OWNER, weakref.ref(owner))


def _taken(claims: Mapping[str | None, Any], owner: Any) -> tuple[str, ...] | None:
    """`(head,)` (or `()` for the trunk) of the first optimizer another live trainer uses.

    Returns a name, not the other trainer: an error's traceback must not keep it alive.
    """
    for head, opt in claims.items():
        user = _user(opt)
        if user is not None and user is not owner:
            return () if head is None else (head,)
    return None


def _user(optimizer: keras.optimizers.Optimizer) -> Any:
    ref = getattr(optimizer, _OWNER, None)
    return ref() if ref is not None else None


#: Metric names that Keras `compile` resolves against the loss (accuracy) or that name
#: the crossentropy matching the loss.
_ACCURACY_NAMES = ("accuracy", "acc")
_CROSSENTROPY_NAMES = ("crossentropy", "ce")

#: Crossentropy loss classes and functions by label encoding: "sparse" (class indices),
#: "categorical" (one-hot or probabilities per class), "binary" (0/1 per output unit).
_CROSSENTROPY_LOSSES: tuple[tuple[str, tuple[type, ...], tuple[Callable[..., Any], ...]], ...] = (
    ("sparse", (keras.losses.SparseCategoricalCrossentropy,),
     (keras.losses.sparse_categorical_crossentropy,)),
    ("categorical", (keras.losses.CategoricalCrossentropy, keras.losses.CategoricalFocalCrossentropy),
     (keras.losses.categorical_crossentropy, keras.losses.categorical_focal_crossentropy)),
    ("binary", (keras.losses.BinaryCrossentropy, keras.losses.BinaryFocalCrossentropy),
     (keras.losses.binary_crossentropy, keras.losses.binary_focal_crossentropy)),
)


def _crossentropy_kind(loss_spec: LossSpec | None) -> tuple[str, bool] | None:
    """The label encoding and `from_logits` of a crossentropy loss spec.

    Args:
        loss_spec: a loss spec as `Objective.loss` takes it, or None.

    Returns:
        `("sparse" | "categorical" | "binary", from_logits)` for a Keras crossentropy
        loss (name, serialization dict, `Loss` object or Keras loss function, whose
        `from_logits` is then False), None for any other loss or a spec that does not say.
    """
    if isinstance(loss_spec, (str, Mapping)):
        try:
            loss_spec = keras.losses.get(dict(loss_spec) if isinstance(loss_spec, Mapping) else loss_spec)
        except (ValueError, TypeError):
            return None
    for kind, classes, functions in _CROSSENTROPY_LOSSES:
        if isinstance(loss_spec, classes):
            return kind, bool(loss_spec.get_config().get("from_logits", False))
        if any(loss_spec is fn for fn in functions):
            return kind, False
    return None


def _metric_for_loss(name: str, head: str, loss_spec: LossSpec | None) -> keras.metrics.Metric:
    """`"accuracy"` / `"crossentropy"` (and aliases) for the head's loss, as Keras `compile`
    resolves them, named `name`."""
    kind = _crossentropy_kind(loss_spec)
    if name.lower() in _ACCURACY_NAMES:
        if kind is None:  # the loss does not say: Keras' exact-match accuracy
            return keras.metrics.Accuracy(name=name)
        encoding, from_logits = kind
        if encoding == "sparse":
            return keras.metrics.SparseCategoricalAccuracy(name=name)  # argmax: logits work
        if encoding == "categorical":
            return keras.metrics.CategoricalAccuracy(name=name)
        # A logit of 0 is a probability of 0.5.
        return keras.metrics.BinaryAccuracy(name=name, threshold=0.0 if from_logits else 0.5)
    if kind is None:
        raise ValueError(
            f"head {head!r}: metric {name!r} means the crossentropy of the head's loss, but its "
            f"loss {loss_spec!r} is not a crossentropy; name the metric instead, e.g. "
            "'binary_crossentropy' or 'sparse_categorical_crossentropy'"
        )
    encoding, from_logits = kind
    metric_class = {"sparse": keras.metrics.SparseCategoricalCrossentropy,
                    "categorical": keras.metrics.CategoricalCrossentropy,
                    "binary": keras.metrics.BinaryCrossentropy}[encoding]
    return metric_class(name=name, from_logits=from_logits)


def resolve_metric(spec: MetricSpec, head: str, loss_spec: LossSpec | None = None) -> keras.metrics.Metric:
    """A Keras metric object for a metric spec of head `head`.

    `"accuracy"` / `"acc"` resolve against the head's loss as in Keras `compile`:
    a sparse categorical crossentropy gives `SparseCategoricalAccuracy`, a
    categorical one `CategoricalAccuracy`, a binary one `BinaryAccuracy` (threshold
    0 for logits, 0.5 for probabilities); any other loss (or none given) Keras'
    exact-match `Accuracy`. `"crossentropy"` / `"ce"` give the crossentropy metric
    matching a crossentropy loss, with its `from_logits`.

    Args:
        spec: a metric name, Keras serialization dict, `keras.metrics.Metric` object
            or function `(y_true, y_pred) -> per-example values`.
        head: the head's name, for error messages.
        loss_spec: the head's loss spec (`Objective.loss`), which decides what
            `"accuracy"` and `"crossentropy"` mean.

    Returns:
        A new metric object, or `spec` itself (reset) when it is a metric object.

    Raises:
        ValueError: an unknown metric, or `"crossentropy"` for a loss that is none.

    Example:
        >>> type(resolve_metric("accuracy", "y", "sparse_categorical_crossentropy")).__name__
        'SparseCategoricalAccuracy'
    """
    if isinstance(spec, keras.metrics.Metric):
        spec.reset_state()
        return spec
    if isinstance(spec, str) and spec.lower() in _ACCURACY_NAMES + _CROSSENTROPY_NAMES:
        return _metric_for_loss(spec, head, loss_spec)
    try:
        metric = keras.metrics.get(dict(spec) if isinstance(spec, Mapping) else spec)
    except (ValueError, TypeError) as err:
        raise ValueError(f"head {head!r}: unknown metric {spec!r} ({_first_line(err)})") from None
    if isinstance(metric, keras.metrics.Metric):
        return metric
    return keras.metrics.MeanMetricWrapper(metric, name=getattr(metric, "__name__", str(spec)))


def _first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


def check_distinct_optimizers(optimizers: Mapping[str, Any]) -> None:
    """No two heads share an optimizer object (each is built on its own head's var_list)."""
    seen: dict[int, str] = {}
    for head, opt in optimizers.items():
        if id(opt) in seen:
            raise ValueError(
                f"heads {seen[id(opt)]!r} and {head!r} were given the same optimizer object; "
                "each head needs its own (it is built on that head's var_list)"
            )
        seen[id(opt)] = head


def check_created_in_scope(optimizers: Mapping[str, Any], strategy: tf.distribute.Strategy) -> None:
    """Each optimizer object was created under `strategy.scope()` (or by name, in it)."""
    for head, opt in optimizers.items():
        if internals.optimizer_strategy(opt) not in (None, strategy):
            raise ValueError(
                f"the optimizer of head {head!r} was created outside strategy.scope(); create "
                "it inside `with strategy.scope():` or give its name (e.g. 'adam')")
