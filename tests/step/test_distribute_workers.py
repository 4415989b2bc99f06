"""tf.distribute: multi-worker training (2 local `multihead train` processes) gives the weights
of single-device training; a lone worker stops in one line; the distribute config and its
errors. (The mirrored tests are tests/step/test_distribute.py: apart, so that `--dist
loadfile` gives the two files' subprocesses to two workers.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import multihead as mh
from multihead.experiments.config.schema import ConfigError, from_dict
from multihead.step.distribute import is_chief, local_workers, make_strategy

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(TESTS)


def _run(args, env=None, timeout=480):
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=ROOT)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
        pytest.fail(f"{args} did not finish in {timeout} s:\n{output[-3000:]}")
    return proc.returncode, output


# -- multi-worker: two `multihead train` processes on 127.0.0.1 ------------------------------------

_CONFIG = """
seed: 1
data: {kind: mmoe, correlation: 0.5, train_size: 192, eval_size: 32, input_dim: 6}
model:
  trunk: {mlp: {units: [8], activation: tanh}}
  heads:
    y1: {layers: {class_name: Dense, config: {units: 1}}, optimizer: {class_name: Adam, config: {learning_rate: 0.01}}}
    y2: {layers: {class_name: Dense, config: {units: 1}}, optimizer: sgd, every: 2}
train: {steps: 6, batch_size: 32}
log: {every: 2, histograms_every: 0}
"""


def _two_workers(config, out, count=2, bound_s=240, timeout_s=60):
    """Runs `config` on `count` of two `multihead train` workers (the other one never starts)
    with `distribute.timeout_s` -> (finished within `bound_s`, return codes, logs)."""
    workers = local_workers(2)
    procs, logs = [], []
    try:
        for index in range(count):
            (out / "tmp").mkdir(exist_ok=True)
            env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TMPDIR=str(out / "tmp"), TF_CONFIG=json.dumps(
                {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}))
            log = open(out / f"worker{index}.log", "w")
            logs.append(log)
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "multihead", "train", str(config), "--quiet",
                 "--set", "distribute.strategy=multi_worker", "--set", f"distribute.timeout_s={timeout_s}",
                 "--run-dir", str(out / f"w{index}")],
                stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT))
        deadline = time.monotonic() + bound_s
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            time.sleep(0.5)
        finished = all(p.poll() is not None for p in procs)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=30)
        for log in logs:
            log.close()
    output = "\n".join((out / f"worker{i}.log").read_text()[-2000:] for i in range(count))
    return finished, [p.returncode for p in procs], output


def test_two_workers_via_the_cli_train_like_one_device(tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text(_CONFIG)
    out = tmp_path / "workers"
    out.mkdir()
    finished, codes, output = _two_workers(config, out)
    assert finished, f"the workers did not finish in 240 s:\n{output}"
    assert codes == [0, 0], output
    # The chief (worker 0) wrote checkpoints and logs; worker 1 neither.
    chief, other = out / "w0", out / "w1"
    assert (chief / "checkpoints" / "final.index").exists()
    assert not (other / "checkpoints").exists() or not os.listdir(other / "checkpoints")
    assert not (other / "train").exists()
    assert os.listdir(out / "tmp") == []  # worker 1's scratch logs are gone with its run
    assert json.loads((chief / "metrics.json").read_text())["steps"] == 6

    # The single-device reference: the same config in this process, no strategy.
    from multihead.experiments.run import runner as tasks
    from multihead.experiments.config.schema import load_config

    runner = tasks.prepare(load_config(config))
    runner.run(str(tmp_path / "single"), verbose=False)
    reference = runner.model
    # A checkpoint of the distributed run restores into a single-device model.
    restored = tasks.prepare(load_config(config)).model
    mh.restore_checkpoint(str(chief / "checkpoints" / "final"), restored, parts=["trunk", "heads"])
    gap = max(float(np.abs(a.numpy() - b.numpy()).max())
              for a, b in zip(reference.weights, restored.weights))
    assert gap < 1e-5, gap


@pytest.mark.slow
def test_two_workers_start_ten_times_in_a_row_without_a_hang(tmp_path):
    """Each of 10 starts finishes within its bound, completed or failed with one line."""
    config = tmp_path / "tiny.yaml"
    config.write_text(_CONFIG)
    outcomes = []
    for start in range(10):
        out = tmp_path / f"start{start}"
        out.mkdir()
        finished, codes, output = _two_workers(config, out)
        assert finished, f"start {start}: the workers hung:\n{output}"
        for code, index in zip(codes, range(2)):
            if code != 0:  # a failure is one line that says so
                errors = [line for line in (out / f"worker{index}.log").read_text().splitlines()
                          if line.startswith("multihead: ")]
                assert len(errors) == 1 and "Traceback" not in output, output
        outcomes.append(codes)
    assert outcomes == [[0, 0]] * 10, outcomes


def test_a_worker_whose_peer_never_starts_stops_with_one_line(tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text(_CONFIG)
    out = tmp_path / "workers"
    out.mkdir()
    # 15 s: the lone worker's wait is idle time that holds a test worker (60 s took 75 s)
    finished, codes, output = _two_workers(config, out, count=1, bound_s=120, timeout_s=15)
    assert finished, f"the lone worker did not stop within 120 s:\n{output}"
    assert codes == [2], output
    ours = [line for line in output.splitlines() if line.startswith("multihead: ")]
    assert len(ours) == 1 and "Traceback" not in output, output
    assert "waited 15 s (distribute.timeout_s) for the other workers" in ours[0], ours
    assert not (out / "w0").exists()  # nothing half-written


def test_multi_worker_calls_are_sized_alike_on_every_worker():
    """Under a multi-worker strategy, `steps_per_execution="auto"` does not read the clock: the
    workers' all-reduces pair call by call, so calls of different sizes would hang both."""
    from multihead.training.execution import ExecutionSize

    sizes = []
    for elapsed in (0.001, 5.0):  # a fast worker and a slow one
        size = ExecutionSize("auto", clocked=False)
        calls = []
        for _ in range(5):
            calls.append(size.next)
            size.observe(calls[-1], elapsed)
        sizes.append(calls)
    assert sizes[0] == sizes[1] == [ExecutionSize.SYNCED_STEPS] * 5
    clocked = [ExecutionSize("auto") for _ in range(2)]
    for size, elapsed in zip(clocked, (0.001, 5.0)):
        for _ in range(5):
            size.observe(size.next, elapsed)
    assert clocked[0].next != clocked[1].next  # the single-process default does adapt


