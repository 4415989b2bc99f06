"""One vectorised trunk backward for K heads against one backward pass per head.

The reference of every comparison is the per-head rule's own gradient: one
`tape.gradient(objective_k, var_list_k)` per head, as the hand-written Keras loop
takes it. Bound (float32 rounding; the chain rule's sums run in another order): per
variable, max |batched - reference| <= 1e-6 x max(1, max |reference|). Measured on
these models: at most 1.8e-7 absolute, 1.2e-7 relative (conv); 9e-8 (Dense), 6e-8 (MMoE).
"""

import logging

import keras
import numpy as np
import pytest
import tensorflow as tf

import multihead as mh
from multihead.step import batched_backward
from multihead.objectives.objective import resolve_loss
from multihead.step.options import StepOptions
from multihead.step.train_step import StepObjective, TrainStep
from multihead.step.trunk_rule import Backward, HeadsPass, PerHeadRule, head_plans
from multihead.experiments.config.schema import ConfigError, apply_override, from_dict, parse_yaml
from conftest import weights

HEADS = ("a", "b", "c")
REL = 1e-6  # the bound above, relative to max(1, max |reference|)


def _dense_trunk():
    reg = keras.regularizers.L2(1e-2)  # the trunk's regularization is in every objective
    return keras.Sequential([keras.layers.Dense(16, activation="relu", kernel_regularizer=reg),
                             keras.layers.Dense(8, activation="tanh")])


def _conv_trunk(extra=()):
    return keras.Sequential([keras.layers.Reshape((6, 6, 1)),
                             keras.layers.Conv2D(4, 3, padding="same", activation="relu"),
                             *extra,
                             keras.layers.MaxPooling2D(2), keras.layers.Flatten(),
                             keras.layers.Dense(8, activation="tanh")])


def _mmoe_trunk():
    return mh.MMoE(HEADS, experts=3, expert_units=[8])


def _omoe_trunk():  # every head reads the one mixture: the same tensor
    return mh.OMoE(HEADS, experts=3, expert_units=[8])


def _unvectorisable_trunk():
    # The gradient of a bilinear resize (ResizeBilinearGrad) has no pfor vectorisation.
    return _conv_trunk([keras.layers.UpSampling2D(2, interpolation="bilinear")])


TRUNKS = {"dense": _dense_trunk, "conv": _conv_trunk, "mmoe": _mmoe_trunk, "omoe": _omoe_trunk}


def _model(trunk, seed=0):
    keras.utils.set_random_seed(seed)
    model = mh.MultiHeadModel(trunk(), {h: keras.layers.Dense(1) for h in HEADS})
    model.build((None, 36))
    return model


def _batch(seed=0, n=16, nan_head=None):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 36)).astype("float32")
    y = {h: rng.standard_normal((n, 1)).astype("float32") for h in HEADS}
    if nan_head is not None:
        y[nan_head][3] = np.nan  # one row: the head's loss and cotangent turn NaN
    return x, y


def _gradients(model, batches, own_batches=False, losses=None):
    """Per batch, (batched, reference, batched heads): per head the gradients its
    optimizer gets from the batched pass, and from its own backward pass."""
    losses = losses or {}
    specs = tuple(StepObjective(h, resolve_loss(losses.get(h, "mse"), h), keras.optimizers.SGD(),
                           tuple(model.var_list(h)), lambda step: tf.constant(1.0), 1, True)
                  for h in HEADS)
    step = TrainStep(model, specs, StepOptions(), tf.Variable(0, dtype=tf.int64),
                     PerHeadRule(True))

    @tf.function
    def run(x, y):
        counter = tf.constant(0, tf.int64)
        with tf.GradientTape(persistent=True) as tape:
            fwd = step.forward(x, y, specs, counter, own_batches)
        heads_pass = HeadsPass(specs, fwd.losses, counter, tuple(model.trunk_variables),
                               Backward(tape, fwd.objectives), features=fwd.features,
                               trunk_reg=fwd.trunk_reg)
        together = batched_backward.head_gradients(specs, heads_pass)
        plans = head_plans(specs, heads_pass, batched=True)
        ours = {p.head: p.gradients() if callable(p.gradients) else p.gradients for p in plans}
        reference = {h.name: tape.gradient(fwd.objectives[h.name], list(h.var_list))
                     for h in specs}
        return ours, reference, {h: tf.constant(True) for h in together}

    results = [run(*batch) for batch in batches]  # one trace: the batches' shapes are equal
    return [(ours, reference, sorted(together)) for ours, reference, together in results]


def _max_relative_gap(ours, reference):
    return max(float(np.max(np.abs(o.numpy() - r.numpy()))) / max(1.0, float(np.max(np.abs(r))))
               for o, r in zip(ours, reference))


@pytest.fixture(scope="module", params=sorted(TRUNKS))
def clean_and_nan(request):
    """(model, gradients of a clean batch, of the same batch with a NaN label of head b)."""
    model = _model(TRUNKS[request.param])
    return (model, *_gradients(model, [_batch(), _batch(nan_head="b")]))


def test_every_heads_gradient_equals_its_own_backward_pass(clean_and_nan):
    _, (ours, reference, together), _ = clean_and_nan
    assert together == sorted(HEADS)  # all three heads came from the one batched pass
    for head in HEADS:
        assert [g is None for g in ours[head]] == [g is None for g in reference[head]]
        assert _max_relative_gap(ours[head], reference[head]) <= REL


