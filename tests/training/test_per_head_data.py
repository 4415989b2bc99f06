"""One dataset per head: `Trainer.fit(data={head: ...}, sampling=...)` and `data.per_head` in configs."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import make_model, weights

import multihead as mh
from multihead.cli.main import main
from multihead.experiments.run.experiment import run_experiment
from multihead.io.manager import CheckpointManager

HEADS = ("a", "b")
RNG = np.random.default_rng(7)
# Different sizes, so the heads' epochs end at different steps.
X = {"a": RNG.standard_normal((40, 5)).astype("float32"),
     "b": RNG.standard_normal((24, 5)).astype("float32")}
Y = {h: RNG.standard_normal((len(X[h]), 1)).astype("float32") for h in HEADS}
PER_HEAD = {h: (X[h], Y[h]) for h in HEADS}


def _trainer(seed=0, **kwargs):
    model = make_model(seed=seed)
    keras.utils.set_random_seed(0)  # the run's seed (shuffles depend on it), as the CLI sets it
    return mh.Trainer(model, {h: mh.Objective("mse", keras.optimizers.Adam(1e-2)) for h in HEADS},
                      **kwargs)


def test_all_equals_a_hand_written_loop_with_each_head_on_its_own_batch():
    batch = 8  # a: 5 batches an epoch, b: 3
    datasets = {h: tf.data.Dataset.from_tensor_slices((X[h], Y[h])).batch(batch) for h in HEADS}
    trainer = _trainer()
    trainer.fit(datasets, 13, verbose=False)

    model = make_model(seed=0)
    optimizers = {h: keras.optimizers.Adam(1e-2) for h in HEADS}
    var_lists = {h: model.trunk.trainable_variables + model.heads[h].trainable_variables
                 for h in HEADS}
    for step in range(13):
        with tf.GradientTape(persistent=True) as tape:
            losses = {}
            for h in HEADS:
                i = step % (len(X[h]) // batch)
                x, y = X[h][i * batch:(i + 1) * batch], Y[h][i * batch:(i + 1) * batch]
                out = model.heads[h](model.trunk(x, training=True), training=True)
                losses[h] = tf.reduce_mean(tf.square(out - y))
        grads = {h: tape.gradient(losses[h], var_lists[h]) for h in HEADS}  # all at one point
        for h in HEADS:
            optimizers[h].apply_gradients(zip(grads[h], var_lists[h]))
    for ours, theirs in zip(weights(trainer.model.variables), weights(model.variables)):
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6)


def _probabilities(kind, sizes, temperature=2.0):
    """Model Garden's samplers, written out: uniform, w / sum w, w^(1/T) / sum w^(1/T)."""
    w = np.array(sizes, dtype=np.float64)
    if kind == "uniform":
        return np.ones_like(w) / len(w)
    if kind == "temperature":
        w = w ** (1.0 / temperature)
    return w / w.sum()


@pytest.mark.parametrize("kind", ["uniform", "proportional", "temperature"])
def test_sampling_frequencies_match_their_definition_over_10000_draws(kind):
    from scipy.stats import chisquare

    sizes = [900, 90, 10]
    sampling = mh.TaskSampling(kind, temperature=2.0, seed=11)
    p = sampling.probabilities(["x", "y", "z"], dict(zip("xyz", sizes)))
    np.testing.assert_allclose(p, _probabilities(kind, sizes), rtol=1e-12)
    draws = np.bincount([sampling.head_at(s, p) for s in range(10_000)], minlength=3)
    assert chisquare(draws, 10_000 * p).pvalue > 1e-3, (draws, 10_000 * p)
    if kind != "uniform":  # and the control: the draws tell the kinds apart
        assert chisquare(draws, np.full(3, 10_000 / 3)).pvalue < 1e-6


