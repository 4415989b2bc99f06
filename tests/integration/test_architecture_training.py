"""Everything built on the partition, with a trunk that owns per-head gates (MMoE):
per-head optimizers and slots, trains_trunk=False, partial checkpoints, trunk
aggregation, target networks of a part, and the gate monitoring."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import multihead as mh
from conftest import make_batch
from multihead.monitoring import tags
from multihead.monitoring.report import format_report, load_report, plot_report, read_scalars

HEADS = ("a", "b")


def _mmoe(seed=0, experts=4):
    keras.utils.set_random_seed(seed)
    model = mh.MultiHeadModel(mh.MMoE(list(HEADS), experts=experts, expert_units=[6]),
                              {h: keras.layers.Dense(1) for h in HEADS})
    model.build((None, 5))
    return model


def _values(variables):
    return [np.array(v.numpy()) for v in variables]


def _gate(model, head):
    return model.trunk.gates[HEADS.index(head)]


def _objectives(**kwargs):
    return {h: mh.Objective(loss="mse", optimizer=keras.optimizers.Adam(1e-2), **kwargs.get(h, {}))
            for h in HEADS}


def test_a_step_of_one_head_leaves_the_other_heads_gate_and_slots_bitwise_unchanged():
    model = _mmoe()
    trainer = mh.Trainer(model, _objectives())
    x, y = make_batch(HEADS)
    trainer.step((x, y))  # both heads have slots that are not zero
    b_gate, b_slots = _values(_gate(model, "b").weights), _values(trainer.optimizers["b"].variables)
    experts = _values(model.trunk.experts.weights)
    a_gate = _values(_gate(model, "a").weights)
    trainer.step((x, y), heads=["a"])
    for before, v in zip(b_gate, _gate(model, "b").weights):
        np.testing.assert_array_equal(v.numpy(), before)
    for before, v in zip(b_slots, trainer.optimizers["b"].variables):
        np.testing.assert_array_equal(v.numpy(), before)
    assert all(not np.array_equal(v.numpy(), e) for v, e in zip(model.trunk.experts.weights, experts))
    assert not np.array_equal(_gate(model, "a").weights[0].numpy(), a_gate[0])
    # b's optimizer is built on shared experts + b's tower + b's gate, nothing of a's
    assert [id(v) for v in model.var_list("b")] == [id(v) for v in model.trunk.experts.weights] + [
        id(v) for v in model.heads["b"].weights] + [id(v) for v in _gate(model, "b").weights]


def test_trains_trunk_false_moves_the_heads_gate_and_tower_but_no_expert():
    model = _mmoe()
    experts = _values(model.trunk.experts.weights)
    gate, tower = _values(_gate(model, "a").weights), _values(model.heads["a"].weights)
    x, y = make_batch(HEADS)
    trainer = mh.Trainer(model, _objectives(a={"trains_trunk": False}))
    trainer.step((x, y), heads=["a"])
    for before, v in zip(experts, model.trunk.experts.weights):
        np.testing.assert_array_equal(v.numpy(), before)
    assert all(not np.array_equal(v.numpy(), w) for v, w in zip(_gate(model, "a").weights, gate))
    assert all(not np.array_equal(v.numpy(), w) for v, w in zip(model.heads["a"].weights, tower))
    assert {id(v) for v in model.var_list("a", trains_trunk=False)} == {
        id(v) for v in model.heads["a"].weights + _gate(model, "a").weights}


def test_trains_trunk_false_gate_gradient_equals_a_tape_on_the_gate():
    """The gate's update is the optimizer step of d loss / d gate with experts held fixed."""
    model, reference = _mmoe(seed=3), _mmoe(seed=3)
    x, y = make_batch(HEADS)
    trainer = mh.Trainer(model, {h: mh.Objective(loss="mse", optimizer=keras.optimizers.SGD(0.1),
                                                 trains_trunk=False) for h in HEADS})
    trainer.step((x, y), heads=["a"])
    variables = reference.heads["a"].trainable_variables + _gate(reference, "a").trainable_variables
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(y["a"] - reference(x)["a"]))
    for v, g in zip(variables, tape.gradient(loss, variables)):
        v.assign_sub(0.1 * g)
    for got, want in zip(model.var_list("a", trains_trunk=False), variables):
        np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-6)


def test_head_checkpoint_restores_its_gate_into_a_fresh_model(tmp_path):
    model = _mmoe(seed=1)
    trainer = mh.Trainer(model, _objectives())
    trainer.step(make_batch(HEADS))
    path = mh.save_checkpoint(str(tmp_path / "ckpt"), model, parts=["heads/a"])
    fresh = _mmoe(seed=2)
    b_gate = _values(_gate(fresh, "b").weights)
    experts = _values(fresh.trunk.experts.weights)
    mh.restore_checkpoint(path, fresh, parts=["heads/a"])
    for got, want in zip(_gate(fresh, "a").weights + fresh.heads["a"].weights,
                         _gate(model, "a").weights + model.heads["a"].weights):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    for got, want in zip(_gate(fresh, "b").weights + fresh.trunk.experts.weights, b_gate + experts):
        np.testing.assert_array_equal(got.numpy(), want)  # not part of heads/a


