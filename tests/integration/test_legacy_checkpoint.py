"""A run written by an earlier revision resumes on this code: its checkpoint's object graph,
the run directory's records and the numbers of the steps after it are unchanged.

`fixtures/run_11ad052` is `multihead train` of its own `config.yaml` (gradvac on the trunk
with an uncertainty loss weighting, dropout in the trunk) at revision 11ad052, for 20 steps,
checkpoints every 10 (TensorBoard events left out). `run_11ad052_ckpt30.npz` holds every
tensor of the checkpoint at step 30 of one uninterrupted 30-step run of the same config at
that revision ('/' in keys written as '|').
"""

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import tensorflow as tf

FIXTURES = Path(__file__).parent / "fixtures"


def _tensors(prefix):
    reader = tf.train.load_checkpoint(prefix)
    return {key: reader.get_tensor(key) for key in reader.get_variable_to_shape_map()
            if not key.startswith(("_CHECKPOINTABLE_OBJECT_GRAPH", "save_counter", "run/"))}


def test_a_run_written_by_11ad052_resumes_bitwise_on_this_code(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "run_11ad052", run)
    result = subprocess.run(
        [sys.executable, "-m", "multihead", "train", str(run / "config.yaml"), "--resume", str(run),
         "--set", "train.steps=30", "--quiet"],
        capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    resumed = _tensors(str(run / "checkpoints" / "ckpt-30"))
    with np.load(FIXTURES / "run_11ad052_ckpt30.npz") as stored:
        expected = {key.replace("|", "/"): stored[key] for key in stored.files}
    assert set(resumed) == set(expected)
    assert any(key.startswith("trunk_update/aggregator_state/") for key in expected)
    for key, value in expected.items():
        np.testing.assert_array_equal(resumed[key], value, err_msg=key)
