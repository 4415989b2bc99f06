"""What each head's update did, measured inside the compiled step on scalar logging steps.

Per head: its loss, the norms of the gradient its optimizer applied (trunk part, head
part, each head's part of an objective that trains several, each variable, after the
optimizer's clipping), the learning rate it used, the relative size of its update, its
gradient histograms, and the cosine of its trunk gradient with every head updated
before it in the step (the tags: `multihead.monitoring.monitor`).

Because a head with `every > 1` updates inside a `tf.cond`, its gradient cannot leave
that branch as a tensor; what later heads need (the weights before the update, the trunk
gradient for cosines) passes through non-trainable buffer variables, written only on
logging steps. They are created eagerly with the `HeadUpdateStats` and cost one copy of
the model's weights plus one copy of the trunk per head but the last (set
`grad_cosine=False` to drop the latter). They are no model state: no checkpoint holds them.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import keras
import tensorflow as tf

from multihead.monitoring import tags
from multihead.monitoring.cadence import Cadence
from multihead.monitoring.gradient_stats import _dense, clipped_gradients, cosine, flat_dot, global_norm

_Grad = tf.Tensor | tf.IndexedSlices | None


class HeadUpdateStats:
    """The per-head update statistics of a `Monitor`, and the buffers they are measured with.

    Created eagerly (it creates its buffers) by `Monitor.bind`; inside a monitored step
    body, `start` once, `snapshot` before any update, then `head_update` after each
    head's optimizer applied its gradients. What it computes goes to the monitor's writer
    through `gated`, `scalar` and `histogram`.

    Args:
        var_lists: head -> the variables its optimizer is built on, in head order.
        trunk_variables: the trunk's trainable variables; a head's gradient is split
            into its trunk part and its head part by variable identity.
        optimizers: head -> its optimizer (the learning rate it applies, its clipping).
        addresses: `id(variable)` -> its stable address, the name per-variable tags use
            (see `Monitor.bind`); None: each variable's Keras path.
        cadence: when scalars and histograms are due.
        variable_norms: also write each variable's gradient norm.
        grad_cosine: write the cosine of every pair of heads' trunk gradients.
        gated: `gated(due, fn)` runs `fn()` in the graph only when `due`.
        scalar: `scalar(tag, value)` writes a scalar at the step's number of updates.
        histogram: `histogram(tag, values)` writes a histogram of `values` likewise.
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
        gated: Callable[[tf.Tensor, Callable[[], None]], None],
        scalar: Callable[[str, tf.Tensor], None],
        histogram: Callable[[str, tf.Tensor], None],
    ) -> None:
        self.heads = tuple(var_lists)
        self._cadence, self._variable_norms, self._grad_cosine = cadence, variable_norms, grad_cosine
        self._gated, self._scalar, self._histogram = gated, scalar, histogram
        self._addresses: dict[int, str] = {}  # id(variable) -> the name its tags use
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
        with tf.init_scope():
            self._create_buffers(var_lists, addresses)
        # The heads updated so far in the step body being traced.
        self._seen: list[str] = []

    def _create_buffers(self, var_lists: Mapping[str, Sequence[keras.Variable]],
                        addresses: Mapping[int, str] | None) -> None:
        self._before: dict[int, tf.Variable] = {}  # id(variable) -> its weights before the update
        self._variables: dict[int, keras.Variable] = {}
        for variables in var_lists.values():
            for v in variables:
                if id(v) not in self._before:
                    self._variables[id(v)] = v
                    self._addresses[id(v)] = (addresses or {}).get(id(v)) or v.path
                    self._before[id(v)] = tf.Variable(
                        tf.zeros(v.shape, v.dtype), trainable=False, name="monitor_before")
        named: dict[str, int] = {}
        for ref, address in self._addresses.items() if addresses else ():
            if named.setdefault(address, ref) != ref:
                raise ValueError(f"addresses: two variables are named {address!r}; give each "
                                 "variable its own address (see variable_addresses(model))")
        self._lr = {h: tf.Variable(0.0, trainable=False, name="monitor_lr") for h in self.heads}
        self._recorded_at = {h: tf.Variable(tf.constant(-1, tf.int64), trainable=False,
                                            name="monitor_recorded_at") for h in self.heads}
        # head -> id(trunk variable) -> its gradient (heads may train different trunk blocks)
        self._trunk_grad: dict[str, dict[int, tf.Variable]] = {}
        self._trunk_norm: dict[str, tf.Variable] = {}
        # The last head never has a later partner in the same step: it needs no buffer.
        for head in self._trunk_heads[:-1] if self._grad_cosine else []:
            trunk = [v for v in var_lists[head] if id(v) in self._trunk_ids]
            self._trunk_grad[head] = {
                id(v): tf.Variable(tf.zeros(v.shape, tf.float32), trainable=False,
                                   name="monitor_trunk_grad") for v in trunk}
            self._trunk_norm[head] = tf.Variable(0.0, trainable=False, name="monitor_trunk_norm")

    def scalar_tags(self) -> list[str]:
        """The scalar tags `head_update` writes for these heads (per-variable norms aside)."""
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

    def start(self) -> None:
        """A step body is being traced: no head has updated in it yet."""
        self._seen = []

    def snapshot(self) -> None:
        """Before any update of a scalar logging step: the weights and the learning rates.

        Each head's `head_update` then refreshes the weights it changed, so the
        next head measures its update from there.
        """
        for ref, buffer in self._before.items():
            buffer.assign(self._variables[ref])
        for head, optimizer in self._optimizers.items():
            # Read before any apply of this step: the rate this step's update uses.
            self._lr[head].assign(tf.cast(optimizer.learning_rate, tf.float32))

    # Plain graph building, no data-dependent Python: autograph must not rewrite it
    # (it mangled the per-pair closures of `_write_cosines`).
    @tf.autograph.experimental.do_not_convert
    def head_update(
        self,
        head: str,
        loss: tf.Tensor,
        grads: Sequence[_Grad],
        variables: Sequence[keras.Variable],
        optimizer: keras.optimizers.Optimizer,
        step: tf.Tensor,
    ) -> None:
        """Head `head`'s optimizer applied `grads` to `variables` in the step written at `step`
        (its number of updates done): its scalars and histograms, each gated on its cadence."""
        pairs = [(g, v) for g, v in zip(grads, variables) if g is not None]
        trunk = [(g, v) for g, v in pairs if id(v) in self._trunk_ids]
        own = [(g, v) for g, v in pairs if id(v) not in self._trunk_ids]
        earlier = [h for h in self._seen if h in self._trunk_grad] if trunk else []
        self._seen.append(head)

        def scalars() -> None:
            self._scalar(tags.loss(head), loss)
            if trunk:
                trunk_norm = global_norm([g for g, _ in trunk])
                self._scalar(tags.trunk_grad_norm(head), trunk_norm)
                clipped = clipped_gradients(optimizer, [g for g, _ in pairs])
                if clipped is not None:
                    applied = [c for c, (_, v) in zip(clipped, pairs) if id(v) in self._trunk_ids]
                    self._scalar(tags.grad_norm_clipped(head), global_norm(applied))
            if own:
                self._scalar(tags.head_grad_norm(head), global_norm([g for g, _ in own]))
            for part, ids in self._parts.get(head, {}).items():
                self._scalar(tags.part_grad_norm(head, part),
                             global_norm([g for g, v in own if id(v) in ids]))
            if self._variable_norms:
                for g, v in pairs:
                    self._scalar(tags.variable_grad_norm(head, self._address(v)), global_norm([g]))
            self._scalar(tags.lr(head), self._lr[head])
            before = [self._before[id(v)] for v in variables]
            update = [v - w for v, w in zip(variables, before)]
            self._scalar(tags.update_ratio(head),
                         tf.math.divide_no_nan(global_norm(update), global_norm(before)))
            for v, w in zip(variables, before):
                w.assign(v)  # the next head's update starts from here
            if trunk:
                self._write_cosines(head, trunk, trunk_norm, earlier, step)
            self._recorded_at[head].assign(step)

        self._gated(self._cadence.scalars_due(step), scalars)
        if self._cadence.histograms_every:
            def histograms() -> None:
                for g, v in pairs:
                    self._histogram(tags.grad_hist(head, self._address(v)), _dense(g))

            self._gated(self._cadence.histograms_due(step), histograms)

    def _address(self, variable: keras.Variable) -> str:
        return self._addresses.get(id(variable)) or variable.path

    def _write_cosines(self, head: str, trunk: list[tuple[_Grad, keras.Variable]],
                       norm: tf.Tensor, earlier: list[str], step: tf.Tensor) -> None:
        # A head that trains fewer trunk blocks (a trunk tap) has a zero gradient on the
        # others: the dot product runs over the variables both heads train, by identity.
        def writer(other: str) -> Callable[[], None]:
            def write() -> None:
                buffers = self._trunk_grad[other]
                common = [(buffers[id(v)], g) for g, v in trunk if id(v) in buffers]
                dot = (flat_dot([b for b, _ in common], [g for _, g in common]) if common
                       else tf.constant(0.0))
                first, second = sorted((other, head), key=self.heads.index)
                self._scalar(tags.grad_cosine(first, second),
                             cosine(dot, self._trunk_norm[other], norm))
            return write

        for other in earlier:  # heads updated before this one in this step, if they were due
            self._gated(tf.equal(self._recorded_at[other], step), writer(other))
        if head in self._trunk_grad:
            for g, v in trunk:
                self._trunk_grad[head][id(v)].assign(_dense(g))
            self._trunk_norm[head].assign(norm)
