"""Mixed precision: float16 / bfloat16 compute with float32 variables, a dynamic loss scale
per head under float16 (`multihead.step.loss_scales`)."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import make_batch, run_mirrored

import multihead as mh
from multihead.monitoring.report import load_report

F16, BF16 = "mixed_float16", "mixed_bfloat16"


def _model(policy=None, heads=("a", "b"), seed=0):
    """The conftest model's shape, every layer with the dtype policy `policy`."""
    keras.utils.set_random_seed(seed)
    dtype = None if policy is None else keras.DTypePolicy(policy)

    def dense(units, activation=None):
        return keras.layers.Dense(units, activation=activation, dtype=dtype)

    model = mh.MultiHeadModel(
        keras.Sequential([dense(8, "tanh"), dense(8, "tanh")]),
        {h: keras.Sequential([dense(4, "tanh"), dense(1)]) for h in heads})
    model.build((None, 5))
    return model


def _sgd_objectives(weight_b=1.0, on_nonfinite="skip"):
    return {"a": mh.Objective("mse", keras.optimizers.SGD(0.1)),
            "b": mh.Objective("mse", keras.optimizers.SGD(0.1), weight=weight_b,
                              on_nonfinite=on_nonfinite)}


def _values(variables):
    return [np.array(v.numpy()) for v in variables]


# -- which trainer scales ----------------------------------------------------------------


@pytest.mark.parametrize("policy,scaled", [(None, False), (BF16, False), (F16, True)])
def test_only_a_float16_model_gets_a_loss_scale_per_head(policy, scaled):
    trainer = mh.Trainer(_model(policy), _sgd_objectives())
    assert (trainer.loss_scales is not None) == scaled
    if scaled:  # one per head, at Keras' LossScaleOptimizer default
        assert trainer.loss_scales.values() == {"a": 2.0 ** 15, "b": 2.0 ** 15}
    assert {v.dtype for v in trainer.model.weights} == {"float32"}  # Keras' mixed policies


def test_a_float16_head_alone_is_enough_and_loss_scale_none_turns_scaling_off():
    keras.utils.set_random_seed(0)
    model = mh.MultiHeadModel(keras.layers.Dense(4), {"a": keras.layers.Dense(1, dtype=F16)})
    assert mh.Trainer(model, {"a": mh.Objective("mse")}).loss_scales is not None
    assert mh.Trainer(model, {"a": mh.Objective("mse", "adam")}, loss_scale=None).loss_scales is None


def test_bad_loss_scale_settings_are_one_line_errors():
    with pytest.raises(ValueError, match=r"^DynamicLossScale.growth_steps: must be >= 1, got 0"):
        mh.DynamicLossScale(growth_steps=0)
    with pytest.raises(ValueError, match=r"^DynamicLossScale.initial: must be > 0"):
        mh.DynamicLossScale(initial=0.0)
    with pytest.raises(TypeError, match=r"^loss_scale must be 'auto', a DynamicLossScale or None"):
        mh.Trainer(_model(), _sgd_objectives(), loss_scale="dynamic")


def test_trunk_aggregation_with_float16_loss_scales_is_refused_in_one_line():
    with pytest.raises(mh.SettingError, match=r"^trunk: trunk aggregation does not support "
                                              r"float16 loss scaling .*trunk='per_head'.*bfloat16"
                       ) as err:
        mh.Trainer(_model(F16), _sgd_objectives(), trunk=mh.TrunkPolicy(aggregator="mean"))
    assert "\n" not in str(err.value)
    mh.Trainer(_model(BF16), _sgd_objectives(), trunk=mh.TrunkPolicy(aggregator="mean"))


# -- the per-head dynamics ----------------------------------------------------------------


