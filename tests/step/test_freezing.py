"""Freezing a head: no update of its variables or slots, none of its gradient in the trunk,
no retrace, saved in checkpoints, lifted by `unfreeze`."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import multihead as mh
from conftest import make_batch, make_model, run_mirrored, weights

HEADS = ("a", "b", "c")
CASES = [("simultaneous", "per_head"), ("sequential", "per_head"),
         ("simultaneous", {"optimizer": "adam", "aggregator": "mgda"}),
         ("simultaneous", {"optimizer": "adam", "aggregator": "pcgrad", "seed": 4})]


def _trainer(heads=HEADS, schedule="simultaneous", trunk="per_head", model=None):
    model = model or make_model(heads=heads)
    return mh.Trainer(model, {h: mh.Objective("mse", keras.optimizers.Adam(1e-2)) for h in heads},
                      schedule=schedule, trunk=trunk)


def _head_state(trainer, head):
    return weights(trainer.model.heads[head].weights + trainer.optimizers[head].variables)


@pytest.mark.parametrize("schedule,trunk", CASES)
def test_a_frozen_head_keeps_its_variables_and_slots_and_the_step_does_not_retrace(schedule, trunk):
    trainer = _trainer(schedule=schedule, trunk=trunk)
    trainer.step(make_batch(HEADS))
    traces = trainer.trace_count
    trainer.freeze("b")
    assert trainer.frozen == ("b",)
    frozen_at = _head_state(trainer, "b")
    others = _head_state(trainer, "a")
    for seed in range(1, 4):
        result = trainer.step(make_batch(HEADS, seed=seed))
        assert result.updated == ("a", "c") and set(result.losses) == {"a", "c"}
    for before, after in zip(frozen_at, _head_state(trainer, "b")):
        np.testing.assert_array_equal(before, after)  # bitwise, iterations included
    assert not all(np.array_equal(x, y) for x, y in zip(others, _head_state(trainer, "a")))
    trainer.unfreeze("b")
    assert trainer.frozen == () and trainer.step(make_batch(HEADS, seed=9)).updated == HEADS
    assert int(trainer.optimizers["b"].iterations.numpy()) == 2  # steps 0 and 4
    assert trainer.trace_count == traces


@pytest.mark.parametrize("trunk", ["per_head", {"optimizer": "adam", "aggregator": "mgda"}])
def test_with_a_head_frozen_the_trunk_moves_as_without_that_head(trunk):
    # Same initial trunk and heads a, c; b frozen from the start vs a model without b.
    with_b, without_b = _trainer(trunk=trunk), _trainer(heads=("a", "c"), trunk=trunk)
    without_b.model.trunk.set_weights(with_b.model.trunk.get_weights())
    for h in ("a", "c"):
        without_b.model.heads[h].set_weights(with_b.model.heads[h].get_weights())
    with_b.freeze("b")
    for seed in range(4):
        x, y = make_batch(HEADS, seed=seed)
        with_b.step((x, y))
        without_b.step((x, {h: y[h] for h in ("a", "c")}))
    # Bitwise: per_head, head b's update is not applied and a's and c's gradients do not
    # depend on it; mgda, the aggregate of the step is that of heads a, c alone (the
    # aggregator restricted to them, as for a head dropped as non-finite), the same ops.
    for x, y in zip(weights(with_b.model.trunk.weights), weights(without_b.model.trunk.weights)):
        np.testing.assert_array_equal(x, y)
    for h in ("a", "c"):
        for x, y in zip(_head_state(with_b, h), _head_state(without_b, h)):
            np.testing.assert_array_equal(x, y)


def test_freezing_is_reachable_from_a_callback_and_checked():
    class FreezeB(mh.Callback):
        def on_step_end(self, step, result):
            if step == 2:
                self.trainer.freeze("b")

    trainer = _trainer()
    x, y = make_batch(HEADS, n=64)
    trainer.fit((x, y), 5, batch_size=16, verbose=False, callbacks=[FreezeB()])
    assert trainer.frozen == ("b",)
    assert int(trainer.optimizers["b"].iterations.numpy()) == 2
    assert int(trainer.optimizers["a"].iterations.numpy()) == 5
    with pytest.raises(ValueError, match="names head 'z'"):
        trainer.freeze("z")


def test_the_freeze_flags_survive_a_checkpoint_and_an_older_checkpoint_freezes_nothing(tmp_path):
    trainer = _trainer()
    trainer.step(make_batch(HEADS))
    trainer.freeze("c")
    path = mh.save_checkpoint(tmp_path / "ckpt", trainer.model, trainer=trainer)
    resumed = _trainer(model=make_model(heads=HEADS, seed=1))
    mh.restore_checkpoint(path, resumed.model, trainer=resumed)
    assert resumed.frozen == ("c",)
    # A checkpoint without the part (written before freezing existed) restores as "none frozen".
    parts = [p for p in mh.available_parts(trainer.model, trainer) if p != "frozen"]
    old = mh.save_checkpoint(tmp_path / "old", trainer.model, parts=parts, trainer=trainer)
    assert "frozen" not in mh.checkpoint_parts(old)
    fresh = _trainer(model=make_model(heads=HEADS, seed=1))
    fresh.freeze("a")
    mh.restore_checkpoint(old, fresh.model, trainer=fresh)  # the part is not in it: kept
    assert fresh.frozen == ("a",) and fresh.global_step == 1
    fresh.unfreeze("a")
    assert fresh.frozen == ()


_MIRRORED = r'''
result = {}
for name, trunk in (("per_head", "per_head"), ("mgda", {"optimizer": "adam", "aggregator": "mgda"})):
    runs = []
    for distributed in (False, True):
        with scope(strategy if distributed else None):
            model = make_model(seed=3)
            t = mh.Trainer(model, {h: mh.Objective("mse", keras.optimizers.Adam(1e-2)) for h in "ab"},
                           trunk=trunk, strategy=strategy if distributed else None)
        t.step(make_batch())
        t.freeze("b")
        frozen_at = [v.numpy().copy() for v in model.heads["b"].weights + t.optimizers["b"].variables]
        for s in range(1, 4):
            t.step(make_batch(seed=s))
        kept = all(np.array_equal(x, v.numpy()) for x, v in
                   zip(frozen_at, model.heads["b"].weights + t.optimizers["b"].variables))
        runs.append((model, kept, t.trace_count))
    (m1, k1, _), (m2, k2, traces) = runs
    gap = max(float(np.abs(x.numpy() - y.numpy()).max()) for x, y in zip(m1.weights, m2.weights))
    result[name] = [gap, k1, k2, traces]
done(result)
'''


def test_freezing_works_under_a_mirrored_strategy(tmp_path):
    for case, (gap, kept_single, kept_mirrored, traces) in run_mirrored(_MIRRORED, tmp_path).items():
        # float rounding only: the mirrored batch mean is summed from two replica halves
        assert gap < 1e-5, case
        assert kept_single and kept_mirrored and traces == 1, case


MGDA = {"optimizer": "adam", "aggregator": "mgda"}


def _aligned(trainer, heads, trunk):
    """A trainer of `heads` only, from `trainer`'s (initial) trunk and head weights."""
    alone = _trainer(heads=heads, trunk=trunk)
    alone.model.trunk.set_weights(trainer.model.trunk.get_weights())
    for h in heads:
        alone.model.heads[h].set_weights(trainer.model.heads[h].get_weights())
    return alone


