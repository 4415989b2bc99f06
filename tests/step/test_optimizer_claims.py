"""The Python API is as strict as configs about optimizers: no loss-scale wrapper, and no
optimizer object shared between two live Trainers (`multihead.objectives.objective`)."""


import keras
import numpy as np
import pytest
import tensorflow as tf

import multihead as mh
from conftest import make_batch, make_model


def _objectives(opt_a=None, opt_b=None):
    return {"a": mh.Objective("mse", optimizer=opt_a or keras.optimizers.SGD(0.1)),
            "b": mh.Objective("mse", optimizer=opt_b or keras.optimizers.SGD(0.1))}


def test_a_loss_scale_optimizer_is_refused_naming_the_head():
    wrapped = keras.mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(0.1))
    with pytest.raises(ValueError, match=r"^head 'b': a LossScaleOptimizer is refused: .*loss "
                                         r"scaling per head.*give the inner optimizer.*"
                                         r"mixed_float16.*dynamic loss scale per head") as err:
        mh.Trainer(make_model(), _objectives(opt_b=wrapped))
    assert "\n" not in str(err.value)


def test_a_loss_scale_trunk_optimizer_is_refused():
    wrapped = keras.mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(0.1))
    with pytest.raises(ValueError, match=r"^head 'trunk': a LossScaleOptimizer is refused"):
        mh.Trainer(make_model(), _objectives(),
                   trunk=mh.TrunkPolicy(aggregator="sum", optimizer=wrapped))


def test_the_inner_optimizer_trains_as_sgd_does():
    """What the refusal points to: the inner optimizer's update is the plain SGD update
    (w - lr * g, checked against a hand computation), not one divided by the scale."""
    model = make_model(heads=("a",))
    trainer = mh.Trainer(model, {"a": mh.Objective("mse", optimizer=keras.optimizers.SGD(0.1))})
    x, y = make_batch(heads=("a",))
    last = model.heads["a"].layers[-1].bias
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(y["a"] - model(x)["a"]))
    grad = tape.gradient(loss, last)
    expected = last.numpy() - 0.1 * grad.numpy()
    trainer.step((x, y))
    np.testing.assert_allclose(last.numpy(), expected, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("same_model", [True, False])
def test_two_trainers_sharing_objectives_with_optimizer_objects_are_refused(same_model):
    """On one model the second trainer would step the first one's slots and iteration
    count (today: silently); on another model it names the head before building."""
    objectives = _objectives()
    model = make_model()
    first = mh.Trainer(model, objectives)
    with pytest.raises(ValueError, match=r"^objectives\['a'\].optimizer is used by another "
                                         r"Trainer, which would share its state"):
        mh.Trainer(model if same_model else make_model(), objectives)
    assert first.optimizers["a"] is objectives["a"].optimizer


def test_a_trainer_that_is_gone_frees_its_optimizers():
    """Rebuilding a Trainer on the same model and objectives works once the first trainer
    is deleted, even before the garbage collector ran (the check collects on conflict)."""
    model, objectives = make_model(), _objectives()
    trainer = mh.Trainer(model, objectives)
    trainer.step(make_batch())
    with pytest.raises(ValueError, match="del the other trainer"):
        mh.Trainer(model, objectives)  # `trainer` is still alive
    del trainer
    trainer = mh.Trainer(model, objectives)
    assert trainer.step(make_batch()).updated == ("a", "b")
    assert int(objectives["a"].optimizer.iterations.numpy()) == 2


def test_a_shared_trunk_optimizer_is_refused():
    trunk = mh.TrunkPolicy(aggregator="sum", optimizer=keras.optimizers.SGD(0.1))
    first = mh.Trainer(make_model(), _objectives(), trunk=trunk)
    with pytest.raises(ValueError, match=r"^the trunk optimizer is used by another Trainer"):
        mh.Trainer(make_model(), _objectives(), trunk=trunk)
    assert first.trunk_optimizer is trunk.optimizer


def test_the_same_trainer_may_be_rebuilt_after_a_failed_construction():
    """A construction that fails claims nothing: the user fixes the argument and retries."""
    objectives = _objectives()
    with pytest.raises(ValueError, match="log_every"):
        mh.Trainer(make_model(), objectives, log_every=0)
    mh.Trainer(make_model(), objectives)


def test_objectives_with_optimizer_names_give_each_trainer_its_own_state():
    """A name makes a fresh optimizer per Trainer: stepping one leaves the other's alone."""
    objectives = {"a": mh.Objective("mse", optimizer="adam"),
                  "b": mh.Objective("mse", optimizer="adam")}
    one, two = (mh.Trainer(make_model(), objectives) for _ in range(2))
    assert one.optimizers["a"] is not two.optimizers["a"]
    one.step(make_batch())
    two.build_optimizers()
    assert int(one.optimizers["a"].iterations.numpy()) == 1
    assert int(two.optimizers["a"].iterations.numpy()) == 0