# -- in-process: configuration and errors ----------------------------------------------------------


def _raw(**distribute):
    return {"model": {"trunk": {"class_name": "Dense", "config": {"units": 4}},
                      "heads": {"y": {}}}, "distribute": distribute}


def test_distribute_config_is_validated_with_key_paths():
    assert from_dict(_raw()).distribute.strategy == "none"
    assert from_dict(_raw(strategy="mirrored", devices=["/cpu:0"])).distribute.devices == ["/cpu:0"]
    with pytest.raises(ConfigError, match=r"distribute.strategy: must be one of .*'mirrord'.*did you mean 'mirrored'"):
        from_dict(_raw(strategy="mirrord"))
    with pytest.raises(ConfigError, match="distribute.devices: only used with strategy mirrored"):
        from_dict(_raw(strategy="multi_worker", devices=["/cpu:0"]))
    with pytest.raises(ConfigError, match="distribute.unknown: unknown key"):
        from_dict(_raw(unknown=1))
    raw = _raw(strategy="mirrored")
    raw["train"] = {"trunk": {"aggregator": "mgda", "rep_grad": True}}
    with pytest.raises(ConfigError, match="train.trunk.rep_grad: true is not supported with distribute"):
        from_dict(raw)


def test_multi_worker_without_tf_config_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ValueError, match="needs the TF_CONFIG environment variable"):
        make_strategy("multi_worker")
    monkeypatch.setenv("TF_CONFIG", "{not json")
    with pytest.raises(ValueError, match="TF_CONFIG is malformed"):
        make_strategy("multi_worker")
    with pytest.raises(ValueError, match="device '/gpu:7' does not exist"):
        make_strategy("mirrored", devices=["/gpu:7"])
    assert make_strategy("none") is None and is_chief(None)


def test_cli_reports_bad_distribute_input_in_one_line(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(_CONFIG)
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    code, output = _run([sys.executable, "-m", "multihead", "train", str(config), "--run-dir",
                         str(tmp_path / "run"), "--set", "distribute.strategy=multi_worker"], env=env)
    assert code == 2
    assert output.strip().splitlines()[-1].startswith("multihead: error: ")
    assert "TF_CONFIG" in output
    assert not (tmp_path / "run").exists()


def test_trainer_refuses_optimizers_and_models_made_outside_the_scope():
    import keras

    from conftest import make_batch, make_model

    strategy = make_strategy("mirrored", devices=["/cpu:0"])
    assert strategy.num_replicas_in_sync == 1 and is_chief(strategy)
    model = make_model()
    with pytest.raises(ValueError, match="was created outside strategy.scope"):
        mh.Trainer(model, {"a": mh.Objective("mse", keras.optimizers.Adam()),
                           "b": mh.Objective("mse")}, strategy=strategy)
    with pytest.raises(ValueError, match="model: variable .* was not created under strategy.scope"):
        mh.Trainer(model, {"a": mh.Objective("mse"), "b": mh.Objective("mse")}, strategy=strategy)
    plain = mh.Trainer(make_model(), {"a": mh.Objective("mse"), "b": mh.Objective("mse")})
    assert plain.strategy is None and plain.is_chief

    with strategy.scope():
        mirrored = mh.Trainer(make_model(), {"a": mh.Objective("mse"), "b": mh.Objective("mse")},
                              strategy=strategy)
        with pytest.raises(RuntimeError, match="outside `with strategy.scope"):
            mirrored.step(make_batch())
    for _ in range(3):  # one replica: the same arithmetic as one device
        assert mirrored.step(make_batch()).losses == pytest.approx(plain.step(make_batch()).losses,
                                                                  rel=1e-6)
    for a, b in zip(mirrored.model.weights, plain.model.weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0, atol=1e-6)
