"""tf.distribute: mirrored (2 logical CPU devices) and multi-worker (2 local processes) training
give the weights of single-device training on the same global batches.

TensorFlow's device configuration must precede its initialisation, so each check runs in a
fresh subprocess (several checks per process: start-up costs ~5 s).
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
from conftest import run_mirrored

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(TESTS)

# Runs in a subprocess with 2 logical CPU devices. Single-device reference and mirrored run of
# each case share the initial weights (seeded make_model) and the global batches (same data,
# batch size and shuffle seed), so the weights must agree up to float rounding.
_MIRRORED = r'''
import glob
from tensorflow.core.util import event_pb2
out = OUT
rng = np.random.default_rng(0)
X = rng.standard_normal((96, 5)).astype("float32")
Y = {h: rng.standard_normal((96, 1)).astype("float32") for h in "ab"}
result = {"replicas": strategy.num_replicas_in_sync}

def trainer(distributed, schedule="simultaneous", trunk="per_head", every_b=1, log_dir=None):
    with scope(strategy if distributed else None):
        model = make_model(seed=3)
        objectives = {"a": mh.Objective("mse", keras.optimizers.Adam(1e-2)),
                      "b": mh.Objective(lambda i, t, o: tf.reduce_mean(tf.square(t["b"] - o)),
                                        keras.optimizers.SGD(5e-2, momentum=0.9),
                                        every=every_b, weight=0.5)}
        return model, mh.Trainer(model, objectives, schedule=schedule, trunk=trunk,
                                 log_dir=log_dir, log_every=1, histograms_every=0,
                                 strategy=strategy if distributed else None)

def diff(a, b):
    return max(float(np.abs(x.numpy() - y.numpy()).max()) for x, y in zip(a, b))

cases = {"simultaneous/per_head/every1": ("simultaneous", "per_head", 1),
         "simultaneous/per_head/every2": ("simultaneous", "per_head", 2),
         "sequential/per_head/every3": ("sequential", "per_head", 3),
         "simultaneous/mgda": ("simultaneous", {"optimizer": "sgd", "aggregator": "mgda"}, 1),
         "simultaneous/sum": ("simultaneous", {"optimizer": "adam", "aggregator": "sum"}, 1),
         "simultaneous/pcgrad": ("simultaneous", {"optimizer": "adam", "aggregator": "pcgrad"}, 1),
         # state in variables + a generator; K x D buffers, one per trunk variable
         "simultaneous/gradvac": ("simultaneous", {"optimizer": "adam", "aggregator": "gradvac"}, 1),
         "simultaneous/moco": ("simultaneous", {"optimizer": "adam", "aggregator": "moco"}, 1)}
cases = {key: case for key, case in cases.items() if CASES is None or key in CASES}
result["fit"], result["updates"] = {}, {}
for key, (schedule, trunk, every_b) in cases.items():
    runs = []
    for distributed in (False, True):
        model, t = trainer(distributed, schedule, trunk, every_b)
        # 8 steps of 16 examples, 3 steps per compiled call: the iterator path of fit
        t.fit((X, Y), 8, batch_size=16, verbose=False, steps_per_execution=3)
        runs.append((model, t))
    (m1, t1), (m2, t2) = runs
    t1.close(), t2.close()  # ends their data iterators now (docs/distributed.md)
    result["fit"][key] = max(diff(m1.weights, m2.weights),
                             diff(t1.optimizers["a"].variables, t2.optimizers["a"].variables))
    result["updates"][key] = [int(t.optimizers["b"].iterations.numpy()) for t in (t1, t2)]
    first_single = m1

# A single-device trainer made after (and beside) mirrored ones is not affected by them:
# bitwise what the first single-device run of the last case gave.
again, t = trainer(False, schedule, trunk, every_b)
t.fit((X, Y), 8, batch_size=16, verbose=False, steps_per_execution=3)
t.close()
result["single_after_mirrored"] = diff(first_single.weights, again.weights)

# A target network made in the scope, read by a research loss inside the replica function
# and synced eagerly outside it.
gaps = []
for distributed in (False, True):
    with scope(strategy if distributed else None):
        model = make_model(seed=5)
        target = mh.TargetNetwork(model, heads=["b"], tau=0.5)
        td = lambda i, t, o: tf.reduce_mean(tf.square(t["b"] + 0.5 * target(i)["b"] - o))
        t = mh.Trainer(model, {"a": mh.Objective("mse", "adam"), "b": mh.Objective(td, "adam")},
                       strategy=strategy if distributed else None)
    for s in range(3):
        t.step(make_batch(seed=s))
        target.update()
    gaps.append((model, target))
(m1, g1), (m2, g2) = gaps
result["target"] = max(diff(m1.weights, m2.weights), diff(g1.variables, g2.variables))

# fit's data position under a strategy: 5 steps, checkpoint, restore into a new mirrored
# trainer, 5 more steps (crossing an epoch of 6 batches) == 10 uninterrupted steps.
whole, t = trainer(True, every_b=2)
t.fit((X, Y), 10, batch_size=16, verbose=False, steps_per_execution=4)
t.close()
half, t = trainer(True, every_b=2)
t.fit((X, Y), 5, batch_size=16, verbose=False, steps_per_execution=4)
path = mh.save_checkpoint(os.path.join(out, "ckpt", "half"), half, trainer=t)
t.close()
resumed, t = trainer(True, every_b=2)
mh.restore_checkpoint(path, resumed, trainer=t)
t.fit((X, Y), 5, batch_size=16, verbose=False, steps_per_execution=4)
t.close()
result["resume"] = diff(whole.weights, resumed.weights)

# Trainer.step on a global batch of 15 (shares of 7 and 8) and the reported losses.
runs = [trainer(d, "sequential", every_b=2) for d in (False, True)]
losses = [[t.step(make_batch(n=15, seed=s)).losses for s in range(4)] for _, t in runs]
result["step"] = diff(runs[0][0].weights, runs[1][0].weights)
result["step_losses"] = losses

# Logged gradient norms: what was applied, all-reduced, written once.
logs = {}
for distributed in (False, True):
    log_dir = os.path.join(out, "logs", str(distributed))
    model, t = trainer(distributed, every_b=2, log_dir=log_dir)
    t.fit((X, Y), 4, batch_size=16, verbose=False)
    t.close()
    found = {}
    for path in sorted(glob.glob(os.path.join(log_dir, "train", "events.out.tfevents.*"))):
        for record in tf.data.TFRecordDataset(path):
            event = event_pb2.Event.FromString(record.numpy())
            for value in event.summary.value:
                if value.tag.startswith("grad_norm/"):
                    found.setdefault(value.tag, []).append(
                        [int(event.step), float(tf.make_ndarray(value.tensor))])
    logs[str(distributed)] = found
result["grad_norms"] = logs

# Checkpoints: mirrored -> single device and single device -> mirrored, with optimizer state.
model, t = trainer(True)
t.fit((X, Y), 3, batch_size=16, verbose=False)
t.close()
path = mh.save_checkpoint(os.path.join(out, "ckpt", "mirrored"), model, trainer=t)
fresh, ft = trainer(False)
mh.restore_checkpoint(path, fresh, trainer=ft)
result["restore_to_single"] = max(diff(model.weights, fresh.weights),
                                  diff(t.optimizers["a"].variables, ft.optimizers["a"].variables))
result["restored_step"] = ft.global_step
path = mh.save_checkpoint(os.path.join(out, "ckpt", "single"), fresh, trainer=ft)
back, bt = trainer(True)
mh.restore_checkpoint(path, back, trainer=bt)
result["restore_to_mirrored"] = max(diff(fresh.weights, back.weights),
                                    diff(ft.optimizers["a"].variables, bt.optimizers["a"].variables))
# every replica's copy holds the restored value
result["replica_copies_equal"] = all(
    np.array_equal(v.value.values[0].numpy(), v.value.values[1].numpy()) for v in back.weights)
done(result)
'''


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


#: The fit cases of the default suite: every schedule and `every`, an aggregated trunk with a
#: stateless method (MGDA) and one with state in variables and a generator (GradVac). The
#: other aggregators (sum, PCGrad, MoCo) take the same mirrored path; they run with -m slow.
DEFAULT_CASES = ["simultaneous/per_head/every1", "simultaneous/per_head/every2",
                 "sequential/per_head/every3", "simultaneous/mgda", "simultaneous/gradvac"]
ALL_CASES = DEFAULT_CASES + ["simultaneous/sum", "simultaneous/pcgrad", "simultaneous/moco"]


@pytest.fixture(scope="module")
def mirrored(tmp_path_factory):
    return run_mirrored(f"CASES = {DEFAULT_CASES!r}\n" + _MIRRORED,
                        tmp_path_factory.mktemp("mirrored"), timeout=480)


def _fit_cases_equal_single_device(mirrored, cases):
    assert mirrored["replicas"] == 2
    assert sorted(mirrored["fit"]) == sorted(cases)
    for case, gap in mirrored["fit"].items():
        assert gap < 1e-5, (case, gap)
    # 8 steps: every=2 updates at 0,2,4,6; every=3 at 0,3,6 -- under both runs
    assert mirrored["updates"]["simultaneous/per_head/every2"] == [4, 4]
    assert mirrored["updates"]["sequential/per_head/every3"] == [3, 3]
    assert mirrored["updates"]["simultaneous/per_head/every1"] == [8, 8]


def test_mirrored_training_equals_single_device_for_every_schedule_and_trunk_policy(mirrored):
    _fit_cases_equal_single_device(mirrored, DEFAULT_CASES)


@pytest.mark.slow
def test_mirrored_training_equals_single_device_for_every_aggregator(tmp_path):
    """The default suite's test above, with every aggregator of its cases list."""
    full = run_mirrored("CASES = None\n" + _MIRRORED, tmp_path, timeout=900)
    _fit_cases_equal_single_device(full, ALL_CASES)