def _policy(aggregator):
    return mh.TrunkPolicy(optimizer=keras.optimizers.Adam(1e-2), aggregator=aggregator)


@pytest.mark.parametrize("aggregator", ["mgda", "moco"])  # moco: per-head buffers and state
def test_with_two_heads_frozen_under_aggregation_the_trunk_moves_as_the_other_head_alone(
        aggregator):
    trainer = _trainer(trunk=_policy(aggregator))
    alone = _aligned(trainer, ("a",), _policy(aggregator))
    trainer.freeze("b")
    trainer.freeze("c")
    frozen_at = {h: _head_state(trainer, h) for h in ("b", "c")}
    for seed in range(4):
        x, y = make_batch(HEADS, seed=seed)
        assert trainer.step((x, y)).updated == ("a",)
        alone.step((x, {"a": y["a"]}))
    # Bitwise: the step is the one compiled for head a alone, whose aggregator is the
    # policy's restricted to a (the same ops as a one-head run's).
    for x, y in zip(weights(trainer.model.trunk.weights), weights(alone.model.trunk.weights)):
        np.testing.assert_array_equal(x, y)
    for x, y in zip(_head_state(trainer, "a"), _head_state(alone, "a")):
        np.testing.assert_array_equal(x, y)
    for x, y in zip(weights(trainer.trunk_optimizer.variables),
                    weights(alone.trunk_optimizer.variables)):
        np.testing.assert_array_equal(x, y)
    for h in ("b", "c"):
        for before, after in zip(frozen_at[h], _head_state(trainer, h)):
            np.testing.assert_array_equal(before, after)
    assert trainer.global_step == 4


