"""TF1 import (seed 003): a `variable_scope` graph saved by `tf.compat.v1.train.Saver`,
restored into a separately built `MultiHeadModel` through a name mapping."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import multihead as mh

X = np.random.default_rng(0).standard_normal((6, 4)).astype("float32")


def _write_tf1_checkpoint(directory):
    """The seed's network, written the TF1 way: `Agent/layer1` shared, `layer2_1`/`layer2_2`
    heads, one Adam per loss (so the file also holds slots and beta powers).

    Returns the checkpoint prefix and the graph's own head outputs on `X`.
    """
    graph = tf.Graph()
    with graph.as_default():
        v1 = tf.compat.v1
        x = v1.placeholder(tf.float32, [None, 4], name="x")
        y = v1.placeholder(tf.float32, [None, 1], name="y")
        init = v1.random_normal_initializer(stddev=0.5, seed=1)
        with v1.variable_scope("Agent"):
            with v1.variable_scope("layer1"):
                w1 = v1.get_variable("w1", [4, 16], initializer=init)
                b1 = v1.get_variable("b1", [16], initializer=init)
                hidden = tf.nn.relu(tf.matmul(x, w1) + b1)
            outputs = {}
            for head in ("layer2_1", "layer2_2"):
                with v1.variable_scope(head):
                    w = v1.get_variable("w", [16, 1], initializer=init)
                    b = v1.get_variable("b", [1], initializer=init)
                    outputs[head] = tf.matmul(hidden, w) + b
        trains = [v1.train.AdamOptimizer(1e-2).minimize(tf.reduce_mean(tf.square(out - y)))
                  for out in outputs.values()]
        saver = v1.train.Saver()
        with v1.Session(graph=graph) as sess:
            sess.run(v1.global_variables_initializer())
            feed = {x: X, y: np.ones((6, 1), "float32")}
            for _ in range(3):  # a few TF1-style simultaneous updates: sess.run([train1, train2])
                sess.run(trains, feed)
            expected = sess.run(outputs, {x: X})
            prefix = saver.save(sess, str(directory / "tf1" / "model.ckpt"))
    return prefix, expected


def _model(hidden=16, seed=3):
    keras.utils.set_random_seed(seed)
    model = mh.MultiHeadModel(trunk=keras.layers.Dense(hidden, activation="relu"),
                              heads={"v1": keras.layers.Dense(1), "v2": keras.layers.Dense(1)})
    model.build((None, 4))
    return model


MAPPING = {
    r"Agent/layer1/w1": "trunk/kernel",
    r"Agent/layer1/b1": "trunk/bias",
    r"Agent/layer2_(\d)/(w|b)": r"heads/v\1",  # by shape within the head
}


def test_tf1_checkpoint_restores_the_graphs_outputs(tmp_path):
    prefix, expected = _write_tf1_checkpoint(tmp_path)
    model = _model()
    report = mh.import_tf1_checkpoint(prefix, model, MAPPING)
    assert report.applied and report.ok and not report.not_loaded
    assert report.assigned == {
        "Agent/layer1/b1": "trunk/bias", "Agent/layer1/w1": "trunk/kernel",
        "Agent/layer2_1/b": "heads/v1/bias", "Agent/layer2_1/w": "heads/v1/kernel",
        "Agent/layer2_2/b": "heads/v2/bias", "Agent/layer2_2/w": "heads/v2/kernel",
    }
    assert "Agent/layer1/w1/Adam" in report.unmatched and "beta1_power" in report.unmatched
    reader = tf.train.load_checkpoint(prefix)
    addresses = mh.variable_addresses(model)
    for name, address in report.assigned.items():
        np.testing.assert_array_equal(addresses[address].numpy(), reader.get_tensor(name))
    out = model(X)
    np.testing.assert_allclose(out["v1"].numpy(), expected["layer2_1"], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out["v2"].numpy(), expected["layer2_2"], rtol=1e-6, atol=1e-6)


def test_dry_run_reports_unmatched_names_and_shape_mismatches_and_assigns_nothing(tmp_path):
    prefix, _ = _write_tf1_checkpoint(tmp_path)
    model = _model(hidden=8)  # the TF1 trunk has 16 units
    before = [v.numpy() for v in model.weights]
    report = mh.import_tf1_checkpoint(prefix, model, MAPPING, dry_run=True)
    assert not report.applied and not report.ok
    assert ("Agent/layer1/w1", "trunk/kernel", "(4, 16) float32", "(4, 8) float32") in report.mismatches
    assert [name for name, _, _ in report.unknown] == ["Agent/layer2_1/w", "Agent/layer2_2/w"]
    assert "no variable of heads/v1 has shape (16, 1)" in report.unknown[0][2]
    weights_ = {f"Agent/layer1/{n}" for n in ("w1", "b1")} | {
        f"Agent/layer2_{i}/{n}" for i in (1, 2) for n in ("w", "b")}
    slots = [n for n, _ in tf.train.list_variables(prefix) if n not in weights_]
    # Each Adam has m and v for its 4 variables (layer1 + its head) and 2 beta powers.
    assert len(slots) == 2 * (4 * 2 + 2)
    assert sorted(report.unmatched) == sorted(slots)
    assert "trunk/kernel" in report.not_loaded and "problems (4):" in str(report)
    with pytest.raises(ValueError, match=r"Agent/layer1/w1 -> trunk/kernel: checkpoint \(4, 16\)"):
        mh.import_tf1_checkpoint(prefix, model, MAPPING)
    for b, v in zip(before, model.weights):
        np.testing.assert_array_equal(b, v.numpy())


def test_ambiguous_part_targets_unknown_addresses_and_strict_mode(tmp_path):
    prefix, _ = _write_tf1_checkpoint(tmp_path)
    model = _model()
    report = mh.import_tf1_checkpoint(prefix, model, {r"Agent/layer2_1/(w|b)": "heads/v1",
                                                      r"Agent/layer1/w1": "trunk/0/kernel",
                                                      r"Agent/layer2_2/w": "heads/v1/kernel"},
                                      dry_run=True)
    assert report.unknown == [("Agent/layer1/w1", "trunk/0/kernel",
                               "the model has no variable at this address "
                               "(see multihead.variable_addresses(model))")]
    assert report.conflicts == {"heads/v1/kernel": ["Agent/layer2_1/w", "Agent/layer2_2/w"]}
    with pytest.raises(ValueError, match="strict=True"):
        mh.import_tf1_checkpoint(prefix, model, MAPPING, strict=True)

    keras.utils.set_random_seed(0)
    deep = mh.MultiHeadModel(trunk=keras.Sequential([keras.layers.Dense(16), keras.layers.Dense(16)]),
                             heads={"v1": keras.layers.Dense(1)})
    deep.build((None, 16))
    assert list(mh.variable_addresses(deep))[:4] == ["trunk/0/kernel", "trunk/0/bias",
                                                     "trunk/1/kernel", "trunk/1/bias"]
    report = mh.import_tf1_checkpoint(prefix, deep, {r"Agent/layer1/b1": "trunk"}, dry_run=True)
    assert "2 variables of trunk have shape (16,) (trunk/0/bias, trunk/1/bias)" in report.unknown[0][2]