def test_single_device_trainer_beside_mirrored_ones_is_unaffected(mirrored):
    assert mirrored["single_after_mirrored"] == 0.0


def test_mirrored_research_loss_reading_a_target_network_equals_single_device(mirrored):
    assert mirrored["target"] < 1e-5


def test_mirrored_fit_resumes_at_its_data_position(mirrored):
    assert mirrored["resume"] < 1e-6


def test_mirrored_step_on_uneven_global_batch_and_its_losses(mirrored):
    assert mirrored["step"] < 1e-5
    single, distributed = mirrored["step_losses"]
    assert [sorted(s) for s in single] == [["a", "b"], ["a"], ["a", "b"], ["a"]]
    for s, d in zip(single, distributed):
        assert s.keys() == d.keys()
        for head in s:  # the global-batch mean, not a replica's share
            assert d[head] == pytest.approx(s[head], rel=1e-5, abs=1e-6)


def test_mirrored_logged_gradient_norms_equal_single_device(mirrored):
    single, distributed = mirrored["grad_norms"]["False"], mirrored["grad_norms"]["True"]
    assert set(single) == {"grad_norm/a/trunk", "grad_norm/a/head", "grad_norm/b/trunk",
                           "grad_norm/b/head"}
    assert set(distributed) == set(single)
    for tag in single:
        steps = [s for s, _ in single[tag]]
        # written once per step (b every 2nd step), not once per replica
        assert [s for s, _ in distributed[tag]] == steps
        assert steps == ([1, 2, 3, 4] if "/a/" in tag else [1, 3])  # updates done
        np.testing.assert_allclose([v for _, v in distributed[tag]], [v for _, v in single[tag]],
                                   rtol=1e-5, atol=1e-6)


def test_checkpoints_move_between_mirrored_and_single_device(mirrored):
    assert mirrored["restore_to_single"] == 0.0
    assert mirrored["restored_step"] == 3
    assert mirrored["restore_to_mirrored"] == 0.0
    assert mirrored["replica_copies_equal"]


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


def _two_workers(config, out, count=2, bound_s=240):
    """Runs `config` on `count` of two `multihead train` workers (the other one never starts)
    -> (finished within `bound_s`, return codes, logs)."""
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
                 "--set", "distribute.strategy=multi_worker", "--set", "distribute.timeout_s=60",
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
    finished, codes, output = _two_workers(config, out, count=1, bound_s=120)
    assert finished, f"the lone worker did not stop within 120 s:\n{output}"
    assert codes == [2], output
    ours = [line for line in output.splitlines() if line.startswith("multihead: ")]
    assert len(ours) == 1 and "Traceback" not in output, output
    assert "waited 60 s (distribute.timeout_s) for the other workers" in ours[0], ours
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
