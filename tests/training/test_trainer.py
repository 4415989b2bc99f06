"""Trainer: construction errors, fit / evaluate on real data, TensorBoard loss scalars."""

import glob
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import multihead as mh
from conftest import make_batch, make_model, weights


def _objectives(**overrides):
    objectives = {"a": mh.Objective("mse"), "b": mh.Objective("mse")}
    objectives.update(overrides)
    return objectives


def test_objective_for_missing_head_and_head_without_objective():
    with pytest.raises(ValueError, match="objective 'c' is not named for a head"):
        mh.Trainer(make_model(), _objectives(c=mh.Objective("mse")))
    with pytest.raises(ValueError, match="head 'b' has no objective"):
        mh.Trainer(make_model(), {"a": mh.Objective("mse")})


def test_one_optimizer_object_for_two_heads_is_refused():
    opt = keras.optimizers.Adam()
    with pytest.raises(ValueError, match="same optimizer object"):
        mh.Trainer(make_model(), {"a": mh.Objective("mse", opt), "b": mh.Objective("mse", opt)})


def test_optimizer_built_on_other_variables_is_refused():
    model = make_model()
    opt = keras.optimizers.Adam()
    opt.build(model.var_list("b"))
    with pytest.raises(ValueError, match="already built on other variables"):
        mh.Trainer(model, _objectives(a=mh.Objective("mse", opt)))


def test_each_optimizer_is_built_on_exactly_its_var_list():
    model = make_model()
    trainer = mh.Trainer(model, _objectives(b=mh.Objective("mse", trains_trunk=False)))
    for head, trains_trunk in [("a", True), ("b", False)]:
        built_on = trainer.optimizers[head]._trainable_variables
        assert [id(v) for v in built_on] == [id(v) for v in model.var_list(head, trains_trunk)]


def test_data_head_mismatch_errors():
    trainer = mh.Trainer(make_model(), _objectives())
    x, y = make_batch()
    with pytest.raises(ValueError, match="no targets for head 'b'"):
        trainer.step((x, {"a": y["a"]}))
    with pytest.raises(ValueError, match="targets for 'c', but the model has no head 'c'"):
        trainer.step((x, {**y, "c": y["a"]}))
    with pytest.raises(TypeError, match=r"pair \(inputs, targets\)"):
        trainer.step(x)


def test_fit_learns_on_arrays_and_tf_data_alike():
    data = mh.mmoe_synthetic(tasks=["a", "b"], train_size=2000, eval_size=500, input_dim=5, seed=1)
    results = {}
    for kind in ["arrays", "tf.data"]:
        model = make_model(seed=2)
        trainer = mh.Trainer(model, {h: mh.Objective("mse", keras.optimizers.Adam(1e-2)) for h in "ab"})
        before = trainer.evaluate(data.eval)
        train = data.train if kind == "arrays" else mh.as_dataset(data.train, 64, seed=0)
        history = trainer.fit(train, steps=300, batch_size=64, eval_data=data.eval,
                              eval_every=100, verbose=False)
        assert [s for s, _ in history.eval] == [100, 200, 300]
        assert len(history.train["a"]) == 300 and trainer.global_step == 300
        for head in "ab":
            assert history.eval[-1][1][head]["loss"] < 0.5 * before[head]["loss"]
        results[kind] = [v.numpy() for v in model.trainable_variables]
    for a, b in zip(results["arrays"], results["tf.data"]):  # same seed -> same batches
        np.testing.assert_array_equal(a, b)


def test_fit_cycles_a_finite_dataset_and_reports_progress(capsys):
    trainer = mh.Trainer(make_model(), _objectives())
    x, y = make_batch(n=10)
    history = trainer.fit((x, y), steps=7, batch_size=4, verbose=True)  # 3 batches per epoch
    assert len(history.train["a"]) == 7
    assert "step 7/7" in capsys.readouterr().err


def test_evaluate_is_the_example_weighted_mean_loss_and_metrics():
    model = make_model()
    trainer = mh.Trainer(model, _objectives(a=mh.Objective("mse", metrics=["mae"])))
    x, y = make_batch(n=10)
    result = trainer.evaluate((x, y), batch_size=4)  # batches of 4, 4, 2
    out = model(x)
    expected_mse = np.mean((out["a"].numpy() - y["a"]) ** 2)
    expected_mae = np.mean(np.abs(out["a"].numpy() - y["a"]))
    assert result["a"]["loss"] == pytest.approx(expected_mse, rel=1e-5)
    assert result["a"]["mean_absolute_error"] == pytest.approx(expected_mae, rel=1e-5)
    assert set(result["b"]) == {"loss"}


