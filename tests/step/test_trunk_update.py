"""The aggregated trunk update's compiled step: its graph holds one aggregation of every head
and one of all heads but one (whose position is known in the graph only), not one per head,
and a step that drops a head aggregates the others exactly as a trainer without that head
(taking one backward pass per head)."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import multihead as mh
from conftest import make_batch, make_model, weights

_LOOPS = ("While", "StatelessWhile")


def _heads(k: int) -> tuple[str, ...]:
    return tuple(f"h{i}" for i in range(k))


def _traced(k: int, trunk) -> tuple[int, int]:
    """(nodes, while loops) of the step compiled for K heads, those of the functions it calls
    (cond branches, loop bodies) included."""
    heads = _heads(k)
    trainer = mh.Trainer(make_model(heads, seed=1),
                         {h: mh.Objective("mse", keras.optimizers.SGD(0.1)) for h in heads},
                         trunk=trunk)
    x, y = make_batch(heads, n=4)
    trainer.step((tf.constant(x), {h: tf.constant(v) for h, v in y.items()}))
    nodes = loops = 0
    for concrete in trainer._runner.train_step.loops._cache._concrete.values():
        graph_def = concrete.graph.as_graph_def()
        every = list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]
        nodes += len(every)
        loops += sum(n.op in _LOOPS for n in every)
    return nodes, loops


def test_the_aggregated_step_grows_per_head_no_faster_than_the_per_head_step():
    # The non-finite guard re-plans the trunk update without a dropped head. Traced once per
    # head, that plan holds K + 1 aggregations of K heads and its graph grows as K^2 (here,
    # from K=4 to 8: 5 -> 9 solver loops, +1176 nodes against the per-head step's +612);
    # traced once with the dropped head's position as a tensor, it grows as the per-head
    # step does (2 loops, +570 nodes).
    mgda = mh.TrunkPolicy("sgd", aggregator="mgda", options={"solver": "frank_wolfe"})
    (agg4, loops4), (agg8, loops8) = _traced(4, mgda), _traced(8, mgda)
    (per_head4, _), (per_head8, _) = _traced(4, "per_head"), _traced(8, "per_head")
    assert loops4 == loops8 == 2  # Frank-Wolfe solves: for every head, for all but one
    assert agg8 - agg4 <= per_head8 - per_head4, (agg4, agg8, per_head4, per_head8)


def _trainer(heads: tuple[str, ...], aggregator: str, options: dict, model=None,
             one_pass: bool = True) -> mh.Trainer:
    policy = mh.TrunkPolicy(keras.optimizers.Adam(1e-2), aggregator=aggregator, options=options,
                            seed=5)
    return mh.Trainer(model or make_model(heads, seed=2),
                      {h: mh.Objective("mse", keras.optimizers.Adam(1e-2)) for h in heads},
                      trunk=policy, one_pass_backward=one_pass)


@pytest.mark.parametrize("aggregator,options", [
    ("mgda", {}),                                    # K - 1 = 4 heads: the stacked Gramian
    ("weights", {"weights": [0.5, 1.0, 2.0, 3.0, 1.5]}),  # per-head options: a step per subset
    ("gradvac", {}),                                 # state per pair of heads
])
def test_a_dropped_head_leaves_the_step_of_the_others_bitwise(aggregator, options):
    heads, dropped = _heads(5), "h2"
    rest = tuple(h for h in heads if h != dropped)
    kept = [heads.index(h) for h in rest]
    full = _trainer(heads, aggregator, options)
    sub_options = ({"weights": [options["weights"][i] for i in kept]} if "weights" in options
                   else options)
    model = make_model(rest, seed=3)
    model.trunk.set_weights(full.model.trunk.get_weights())
    for h in rest:
        model.heads[h].set_weights(full.model.heads[h].get_weights())
    # A step that drops a head is taken per head (fixed weights take one backward pass of
    # the weighted loss otherwise, equal to float32 rounding: tests/step/test_one_pass.py).
    without = _trainer(rest, aggregator, sub_options, model, one_pass=False)
    x, y = make_batch(heads, seed=4)
    result = full.step((x, dict(y, h2=np.full_like(y[dropped], np.nan))))
    without.step((x, {h: y[h] for h in rest}))
    assert result.skipped == (dropped,) and result.updated == rest
    for a, b in zip(weights(full.model.trunk.weights), weights(without.model.trunk.weights)):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(weights(full.trunk_update.optimizer.variables),
                    weights(without.trunk_update.optimizer.variables)):
        np.testing.assert_array_equal(a, b)
    if aggregator == "gradvac":  # the pairs of the heads kept moved as without h2; h2's did not
        rho, sub = full.trunk_update.aggregator_state.rho_T.numpy(), \
            without.trunk_update.aggregator_state.rho_T.numpy()
        np.testing.assert_array_equal(rho[np.ix_(kept, kept)], sub)
        assert not rho[2].any() and not rho[:, 2].any() and sub.any()