def test_a_sampled_step_updates_only_the_drawn_head_and_its_draws_are_the_samplers():
    trainer = _trainer()
    seen = []
    record = mh.LambdaCallback(on_step_end=lambda step, result: seen.append(
        (result.step, result.updated, weights(trainer.model.heads["a"].variables),
         weights(trainer.model.heads["b"].variables), weights(trainer.model.trunk.variables))))
    before = [weights(trainer.model.heads[h].variables) for h in HEADS]
    trainer.fit(PER_HEAD, 30, batch_size=8, verbose=False, callbacks=[record], steps_per_execution=1,
                sampling=mh.TaskSampling("proportional", seed=3))
    p = mh.TaskSampling("proportional", seed=3).probabilities(list(HEADS), {"a": 40, "b": 24})
    drawn = [HEADS[mh.TaskSampling("proportional", seed=3).head_at(s, p)] for s in range(30)]
    assert [updated for _, updated, *_ in seen] == [(h,) for h in drawn]
    assert set(drawn) == set(HEADS)
    previous = {"a": before[0], "b": before[1]}
    trunk_before = None
    for _, (head,), a, b, trunk in seen:
        now = {"a": a, "b": b}
        other = "b" if head == "a" else "a"
        for old, new in zip(previous[other], now[other]):
            np.testing.assert_array_equal(old, new)  # the other head: bitwise unchanged
        assert any(not np.array_equal(o, n) for o, n in zip(previous[head], now[head]))
        if trunk_before is not None:
            assert any(not np.array_equal(o, n) for o, n in zip(trunk_before, trunk))
        previous, trunk_before = now, trunk


def test_each_head_is_evaluated_on_its_own_eval_set():
    trainer = _trainer()
    trainer.fit(PER_HEAD, 5, batch_size=8, verbose=False)
    evaluation = {h: (X[h][:10], Y[h][:10]) for h in HEADS}
    results = trainer.evaluate(evaluation)
    for h in HEADS:
        prediction = trainer.model(X[h][:10], training=False)[h].numpy()
        expected = np.mean((prediction.astype(np.float64) - Y[h][:10]) ** 2)
        assert results[h]["loss"] == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("sampling", ["all", "temperature"])
def test_resume_from_a_checkpoint_continues_every_stream_bitwise(tmp_path, sampling):
    uninterrupted = _trainer()
    uninterrupted.fit(PER_HEAD, 23, batch_size=8, verbose=False, sampling=sampling)
    first = _trainer()
    first.fit(PER_HEAD, 17, batch_size=8, verbose=False, sampling=sampling,
              checkpoints=CheckpointManager(tmp_path, first.model, first, every=10))
    resumed = _trainer(seed=4)
    manager = CheckpointManager(tmp_path, resumed.model, resumed, every=10)
    assert manager.restore_latest() == 10
    resumed.fit(PER_HEAD, 13, batch_size=8, verbose=False, sampling=sampling)
    for ours, theirs in zip(weights(uninterrupted.model.variables), weights(resumed.model.variables)):
        np.testing.assert_array_equal(ours, theirs)
    positions = [uninterrupted.data_position.heads[h].drawn.numpy() for h in HEADS]
    assert positions == [resumed.data_position.heads[h].drawn.numpy() for h in HEADS]


