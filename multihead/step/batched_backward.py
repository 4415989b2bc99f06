"""One vectorised trunk backward pass for the heads of the per-head rule.

Under the per-head rule (`multihead.step.trunk_rule.PerHeadRule`) each head's
optimizer applies the gradient of its own objective to trunk + head. Taken one
head at a time, that is K backward passes through the trunk. Here the trunk's
part of every head's gradient comes from one vectorised vector-Jacobian product
instead (`tf.vectorized_map`, i.e. pfor), as torchjd does in PyTorch:

1. per head, one backward pass through the head only: the gradient of its
   objective on its own variables and on the trunk output `features`
   (its cotangent `c_k = d objective_k / d features`);
2. the K cotangents stacked, one vectorised VJP of the trunk:
   `vectorized_map(lambda c: gradient(features, trunk, output_gradients=c), C)`;
3. plus the gradient of the trunk's regularization, which every per-head
   objective carries once (`multihead.step.forward.Forward.objectives`).

A head's gradient equals its own backward pass to float32 rounding (the sums of
the chain rule happen in another order; tests/step/test_batched_backward.py
states the bound). Each head is a row of the vectorised pass: a NaN in one head's
cotangent stays in that head's row, so the non-finite guard drops that head only.

A head is batched only where that decomposition is exact and cheap: it trains the
trunk, is due every step (`every=1`; a head due on some steps keeps its own pass,
taken only when due), and its objective reaches the trunk's variables only
through `features` and the trunk's regularization (checked on the traced graph: a
loss that reads a trunk variable itself keeps its own pass). Heads with batches of
their own (one trunk call per head) keep one pass each, as do the sequential
schedule (one head per pass) and steps under a `tf.distribute` strategy. Where
pfor has no vectorisation for an op of the trunk's backward pass (e.g. the gradient
of a bilinear resize), the step falls back to one pass per head, with a one-line
warning at trace time.

Speed: on the 2-core CPU this was measured on, the batched pass is *slower* than
K passes (docs/performance.md gives the figures), so `"auto"` resolves to off.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

import keras
import tensorflow as tf

from multihead.step.applier import not_converted

_LOG = logging.getLogger("multihead")

@not_converted
def head_gradients(heads: Sequence[Any], heads_pass: Any) -> dict[str, list[Any]]:
    """The gradients of the heads that can be batched (see the module docstring), each
    on its var_list, from one vectorised trunk backward pass; head -> gradients.

    Heads missing from the result take their own backward pass. Empty when fewer than
    two heads can be batched, when the step runs eagerly, or when pfor cannot
    vectorise the trunk's backward pass (logged as a warning).

    Args:
        heads: the heads (`StepObjective`s) the rule plans for.
        heads_pass: the rule's `HeadsPass` (one device: `backward` and `features`).
    """
    backward, features = heads_pass.backward, heads_pass.features
    if backward is None or features is None or tf.executing_eagerly():
        return {}
    # once each: heads may read the same tensor (OMoE), whose VJP must count it once
    flat = list({id(t): t for t in tf.nest.flatten(features)}.values())
    trunk = list(heads_pass.trunk_variables)
    trunk_ids = {id(v) for v in trunk}
    reg = heads_pass.trunk_reg if isinstance(heads_pass.trunk_reg, tf.Tensor) else None
    cut = flat + ([reg] if reg is not None else [])
    candidates = [h for h in heads
                  if h.trains_trunk and h.every == 1 and any(id(v) in trunk_ids for v in h.var_list)
                  and not _trunk_reads(backward.objectives[h.name], cut, trunk)]
    if len(candidates) < 2 or not _one_trunk_call(flat, trunk):
        return {}
    own, cotangents = {}, {}
    for head in candidates:
        own_vars = [v for v in head.var_list if id(v) not in trunk_ids]
        grads = backward.gradient(backward.objectives[head.name], own_vars + flat)
        own[head.name], cotangents[head.name] = grads[:len(own_vars)], grads[len(own_vars):]
    candidates = [h for h in candidates if any(c is not None for c in cotangents[h.name])]
    if len(candidates) < 2:
        return {}
    stacked = _trunk_vjp(backward, flat, trunk, [cotangents[h.name] for h in candidates])
    if stacked is None:
        return {}
    reg_grads = (backward.gradient(reg, trunk) if reg is not None else [None] * len(trunk))
    reached: dict[tuple[int, ...], list[Any]] = {}  # the trunk variables a set of outputs reads
    out = {}
    for row, head in enumerate(candidates):
        used = [f for f, c in zip(flat, cotangents[head.name]) if c is not None]
        key = tuple(id(f) for f in used)
        if key not in reached:
            reached[key] = backward.gradient(used + ([reg] if reg is not None else []), trunk)
        connected = reached[key]
        trunk_grads = {id(v): _row(stacked[i], row, reg_grads[i], connected[i] is not None)
                       for i, v in enumerate(trunk)}
        own_grads = iter(own[head.name])
        out[head.name] = [trunk_grads[id(v)] if id(v) in trunk_ids else next(own_grads)
                          for v in head.var_list]
    return out


def _row(stacked: tf.Tensor | None, row: int, reg: tf.Tensor | None, connected: bool,
         ) -> tf.Tensor | None:
    """Head `row`'s gradient on one trunk variable: its row of the batched VJP plus the
    regularization's gradient; None where the head's objective does not reach it."""
    if not connected:
        return None
    parts = [g for g in (None if stacked is None else stacked[row], reg) if g is not None]
    return parts[0] if len(parts) == 1 else parts[0] + parts[1]


def _trunk_vjp(backward: Any, flat: list[tf.Tensor], trunk: list[keras.Variable],
               cotangents: list[list[tf.Tensor | None]]) -> list[tf.Tensor | None] | None:
    """`gradient(flat, trunk, output_gradients=c_k)` for every head k, as one vectorised
    pass: per trunk variable, the K gradients stacked (None: no dependence); None when
    pfor cannot vectorise the pass."""
    stacked = [tf.stack([c if c is not None else tf.zeros_like(f) for c in column])
               for f, column in zip(flat, zip(*cotangents))]
    connected = backward.gradient(flat, trunk)
    if any(isinstance(g, tf.IndexedSlices) for g in connected):
        return None  # a sparse (embedding) gradient: its own pass keeps it sparse
    sources = [v for v, g in zip(trunk, connected) if g is not None]

    def vjp(cs: list[tf.Tensor]) -> list[tf.Tensor]:
        grads = backward.gradient(flat, sources, output_gradients=list(cs))
        return list(grads)

    try:
        grads = iter(tf.vectorized_map(vjp, stacked, fallback_to_while_loop=False))
    except (ValueError, TypeError, NotImplementedError) as error:
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        _LOG.warning("batched_backward: pfor cannot vectorise the trunk's backward pass (%s); "
                     "taking one backward pass per head", first)
        return None
    return [next(grads) if g is not None else None for g in connected]


def _trunk_reads(tensor: tf.Tensor, cut: Sequence[tf.Tensor],
                 trunk: Sequence[keras.Variable]) -> set[int]:
    """Ids of the ops that read a trunk variable and that `tensor` depends on other than
    through the tensors `cut`, walking the traced graph back."""
    handles = _trunk_handles(tensor.graph, trunk)
    stop = {id(t) for t in cut}
    seen: set[int] = set()
    reads = set()
    todo = [tensor]
    while todo:
        tensor = todo.pop()
        if id(tensor) in stop or id(tensor.op) in seen:
            continue
        seen.add(id(tensor.op))
        if any(id(t) in handles for t in tensor.op.inputs):
            reads.add(id(tensor.op))
        todo.extend(tensor.op.inputs)
    return reads


def _one_trunk_call(flat: Sequence[tf.Tensor], trunk: Sequence[keras.Variable]) -> bool:
    """Whether the trunk outputs `flat` come from one call of the trunk (they share a read
    of a trunk variable), not one call per head (own batches): there the vectorised pass
    would run every head's row through every head's trunk call."""
    reads = [_trunk_reads(f, (), trunk) for f in flat]
    return all(r & reads[0] for r in reads[1:])


def _trunk_handles(graph: Any, trunk: Sequence[keras.Variable]) -> set[int]:
    """Ids of the tensors by which `graph` (and the graphs it is nested in) hold the
    trunk variables' resource handles."""
    ids = {id(v.handle) for v in trunk}
    chain = []
    while graph is not None and hasattr(graph, "captures"):
        chain.append(graph)
        graph = getattr(graph, "outer_graph", None)
    for g in reversed(chain):  # outermost first: an inner capture's external is the outer's
        for external, internal in g.captures:
            if id(external) in ids:
                ids.add(id(internal))
    return ids