def test_a_nan_head_does_not_leak_into_the_others_rows(clean_and_nan):
    model, (clean, _, _), (ours, reference, together) = clean_and_nan
    assert together == sorted(HEADS)
    trunk_ids = {id(v) for v in model.trunk_variables}
    trunk_rows = [i for i, v in enumerate(model.var_list("b")) if id(v) in trunk_ids]
    assert all(not np.all(np.isfinite(ours["b"][i])) for i in trunk_rows)
    for head in ("a", "c"):
        # bitwise the gradients of the clean batch: no element of b's row reached theirs
        assert all(np.array_equal(o, c) for o, c in zip(ours[head], clean[head]))
        assert _max_relative_gap(ours[head], reference[head]) <= REL


def test_a_layer_pfor_cannot_vectorise_falls_back_to_one_pass_per_head(caplog):
    with caplog.at_level(logging.WARNING, logger="multihead"):
        [(ours, reference, together)] = _gradients(_model(_unvectorisable_trunk), [_batch()])
    assert together == []
    assert ("batched_backward: pfor cannot vectorise the trunk's backward pass (No pfor "
            "vectorization defined for ResizeBilinearGrad); taking one backward pass per head"
            in caplog.messages)
    for head in HEADS:  # the per-head passes themselves: bitwise the reference
        assert all(np.array_equal(o, r) for o, r in zip(ours[head], reference[head]))


def test_heads_with_batches_of_their_own_take_one_pass_each():
    # Each head's features come from its own trunk call: one vectorised pass would run
    # every head's row through every head's trunk call (K times the work).
    batches = {h: _batch(seed=i) for i, h in enumerate(HEADS)}
    x, y = {h: b[0] for h, b in batches.items()}, {h: b[1] for h, b in batches.items()}
    [(ours, reference, together)] = _gradients(_model(_dense_trunk), [(x, y)], own_batches=True)
    assert together == []
    for head in HEADS:
        assert all(np.array_equal(o, r) for o, r in zip(ours[head], reference[head]))


def test_a_loss_that_reads_the_trunk_itself_keeps_its_own_pass():
    model = _model(_dense_trunk)
    kernel = model.trunk.layers[0].kernel

    def penalised(inputs, targets, output):  # a research loss with a trunk penalty of its own
        return (tf.reduce_mean(tf.square(targets["a"] - output))
                + 0.1 * tf.reduce_sum(tf.square(kernel)))

    [(ours, reference, together)] = _gradients(model, [_batch()], losses={"a": penalised})
    assert together == ["b", "c"]  # a's objective reaches the trunk past its output
    assert all(np.array_equal(o, r) for o, r in zip(ours["a"], reference["a"]))
    for head in ("b", "c"):
        assert _max_relative_gap(ours[head], reference[head]) <= REL


def _train(trunk, batched, steps=3, nan_head=None, frozen=()):
    model = _model(trunk, seed=1)
    trainer = mh.Trainer(model, {h: mh.Objective("mse", keras.optimizers.Adam(1e-2))
                                 for h in HEADS}, batched_backward=batched)
    for head in frozen:
        trainer.freeze(head)
    results = [trainer.step(_batch(seed=step, nan_head=nan_head if step == 1 else None))
               for step in range(steps)]
    return model, results


def _close(ours, reference, tol=1e-5):
    return all(np.max(np.abs(o - r)) <= tol * max(1.0, np.max(np.abs(r)))
               for o, r in zip(ours, reference))


def test_training_with_the_batched_pass_matches_one_pass_per_head_frozen_head_included():
    ours, results = _train(_dense_trunk, True, frozen=("c",))
    reference, _ = _train(_dense_trunk, False, frozen=("c",))
    # Adam after 3 steps: the gradients' rounding gap stays at rounding level
    assert _close(weights(ours.weights), weights(reference.weights))
    assert not all(np.array_equal(o, r) for o, r in zip(weights(ours.weights),
                                                        weights(reference.weights)))
    start = _model(_dense_trunk, seed=1)  # the frozen head: never updated
    assert all(r.updated == ("a", "b") for r in results)
    assert all(np.array_equal(o, s) for o, s in zip(weights(ours.heads["c"].weights),
                                                    weights(start.heads["c"].weights)))


def test_a_nan_head_is_skipped_and_the_others_train_as_without_batching():
    ours, results = _train(_mmoe_trunk, True, nan_head="b")
    reference, _ = _train(_mmoe_trunk, False, nan_head="b")
    assert [r.skipped for r in results] == [(), ("b",), ()]
    assert all(np.all(np.isfinite(w)) for w in weights(ours.weights))
    assert _close(weights(ours.weights), weights(reference.weights))


def test_the_fallback_trains_exactly_as_one_pass_per_head():
    ours, _ = _train(_unvectorisable_trunk, True, steps=1)
    reference, _ = _train(_unvectorisable_trunk, False, steps=1)
    assert all(np.array_equal(o, r) for o, r in zip(weights(ours.weights),
                                                    weights(reference.weights)))


def test_auto_is_off_and_bad_values_name_the_argument():
    assert StepOptions(batched_backward="auto").batched is False
    assert StepOptions(batched_backward=True).batched is True
    with pytest.raises(ValueError, match=r"^batched_backward: expected 'auto', True or False, "
                                         r"got 'yes'$"):
        mh.Trainer(_model(_dense_trunk), {h: mh.Objective("mse", "sgd") for h in HEADS},
                   batched_backward="yes")


def test_the_config_key_reaches_the_trainer():
    raw = parse_yaml('{"model": {"trunk": {"mlp": {"units": [4]}}, "heads": {"y1": {}}}}')
    assert from_dict(raw).train.batched_backward == "auto"
    apply_override(raw, "train.batched_backward=true")
    assert from_dict(raw).train.batched_backward is True
    apply_override(raw, "train.batched_backward=sometimes")
    with pytest.raises(ConfigError, match="train.batched_backward: must be one of"):
        from_dict(raw, "x.yaml")