def test_trunk_aggregation_is_over_the_shared_variables_and_gates_train_per_head():
    model = _mmoe()
    trainer = mh.Trainer(model, _objectives(), trunk=mh.TrunkPolicy(optimizer="sgd", aggregator="mean"))
    gates = {h: _values(_gate(model, h).weights) for h in HEADS}
    trainer.step(make_batch(HEADS))
    assert [id(v) for v in trainer.trunk_update.var_list] == [id(v) for v in model.trunk_variables]
    assert [id(v) for v in model.trunk_variables] == [id(v) for v in model.trunk.experts.weights]
    for h in HEADS:
        assert not np.array_equal(_gate(model, h).weights[0].numpy(), gates[h][0])


def test_rep_grad_needs_one_shared_trunk_output():
    with pytest.raises(ValueError, match="rep_grad=True combines .* MMoE gives each head its own"):
        mh.Trainer(_mmoe(), _objectives(), trunk=mh.TrunkPolicy(aggregator="mgda", rep_grad=True))


def test_target_network_of_one_head_follows_its_gate():
    model = _mmoe()
    target = mh.TargetNetwork(model, heads=["a"], every=1)
    x, y = make_batch(HEADS)
    np.testing.assert_array_equal(target(x)["a"].numpy(), model(x)["a"].numpy())
    mh.Trainer(model, _objectives()).step((x, y))
    target.update()
    np.testing.assert_array_equal(target(x)["a"].numpy(), model(x)["a"].numpy())


def test_logged_gate_utilisation_is_the_mean_gate_output_on_the_batch(tmp_path):
    model = _mmoe()
    trainer = mh.Trainer(model, _objectives(), log_dir=str(tmp_path), log_every=1, histograms_every=2)
    batches = [make_batch(HEADS, seed=s) for s in range(3)]
    expected = []
    x0, y0 = batches[0]
    with tf.GradientTape() as tape:  # head a's gradient: its head part includes its gate
        loss = tf.reduce_mean(tf.square(y0["a"] - model(x0)["a"]))
    own = model.heads["a"].trainable_variables + _gate(model, "a").trainable_variables
    head_norm = np.sqrt(sum(np.sum(g.numpy() ** 2) for g in tape.gradient(loss, own)))
    for x, y in batches:  # the gates at the parameters each step starts from
        expected.append({h: _gate(model, h)(x).numpy().astype(np.float64) for h in HEADS})
        trainer.step((x, y))
    trainer.close()
    scalars = read_scalars(str(tmp_path / "train"))
    np.testing.assert_allclose(scalars[tags.head_grad_norm("a")].values[0], head_norm, rtol=1e-5)
    for step, gates in enumerate(expected, start=1):  # logged at the number of updates done
        for h, g in gates.items():
            for i in range(g.shape[1]):
                logged = scalars[tags.gate_expert(h, i)]
                np.testing.assert_allclose(logged.values[list(logged.steps).index(step)],
                                           g[:, i].mean(), atol=1e-6)
            entropy = scalars[tags.gate_entropy(h)]
            np.testing.assert_allclose(entropy.values[list(entropy.steps).index(step)],
                                       np.mean(-np.sum(g * np.log(g), axis=1)), atol=1e-5)
    # `multihead report`: the heads x experts matrix, at the last logged step
    report = load_report(str(tmp_path))
    for h in HEADS:
        np.testing.assert_allclose(report.utilisation[h], expected[-1][h].mean(axis=0), atol=1e-6)
    text = format_report(report)
    assert "gate utilisation" in text
    row = next(line for line in text.splitlines() if line.startswith("b ") and "e0" not in line
               and len(line.split()) == 1 + 4 + 1)
    assert row.split()[1:5] == [f"{v:.3f}" for v in expected[-1]["b"].mean(axis=0)]


def test_report_png_has_the_utilisation_heatmap(tmp_path):
    pytest.importorskip("matplotlib")
    model = _mmoe()
    trainer = mh.Trainer(model, _objectives(), log_dir=str(tmp_path), log_every=1, histograms_every=0)
    trainer.step(make_batch(HEADS))
    trainer.close()
    report = load_report(str(tmp_path))
    plot_report(report, tmp_path / "r.png")
    import dataclasses
    import matplotlib.image

    plot_report(dataclasses.replace(report, utilisation={}, gate_entropy={}), tmp_path / "plain.png")
    image = matplotlib.image.imread(str(tmp_path / "r.png"))
    assert image.shape[:2] == (450, 1500)  # the figure keeps its size with a fourth panel
    assert not np.array_equal(image, matplotlib.image.imread(str(tmp_path / "plain.png")))


def test_saved_model_export_routes_each_head_its_features(tmp_path):
    model = _mmoe()
    x, _ = make_batch(HEADS)
    mh.export_saved_model(model, str(tmp_path / "export"))
    loaded = tf.saved_model.load(str(tmp_path / "export"))
    out = loaded(tf.constant(x))
    for h in HEADS:
        np.testing.assert_allclose(out[h].numpy(), model(x)[h].numpy(), atol=1e-6)