def _float32_reference(initial, x, y, steps):
    """Head a alone, trained by hand in float32 from `initial`: `steps` SGD(0.1) steps on
    mse, trunk + head a (`tape.gradient` + `apply_gradients`)."""
    model = _model(None)
    model.set_weights(initial)
    variables = model.var_list("a")
    optimizer = keras.optimizers.SGD(0.1)
    for _ in range(steps):
        with tf.GradientTape() as tape:
            out = model.head_output("a", model.features(x, training=True), training=True)
            loss = tf.reduce_mean(tf.square(y["a"] - out))
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
    return model


def test_an_overflowing_head_skips_and_halves_its_scale_the_other_head_matches_float32():
    model = _model(F16)
    initial = model.get_weights()
    # Head b's loss weight makes its float16 output gradient overflow (1e8 x 2^8 x dL/dy).
    trainer = mh.Trainer(model, _sgd_objectives(weight_b=1e8),
                         loss_scale=mh.DynamicLossScale(initial=2.0 ** 8))
    x, y = make_batch()
    b_before = _values(model.head_variables("b"))
    for _ in range(3):
        result = trainer.step((x, y))
        assert result.updated == ("a",) and result.skipped == ("b",)
    # b: three overflows, three halvings 2^8 -> 2^5; a: three finite updates, no growth yet
    assert trainer.loss_scales.values() == {"a": 2.0 ** 8, "b": 2.0 ** 5}
    assert int(trainer.optimizers["b"].iterations) == 0
    for now, before in zip(_values(model.head_variables("b")), b_before):
        np.testing.assert_array_equal(now, before)  # b's update was skipped, every time
    np.testing.assert_array_equal(trainer._runner.train_step.nonfinite_skips.numpy(), [0, 3])
    # a (and the trunk, which only a updated) moved as head a alone in float32, to float16
    # precision: each update within 1% of the largest update of the variable
    reference = _float32_reference(initial, x, y, steps=3)
    start = dict(zip([v.path for v in model.weights], initial))
    for ours, theirs in zip(model.var_list("a"), reference.var_list("a")):
        ours_delta = ours.numpy() - start[ours.path]
        theirs_delta = theirs.numpy() - start[ours.path]
        assert np.abs(theirs_delta).max() > 0
        np.testing.assert_allclose(ours_delta, theirs_delta, rtol=0,
                                   atol=1e-2 * np.abs(theirs_delta).max(), err_msg=ours.path)


def test_the_scale_doubles_after_growth_steps_finite_updates():
    x, y = make_batch()
    trainer = mh.Trainer(_model(F16), _sgd_objectives(),
                         loss_scale=mh.DynamicLossScale(initial=4.0, growth_steps=3))
    seen = []
    for _ in range(7):
        assert trainer.step((x, y)).updated == ("a", "b")
        seen.append(trainer.loss_scales.values())
    # doubled after the 3rd and the 6th finite update: 4 4 8 8 8 16 16, each head
    assert [s["a"] for s in seen] == [s["b"] for s in seen] == [4.0, 4.0, 8.0, 8.0, 8.0, 16.0, 16.0]


def test_an_overflow_resets_the_growth_count():
    x, y = make_batch()
    trainer = mh.Trainer(_model(F16), _sgd_objectives(),
                         loss_scale=mh.DynamicLossScale(initial=4.0, growth_steps=2))
    trainer.step((x, y))                                       # a: count 1
    trainer.objectives["a"].weight = 1e12                      # a overflows once
    assert trainer.step((x, y)).skipped == ("a",)              # a: 4 -> 2, count 0
    trainer.objectives["a"].weight = 1.0
    trainer.step((x, y))                                       # a: count 1
    assert trainer.loss_scales.values()["a"] == 2.0
    trainer.step((x, y))                                       # a: count 2 -> doubles
    assert trainer.loss_scales.values() == {"a": 4.0, "b": 16.0}  # b: 4 -> 8 -> 16