def test_unbuilt_model_is_built_by_the_first_batch():
    model = mh.MultiHeadModel(keras.layers.Dense(4), {"a": keras.layers.Dense(1)})
    trainer = mh.Trainer(model, {"a": mh.Objective("mse")})
    x, y = make_batch(heads=("a",))
    result = trainer.step((x, y["a"]))  # a single head may take bare labels
    assert result.updated == ("a",) and np.isfinite(result.losses["a"])


@pytest.mark.parametrize("policy, message", [
    ("skip", "loss of head 'b' became nan at step 0 and stayed non-finite for 4 consecutive steps"),
    ("raise", "loss of head 'b' became nan at step 0$"),
])
def test_diverging_loss_stops_fit_with_the_head_and_step(policy, message):
    diverging = mh.Objective(lambda t, p: tf.math.log(p - 1e9), on_nonfinite=policy)
    trainer = mh.Trainer(make_model(), _objectives(b=diverging), max_nonfinite_steps=4)
    with pytest.raises(FloatingPointError, match=message):
        trainer.fit(make_batch(), steps=20, batch_size=16, verbose=False, steps_per_execution=1)


def _scalars(log_dir, tag):
    acc = EventAccumulator(log_dir, size_guidance={"tensors": 0})
    acc.Reload()
    return [(e.step, float(tf.make_ndarray(e.tensor_proto))) for e in acc.Tensors(tag)]


def test_per_head_losses_go_to_tensorboard_at_the_cadence(tmp_path):
    trainer = mh.Trainer(make_model(), _objectives(b=mh.Objective("mse", every=2)),
                         log_dir=str(tmp_path), log_every=3)
    x, y = make_batch()
    results = [trainer.step((x, y)) for _ in range(10)]
    trainer.evaluate((x, y))
    trainer.close()
    train_dir = os.path.join(tmp_path, "train")
    logged_a = _scalars(train_dir, "loss/a")
    # logged at the number of updates done: the first step, then every 3rd (10 steps)
    assert [s for s, _ in logged_a] == [1, 3, 6, 9]
    for step, value in logged_a:
        assert value == pytest.approx(results[step - 1].losses["a"], rel=1e-6)
    assert [s for s, _ in _scalars(train_dir, "loss/b")] == [1, 3, 9]  # b updates on 1, 3, 5, ...
    assert glob.glob(os.path.join(tmp_path, "eval", "events.*"))
    assert [s for s, _ in _scalars(os.path.join(tmp_path, "eval"), "loss/a")] == [10]


#: "auto" (the default) in the default suite; a fixed count with -m slow (the calls of both
#: are cut at the same log, checkpoint and evaluation steps).
SPE_CASES = [pytest.param(7, marks=pytest.mark.slow), "auto"]


@pytest.mark.parametrize("other", SPE_CASES)
def test_steps_per_execution_changes_nothing_but_speed(tmp_path, other):
    """Same weights, history, evaluations, logged steps and checkpoint steps as one step per call."""
    from multihead.io.checkpoints import CheckpointManager

    data = mh.mmoe_synthetic(tasks=["a", "b"], train_size=200, eval_size=50, input_dim=5, seed=3)
    runs = {}
    for spe in [1, other]:
        model = make_model(seed=4, dropout=0.2)
        trainer = mh.Trainer(model, _objectives(b=mh.Objective("mse", every=2)),
                             log_dir=str(tmp_path / f"spe{spe}"), log_every=3)
        manager = CheckpointManager(str(tmp_path / f"ckpt{spe}"), model, trainer, every=5, keep=100)
        history = trainer.fit(data.train, steps=40, batch_size=16, eval_data=data.eval,
                              eval_every=10, verbose=False, checkpoints=manager,
                              steps_per_execution=spe)  # 13 batches per epoch: calls cross epochs
        trainer.close()
        runs[spe] = (weights(model.trainable_variables), history,
                     sorted(os.path.basename(p) for p in glob.glob(str(tmp_path / f"ckpt{spe}" / "*.index"))),
                     _scalars(str(tmp_path / f"spe{spe}" / "train"), "loss/b"))
    w1, h1, c1, s1 = runs[1]
    for spe in [other]:
        w, h, c, s = runs[spe]
        for a, b in zip(w1, w):
            np.testing.assert_array_equal(a, b)
        assert h1.train == h.train and len(h.train["b"]) == 20
        assert [step for step, _ in h1.eval] == [step for step, _ in h.eval] == [10, 20, 30, 40]
        assert h1.eval == h.eval
        assert c1 == c and len(c) == 8  # steps 5, 10, ..., 40
        # b is updated on steps 1, 3, 5, ...: logged on those of 1, 3, 6, ..., 39 and 40 (last)
        assert s1 == s and [step for step, _ in s] == [1, 3, 9, 15, 21, 27, 33, 39]


