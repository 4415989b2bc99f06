"""The one-pass backward of an aggregated trunk with constant weights (multihead.step.one_pass):
equal to the per-head passes to float32 rounding, the per-head path within the step when a
head must be isolated, and the per-head path on logging steps."""

from __future__ import annotations

import glob
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import multihead as mh
from conftest import make_batch, make_model, make_tapped, weights
from multihead.step.trunk_rule import Backward

HEADS = ("a", "b", "c", "d")
NAN = float("nan")

# (aggregator, its options, loss weighting): every linear combination the step takes in one pass
LINEAR = [
    pytest.param("sum", {}, None, id="sum"),
    pytest.param("mean", {}, None, id="mean"),
    pytest.param("weights", {"weights": [0.2, 1.0, 3.0, 0.5]}, None, id="weights"),
    pytest.param("sum", {}, "uncertainty", id="uncertainty-under-sum"),
]

# Measured over 5 seeds x 5 SGD steps (this model, momentum 0.9 on the trunk): the one-pass and
# per-head trainers' variables at most 1.5e-7 apart (sum 1.2e-7, mean 6e-8, weights 1.4e-7,
# uncertainty 1.2e-7); a single step: at most 6e-8. The bound leaves room for other BLAS builds.
BOUND = 1e-6


def _trainer(aggregator, options, weighting, one_pass, on_nonfinite="skip", missing_label=None,
             seed=4, **kwargs) -> mh.Trainer:
    return mh.Trainer(
        make_model(HEADS, seed=seed),
        {h: mh.Objective("mse", keras.optimizers.SGD(0.05), on_nonfinite=on_nonfinite,
                         missing_label=missing_label) for h in HEADS},
        trunk=mh.TrunkPolicy(keras.optimizers.SGD(0.05, momentum=0.9), aggregator, options,
                             loss_weighting=weighting),
        one_pass_backward=one_pass, **kwargs)


def _state(trainer: mh.Trainer) -> list[np.ndarray]:
    """Every variable a step writes: the model's, the trunk optimizer's (slots, the loss
    weighting's variables) and the heads' optimizers'."""
    opts = [trainer.trunk_update.optimizer] + [o.optimizer for o in trainer.objectives.values()]
    return weights(trainer.model.weights) + [w for o in opts for w in weights(o.variables)]


@pytest.mark.parametrize("aggregator,options,weighting", LINEAR)
def test_one_pass_equals_the_per_head_passes_to_float32_rounding(aggregator, options, weighting):
    one, per_head = (_trainer(aggregator, options, weighting, flag) for flag in (True, False))
    for step in range(5):
        batch = make_batch(HEADS, seed=step)
        a, b = one.step(batch), per_head.step(batch)
        assert (a.updated, a.skipped) == (b.updated, b.skipped) == (HEADS, ())
        if step == 0:  # the heads' own gradients are those of the per-head passes, bitwise
            for h in HEADS:
                for x, y in zip(weights(one.model.head_variables(h)),
                                weights(per_head.model.head_variables(h))):
                    np.testing.assert_array_equal(x, y)
    for x, y in zip(_state(one), _state(per_head)):
        np.testing.assert_allclose(x, y, rtol=0, atol=BOUND)
    assert one.trace_count == 1


def _count_per_head_backward_passes(monkeypatch) -> tf.Variable:
    """A counter of the per-head backward passes the steps traced from now on run (counted in
    the graph: a pass traced in a branch the step does not take is not counted)."""
    count = tf.Variable(0, dtype=tf.int64)
    original = Backward.head

    def counted(self, head, *args, **kwargs):
        count.assign_add(1)
        return original(self, head, *args, **kwargs)

    monkeypatch.setattr(Backward, "head", counted)
    return count


@pytest.mark.parametrize("aggregator,options,weighting,one_pass", [
    ("sum", {}, None, True), ("weights", {"weights": [1.0, 2.0, 3.0, 4.0]}, None, True),
    ("mean", {}, "dwa", True),
    ("sum", {}, None, False),                              # the option off
    ("weights", {"weights": [1.0, 0.0, 3.0, 4.0]}, None, True),  # a weight of 0
    ("sum", {}, "gradnorm", True),                         # reads the heads' gradient norms
    ("random", {}, None, True),                            # random weights
    ("mgda", {}, None, True),                              # weights from the Gramian
])
def test_only_a_linear_combination_takes_one_backward_pass(aggregator, options, weighting,
                                                           one_pass, monkeypatch):
    passes = _count_per_head_backward_passes(monkeypatch)
    trainer = _trainer(aggregator, options, weighting, one_pass)
    linear = (one_pass and weighting != "gradnorm" and aggregator in ("sum", "mean", "weights")
              and 0.0 not in options.get("weights", []))
    for seed in range(2):  # finite steps: no per-head pass on the one-pass path
        trainer.step(make_batch(HEADS, seed=seed))
    assert int(passes.numpy()) == (0 if linear else 2 * len(HEADS))
    trainer.step(_bad_batch(("b",)))  # a non-finite head: the step redone per head
    assert int(passes.numpy()) == (1 if linear else 3) * len(HEADS)


