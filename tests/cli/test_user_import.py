"""`--import MODULE`: a user module with a registered aggregator and loss weighting (the two of
docs/own-methods.md, written to a file) trains, resumes and sweeps from the command line with
no wrapper, and the output stays quiet."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from test_user_methods import CONFIG as METHODS_CONFIG

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The user-method config of tests/aggregation/test_user_methods.py, 20 steps, checkpoints every 10.
CONFIG = (METHODS_CONFIG.replace("STEPS", "20").replace("eval_every: 25", "eval_every: 10")
          .replace("checkpoint: {every: 25, keep: 2}", "checkpoint: {every: 10, keep: 3}"))


@pytest.fixture
def workdir(tmp_path):
    """A working directory with the docs' methods as module `mymethods` and a config naming them."""
    with open(os.path.join(ROOT, "docs", "own-methods.md"), encoding="utf-8") as fh:
        blocks = re.findall(r"^```python\n(.*?)^```", fh.read(), re.S | re.M)
    (tmp_path / "mymethods.py").write_text("\n\n".join(blocks[:2]))
    (tmp_path / "exp.yaml").write_text(CONFIG)
    return tmp_path


def _cli(workdir, *args, timeout=600):
    """`multihead ...` as a user runs it: the console script's module, from `workdir`."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = ROOT
    return subprocess.run([sys.executable, "-m", "multihead", *args], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


def _tensors(prefix):
    reader = tf.train.load_checkpoint(str(prefix))
    return {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map()
            if not k.startswith(("_CHECKPOINTABLE_OBJECT_GRAPH", "save_counter", "run/"))}


def test_without_import_the_class_is_not_found_in_one_line(workdir):
    result = _cli(workdir, "validate", "exp.yaml")
    assert result.returncode == 2
    assert "is not a registered Aggregator subclass" in result.stderr and "--import" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("bitwise", [False, pytest.param(True, marks=pytest.mark.slow)],
                         ids=["resumes", "bitwise"])
def test_a_user_module_trains_and_resumes_bitwise_from_the_cli(workdir, bitwise):
    """The default suite trains and resumes with --import; with -m slow the resumed run is
    also compared with an uninterrupted one (bitwise in process by default:
    tests/aggregation/test_user_methods.py::test_user_methods_resume_bitwise_in_process)."""
    assert _cli(workdir, "validate", "exp.yaml", "--import", "mymethods").returncode == 0
    first = _cli(workdir, "train", "exp.yaml", "--import", "mymethods", "--run-dir", "stopped",
                 "--set", "train.steps=10", "--quiet")
    assert first.returncode == 0, first.stderr[-2000:]
    assert first.stderr.strip() == ""   # quiet: no TensorFlow start-up lines
    resumed = _cli(workdir, "train", "exp.yaml", "--import", "mymethods", "--resume", "stopped", "--quiet")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert (workdir / "stopped" / "checkpoints" / "ckpt-20.index").exists()
    bad = _cli(workdir, "validate", "exp.yaml", "--import", "no_such_module")
    assert bad.returncode == 2 and "--import no_such_module: ModuleNotFoundError" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    if not bitwise:
        return
    full = _cli(workdir, "train", "exp.yaml", "--import", "mymethods", "--run-dir", "full", "--quiet")
    assert full.returncode == 0, full.stderr[-2000:]
    a, b = _tensors(workdir / "stopped" / "checkpoints" / "ckpt-20"), _tensors(workdir / "full" / "checkpoints" / "ckpt-20")
    assert set(a) == set(b)
    assert any("aggregator_state" in k for k in b)
    for key, value in b.items():
        np.testing.assert_array_equal(a[key], value, err_msg=key)


@pytest.mark.slow
def test_a_user_module_sweeps_from_the_cli(workdir):
    result = _cli(workdir, "sweep", "exp.yaml", "--import", "mymethods", "--grid",
                  "train.trunk.aggregator.config.decay=0.5,0.9", "--sweep-dir", "sw", "--quiet")
    assert result.returncode == 0, result.stderr[-3000:]
    trials = json.loads((workdir / "sw" / "sweep.json").read_text())["trials"]
    assert [t["status"] for t in trials] == ["done", "done"]
