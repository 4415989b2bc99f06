"""SavedModel export: a signature per head, same outputs as the model, also in a fresh process."""

import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

import multihead as mh
from conftest import make_batch, make_model
from multihead.io.checkpoints import restore_checkpoint
from multihead.cli.main import main
from multihead.experiments.run.experiment import run_experiment
from multihead.experiments.config.schema import load_config


def _compiled_outputs(model, x):
    """The model's inference outputs as a compiled graph (what the SavedModel runs)."""
    return {h: v.numpy() for h, v in tf.function(lambda t: model(t, training=False))(x).items()}


def test_exported_signatures_give_the_models_outputs(tmp_path):
    model = make_model(heads=("a", "b", "c"), seed=2, dropout=0.5)
    trainer = mh.Trainer(model, {h: mh.Objective("mse") for h in "abc"})
    for s in range(3):
        trainer.step(make_batch(("a", "b", "c"), seed=s))
    result = mh.export_saved_model(model, tmp_path / "export", heads=["c", "a"])
    assert result.signatures == {"serving_default": ("c", "a"), "c": ("c",), "a": ("a",)}
    assert tuple(result.input_spec.shape) == (None, 5)

    loaded = tf.saved_model.load(str(tmp_path / "export"))
    assert sorted(loaded.signatures) == ["a", "c", "serving_default"]
    x, _ = make_batch(("a",), n=9, seed=5)
    expected = _compiled_outputs(model, x)
    eager = model(x, training=False)
    every = loaded.signatures["serving_default"](inputs=tf.constant(x))
    assert sorted(every) == ["a", "c"]
    for head in ("a", "c"):
        only = loaded.signatures[head](inputs=tf.constant(x))
        assert list(only) == [head]
        np.testing.assert_array_equal(only[head].numpy(), expected[head])
        np.testing.assert_array_equal(every[head].numpy(), expected[head])
        np.testing.assert_array_equal(loaded(x)[head].numpy(), expected[head])
        np.testing.assert_allclose(every[head].numpy(), eager[head].numpy(), rtol=1e-6, atol=1e-6)


def test_a_trunk_on_named_inputs_exports_signatures_with_one_argument_per_name(tmp_path):
    keras.utils.set_random_seed(0)
    inputs = {"age": keras.Input((1,), name="age"), "income": keras.Input((3,), name="income")}
    features = keras.layers.Dense(4, activation="tanh")(
        keras.layers.Concatenate()([inputs["age"], inputs["income"]]))
    model = mh.MultiHeadModel(keras.Model(inputs, features),
                              {"a": keras.layers.Dense(1), "b": keras.layers.Dense(2)})
    x = {"age": np.ones((6, 1), "float32"), "income": np.arange(18, dtype="float32").reshape(6, 3)}
    model(x)
    result = mh.export_saved_model(model, tmp_path / "export")
    assert sorted(result.input_spec) == ["age", "income"]
    loaded = tf.saved_model.load(str(tmp_path / "export"))
    expected = _compiled_outputs(model, x)
    for head in ("a", "b"):
        only = loaded.signatures[head](age=tf.constant(x["age"]), income=tf.constant(x["income"]))
        np.testing.assert_array_equal(only[head].numpy(), expected[head])


def test_export_errors_leave_nothing_behind(tmp_path):
    model = make_model()
    with pytest.raises(ValueError, match=r"heads names head 'zz', but the model's heads are \['a', 'b'\]"):
        mh.export_saved_model(model, tmp_path / "out", heads=["zz"])
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("x")
    with pytest.raises(ValueError, match="exists and is not an empty directory"):
        mh.export_saved_model(model, tmp_path / "full")
    unbuilt = mh.MultiHeadModel(keras.layers.Dense(2), {"a": keras.layers.Dense(1)})
    with pytest.raises(ValueError, match=r"call model.build\(input_shape\) first"):
        mh.export_saved_model(unbuilt, tmp_path / "other")
    assert sorted(os.listdir(tmp_path)) == ["full"]  # no directory, no temporary left


CONFIG = """\
seed: 1
data: {kind: mmoe, train_size: 128, eval_size: 32, input_dim: 6}
model:
  trunk: {mlp: {units: [8], dropout: 0.3}}
  heads:
    a: {layers: {mlp: {units: [1]}}}
    b: {layers: {mlp: {units: [4, 1]}}}
train: {steps: 20, batch_size: 32}
log: {every: 10, histograms_every: 0}
"""

LOAD = textwrap.dedent("""\
    import sys
    import numpy as np
    import tensorflow as tf
    loaded = tf.saved_model.load(sys.argv[1])
    x = tf.constant(np.load(sys.argv[2]))
    np.savez(sys.argv[3], **{k: v.numpy() for k, v in loaded.signatures["b"](inputs=x).items()},
             all_b=loaded.signatures["serving_default"](inputs=x)["b"].numpy())
""")


def test_cli_export_reloads_in_a_fresh_process_with_the_models_outputs(tmp_path, capsys):
    config, run, out = tmp_path / "exp.yaml", tmp_path / "run", tmp_path / "served"
    config.write_text(CONFIG)
    assert run_experiment(str(config), run_dir=str(run), quiet=True).exit_code == 0
    assert main(["export", str(run), str(tmp_path / "bad"), "--heads", "a,zz"]) == 2
    assert "--heads 'a,zz': the run's heads are a,b" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()
    assert main(["export", str(run), str(out), "--heads", "b"]) == 0
    assert "signatures: serving_default, b" in capsys.readouterr().out

    # The reference: the run's model rebuilt from its config and checkpoint in this process.
    from multihead.experiments.run import runner as tasks

    model = tasks.prepare(load_config(run / "config.yaml")).model
    restore_checkpoint(tf.train.latest_checkpoint(str(run / "checkpoints")), model,
                       parts=["trunk", "heads/b"])
    x = np.random.default_rng(3).standard_normal((5, 6)).astype("float32")
    np.save(tmp_path / "x.npy", x)
    script = tmp_path / "load.py"
    script.write_text(LOAD)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    subprocess.run([sys.executable, str(script), str(out), str(tmp_path / "x.npy"),
                    str(tmp_path / "y.npz")], env=env, check=True, timeout=120,
                   capture_output=True)
    served = np.load(tmp_path / "y.npz")
    assert sorted(served.files) == ["all_b", "b"]  # head a was not exported
    expected = _compiled_outputs(model, x)["b"]
    np.testing.assert_array_equal(served["b"], expected)
    np.testing.assert_array_equal(served["all_b"], expected)