def test_on_nonfinite_raise_stops_fit_at_a_nonfinite_loss_not_at_an_overflow():
    x, y = make_batch()
    trainer = mh.Trainer(_model(F16), _sgd_objectives(weight_b=1e8, on_nonfinite="raise"),
                         loss_scale=mh.DynamicLossScale(initial=2.0 ** 8))
    trainer.fit((x, y), steps=3, batch_size=16, verbose=False)  # b overflows: no error
    assert trainer.loss_scales.values()["b"] == 2.0 ** 5
    y_nan = dict(y, b=np.full_like(y["b"], np.nan))
    with pytest.raises(FloatingPointError, match=r"the loss of head 'b' became nan at step 3"):
        trainer.fit((x, y_nan), steps=3, batch_size=16, verbose=False)


def test_loss_scales_are_logged_per_head_after_each_logged_step(tmp_path):
    x, y = make_batch()
    trainer = mh.Trainer(_model(F16), _sgd_objectives(weight_b=1e8), log_dir=tmp_path,
                         log_every=1, histograms_every=0,
                         loss_scale=mh.DynamicLossScale(initial=2.0 ** 8))
    trainer.fit((x, y), steps=3, batch_size=16, verbose=False)
    trainer.close()
    report = load_report(tmp_path)
    # logged at the number of updates done (1, 2, 3): b halves at every step, a stays
    assert list(report.train["loss_scale/b"].steps) == [1, 2, 3]
    assert list(report.train["loss_scale/b"].values) == [2.0 ** 7, 2.0 ** 6, 2.0 ** 5]
    assert list(report.train["loss_scale/a"].values) == [2.0 ** 8] * 3


def test_loss_scales_are_a_checkpoint_part_restored_into_a_fresh_trainer(tmp_path):
    x, y = make_batch()
    options = mh.DynamicLossScale(initial=2.0 ** 8, growth_steps=2)
    first = mh.Trainer(_model(F16), _sgd_objectives(weight_b=1e8), loss_scale=options)
    for _ in range(3):
        first.step((x, y))
    assert "loss_scales" in mh.available_parts(first.model, first)
    mh.save_checkpoint(tmp_path / "ckpt", first.model, trainer=first)
    fresh = mh.Trainer(_model(F16, seed=1), _sgd_objectives(weight_b=1e8), loss_scale=options)
    mh.restore_checkpoint(tmp_path / "ckpt", fresh.model, trainer=fresh)
    assert fresh.loss_scales.values() == first.loss_scales.values() == {"a": 2.0 ** 9,
                                                                          "b": 2.0 ** 5}
    # the growth counts too: a had 1 finite update of 2 since it doubled, so one more
    # doubles it (a fresh count would not); b had none since it halved
    for trainer in (first, fresh):
        trainer.objectives["b"].weight = 1.0
        trainer.step((x, y))
    assert fresh.loss_scales.values() == first.loss_scales.values() == {"a": 2.0 ** 10,
                                                                          "b": 2.0 ** 5}


# -- every architecture computes in the policy's dtype -----------------------------------


ARCHITECTURES = {
    "mmoe": lambda d: mh.MMoE(heads=["a", "b"], experts=4, expert_units=[8], dtype=d),
    "omoe": lambda d: mh.OMoE(heads=["a", "b"], experts=4, expert_units=[8], dtype=d),
    "cgc": lambda d: mh.CGC(heads=["a", "b"], shared_experts=2, task_experts=1,
                            expert_units=[8], dtype=d),
    "ple": lambda d: mh.PLE(heads=["a", "b"], shared_experts=2, task_experts=1,
                            expert_units=[8], levels=2, dtype=d),
    "dselect_k": lambda d: mh.DSelectK(heads=["a", "b"], experts=4, k=2, expert_units=[8],
                                       entropy_reg=0.1, dtype=d),
    "cross_stitch": lambda d: mh.CrossStitch(heads=["a", "b"], units=[8, 8], dtype=d),
    "mtan": lambda d: mh.MTAN(heads=["a", "b"], channels=[4, 4], batch_norm=True, dtype=d),
}


