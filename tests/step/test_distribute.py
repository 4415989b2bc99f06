"""tf.distribute: mirrored training (2 logical CPU devices) gives the weights of single-device
training on the same global batches (multi-worker: tests/step/test_distribute_workers.py).

TensorFlow's device configuration must precede its initialisation, so each check runs in a
fresh subprocess (several checks per process: start-up costs ~5 s).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

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
