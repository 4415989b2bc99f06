"""What each head's update did, measured inside the compiled step on scalar logging steps.

Per head: its loss, the norms of the gradient its optimizer applied (trunk part, head
part, each head's part of an objective that trains several, each variable, after the
optimizer's clipping), the learning rate it used, the relative size of its update, its
gradient histograms, and the cosine of its trunk gradient with every head updated
before it in the step (the tags: `multihead.monitoring.monitor`).

Everything is measured into the step's `StepStats` and returned by the step: a head with
`every > 1` updates inside a `tf.cond`, and what later heads need of it (its trunk
gradient, for the cosines) leaves that branch as an output. Nothing is written inside the
step, and nothing is kept between steps.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import keras
import tensorflow as tf

from multihead.monitoring import tags
from multihead.monitoring.cadence import Cadence
from multihead.monitoring.gradient_stats import (
    _dense,
    clipped_gradients,
    cosine,
    flat_dot,
    global_norm,
    histogram_buckets,
)
from multihead.monitoring.step_stats import StepStats

_Grad = tf.Tensor | tf.IndexedSlices | None


class HeadUpdateStats:
    """The per-head update statistics a monitored step measures (see the module docstring).

    Created eagerly by `Monitor.bind`. Inside a monitored step body, per head:
    `before_update` right before its optimizer applies its gradients, `head_update`
    right after; both record into the step's `StepStats`, each piece gated on its cadence.

    Args:
        var_lists: head -> the variables its optimizer is built on, in head order.
        trunk_variables: the trunk's trainable variables; a head's gradient is split
            into its trunk part and its head part by variable identity.
        optimizers: head -> its optimizer (the learning rate it applies, its clipping).
        addresses: `id(variable)` -> its stable address, the name per-variable tags use
            (see `Monitor.bind`); None: each variable's Keras path.
        cadence: when scalars and histograms are due.
        variable_norms: also measure each variable's gradient norm.
        grad_cosine: measure the cosine of every pair of heads' trunk gradients.
    """

    def __init__(
        self,
        var_lists: Mapping[str, Sequence[keras.Variable]],
        trunk_variables: Sequence[keras.Variable],
        optimizers: Mapping[str, keras.optimizers.Optimizer],
        addresses: Mapping[int, str] | None,
        cadence: Cadence,
        variable_norms: bool,
        grad_cosine: bool,
    ) -> None:
        self.heads = tuple(var_lists)
        self._cadence, self._variable_norms, self._grad_cosine = cadence, variable_norms, grad_cosine
        self._optimizers = dict(optimizers)
        self._trunk_ids = {id(v) for v in trunk_variables}
        self._var_lists = dict(var_lists)
        named_parts = {ref: "/".join(a.split("/")[:2]) for ref, a in (addresses or {}).items()}
        #: Objective -> {part address: ids of its variables}, for objectives training >1 head.
        self._parts: dict[str, dict[str, set[int]]] = {}
        for head, variables in var_lists.items():
            parts: dict[str, set[int]] = {}
            for v in variables:
                part = named_parts.get(id(v), "")
                if id(v) not in self._trunk_ids and part.startswith("heads/"):
                    parts.setdefault(part, set()).add(id(v))
            if len(parts) > 1:
                self._parts[head] = parts
        self._trunk_heads = [h for h, vs in var_lists.items() if any(id(v) in self._trunk_ids for v in vs)]
        self._addresses: dict[int, str] = {}  # id(variable) -> the name its tags use
        for variables in var_lists.values():
            for v in variables:
                self._addresses.setdefault(id(v), (addresses or {}).get(id(v)) or v.path)
        named: dict[str, int] = {}
        for ref, address in self._addresses.items() if addresses else ():
            if named.setdefault(address, ref) != ref:
                raise ValueError(f"addresses: two variables are named {address!r}; give each "
                                 "variable its own address (see variable_addresses(model))")

    def scalar_tags(self) -> list[str]:
        """The scalar tags `head_update` measures for these heads (per-variable norms aside)."""
        written = []
        for head, variables in self._var_lists.items():
            written += [tags.loss(head), tags.lr(head), tags.update_ratio(head)]
            if head in self._trunk_heads:
                written.append(tags.trunk_grad_norm(head))
                optimizer = self._optimizers.get(head)
                if optimizer is not None and (optimizer.clipnorm or optimizer.global_clipnorm
                                              or optimizer.clipvalue):
                    written.append(tags.grad_norm_clipped(head))
            if any(id(v) not in self._trunk_ids for v in variables):
                written.append(tags.head_grad_norm(head))
            written += [tags.part_grad_norm(head, part) for part in self._parts.get(head, {})]
        if self._grad_cosine:
            written += [tags.grad_cosine(a, b) for i, a in enumerate(self._trunk_heads)
                        for b in self._trunk_heads[i + 1:]]
        return written

    # Plain graph building, no data-dependent Python: autograph must not rewrite it.
    @tf.autograph.experimental.do_not_convert
    def before_update(self, stats: StepStats, head: str, variables: Sequence[keras.Variable],
                      optimizer: keras.optimizers.Optimizer) -> None:
        """Right before head `head`'s optimizer applies its update, on scalar logging steps:
        the weights it will change and the learning rate it will use."""
        def measure() -> None:
            for v in variables:
                stats.keep(("before", id(v)), tf.identity(v.value))
            stats.keep(("lr", head), tf.cast(optimizer.learning_rate, tf.float32))

        stats.gated(stats.scalars_due, measure)

    @tf.autograph.experimental.do_not_convert
    def head_update(
        self,
        stats: StepStats,
        head: str,
        loss: tf.Tensor,
        grads: Sequence[_Grad],
        variables: Sequence[keras.Variable],
        optimizer: keras.optimizers.Optimizer,
    ) -> None:
        """Head `head`'s optimizer applied `grads` to `variables` (after `before_update`):
        its scalars and histograms, each gated on its cadence."""
        pairs = [(g, v) for g, v in zip(grads, variables) if g is not None]
        trunk = [(g, v) for g, v in pairs if id(v) in self._trunk_ids]
        own = [(g, v) for g, v in pairs if id(v) not in self._trunk_ids]

        def scalars() -> None:
            stats.record(tags.loss(head), loss)
            if trunk:
                trunk_norm = global_norm([g for g, _ in trunk])
                stats.record(tags.trunk_grad_norm(head), trunk_norm)
                clipped = clipped_gradients(optimizer, [g for g, _ in pairs])
                if clipped is not None:
                    applied = [c for c, (_, v) in zip(clipped, pairs) if id(v) in self._trunk_ids]
                    stats.record(tags.grad_norm_clipped(head), global_norm(applied))
            if own:
                stats.record(tags.head_grad_norm(head), global_norm([g for g, _ in own]))
            for part, ids in self._parts.get(head, {}).items():
                stats.record(tags.part_grad_norm(head, part),
                             global_norm([g for g, v in own if id(v) in ids]))
            if self._variable_norms:
                for g, v in pairs:
                    stats.record(tags.variable_grad_norm(head, self._addresses[id(v)]), global_norm([g]))
            stats.record(tags.lr(head), stats.get(("lr", head))[0])
            before = [stats.get(("before", id(v)))[0] for v in variables]
            update = [v - w for v, w in zip(variables, before)]
            stats.record(tags.update_ratio(head),
                         tf.math.divide_no_nan(global_norm(update), global_norm(before)))
            if trunk and self._grad_cosine:
                self._cosines(stats, head, trunk, trunk_norm)

        stats.gated(stats.scalars_due, scalars)
        stats.forget([("before", id(v)) for v in variables] + [("lr", head)])
        if self._cadence.histograms_every:
            def histograms() -> None:
                for g, v in pairs:
                    stats.record(tags.grad_hist(head, self._addresses[id(v)]),
                                 histogram_buckets(_dense(g)), histogram=True)

            stats.gated(self._cadence.histograms_due(stats.done), histograms)

    def _cosines(self, stats: StepStats, head: str, trunk: list[tuple[_Grad, keras.Variable]],
                 norm: tf.Tensor) -> None:
        """The cosine of `head`'s trunk gradient with that of each head updated before it in
        the step (kept by its own `head_update`); then keeps its own for the heads after it.
        A head that trains fewer trunk blocks (a trunk tap) has a zero gradient on the
        others: the dot product runs over the variables both heads train, by identity."""
        for other in self._trunk_heads:
            kept = stats.get(("trunk_norm", other))
            if other == head or kept is None:
                continue
            other_norm, other_present = kept
            common = [(stats.get(("trunk_grad", other, id(v)))[0], g) for g, v in trunk
                      if stats.get(("trunk_grad", other, id(v))) is not None]
            dot = (flat_dot([b for b, _ in common], [g for _, g in common]) if common
                   else tf.constant(0.0))
            first, second = sorted((other, head), key=self.heads.index)
            stats.record(tags.grad_cosine(first, second), cosine(dot, other_norm, norm),
                         present=other_present)
        if head != self._trunk_heads[-1]:  # the last head has no later partner
            for g, v in trunk:
                stats.keep(("trunk_grad", head, id(v)), _dense(g))
            stats.keep(("trunk_norm", head), norm)