# float16 for every architecture by default; bfloat16 (the same code path, another dtype) slow
@pytest.mark.parametrize("policy", [F16, pytest.param(BF16, marks=pytest.mark.slow)])
@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_every_architecture_computes_in_the_policy_with_float32_variables(name, policy):
    keras.utils.set_random_seed(0)
    dtype = keras.DTypePolicy(policy)
    image = name == "mtan"
    heads = {h: keras.Sequential([keras.layers.Flatten(dtype=dtype), keras.layers.Dense(1, dtype=dtype)])
             for h in "ab"}
    model = mh.MultiHeadModel(ARCHITECTURES[name](dtype), heads)
    shape = (None, 8, 8, 3) if image else (None, 5)
    model.build(shape)
    x = np.random.default_rng(0).random((8, *shape[1:])).astype("float32")
    y = {"a": np.ones((8, 1), "float32"), "b": np.zeros((8, 1), "float32")}
    trainer = mh.Trainer(model, {"a": mh.Objective("mse", metrics=["mae"]), "b": mh.Objective("mse")},
                         loss_scale=mh.DynamicLossScale(initial=2.0 ** 4) if policy == F16 else "auto")
    assert {v.dtype for v in model.weights} == {"float32"}
    assert {layer.dtype_policy.name for layer in internal_layers(model.trunk)} == {policy}
    compute = policy.removeprefix("mixed_")
    assert {h: out.dtype.name for h, out in model(x).items()} == {"a": compute, "b": compute}
    before = _values(model.trainable_variables)
    result = trainer.step((x, y))
    assert result.updated == ("a", "b") and all(np.isfinite(list(result.losses.values())))
    assert all(not np.array_equal(b, a) for b, a in zip(before, _values(model.trainable_variables))
               if b.size > 1)
    evaluated = trainer.evaluate((x, y))
    assert all(np.isfinite(v) for head in evaluated.values() for v in head.values())


def internal_layers(layer):
    from multihead import _keras_internals as internals

    return internals.all_layers(layer)


# -- under a MirroredStrategy (2 logical CPUs, in a subprocess) ----------------------------

MIRRORED = """
def run(strategy):
    scope = strategy.scope() if strategy else tf.name_scope("single")
    with scope:
        keras.utils.set_random_seed(0)
        pol = keras.DTypePolicy("mixed_float16")
        model = mh.MultiHeadModel(keras.layers.Dense(8, activation="tanh", dtype=pol),
                                  {"a": keras.layers.Dense(1, dtype=pol),
                                   "b": keras.layers.Dense(1, dtype=pol)})
        model.build((None, 5))
        objectives = {"a": mh.Objective("mse", keras.optimizers.SGD(0.1)),
                      "b": mh.Objective("mse", keras.optimizers.SGD(0.1), weight=1e8)}
    trainer = mh.Trainer(model, objectives, strategy=strategy,
                         loss_scale=mh.DynamicLossScale(initial=2.0 ** 8))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 5)).astype("float32")
    y = {h: rng.standard_normal((16, 1)).astype("float32") for h in "ab"}
    steps = [trainer.step((x, y)) for _ in range(3)]
    return {"skipped": [list(r.skipped) for r in steps], "scales": trainer.loss_scales.values(),
            "weights": [w.tolist() for w in model.get_weights()]}

done({"single": run(None), "mirrored": run(strategy)})
"""


@pytest.mark.slow
def test_float16_loss_scales_under_a_mirrored_strategy_match_one_device(tmp_path):
    runs = run_mirrored(MIRRORED, tmp_path, timeout=300)
    for run in runs.values():
        assert run["skipped"] == [["b"]] * 3
        assert run["scales"] == {"a": 2.0 ** 8, "b": 2.0 ** 5}
    for one, mirrored in zip(runs["single"]["weights"], runs["mirrored"]["weights"]):
        np.testing.assert_allclose(mirrored, one, rtol=1e-3, atol=1e-4)  # float16 half batches