def test_a_subset_step_reads_and_writes_the_aggregator_state_of_its_members_only():
    trainer = _trainer(trunk=_policy("moco"))
    trainer.step(make_batch(HEADS))  # every head's buffer row is written once
    state = trainer.trunk_update.aggregator_state
    before = weights(state.variables)
    trainer.freeze("b")
    trainer.freeze("c")
    trainer.step(make_batch(HEADS, seed=1))
    after = weights(state.variables)
    rows_changed = [v.shape.rank > 0 and v.shape[0] == 3 for v in state.variables]
    assert any(rows_changed)
    for old, new, per_head in zip(before, after, rows_changed):
        if per_head:  # rows of b and c: bitwise kept; the row of a: moved
            np.testing.assert_array_equal(old[1:], new[1:])
            assert not np.array_equal(old[0], new[0])


def test_freezing_one_head_does_not_retrace_two_trace_once_and_unfreezing_returns():
    trainer = _trainer(trunk=MGDA)
    trainer.step(make_batch(HEADS))
    traces = trainer.trace_count
    trainer.freeze("b")
    trainer.step(make_batch(HEADS, seed=1))
    assert trainer.trace_count == traces  # one frozen head: dropped in the graph
    trainer.freeze("c")
    assert trainer.step(make_batch(HEADS, seed=2)).updated == ("a",)
    assert trainer.trace_count == traces + 1  # the variant of head a alone
    trainer.unfreeze("b")
    trainer.unfreeze("c")
    assert trainer.step(make_batch(HEADS, seed=3)).updated == HEADS
    trainer.freeze("b")
    trainer.freeze("c")
    trainer.step(make_batch(HEADS, seed=4))
    assert trainer.trace_count == traces + 1  # both variants compiled already


def test_fit_honours_two_frozen_heads_under_aggregation():
    class FreezeBC(mh.Callback):
        def on_step_end(self, step, result):
            if step == 2:
                self.trainer.freeze("b")
                self.trainer.freeze("c")

    x, y = make_batch(HEADS, n=80)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    fitted, stepped = _trainer(trunk=MGDA), _trainer(trunk=MGDA)
    stepped.model.set_weights(fitted.model.get_weights())
    history = fitted.fit(data, 5, verbose=False, callbacks=[FreezeBC()])
    for i, batch in enumerate(data):
        if i == 2:
            stepped.freeze("b")
            stepped.freeze("c")
        stepped.step(batch)
    for a, b in zip(weights(fitted.model.weights), weights(stepped.model.weights)):
        np.testing.assert_array_equal(a, b)
    assert fitted.global_step == 5 and [s for s, _ in history.train["a"]] == [0, 1, 2, 3, 4]
    assert [s for s, _ in history.train["b"]] == [0, 1]
    assert int(fitted.optimizers["b"].iterations.numpy()) == 2
    assert int(fitted.trunk_optimizer.iterations.numpy()) == 5  # the trunk kept moving


def test_under_a_loss_weighting_a_frozen_head_stops_the_trunk_without_retracing():
    # Documented limit: a loss weighting weighs all its heads or none.
    trainer = _trainer(trunk={"optimizer": "adam", "aggregator": "mgda",
                              "loss_weighting": "uncertainty"})
    trainer.step(make_batch(HEADS))
    traces, trunk = trainer.trace_count, weights(trainer.model.trunk.weights)
    trainer.freeze("b")
    trainer.freeze("c")
    assert trainer.step(make_batch(HEADS, seed=1)).updated == ("a",)
    assert trainer.trace_count == traces
    for x, y in zip(trunk, weights(trainer.model.trunk.weights)):
        np.testing.assert_array_equal(x, y)


def test_run_steps_of_the_keras_adapter_honours_two_frozen_heads():
    x, y = make_batch(HEADS, n=48)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    adapter, stepped = _trainer(trunk=MGDA), _trainer(trunk=MGDA)
    stepped.model.set_weights(adapter.model.get_weights())
    trunk = weights(adapter.model.trunk.weights)
    for trainer in (adapter, stepped):
        trainer.freeze("b")
        trainer.freeze("c")
    results = adapter.run_steps(iter(data), 3)
    for batch in data:
        stepped.step(batch)
    assert [r.updated for r in results] == [("a",)] * 3
    for a, b in zip(weights(adapter.model.weights), weights(stepped.model.weights)):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(trunk[0], adapter.model.trunk.weights[0].numpy())
