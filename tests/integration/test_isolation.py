"""Isolation (TF1 seed 000): many models and trainers in one process, no names or state shared."""

import keras
import numpy as np

import multihead as mh
from conftest import weights
from multihead.experiments.build.builders import build_model, build_objectives
from multihead.experiments.config.schema import from_dict

RAW = {
    "seed": 0,
    "model": {
        "trunk": {"mlp": {"units": [16, 16], "activation": "relu", "dropout": 0.25}},
        "heads": {
            "q": {"layers": {"mlp": {"units": [8, 1], "output_activation": "linear"}},
                  "optimizer": {"class_name": "Adam", "config": {"learning_rate": 1e-2}}},
            "pi": {"layers": [{"class_name": "Dense", "config": {"units": 3}}], "every": 2},
        },
    },
}
DATA = mh.mmoe_synthetic(tasks=["q", "pi"], train_size=128, eval_size=32, input_dim=6, seed=2)
for _labels in (DATA.y_train, DATA.y_eval):  # one label column per unit of the 3-unit head
    _labels["pi"] = np.repeat(_labels["pi"], 3, axis=1)


def _build(seed=0):
    config = from_dict({**RAW, "seed": seed})
    keras.utils.set_random_seed(config.seed)
    return config, build_model(config, (None, 6))


def _batch(i):
    rows = slice(16 * (i % 8), 16 * (i % 8) + 16)
    return DATA.x_train[rows], {h: y[rows] for h, y in DATA.y_train.items()}


def test_training_and_inference_models_from_one_config_twice_restore_exactly(tmp_path):
    _, train_model = _build()
    initial = weights(train_model.weights)
    _, infer_model = _build()  # same config and seed: same initial weights, other objects
    assert not {id(v) for v in train_model.weights} & {id(v) for v in infer_model.weights}
    assert [v.path for v in train_model.weights] != [v.path for v in infer_model.weights]
    for a, b in zip(initial, infer_model.weights):
        np.testing.assert_array_equal(a, b.numpy())

    config, _ = _build()
    trainer = mh.Trainer(train_model, build_objectives(config))
    for i in range(10):
        trainer.step(_batch(i))
    for a, b in zip(initial, infer_model.weights):  # training one model leaves the other alone
        np.testing.assert_array_equal(a, b.numpy())

    _, late_model = _build()  # built after training: no state leaked into a new build
    for a, b in zip(initial, late_model.weights):
        np.testing.assert_array_equal(a, b.numpy())

    path = mh.save_checkpoint(tmp_path / "weights", train_model, parts=["trunk", "heads"])
    mh.restore_checkpoint(path, infer_model, parts=["trunk", "heads"])
    x = DATA.x_eval
    trained, inferred = train_model(x, training=False), infer_model(x, training=False)
    for head in ("q", "pi"):
        np.testing.assert_array_equal(trained[head].numpy(), inferred[head].numpy())


def _run(trainer, steps, offset):
    return [trainer.step(_batch(i + offset)).losses for i in range(steps)]


def _pair():
    """Two different runs: config seed 0 and seed 1 (other weights, other dropout seeds)."""
    trainers = []
    for seed in (0, 1):
        config, model = _build(seed)
        trainers.append(mh.Trainer(model, build_objectives(config)))
    return trainers


def test_two_trainers_stepped_alternately_equal_each_run_alone():
    alone = []
    for index in range(2):
        trainer = _pair()[index]
        losses = _run(trainer, 12, offset=3 * index)
        alone.append((losses, weights(trainer.model.variables),
                      [v.numpy() for h in ("q", "pi") for v in trainer.optimizers[h].variables]))

    first, second = _pair()
    interleaved = ([], [])
    for i in range(12):
        interleaved[0].extend(_run(first, 1, offset=i))
        interleaved[1].extend(_run(second, 1, offset=3 + i))
    for trainer, losses, (ref_losses, ref_weights, ref_slots) in zip(
            (first, second), interleaved, alone):
        assert losses == ref_losses
        for a, b in zip(ref_weights, trainer.model.variables):  # with the Dropout seed state
            np.testing.assert_array_equal(a, b.numpy())
        slots = [v.numpy() for h in ("q", "pi") for v in trainer.optimizers[h].variables]
        for a, b in zip(ref_slots, slots):
            np.testing.assert_array_equal(a, b)
    assert alone[0][0] != alone[1][0]  # the two runs really differ
