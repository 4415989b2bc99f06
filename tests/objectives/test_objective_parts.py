"""Objectives over parts: losses that read several heads, var_lists over any parts,
gradient reversal into the trunk; each checked against a hand-written GradientTape."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import multihead as mh
from multihead.io.checkpoints import restore_checkpoint, save_checkpoint


def _model(heads=("ctr", "cvr"), seed=0, activation="sigmoid"):
    keras.utils.set_random_seed(seed)
    model = mh.MultiHeadModel(
        trunk=keras.Sequential([keras.layers.Dense(8, activation="tanh"),
                                keras.layers.Dense(6, activation="tanh")]),
        heads={h: keras.layers.Dense(1, activation=activation) for h in heads})
    model.build((None, 5))
    return model


def _batch(seed=0, n=16):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 5)).astype("float32")
    click = (rng.random((n, 1)) < 0.5).astype("float32")
    return x, {"ctr": click, "ctcvr": click * (rng.random((n, 1)) < 0.5).astype("float32")}


def _esmm(model, lr=0.1):
    return mh.Trainer(model, {
        "ctr": mh.Objective("binary_crossentropy", keras.optimizers.SGD(lr)),
        "ctcvr": mh.Objective("binary_crossentropy", keras.optimizers.SGD(lr),
                              reads=("ctr", "cvr"), combine=lambda o: o["ctr"] * o["cvr"],
                              trains=("trunk", "heads/ctr", "heads/cvr")),
    })


def _values(variables):
    return [np.array(v.numpy()) for v in variables]


def test_a_standalone_objective_reads_two_heads_and_trains_exactly_its_parts():
    model = _model()
    trainer = _esmm(model)
    x, y = _batch()
    trainer.build_optimizers()
    parts = trainer._runner.train_step._heads  # the resolved objectives, in order
    assert [h.name for h in parts] == ["ctr", "ctcvr"]
    expected = model.trunk_variables + model.head_variables("ctr") + model.head_variables("cvr")
    assert [id(v) for v in parts[1].var_list] == [id(v) for v in expected]
    # The hand-written step: both gradients at the same parameters, then each SGD update.
    before = _values(model.trainable_variables)
    bce = keras.losses.BinaryCrossentropy()
    with tf.GradientTape(persistent=True) as tape:
        out = model(x, training=True)
        l_ctr = bce(y["ctr"], out["ctr"])
        l_ctcvr = bce(y["ctcvr"], out["ctr"] * out["cvr"])
    g_ctr = tape.gradient(l_ctr, model.var_list("ctr"))
    g_ctcvr = tape.gradient(l_ctcvr, expected)
    result = trainer.step((x, y))
    assert result.updated == ("ctr", "ctcvr")
    np.testing.assert_allclose(result.losses["ctcvr"], l_ctcvr.numpy(), rtol=1e-6)
    update = {id(v): np.zeros_like(b) for v, b in zip(model.trainable_variables, before)}
    for grads, variables in [(g_ctr, model.var_list("ctr")), (g_ctcvr, expected)]:
        for g, v in zip(grads, variables):
            update[id(v)] += 0.1 * g.numpy()
    for v, b in zip(model.trainable_variables, before):
        np.testing.assert_allclose(v.numpy(), b - update[id(v)], rtol=1e-5, atol=1e-7)


def test_an_objective_that_reads_a_head_it_does_not_train_leaves_that_head_and_its_slots_unchanged():
    # "reader" reads heads ctr and cvr but trains heads/cvr only (as DDPG's actor reads the
    # critic); "ctr" trains trunk + ctr on its own labels with Adam (slots), every 1000 steps.
    model = _model()
    trainer = mh.Trainer(model, {
        "ctr": mh.Objective("binary_crossentropy", keras.optimizers.Adam(1e-2), every=1000),
        "reader": mh.Objective("mse", keras.optimizers.SGD(0.1), reads=("ctr", "cvr"),
                               combine=lambda o: o["ctr"] + o["cvr"], trains=("heads/cvr",)),
    })
    x, y = _batch(1)
    y = {"ctr": y["ctr"], "reader": y["ctcvr"]}
    trainer.step((x, y))  # step 0: both update
    ctr_state = _values(model.trunk_variables + model.head_variables("ctr")
                        + trainer.optimizers["ctr"].variables)
    head_vars = model.head_variables("cvr")
    for _ in range(3):  # "ctr" is not due: only "reader" updates
        with tf.GradientTape() as tape:
            out = model(x, training=True)
            loss = keras.losses.MeanSquaredError()(y["reader"], out["ctr"] + out["cvr"])
        expected = [v.numpy() - 0.1 * g.numpy() for v, g in zip(head_vars,
                                                                 tape.gradient(loss, head_vars))]
        assert trainer.step((x, y)).updated == ("reader",)
        for v, e in zip(head_vars, expected):
            np.testing.assert_allclose(v.numpy(), e, rtol=1e-6, atol=1e-8)
    for before, after in zip(ctr_state, _values(model.trunk_variables + model.head_variables("ctr")
                                                 + trainer.optimizers["ctr"].variables)):
        np.testing.assert_array_equal(before, after)


@pytest.mark.parametrize("lam", [0.5, 2.0])
def test_gradient_reversal_updates_the_trunk_by_minus_lambda_times_the_plain_gradient(lam):
    # DANN: the domain head learns to classify the domain; its gradient into the trunk is
    # reversed and scaled. SGD, so the update is exactly -lr * factor * gradient.
    model = _model(heads=("domain",), seed=3)
    trainer = mh.Trainer(model, {"domain": mh.Objective(
        "binary_crossentropy", keras.optimizers.SGD(0.1), trunk_scale=-lam)})
    x, y = _batch(2)
    with tf.GradientTape() as tape:
        loss = keras.losses.BinaryCrossentropy()(y["ctr"], model(x, training=True)["domain"])
    trunk, head = model.trunk_variables, model.head_variables("domain")
    g_trunk, g_head = tape.gradient(loss, [trunk, head])
    expected = ([v.numpy() + 0.1 * lam * g.numpy() for v, g in zip(trunk, g_trunk)]
                + [v.numpy() - 0.1 * g.numpy() for v, g in zip(head, g_head)])
    assert max(np.abs(g.numpy()).max() for g in g_trunk) > 1e-4
    trainer.step((x, {"domain": y["ctr"]}))
    for v, e in zip(trunk + head, expected):
        np.testing.assert_allclose(v.numpy(), e, rtol=1e-6, atol=1e-7)


def test_a_trunk_scale_schedule_is_read_at_each_step():
    # A callable of the step: 0 at step 0 (no trunk change from SGD), 1 from step 1 on.
    model = _model(heads=("domain",), seed=4)
    trainer = mh.Trainer(model, {"domain": mh.Objective(
        "binary_crossentropy", keras.optimizers.SGD(0.1),
        trunk_scale=lambda step: tf.minimum(tf.cast(step, tf.float32), 1.0))})
    x, y = _batch(3)
    trunk = _values(model.trunk_variables)
    trainer.step((x, {"domain": y["ctr"]}))
    for before, after in zip(trunk, _values(model.trunk_variables)):
        np.testing.assert_array_equal(before, after)
    trainer.step((x, {"domain": y["ctr"]}))
    assert any(not np.array_equal(b, a) for b, a in zip(trunk, _values(model.trunk_variables)))


def test_evaluate_reports_a_standalone_objective_on_its_combined_prediction():
    model = _model()
    trainer = _esmm(model)
    x, y = _batch(5, n=40)
    results = trainer.evaluate((x, y), batch_size=16)
    out = model.predict(x)
    p = np.clip(out["ctr"] * out["cvr"], 1e-7, 1 - 1e-7)
    expected = -np.mean(y["ctcvr"] * np.log(p) + (1 - y["ctcvr"]) * np.log(1 - p))
    assert set(results) == {"ctr", "ctcvr"}
    np.testing.assert_allclose(results["ctcvr"]["loss"], expected, rtol=1e-5)


def test_a_checkpoint_holds_each_objectives_optimizer_and_resumes_bitwise(tmp_path):
    x, y = _batch(6)

    def esmm_trainer(seed):
        return mh.Trainer(_model(seed=seed), {
            "ctr": mh.Objective("binary_crossentropy", keras.optimizers.Adam(1e-2)),
            "ctcvr": mh.Objective("binary_crossentropy", keras.optimizers.Adam(1e-2),
                                  reads=("ctr", "cvr"), combine="product",
                                  trains=("trunk", "heads/ctr", "heads/cvr"))})

    runs = []
    for restore in (False, True):
        trainer = esmm_trainer(seed=7)
        trainer.step((x, y))
        if restore:
            save_checkpoint(tmp_path / "ckpt", trainer.model, trainer=trainer)
            trainer = esmm_trainer(seed=8)
            restore_checkpoint(tmp_path / "ckpt", trainer.model, trainer=trainer)
        model = trainer.model
        trainer.step((x, y))
        runs.append(_values(model.trainable_variables + trainer.optimizers["ctcvr"].variables))
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)


def test_trunk_aggregation_combines_the_objectives_that_train_the_trunk():
    # trunk "sum" with SGD: the trunk moves by lr * (g_ctr + g_ctcvr) on the trunk.
    model = _model(seed=9)
    trainer = mh.Trainer(model, {
        "ctr": mh.Objective("binary_crossentropy", keras.optimizers.SGD(0.1)),
        "ctcvr": mh.Objective("binary_crossentropy", keras.optimizers.SGD(0.1),
                              reads=("ctr", "cvr"), combine="product",
                              trains=("trunk", "heads/ctr", "heads/cvr"))},
        trunk={"optimizer": {"class_name": "SGD", "config": {"learning_rate": 0.1}},
               "aggregator": "sum"})
    x, y = _batch(7)
    bce = keras.losses.BinaryCrossentropy()
    with tf.GradientTape(persistent=True) as tape:
        out = model(x, training=True)
        losses = [bce(y["ctr"], out["ctr"]), bce(y["ctcvr"], out["ctr"] * out["cvr"])]
    trunk_grads = [tape.gradient(loss, model.trunk_variables) for loss in losses]
    before = _values(model.trunk_variables)
    trainer.step((x, y))
    for i, (b, v) in enumerate(zip(before, model.trunk_variables)):
        np.testing.assert_allclose(v.numpy(), b - 0.1 * (trunk_grads[0][i] + trunk_grads[1][i]),
                                   rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("objectives,message", [
    ({"ctr": mh.Objective("mse"), "x": mh.Objective("mse")},
     "objective 'x' is not named for a head"),
    ({"ctr": mh.Objective("mse"), "cvr": mh.Objective("mse", reads=("ctr", "nope"), combine="sum")},
     "objective 'cvr': reads unknown output 'nope'"),
    ({"ctr": mh.Objective("mse"), "cvr": mh.Objective("mse", reads=("ctr", "cvr"))},
     "objective 'cvr': reads \\['ctr', 'cvr'\\]: give combine="),
    ({"ctr": mh.Objective("mse")},
     "head 'cvr' has no objective"),
    ({"ctr": mh.Objective("mse"), "cvr": mh.Objective("mse", trains=("heads/cvr", "heads/zzz"))},
     "objective 'cvr': trains unknown part 'heads/zzz'"),
])
def test_bad_objectives_get_one_line_naming_them(objectives, message):
    with pytest.raises(ValueError, match=message) as err:
        mh.Trainer(_model(), objectives).build_optimizers()
    assert "\n" not in str(err.value)


def test_a_combine_that_ignores_a_read_output_is_refused_at_the_first_batch():
    trainer = mh.Trainer(_model(), {
        "ctr": mh.Objective("mse"),
        "both": mh.Objective("mse", reads=("ctr", "cvr"), combine=lambda o: o["ctr"] * 2.0,
                             trains=("heads/ctr", "heads/cvr"))})
    x, y = _batch()
    with pytest.raises(ValueError, match="objective 'both': its combine does not depend on 'cvr'"):
        trainer.step((x, {"ctr": y["ctr"], "both": y["ctcvr"]}))


def test_two_objectives_sharing_one_optimizer_object_are_refused():
    shared = keras.optimizers.Adam()
    with pytest.raises(ValueError, match="'ctr' and 'both' were given the same optimizer object"):
        mh.Trainer(_model(), {
            "ctr": mh.Objective("mse", shared),
            "both": mh.Objective("mse", shared, reads=("ctr", "cvr"), combine="sum")})


def test_an_empty_part_is_refused_naming_the_objective():
    model = mh.MultiHeadModel(keras.layers.Dense(4), {"a": keras.layers.Dense(1),
                                                      "b": keras.layers.Lambda(lambda t: t[:, :1])})
    model.build((None, 3))
    with pytest.raises(ValueError, match="objective 'b': trains part 'heads/b', which holds no "
                                         "trainable variable"):
        mh.Trainer(model, {"a": mh.Objective("mse"),
                           "b": mh.Objective("mse", trains=("heads/b",))})


def test_a_nonfinite_standalone_objective_is_skipped_and_the_others_proceed():
    # The ctcvr loss is NaN (a NaN label): its update is dropped, ctr's is the plain one.
    model, reference = _model(seed=11), _model(seed=11)
    trainer = _esmm(model)
    alone = mh.Trainer(reference, {"ctr": mh.Objective("binary_crossentropy",
                                                       keras.optimizers.SGD(0.1)),
                                   "cvr": mh.Objective("mse", keras.optimizers.SGD(0.0),
                                                       trains_trunk=False)})
    x, y = _batch(8)
    y["ctcvr"][0, 0] = np.nan
    result = trainer.step((x, y))
    alone.step((x, {"ctr": y["ctr"], "cvr": y["ctr"]}))
    assert result.updated == ("ctr",) and result.skipped == ("ctcvr",)
    for a, b in zip(model.trainable_variables, reference.trainable_variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_the_sequential_schedule_updates_objectives_one_after_another():
    # Sequential: ctcvr's gradient is taken at the parameters ctr's update left.
    model = _model(seed=12)
    trainer = mh.Trainer(model, {
        "ctr": mh.Objective("binary_crossentropy", keras.optimizers.SGD(0.1)),
        "ctcvr": mh.Objective("binary_crossentropy", keras.optimizers.SGD(0.1),
                              reads=("ctr", "cvr"), combine="product")}, schedule="sequential")
    x, y = _batch(9)
    bce = keras.losses.BinaryCrossentropy()
    with tf.GradientTape() as tape:
        loss = bce(y["ctr"], model(x, training=True)["ctr"])
    variables = model.var_list("ctr")
    for v, g in zip(variables, tape.gradient(loss, variables)):
        v.assign_sub(0.1 * g)
    every = model.trunk_variables + model.head_variables("ctr") + model.head_variables("cvr")
    with tf.GradientTape() as tape:
        out = model(x, training=True)
        loss = bce(y["ctcvr"], out["ctr"] * out["cvr"])
    expected = [v.numpy() - 0.1 * g.numpy() for v, g in zip(every, tape.gradient(loss, every))]
    for v, w in zip(model.trainable_variables, _model(seed=12).trainable_variables):
        v.assign(w)  # back to the start, then the trainer's step
    assert trainer.step((x, y)).updated == ("ctr", "ctcvr")
    for v, e in zip(every, expected):
        np.testing.assert_allclose(v.numpy(), e, rtol=1e-5, atol=1e-7)


def test_tensorboard_logs_each_objective_and_the_parts_it_trains(tmp_path):
    # ESMM's ctcvr trains the trunk and two heads: its loss, trunk norm, and one norm per head
    # part are logged, each equal to the hand-written tape's; its trunk gradient meets ctr's
    # in grad_cosine.
    from test_monitor import read_events  # noqa: PLC0415 - the shared event reader

    model = _model(seed=13)
    trainer = mh.Trainer(model, {
        "ctr": mh.Objective("binary_crossentropy", keras.optimizers.SGD(0.1)),
        "ctcvr": mh.Objective("binary_crossentropy", keras.optimizers.SGD(0.1),
                              reads=("ctr", "cvr"), combine="product")},
        log_dir=tmp_path, log_every=1)
    x, y = _batch(10)
    bce = keras.losses.BinaryCrossentropy()
    with tf.GradientTape(persistent=True) as tape:
        out = model(x, training=True)
        l_ctr, l_ctcvr = bce(y["ctr"], out["ctr"]), bce(y["ctcvr"], out["ctr"] * out["cvr"])
    trunk = model.trunk_variables
    g = {name: tape.gradient(loss, trunk + model.head_variables("ctr") + model.head_variables("cvr"))
         for name, loss in [("ctr", l_ctr), ("ctcvr", l_ctcvr)]}
    trainer.step((x, y))
    trainer.close()
    logged = {tag: values[1] for tag, values in read_events(str(tmp_path / "train")).items()
              if 1 in values}
    n, n_ctr = len(trunk), len(model.head_variables("ctr"))

    def norm(grads):
        return float(np.sqrt(sum(np.sum(np.square(t.numpy())) for t in grads)))

    np.testing.assert_allclose(logged["loss/ctcvr"], l_ctcvr.numpy(), rtol=1e-6)
    np.testing.assert_allclose(logged["grad_norm/ctcvr/trunk"], norm(g["ctcvr"][:n]), rtol=1e-5)
    np.testing.assert_allclose(logged["grad_norm/ctcvr/part/heads/ctr"],
                               norm(g["ctcvr"][n:n + n_ctr]), rtol=1e-5)
    np.testing.assert_allclose(logged["grad_norm/ctcvr/part/heads/cvr"],
                               norm(g["ctcvr"][n + n_ctr:]), rtol=1e-5)
    np.testing.assert_allclose(logged["grad_norm/ctcvr/head"], norm(g["ctcvr"][n:]), rtol=1e-5)
    a = np.concatenate([t.numpy().ravel() for t in g["ctr"][:n]])
    b = np.concatenate([t.numpy().ravel() for t in g["ctcvr"][:n]])
    np.testing.assert_allclose(logged["grad_cosine/ctr/ctcvr"],
                               a @ b / np.linalg.norm(a) / np.linalg.norm(b), rtol=1e-5)
    assert "grad_norm/ctr/part/heads/ctr" not in logged  # one head: its /head norm says it


def test_user_callables_inside_the_step_may_branch_in_python_on_tensors():
    """The step's own code is traced without autograph; the user's code inside it is converted:
    a weight schedule, a trunk_scale schedule and a `combine` that branch in Python on tensors
    train bitwise as their branch-free equivalents."""
    def weight(step):
        if step < 2:  # a tensor: needs autograph
            return 0.5
        return 1.0

    def trunk_scale(step):
        if step % 2 == 0:
            return 1.0
        return 0.25

    def combine(outputs):
        product = outputs["ctr"] * outputs["cvr"]
        if tf.reduce_max(product) > 2.0:  # never true for sigmoids: the product as is
            return product * 0.0
        return product

    def trainer(model, branching):
        plain_weight = lambda step: tf.where(step < 2, 0.5, 1.0)  # noqa: E731
        plain_scale = lambda step: tf.where(step % 2 == 0, 1.0, 0.25)  # noqa: E731
        return mh.Trainer(model, {
            "ctr": mh.Objective("binary_crossentropy", keras.optimizers.SGD(0.1),
                                weight=weight if branching else plain_weight,
                                trunk_scale=trunk_scale if branching else plain_scale),
            "ctcvr": mh.Objective("binary_crossentropy", keras.optimizers.SGD(0.1),
                                  reads=("ctr", "cvr"),
                                  combine=combine if branching else (lambda o: o["ctr"] * o["cvr"]),
                                  trains=("trunk", "heads/ctr", "heads/cvr")),
        })

    ours, reference = trainer(_model(seed=4), True), trainer(_model(seed=4), False)
    for s in range(4):
        ours.step(_batch(seed=s))
        reference.step(_batch(seed=s))
    for a, b in zip(ours.model.weights, reference.model.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert any(not np.array_equal(a.numpy(), b.numpy())
               for a, b in zip(ours.model.weights, _model(seed=4).weights))
