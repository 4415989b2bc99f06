"""`Objective`: what one head is trained for (loss, optimizer, cadence), and its resolution."""

from __future__ import annotations

import dataclasses
import inspect
import math
import re
from typing import Any, Callable, Mapping, Sequence, Union

import keras
import tensorflow as tf

LossSpec = Union[str, Mapping[str, Any], keras.losses.Loss, Callable[..., Any]]
OptimizerSpec = Union[str, Mapping[str, Any], keras.optimizers.Optimizer]
MetricSpec = Union[str, Mapping[str, Any], keras.metrics.Metric, Callable[..., Any]]

#: A resolved head loss: `(inputs, targets, head_output) -> scalar`, where `targets`
#: is the batch's whole targets structure.
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
        weight: factor on this head's loss before its gradient is taken.
        every: the head is updated on every `every`-th step (steps 0, n, 2n, ...).
        trains_trunk: if False the head's gradient stops at the trunk output and
            its optimizer is built on the head's variables only.
        metrics: extra Keras metrics reported by `Trainer.evaluate` for this head.
    """

    loss: LossSpec
    optimizer: OptimizerSpec = "adam"
    weight: float = 1.0
    every: int = 1
    trains_trunk: bool = True
    metrics: Sequence[MetricSpec] = ()

    def __post_init__(self) -> None:
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 1:
            raise ValueError(f"every must be an integer >= 1, got {self.every!r}")
        if isinstance(self.weight, bool) or not isinstance(self.weight, (int, float)):
            raise TypeError(f"weight must be a number, got {self.weight!r}")
        if not math.isfinite(self.weight) or self.weight < 0:
            raise ValueError(f"weight must be finite and >= 0, got {self.weight!r}")
        if not isinstance(self.trains_trunk, bool):
            raise TypeError(f"trains_trunk must be True or False, got {self.trains_trunk!r}")
        if isinstance(self.metrics, (str, Mapping)):
            self.metrics = [self.metrics]


def _positional_arity(fn: Callable[..., Any]) -> int | None:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(1 for p in params if p.kind in kinds and p.default is inspect.Parameter.empty)


def resolve_loss(spec: LossSpec, head: str) -> HeadLoss:
    """Turns a loss spec into `(inputs, targets, output) -> scalar` for head `head`.

    Element-wise Keras losses and `(y_true, y_pred)` callables are wrapped in a
    Keras `Loss` that matches the ranks of `y_true` and `y_pred` (a `(batch,)`
    label against a `(batch, 1)` output would otherwise broadcast to
    `(batch, batch)`) and averages over the batch.

    Raises:
        ValueError: unknown loss name or bad serialization dict.
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
            research: Callable[[Any, Any, Any], tf.Tensor] = spec
            return lambda inputs, targets, output: research(inputs, targets, output)
        if arity not in (2, None):
            raise TypeError(
                f"head {head!r}: a loss callable takes (y_true, y_pred) or "
                f"(inputs, targets, outputs); {getattr(spec, '__name__', spec)!r} takes {arity}"
            )
        loss_obj = _ElementwiseLoss(spec)
    else:
        raise TypeError(f"head {head!r}: loss must be a name, dict, Loss or callable, got {spec!r}")

    def head_loss(inputs: Any, targets: Any, output: Any) -> tf.Tensor:
        del inputs
        return loss_obj(targets[head], output)

    head_loss.elementwise = True  # type: ignore[attr-defined]
    return head_loss


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
    """Turns an optimizer spec into a Keras optimizer object (the same object if given one)."""
    if isinstance(spec, keras.optimizers.Optimizer):
        return spec
    if isinstance(spec, (str, Mapping)):
        try:
            return keras.optimizers.get(dict(spec) if isinstance(spec, Mapping) else spec)
        except (ValueError, TypeError) as err:
            raise ValueError(
                f"head {head!r}: unknown optimizer {spec!r} ({_first_line(err)})"
            ) from None
    raise TypeError(f"head {head!r}: optimizer must be a name, dict or Keras optimizer, got {spec!r}")


def resolve_metric(spec: MetricSpec, head: str) -> keras.metrics.Metric:
    """A fresh (reset) Keras metric object for a metric spec."""
    if isinstance(spec, keras.metrics.Metric):
        spec.reset_state()
        return spec
    try:
        metric = keras.metrics.get(dict(spec) if isinstance(spec, Mapping) else spec)
    except (ValueError, TypeError) as err:
        raise ValueError(f"head {head!r}: unknown metric {spec!r} ({_first_line(err)})") from None
    if isinstance(metric, keras.metrics.Metric):
        return metric
    return keras.metrics.MeanMetricWrapper(metric, name=getattr(metric, "__name__", str(spec)))


def _first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
