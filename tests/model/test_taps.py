"""Trunk taps: a head reading an intermediate trunk block trains exactly the blocks below it."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import multihead as mh
from conftest import make_batch, make_tapped, weights

HEADS = ("main", "aux")  # `aux` reads a trunk tap (see conftest.make_tapped)
BLOCKS = ("conv1", "drop", "conv2", "conv3")


def block(model, name):
    return next(layer for layer in model.trunk.layers if layer.name == name)


def ids(variables):
    return [id(v) for v in variables]


@pytest.mark.parametrize("tap, below", [("conv1", ["conv1"]), ("trunk/drop", ["conv1"]),
                                        (2, ["conv1", "conv2"]), ("3", BLOCKS)])
def test_tap_var_list_holds_exactly_the_variables_below_the_tap(tap, below):
    model = make_tapped(tap)
    expected = [v for name in below for v in block(model, name).trainable_variables]
    # by identity, in the trunk's order, then the head's own
    assert ids(model.var_list("aux")) == ids(expected + model.heads["aux"].trainable_variables)
    address = str(tap) if str(tap).startswith("trunk/") else f"trunk/{tap}"  # trunk/2 as well
    assert ids(model.tap_variables(address)) == ids(expected)
    # the main head and the partition's trunk keep the whole shared trunk
    assert ids(model.var_list("main")) == ids(model.trunk.trainable_variables
                                              + model.heads["main"].trainable_variables)
    assert ids(model.trunk_variables) == ids(model.trunk.trainable_variables)
    assert model.var_list("aux", trains_trunk=False) == model.heads["aux"].trainable_variables


def test_tap_variables_follow_identity_not_names():
    # two models built in one process: Keras names their variables differently, the taps
    # still select each model's own block objects
    first, second = make_tapped("conv2"), make_tapped("conv2")
    for model in (first, second):
        expected = block(model, "conv1").trainable_variables + block(model, "conv2").trainable_variables
        assert ids(model.tap_variables("trunk/conv2")) == ids(expected)
    assert not set(ids(first.tap_variables("trunk/conv2"))) & set(ids(second.tap_variables("conv2")))


def test_head_reads_its_block_output():
    model = make_tapped("conv2")
    x = make_batch(HEADS, seed=1)[0]
    h = x
    for name in ("conv1", "drop", "conv2"):
        h = block(model, name)(h)
    expected_aux = model.heads["aux"](h).numpy()
    expected_main = model.heads["main"](model.trunk(x)).numpy()
    out = model(x)
    np.testing.assert_array_equal(out["aux"].numpy(), expected_aux)
    np.testing.assert_array_equal(out["main"].numpy(), expected_main)
    predicted = model.predict(x, batch_size=7)
    np.testing.assert_allclose(predicted["aux"], expected_aux, rtol=0, atol=1e-6)
    feats = model.features(x, taps=["trunk/conv1"])
    np.testing.assert_array_equal(model.tap_output(feats, "trunk/conv1").numpy(),
                                  block(model, "conv1")(x).numpy())
    np.testing.assert_array_equal(model.tap_output(feats, "trunk").numpy(), model.trunk(x).numpy())


def _hand_step(model, head, opt, batch):
    """A researcher's step: one tape, `apply_gradients` on exactly `head`'s var_list."""
    x, y = batch
    var_list = model.var_list(head)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(y[head] - model(x, training=True)[head]))
    opt.apply_gradients(zip(tape.gradient(loss, var_list), var_list))


@pytest.mark.parametrize("make_opt", [lambda: keras.optimizers.Adam(1e-2),
                                      lambda: keras.optimizers.SGD(5e-2, momentum=0.9)])
def test_head_on_early_tap_leaves_later_blocks_bitwise_unchanged(make_opt):
    ours, ref = make_tapped("conv1"), make_tapped("conv1")
    opts = {h: make_opt() for h in HEADS}
    trainer = mh.Trainer(ours, {h: mh.Objective("mse", opts[h]) for h in HEADS})
    ref_opt = make_opt()
    ref_opt.build(ref.var_list("aux"))
    later = [v for name in ("conv2", "conv3") for v in block(ours, name).trainable_variables]
    before = weights(later)
    main_before = weights(ours.heads["main"].trainable_variables)
    for seed in range(3):
        batch = make_batch(HEADS, seed=seed)
        trainer.step(batch, heads=["aux"])
        _hand_step(ref, "aux", ref_opt, batch)
    for a, b in zip(weights(later), before):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(weights(ours.heads["main"].trainable_variables), main_before):
        np.testing.assert_array_equal(a, b)
    moved = weights(block(ours, "conv1").trainable_variables)
    assert all(not np.array_equal(a, b) for a, b in
               zip(moved, weights(block(make_tapped("conv1"), "conv1").trainable_variables)))
    for a, b in zip(ours.trainable_variables, ref.trainable_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0, atol=1e-6)


def test_main_head_still_trains_every_block():
    ours, ref = make_tapped("conv1"), make_tapped("conv1")
    trainer = mh.Trainer(ours, {h: mh.Objective("mse", keras.optimizers.Adam(1e-2)) for h in HEADS})
    ref_opt = keras.optimizers.Adam(1e-2)
    ref_opt.build(ref.var_list("main"))
    start = weights(ours.trunk_variables)
    for seed in range(3):
        batch = make_batch(HEADS, seed=seed)
        trainer.step(batch, heads=["main"])
        _hand_step(ref, "main", ref_opt, batch)
    assert all(not np.array_equal(a, b) for a, b in zip(weights(ours.trunk_variables), start))
    for a, b in zip(ours.trainable_variables, ref.trainable_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0, atol=1e-6)


def test_save_and_load_round_trip_keeps_the_taps(tmp_path):
    model = make_tapped("conv2")
    x = make_batch(HEADS, seed=2)[0]
    path = str(tmp_path / "tapped.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert loaded.taps == {"aux": "conv2"}
    expected = model.predict(x)
    for head, value in loaded.predict(x).items():
        np.testing.assert_array_equal(value, expected[head])
    assert ids(loaded.var_list("aux")) == ids(
        block(loaded, "conv1").trainable_variables + block(loaded, "conv2").trainable_variables
        + loaded.heads["aux"].trainable_variables)


@pytest.mark.parametrize("trunk, taps, message", [
    ("blocks", {"aux": "conv_1"}, "taps['aux']: the trunk has no block 'conv_1' (did you mean "
                                 "'conv1'?); its blocks are ['conv1', 'conv2'] (or their indices 0..1)"),
    ("blocks", {"aux": 5}, "taps['aux']: the trunk has no block 5"),
    ("blocks", {"other": "conv1"}, "taps['other']: the model has no head 'other'"),
    ("dense", {"aux": "conv1"}, "taps['aux']: trunk taps need a trunk built from named blocks "
                                "(a keras.Sequential), but the trunk is a Dense"),
])
def test_bad_taps_get_one_line_naming_the_tap(trunk, taps, message):
    layer = (keras.Sequential([keras.layers.Dense(4, name="conv1"), keras.layers.Dense(4, name="conv2")])
             if trunk == "blocks" else keras.layers.Dense(4))
    with pytest.raises(ValueError) as err:
        mh.MultiHeadModel(layer, {h: keras.layers.Dense(1) for h in HEADS}, taps=taps)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_unknown_tap_of_an_objective_lists_the_blocks():
    model = make_tapped()
    with pytest.raises(ValueError, match=r"tap 'trunk/conv7': the trunk has no block 'trunk/conv7'"
                                         r" \(did you mean 'conv3'\?\); its blocks are "
                                         r"\['conv1', 'drop', 'conv2', 'conv3'\]"):
        model.tap_variables("trunk/conv7")
    with pytest.raises(ValueError, match="compute them with model.features"):
        model.tap_output(model.features(make_batch(HEADS)[0]), "trunk/conv2")


def test_blocks_trained_lists_the_blocks_of_a_var_list():
    model = make_tapped("conv2")
    assert model.blocks_trained(model.var_list("aux")) == ["conv1", "conv2"]
    assert model.blocks_trained(model.var_list("main")) == ["conv1", "conv2", "conv3"]
    assert model.blocks_trained(model.var_list("aux", trains_trunk=False)) == []


def test_aggregated_trunk_with_a_tap_equals_hand_written_sum():
    # trunk: one SGD on the sum of the heads' trunk gradients, aux's being zero on the
    # blocks above its tap; each head: its own SGD on its own variables
    ours, ref = make_tapped("conv2"), make_tapped("conv2")
    trainer = mh.Trainer(ours, {h: mh.Objective("mse", keras.optimizers.SGD(0.1)) for h in HEADS},
                         trunk=mh.TrunkPolicy(optimizer=keras.optimizers.SGD(0.05), aggregator="sum"))
    trunk_opt = keras.optimizers.SGD(0.05)
    head_opts = {h: keras.optimizers.SGD(0.1) for h in HEADS}
    conv3 = weights(block(ours, "conv3").trainable_variables)
    for seed in range(2):
        x, y = batch = make_batch(HEADS, seed=seed)
        trainer.step(batch)
        with tf.GradientTape(persistent=True) as tape:
            out = ref(x, training=True)
            losses = {h: tf.reduce_mean(tf.square(y[h] - out[h])) for h in HEADS}
        trunk = ref.trunk_variables
        total = [tf.zeros_like(v) for v in trunk]
        for h in HEADS:
            grads = tape.gradient(losses[h], trunk)
            total = [t if g is None else t + g for t, g in zip(total, grads)]
            own = ref.heads[h].trainable_variables
            head_opts[h].apply_gradients(zip(tape.gradient(losses[h], own), own))
        trunk_opt.apply_gradients(zip(total, trunk))
        del tape
    for a, b in zip(ours.trainable_variables, ref.trainable_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0, atol=1e-6)
    # conv3 moved by main's gradient alone
    assert all(not np.array_equal(a, b) for a, b in
               zip(weights(block(ours, "conv3").trainable_variables), conv3))


def test_rep_grad_is_refused_with_taps():
    with pytest.raises(mh.SettingError, match=r"trunk.rep_grad: trunk.rep_grad=True combines the "
                                              r"heads' gradients at one shared trunk output, but "
                                              r"heads \['aux'\] read trunk taps"):
        mh.Trainer(make_tapped(), {h: mh.Objective("mse") for h in HEADS},
                   trunk=mh.TrunkPolicy(aggregator="mgda", rep_grad=True))


def test_target_network_and_export_read_the_tapped_block(tmp_path):
    model = make_tapped("conv2")
    x = make_batch(HEADS, seed=4)[0]
    expected = {h: v.numpy() for h, v in model(x).items()}
    target = mh.TargetNetwork(model, tau=1.0)
    for head, value in target(x).items():
        np.testing.assert_array_equal(value.numpy(), expected[head])
    mh.export_saved_model(model, str(tmp_path / "export"))
    served = tf.saved_model.load(str(tmp_path / "export"))(tf.constant(x))
    for head, value in served.items():
        np.testing.assert_allclose(value.numpy(), expected[head], rtol=0, atol=1e-6)


def test_blocks_table_names_the_blocks_each_head_trains():
    model = make_tapped("conv2")
    assert model.blocks_table() == ("head  trunk blocks trained\n"
                                    "main  conv1, conv2, conv3\n"
                                    "aux   conv1, conv2")
    assert model.blocks_table({"aux": False}) is None  # main trains every block, aux none
    untapped = mh.MultiHeadModel(keras.Sequential([keras.layers.Dense(3)]),
                                 {h: keras.layers.Dense(1) for h in HEADS})
    untapped.build((None, 2))
    assert untapped.blocks_table() is None  # every head trains the whole trunk


def test_an_objective_reading_a_trunk_tap_trains_the_blocks_below_it():
    # a standalone deep-supervision objective on block conv2 (no head reads conv2): its
    # optimizer is built on conv1 + conv2 and its step equals a hand-written tape
    ours, ref = make_tapped("conv1"), make_tapped("conv1")
    probe = lambda o: tf.reduce_mean(o["trunk/conv2"], axis=-1, keepdims=True)  # noqa: E731
    objectives = {h: mh.Objective("mse", keras.optimizers.SGD(0.1)) for h in HEADS}
    objectives["deep"] = mh.Objective("mse", keras.optimizers.SGD(0.1), reads=["trunk/conv2"],
                                      combine=probe)
    trainer = mh.Trainer(ours, objectives)
    below = block(ours, "conv1").trainable_variables + block(ours, "conv2").trainable_variables
    x, y = make_batch(HEADS, seed=5)
    y = {**y, "deep": y["main"]}
    conv3 = weights(block(ours, "conv3").trainable_variables)
    trainer.step((x, y), heads=["deep"])
    assert ids(internals_built(objectives["deep"].optimizer)) == ids(below)
    var_list = block(ref, "conv1").trainable_variables + block(ref, "conv2").trainable_variables
    with tf.GradientTape() as tape:
        h = x
        for layer in ref.trunk.layers[:3]:
            h = layer(h, training=True)
        loss = tf.reduce_mean(tf.square(y["deep"] - tf.reduce_mean(h, axis=-1, keepdims=True)))
    keras.optimizers.SGD(0.1).apply_gradients(zip(tape.gradient(loss, var_list), var_list))
    for a, b in zip(ours.trainable_variables, ref.trainable_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0, atol=1e-6)
    for a, b in zip(weights(block(ours, "conv3").trainable_variables), conv3):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match=r"objective 'deep': reads 'trunk/conv9': the trunk has "
                                         r"no block 'trunk/conv9'"):
        mh.Trainer(make_tapped(), {**{h: mh.Objective("mse") for h in HEADS}, "deep": mh.Objective(
            "mse", reads=["trunk/conv9"], combine=probe)})


def internals_built(optimizer):
    from multihead import _keras_internals as internals

    return internals.built_variables(optimizer)


def test_evaluate_reports_an_objective_reading_a_trunk_tap():
    model = make_tapped("conv1")
    probe = lambda o: tf.reduce_mean(o["trunk/conv2"], axis=-1, keepdims=True)  # noqa: E731
    trainer = mh.Trainer(model, {**{h: mh.Objective("mse") for h in HEADS},
                                 "deep": mh.Objective("mse", reads=["trunk/conv2"], combine=probe)})
    x, y = make_batch(HEADS, seed=6)
    h = x
    for layer in model.trunk.layers[:3]:
        h = layer(h)
    expected = np.mean(np.square(y["main"] - np.mean(h.numpy(), axis=-1, keepdims=True)))
    results = trainer.evaluate((x, {**y, "deep": y["main"]}))
    np.testing.assert_allclose(results["deep"]["loss"], expected, rtol=1e-5)
