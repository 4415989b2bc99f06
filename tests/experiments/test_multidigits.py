"""MultiDigits: the MultiMNIST construction on scikit-learn's digits, split by source image,
and experiments/multidigits.yaml learning both heads."""

import json
import os

import numpy as np
import pytest

pytest.importorskip("sklearn")

from sklearn.datasets import load_digits  # noqa: E402

from multihead.cli.main import main  # noqa: E402
from multihead.experiments.run.experiment import run_experiment  # noqa: E402
from multihead.datasets.multidigits import multidigits, source_split  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "experiments", "multidigits.yaml")


def test_examples_are_two_source_images_of_their_split_with_their_labels():
    # canvas 16, shift 0: the digits sit in opposite corners without overlap, so each corner
    # is exactly one scaled source image
    data = multidigits(train_size=300, eval_size=200, canvas=16, shift=0, seed=3)
    digits = load_digits()
    images = digits.images.astype(np.float32) / 16.0
    train_sources, eval_sources = source_split(seed=3)
    assert not set(train_sources) & set(eval_sources)
    assert len(train_sources) + len(eval_sources) == 1797 and len(eval_sources) == 359
    for x, y, sources in [(data.x_train, data.y_train, train_sources),
                          (data.x_eval, data.y_eval, eval_sources)]:
        assert x.shape[1:] == (16, 16, 1) and x.dtype == np.float32
        pool = images[sources].reshape(len(sources), -1)
        for i in range(0, len(x), 17):
            for corner, head in [(x[i, :8, :8, 0], "left"), (x[i, 8:, 8:, 0], "right")]:
                match = np.flatnonzero((pool == corner.reshape(1, -1)).all(axis=1))
                assert match.size, "a corner is not a source image of its split"
                assert y[head][i, 0] in digits.target[sources[match]]
        assert y["left"].dtype == np.int32 and y["left"].shape == (len(x), 1)


def test_overlay_is_the_pixelwise_maximum_and_seeded():
    a = multidigits(train_size=50, eval_size=10, canvas=12, shift=1, seed=0)
    b = multidigits(train_size=50, eval_size=10, canvas=12, shift=1, seed=0)
    np.testing.assert_array_equal(a.x_train, b.x_train)
    assert 0.0 <= a.x_train.min() and a.x_train.max() <= 1.0
    assert not np.array_equal(a.x_train, multidigits(train_size=50, eval_size=10, seed=1).x_train)
    with pytest.raises(ValueError, match="canvas: must be >= 9"):
        multidigits(canvas=8)


def _accuracies(run_dir):
    metrics = json.loads(open(os.path.join(run_dir, "metrics.json")).read())
    return {h: metrics["eval"][h]["accuracy"] for h in ("left", "right")}


def test_short_run_learns_both_heads_above_chance(tmp_path):
    """The fast version: 200 steps on 3,000 examples; chance is 10%."""
    run_dir = str(tmp_path / "run")
    overrides = ["train.steps=200", "train.eval_every=null", "data.options.train_size=3000",
                 "data.options.eval_size=1000", "log.tensorboard=false"]
    assert run_experiment(CONFIG, run_dir=run_dir, overrides=overrides, quiet=True).exit_code == 0
    for head, accuracy in _accuracies(run_dir).items():
        assert accuracy > 0.5, (head, accuracy)


def test_heads_must_be_multidigits_tasks(tmp_path, capsys):
    assert main(["train", CONFIG, "--run-dir", str(tmp_path / "run"), "--set",
                 "model.heads.middle={}"]) == 2
    assert "model.heads.middle: data kind multidigits has no task 'middle'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_multidigits_config_reaches_85_percent_on_both_heads(tmp_path):
    """The shipped config, unchanged (about 4 minutes on 2 CPU cores)."""
    run_dir = str(tmp_path / "run")
    assert run_experiment(str(CONFIG), run_dir=str(run_dir), quiet=True).exit_code == 0
    for head, accuracy in _accuracies(run_dir).items():
        assert accuracy >= 0.85, (head, accuracy)