def test_auto_steps_per_execution_runs_a_small_model_in_few_calls():
    trainer = mh.Trainer(make_model(), _objectives())
    calls = []
    run = trainer._runner.ensure_built(make_batch(n=8)[0]).run  # noqa: SLF001

    def counted(iterator, max_steps):
        calls.append(max_steps)
        return run(iterator, max_steps)

    trainer._runner.train_step.run = counted  # noqa: SLF001
    # 100 batches per epoch; the default is "auto"
    trainer.fit(make_batch(n=800), steps=400, batch_size=8, verbose=False)
    assert trainer.global_step == 400 and trainer.trace_count == 1
    assert len(calls) < 40 and max(calls) > 10  # a step takes well under 5 ms


@pytest.mark.parametrize("bad", [0, -1, 2.5, "fast", True])
def test_bad_steps_per_execution_is_refused(bad):
    trainer = mh.Trainer(make_model(), _objectives())
    with pytest.raises(ValueError, match=r"^steps_per_execution: .*got .*; give an integer >= 1 or 'auto'$"):
        trainer.fit(make_batch(n=16), steps=2, batch_size=8, verbose=False, steps_per_execution=bad)


def test_fit_with_steps_per_execution_traces_once():
    trainer = mh.Trainer(make_model(), _objectives(b=mh.Objective("mse", every=3)))
    trainer.fit(make_batch(n=64), steps=50, batch_size=8, steps_per_execution=6, verbose=False)
    assert trainer.trace_count == 1 and trainer.global_step == 50


def test_xla_with_tensorboard_is_refused_early(tmp_path):
    with pytest.raises(ValueError, match="XLA cannot compile the summary ops"):
        mh.Trainer(make_model(), _objectives(), log_dir=str(tmp_path), jit_compile=True)


# -- epochs ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["arrays", "tf.data"])
def test_fit_epochs_trains_ceil_rows_over_batch_steps_per_epoch_bitwise_as_steps(kind, capsys):
    x, y = make_batch(n=10)  # 10 rows, batch 4: ceil(10 / 4) = 3 steps an epoch, 6 for 2 epochs
    runs = {}
    for how in ("epochs", "steps"):  # a fresh dataset each: an iterated one drew its reshuffles
        data = (x, y) if kind == "arrays" else mh.as_dataset((x, y), batch_size=4, seed=0)
        model = make_model()
        trainer = mh.Trainer(model, _objectives())
        given = {"epochs": 2} if how == "epochs" else {"steps": 6}
        trainer.fit(data, batch_size=4, verbose=how == "epochs", **given)
        assert trainer.global_step == 6
        runs[how] = weights(model.weights)
    for a, b in zip(runs["epochs"], runs["steps"]):
        np.testing.assert_array_equal(a, b)
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith("epoch 2/2  step 6/6")


def test_fit_epochs_of_per_head_data_is_one_pass_over_the_largest_head():
    (xa, ya), (xb, yb) = make_batch(n=10, seed=1), make_batch(n=3, seed=2)
    data = {"a": (xa, ya["a"]), "b": (xb, yb["b"])}  # batch 2: a has 5 batches, b has 2
    trainer = mh.Trainer(make_model(), _objectives())
    history = trainer.fit(data, epochs=3, batch_size=2, verbose=False)
    assert trainer.global_step == 15 and len(history.train["b"]) == 15


@pytest.mark.parametrize("given, message", [
    ({}, "give exactly one of steps and epochs"),
    ({"steps": 4, "epochs": 1}, "give exactly one of steps and epochs"),
    ({"epochs": 0}, "epochs"),
])
def test_fit_needs_exactly_one_of_steps_and_epochs(given, message):
    x, y = make_batch(n=8)
    trainer = mh.Trainer(make_model(), _objectives())
    with pytest.raises(ValueError, match=message):
        trainer.fit((x, y), batch_size=4, verbose=False, **given)
    assert trainer.global_step == 0


@pytest.mark.parametrize("edit, message", [
    (lambda ds: ds.repeat(), "repeats forever.*give steps"),
    (lambda ds: ds.filter(lambda x, y: True), "length of data is unknown.*give steps"),
])
def test_fit_epochs_of_a_dataset_without_a_known_length_is_one_line_asking_for_steps(edit, message):
    x, y = make_batch(n=8)
    dataset = edit(tf.data.Dataset.from_tensor_slices((x, y)).batch(4))
    trainer = mh.Trainer(make_model(), _objectives())
    with pytest.raises(ValueError, match=message) as err:
        trainer.fit(dataset, epochs=1, verbose=False)
    assert "\n" not in str(err.value)
