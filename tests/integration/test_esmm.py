"""ESMM (Ma et al., SIGIR 2018) on the framework: its step equals the two-loss, two-optimizer
TF2 loop a researcher writes by hand, and the three configs of experiments/esmm/ run."""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import multihead as mh
from conftest import weights

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = os.path.join(ROOT, "experiments", "esmm")


def _model(seed: int, width: int) -> mh.MultiHeadModel:
    keras.utils.set_random_seed(seed)
    model = mh.MultiHeadModel(
        trunk=keras.Sequential([keras.layers.Dense(16, activation="relu"),
                                keras.layers.Dense(8, activation="relu")]),
        heads={"ctr": keras.layers.Dense(1, activation="sigmoid"),
               "cvr": keras.layers.Dense(1, activation="sigmoid")})
    model.build((None, width))
    return model


def _batches(steps: int, size: int = 32):
    """Generated impressions, clicks frequent enough that most batches hold a conversion."""
    data = mh.impressions(train_size=steps * size, eval_size=1, click_rate=0.3, cvr_rate=0.4,
                          seed=11).train
    return [(data.x[i:i + size], {"ctr": data.click[i:i + size], "ctcvr": data.ctcvr[i:i + size]})
            for i in range(0, steps * size, size)]


def _optimizers():
    return {"ctr": keras.optimizers.Adam(1e-2), "ctcvr": keras.optimizers.Adam(5e-3)}


def _hand_written_esmm(model: mh.MultiHeadModel, batches) -> dict:
    """ESMM as written by hand: one tape; the CTR loss (BCE of pCTR against the click, every
    impression) moves trunk + CTR head; the CTCVR loss (BCE of pCTR * pCVR against
    click * conversion) moves trunk + CTR head + CVR head; each through its own Adam built on
    exactly that var_list; both gradients taken at the same parameters."""
    bce = keras.losses.BinaryCrossentropy()
    trunk, ctr, cvr = model.trunk, model.heads["ctr"], model.heads["cvr"]
    var_lists = {"ctr": trunk.trainable_variables + ctr.trainable_variables,
                 "ctcvr": trunk.trainable_variables + ctr.trainable_variables
                 + cvr.trainable_variables}
    optimizers = _optimizers()
    for name, optimizer in optimizers.items():
        optimizer.build(var_lists[name])
    for x, y in batches:
        with tf.GradientTape(persistent=True) as tape:
            features = trunk(x, training=True)
            p_ctr, p_cvr = ctr(features, training=True), cvr(features, training=True)
            losses = {"ctr": bce(y["ctr"], p_ctr), "ctcvr": bce(y["ctcvr"], p_ctr * p_cvr)}
        for name in ("ctr", "ctcvr"):
            grads = tape.gradient(losses[name], var_lists[name])
            optimizers[name].apply_gradients(zip(grads, var_lists[name]))
        del tape
    return optimizers


def _esmm_objectives(optimizers) -> dict:
    return {
        "ctr": mh.Objective("binary_crossentropy", optimizers["ctr"]),
        "ctcvr": mh.Objective("binary_crossentropy", optimizers["ctcvr"], reads=("ctr", "cvr"),
                              combine=lambda o: o["ctr"] * o["cvr"],
                              trains=("trunk", "heads/ctr", "heads/cvr")),
    }


def test_esmm_step_equals_a_hand_written_loop_with_two_losses_and_two_optimizers():
    batches = _batches(10)
    width = batches[0][0].shape[1]
    ours, ref = _model(seed=4, width=width), _model(seed=4, width=width)
    cvr_before = weights(ours.head_variables("cvr"))
    optimizers = _optimizers()
    trainer = mh.Trainer(ours, _esmm_objectives(optimizers))
    for batch in batches:
        trainer.step(batch)
    ref_optimizers = _hand_written_esmm(ref, batches)
    for a, b in zip(ours.trainable_variables, ref.trainable_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0, atol=1e-6)
    for name in ("ctr", "ctcvr"):
        assert int(optimizers[name].iterations) == int(ref_optimizers[name].iterations) == 10
        for a, b in zip(optimizers[name].variables, ref_optimizers[name].variables):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-6)
    # the CVR head has no loss of its own: only the CTCVR loss moved it
    assert any(not np.array_equal(b, v.numpy())
               for b, v in zip(cvr_before, ours.head_variables("cvr")))
    ctr_ids = {id(v) for v in ours.var_list("ctr")}
    assert {id(v) for v in optimizers["ctr"]._trainable_variables} == ctr_ids
    assert not {id(v) for v in ours.head_variables("cvr")} & ctr_ids


# -- the configs ---------------------------------------------------------------------------

TINY = ["train.steps=3", "data.options.train_size=2000", "data.options.eval_size=400",
        "log.tensorboard=false", "train.steps_per_execution=1"]


@pytest.mark.parametrize("name, evaluated", [("naive_cvr", {"cvr"}),
                                             ("shared_bottom", {"ctr", "cvr"}),
                                             ("esmm", {"ctr", "ctcvr"})])
def test_each_esmm_config_trains_and_writes_metrics(name, evaluated, tmp_path):
    from multihead.experiments.run.experiment import run_experiment

    run_dir = tmp_path / name
    config = os.path.join(CONFIGS, f"{name}.yaml")
    assert run_experiment(config, run_dir=str(run_dir), overrides=TINY, quiet=True).exit_code == 0
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["steps"] == 3
    assert set(metrics["eval"]) == evaluated
    for values in metrics["eval"].values():
        assert np.isfinite(values["loss"])