def test_two_fits_on_the_same_per_head_data_continue_the_streams():
    once, twice = _trainer(), _trainer()
    once.fit(PER_HEAD, 14, batch_size=8, verbose=False, sampling="uniform")
    twice.fit(PER_HEAD, 6, batch_size=8, verbose=False, sampling="uniform")
    twice.fit(PER_HEAD, 8, batch_size=8, verbose=False, sampling="uniform")
    for ours, theirs in zip(weights(once.model.variables), weights(twice.model.variables)):
        np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("data, kwargs, message", [
    ({"a": PER_HEAD["a"]}, {}, "head 'b' has no dataset"),
    ({**PER_HEAD, "c": PER_HEAD["a"]}, {}, "'c'"),
    ((X["a"], {"a": Y["a"], "b": Y["a"]}), {"sampling": "uniform"}, "give data as a dict"),
    (PER_HEAD, {"sampling": "sometimes"}, "sampling: must be one of"),
    (PER_HEAD, {"sampling": mh.TaskSampling("proportional", weights={"c": 1.0})}, "'c'"),
])
def test_bad_per_head_arguments_name_what_is_wrong(data, kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        _trainer().fit(data, 2, batch_size=8, verbose=False, **kwargs)


CONFIG = """\
seed: 0
data:
  sampling: {sampling}
  per_head:
    a: {{kind: mmoe, train_size: 64, eval_size: 16, input_dim: 6, seed: 1}}
    b: {{kind: mmoe, train_size: 32, eval_size: 16, input_dim: 6, seed: 2}}
model:
  trunk: {{mlp: {{units: [8], activation: relu}}}}
  heads:
    a: {{}}
    b: {{}}
train: {{steps: 12, batch_size: 8, eval_every: 6}}
log: {{every: 2, histograms_every: 0}}
"""


def test_a_per_head_config_trains_and_reports_each_heads_own_eval_loss(tmp_path):
    import json

    path = tmp_path / "exp.yaml"
    path.write_text(CONFIG.format(sampling="temperature"))
    assert run_experiment(str(path), run_dir=str(tmp_path / "run"), quiet=True).exit_code == 0
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    run = mh.load_run(str(tmp_path / "run"))
    data = mh.load_data({"per_head": {
        "a": {"kind": "mmoe", "train_size": 64, "eval_size": 16, "input_dim": 6, "seed": 1},
        "b": {"kind": "mmoe", "train_size": 32, "eval_size": 16, "input_dim": 6, "seed": 2}}},
        heads=list(HEADS))
    for h in HEADS:  # each head's eval loss: on its own eval set, computed independently
        prediction = run.model(data[h].x_eval, training=False)[h].numpy().astype(np.float64)
        expected = np.mean((prediction - data[h].y_eval[h]) ** 2)
        assert metrics["eval"][h]["loss"] == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("edit, key", [
    (lambda c: c.replace("    b: {kind: mmoe, train_size: 32, eval_size: 16, input_dim: 6, seed: 2}\n", ""),
     "data.per_head.b: missing"),
    (lambda c: c.replace("    b: {kind", "    c: {kind"), "data.per_head.c"),
    (lambda c: c.replace("  sampling: all", "  kind: npz\n  sampling: all"), "data.kind: not used"),
    (lambda c: c.replace("seed: 2}", "seed: 2, sampling: uniform}"), "data.per_head.b.sampling"),
    (lambda c: c.replace("seed: 2}", "seed: 2, train: b.npz}"), "data.per_head.b.train"),
    (lambda c: c.replace("  per_head:", "  temperature: 0\n  per_head:"), "data.temperature"),
    (lambda c: c.replace("  sampling: all\n  per_head:\n", "  sampling: uniform\n  unused:\n"),
     "data"),
])
def test_bad_per_head_configs_are_one_line_exit_2_and_write_nothing(tmp_path, capsys, edit, key):
    path = tmp_path / "exp.yaml"
    path.write_text(edit(CONFIG.format(sampling="all")))
    run_dir = tmp_path / "run"
    assert main(["train", str(path), "--run-dir", str(run_dir), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert key in err and len(err.splitlines()) == 1, err
    assert not run_dir.exists()


def test_the_single_task_baseline_of_a_per_head_config_keeps_that_heads_dataset(tmp_path):
    from multihead.experiments.config.schema import load_config
    from multihead.experiments.build.data_sources import build_data
    from multihead.experiments.run.single_task import only_head

    path = tmp_path / "exp.yaml"
    path.write_text(CONFIG.format(sampling="temperature"))
    config = load_config(str(path))
    baseline = only_head(config, "b")
    assert list(baseline.data.per_head) == ["b"] and baseline.data.sampling == "all"
    ours, theirs = build_data(baseline)["b"], build_data(config)["b"]
    np.testing.assert_array_equal(ours.x_train, theirs.x_train)
    np.testing.assert_array_equal(ours.y_eval["b"], theirs.y_eval["b"])
