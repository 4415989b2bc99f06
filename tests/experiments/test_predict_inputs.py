"""`multihead predict --data` on inputs the run's model cannot take: one line that says why
(no rows; expected vs got width, naming the input), not numpy's or TensorFlow's words
("need at least one array to concatenate", "in user code:")."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import yaml

import multihead as mh
from multihead.cli.main import main
from multihead.experiments.run.experiment import run_experiment


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("predict_inputs")
    config = {"model": {"trunk": {"mlp": {"units": [8]}}, "heads": {"y1": {}, "y2": {}}},
              "data": {"kind": "mmoe", "train_size": 64, "eval_size": 16, "input_dim": 4},
              "train": {"steps": 2, "batch_size": 8}, "log": {"tensorboard": False}}
    (root / "c.yaml").write_text(yaml.safe_dump(config))
    assert run_experiment(str(root / "c.yaml"),
                          run_dir=str(root / "run"), quiet=True).exit_code == 0
    return root / "run"


@pytest.mark.parametrize("x, line", [
    (np.zeros((0, 4), "float32"), "x: 0 rows (shape (0, 4)); give at least one example"),
    (np.zeros((5, 3), "float32"), "x: the model takes inputs of width 4 (shape (None, 4)), got "
                                  "width 3 (shape (None, 3))"),
], ids=["no rows", "wrong width"])
def test_predict_says_what_is_wrong_with_the_inputs(run_dir, tmp_path, capsys, x, line):
    np.savez(tmp_path / "in.npz", x=x)
    capsys.readouterr()
    assert main(["predict", str(run_dir), "--data", str(tmp_path / "in.npz"),
                 "--out", str(tmp_path / "out.npz")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and line in err, err
    assert not (tmp_path / "out.npz").exists()


def test_a_named_input_of_the_wrong_width_is_named():
    keras.utils.set_random_seed(0)
    inputs = {"u": keras.Input((2,), name="u"), "v": keras.Input((3,), name="v")}
    joined = keras.layers.Concatenate()([inputs["u"], inputs["v"]])
    trunk = keras.Model(inputs, keras.layers.Dense(8)(joined))
    model = mh.MultiHeadModel(trunk, {"a": keras.layers.Dense(1)})
    model.build({"u": (None, 2), "v": (None, 3)})
    x = {"u": np.zeros((4, 2), "float32"), "v": np.zeros((4, 5), "float32")}
    with pytest.raises(ValueError, match=r"^x\['v'\]: the model takes inputs of width 3 .* got "
                                         r"width 5"):
        model.predict(x)