def _bad_batch(heads_without: tuple[str, ...], seed: int = 0):
    x, y = make_batch(HEADS, seed=seed)
    return x, dict(y, **{h: np.full_like(y[h], NAN) for h in heads_without})


@pytest.mark.parametrize("aggregator,options,weighting", LINEAR)
@pytest.mark.parametrize("bad,missing", [(("b",), False), (("b", "c"), False), (("c",), True)],
                         ids=["one-nonfinite-head", "two-nonfinite-heads", "one-head-unlabelled"])
def test_a_head_to_isolate_gives_the_per_head_step_bitwise(aggregator, options, weighting, bad,
                                                          missing):
    # A NaN label makes the head's loss NaN; with `missing_label=nan` it marks the head's rows
    # as unlabelled instead, so the head takes no part in the step.
    marker = NAN if missing else None
    one, per_head = (_trainer(aggregator, options, weighting, flag, missing_label=marker)
                     for flag in (True, False))
    a, b = one.step(_bad_batch(bad)), per_head.step(_bad_batch(bad))
    assert (a.updated, a.skipped) == (b.updated, b.skipped)
    assert a.updated == tuple(h for h in HEADS if h not in bad)
    assert a.skipped == (() if missing else bad)
    for x, y in zip(_state(one), _state(per_head)):
        np.testing.assert_array_equal(x, y)
    step = one._runner.train_step
    np.testing.assert_array_equal(step.nonfinite_skips.numpy(),
                                  per_head._runner.train_step.nonfinite_skips.numpy())
    batch = make_batch(HEADS, seed=1)  # the next, finite step: one pass again
    one.step(batch), per_head.step(batch)
    for x, y in zip(_state(one), _state(per_head)):
        np.testing.assert_allclose(x, y, rtol=0, atol=BOUND)


def _scalars(log_dir: str) -> dict[str, dict[int, float]]:
    values: dict[str, dict[int, float]] = {}
    for path in glob.glob(os.path.join(log_dir, "train", "events*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for v in event.summary.value:
                if v.metadata.plugin_data.plugin_name == "scalars":
                    values.setdefault(v.tag, {})[event.step] = float(tf.make_ndarray(v.tensor))
    return values


def test_logging_steps_log_each_heads_trunk_gradient_between_one_pass_steps(tmp_path,
                                                                           monkeypatch):
    passes = _count_per_head_backward_passes(monkeypatch)
    trainer = _trainer("mean", {}, None, True, log_dir=str(tmp_path), log_every=2)
    model = trainer.model
    expected: dict[int, dict[str, float]] = {}
    for step in range(1, 5):
        x, y = make_batch(HEADS, seed=step)
        with tf.GradientTape(persistent=True) as tape:  # by hand, at the step's parameters
            out = model(x, training=True)
            losses = {h: tf.reduce_mean(tf.square(y[h] - out[h])) for h in HEADS}
        grads = {h: np.concatenate([g.numpy().ravel() for g in
                                    tape.gradient(losses[h], model.trunk_variables)])
                 for h in HEADS}
        del tape
        expected[step] = {f"agg_trunk_grad_norm/{h}": float(np.linalg.norm(grads[h]))
                          for h in HEADS}
        expected[step]["agg_cosine/a/b"] = float(
            grads["a"] @ grads["b"] / np.linalg.norm(grads["a"]) / np.linalg.norm(grads["b"]))
        trainer.step((x, y))
    trainer.close()
    assert int(passes.numpy()) == 3 * len(HEADS)  # per head on the logging steps only
    logged = _scalars(str(tmp_path))
    assert sorted(logged["agg_trunk_grad_norm/a"]) == [1, 2, 4]  # the first, then every 2nd
    for step in (1, 2, 4):  # 4: after the one-pass step 3
        for tag, value in expected[step].items():
            assert logged[tag][step] == pytest.approx(value, rel=1e-5, abs=1e-7), (tag, step)


def _mmoe(seed: int) -> mh.MultiHeadModel:
    keras.utils.set_random_seed(seed)
    model = mh.MultiHeadModel(mh.MMoE(["main", "aux"], experts=4, expert_units=[6]),
                              {h: keras.layers.Dense(1) for h in ("main", "aux")})
    model.build((None, 5))
    return model


@pytest.mark.parametrize("make", [_mmoe, make_tapped], ids=["mmoe", "trunk-tap"])
def test_a_routing_trunk_and_a_trunk_tap_take_one_pass_too(make, monkeypatch):
    # Neither has the one trunk output rep_grad needs: each head sees its own gate's mix, or
    # `aux` reads an inner block of the trunk.
    passes = _count_per_head_backward_passes(monkeypatch)
    heads = ("main", "aux")
    trainers = [mh.Trainer(make(seed=1), {h: mh.Objective("mse", keras.optimizers.SGD(0.05))
                                          for h in heads},
                           trunk=mh.TrunkPolicy("sgd", "mean"), one_pass_backward=flag)
                for flag in (True, False)]
    for step in range(3):
        for trainer in trainers:
            trainer.step(make_batch(heads, seed=step))
    assert int(passes.numpy()) == 3 * len(heads)  # the per-head trainer's only
    for x, y in zip(*(_state(t) for t in trainers)):
        np.testing.assert_allclose(x, y, rtol=0, atol=BOUND)
