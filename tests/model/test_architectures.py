"""Architectures that route heads: each forward pass against a numpy implementation of
the paper's equations, serialization, and the partition into shared and owned variables."""

import keras
import numpy as np
import pytest

import multihead as mh
from multihead.model.dselect import smooth_step

HEADS = ["a", "b"]
RNG = np.random.default_rng(0)


def _np(v):
    return np.asarray(v.numpy(), np.float64)


def _relu(x):
    return np.maximum(x, 0.0)


def _softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _experts(layer, x):
    """Expert i's MLP, one expert at a time (the reference loops where the layer batches)."""
    outs = []
    for i in range(layer.n):
        h = x if x.ndim == 2 else x[:, i]
        for dense in layer.stack:
            h = _relu(h @ _np(dense.kernel)[:, i] + _np(dense.bias)[i])
        outs.append(h)
    return np.stack(outs, axis=1)


def _gate(dense, x):  # softmax(W x), no bias
    return _softmax(x @ _np(dense.kernel))


def _mix(g, e):
    return np.sum(g[:, :, None] * e, axis=1)


def _model(trunk, input_shape):
    heads = {h: keras.Sequential([keras.layers.Flatten(), keras.layers.Dense(1)]) for h in HEADS}
    model = mh.MultiHeadModel(trunk, heads)
    model.build(input_shape)
    return model


def _check(trunk, x, expected):
    out = trunk(x.astype("float32"))
    assert sorted(out) == sorted(expected)
    for h in expected:
        np.testing.assert_allclose(out[h].numpy(), expected[h], atol=1e-6, rtol=0)


def test_mmoe_forward_is_the_papers_mixture_per_gate():
    trunk = mh.MMoE(HEADS, experts=4, expert_units=[6, 5])
    _model(trunk, (None, 3))
    x = RNG.normal(size=(7, 3))
    e = _experts(trunk.experts, x)  # f_i(x)
    # y_k = sum_i softmax(W_k x)_i f_i(x), one gate per task
    _check(trunk, x, {h: _mix(_gate(trunk.gates[k], x), e) for k, h in enumerate(HEADS)})


def test_omoe_forward_is_one_gate_for_all_heads():
    trunk = mh.OMoE(HEADS, experts=3, expert_units=[4])
    _model(trunk, (None, 3))
    x = RNG.normal(size=(5, 3))
    y = _mix(_gate(trunk.gates[0], x), _experts(trunk.experts, x))
    _check(trunk, x, {h: y for h in HEADS})


@pytest.mark.parametrize("levels", [1, 2, 3])
def test_ple_forward_is_progressive_extraction(levels):
    trunk = (mh.CGC(HEADS, shared_experts=2, task_experts=3, expert_units=[4]) if levels == 1 else
             mh.PLE(HEADS, shared_experts=2, task_experts=3, expert_units=[4], levels=levels))
    _model(trunk, (None, 3))
    x = RNG.normal(size=(5, 3))
    k = len(HEADS)
    xs, xt = x, [x] * k
    for j in range(levels):
        shared = _experts(trunk.shared_stacks[j], xs)
        own = [_experts(trunk.task_stacks[j * k + t], xt[t]) for t in range(k)]
        # task gate over [own experts, shared experts], from the task's own input
        new_t = [_mix(_gate(trunk.task_gates[j * k + t], xt[t]),
                      np.concatenate([own[t], shared], 1)) for t in range(k)]
        if j < levels - 1:  # shared gate over every expert of the level
            xs = _mix(_gate(trunk.shared_gates[j], xs), np.concatenate(own + [shared], 1))
        xt = new_t
    _check(trunk, x, dict(zip(HEADS, xt)))


def _np_smooth_step(t, gamma):
    out = np.where(t <= -gamma / 2, 0.0, np.where(t >= gamma / 2, 1.0, 0.0))
    mid = (t > -gamma / 2) & (t < gamma / 2)
    return np.where(mid, -2 / gamma ** 3 * t ** 3 + 3 / (2 * gamma) * t + 0.5, out)


def test_smooth_step_matches_its_definition():
    t = np.linspace(-2, 2, 41)
    np.testing.assert_allclose(smooth_step(t.astype("float32"), 1.5).numpy(), _np_smooth_step(t, 1.5),
                               atol=1e-6)


def test_dselect_k_forward_is_the_papers_selector_mixture():
    trunk = mh.DSelectK(HEADS, experts=4, k=2, expert_units=[5], gamma=1.0)
    _model(trunk, (None, 3))
    for gate in trunk.gates:  # logits spread over the whole smooth step, not only its middle
        gate.selector_logits.kernel.assign(RNG.normal(size=gate.selector_logits.kernel.shape))
        gate.selector_weights.kernel.assign(RNG.normal(size=gate.selector_weights.kernel.shape))
    x = RNG.normal(size=(6, 3))
    e = _experts(trunk.experts, x)
    expected = {}
    for t, h in enumerate(HEADS):
        gate = trunk.gates[t]
        z = (x @ _np(gate.selector_logits.kernel) + _np(gate.selector_logits.bias)).reshape(6, 2, 2)
        a = _softmax(x @ _np(gate.selector_weights.kernel) + _np(gate.selector_weights.bias))
        s = _np_smooth_step(z, 1.0)
        w = np.zeros((6, 4))
        for i in range(2):  # selector i
            for j in range(4):  # expert j, by its binary code
                r = np.ones(6)
                for bit in range(2):
                    r *= s[:, i, bit] if (j >> bit) & 1 else 1 - s[:, i, bit]
                w[:, j] += a[:, i] * r
        np.testing.assert_allclose(w.sum(1), 1.0, atol=1e-12)  # a distribution over experts
        expected[h] = _mix(w, e)
    _check(trunk, x, expected)


def test_dselect_k_needs_a_power_of_two_experts():
    with pytest.raises(ValueError, match="DSelectK.experts: must be a power of two"):
        mh.DSelectK(HEADS, experts=6, k=2, expert_units=[4])


def test_cross_stitch_forward_mixes_columns_by_the_stitch_units():
    trunk = mh.CrossStitch(HEADS, units=[4, 3])
    _model(trunk, (None, 3))
    for s in trunk.stitches:
        s.assign(RNG.normal(size=(2, 2)))
    x = RNG.normal(size=(5, 3))
    xs = [x, x]
    for l, stitch in enumerate(trunk.stitches):
        h = [_relu(xs[t] @ _np(trunk.columns[l * 2 + t].kernel) + _np(trunk.columns[l * 2 + t].bias))
             for t in range(2)]
        a = _np(stitch)
        xs = [a[k, 0] * h[0] + a[k, 1] * h[1] for k in range(2)]
    _check(trunk, x, dict(zip(HEADS, xs)))


def _conv(x, layer, act):
    """'same' convolution, stride 1, by sums over kernel offsets."""
    w, b = _np(layer.kernel), _np(layer.bias)
    kh, kw = w.shape[:2]
    ph, pw = kh // 2, kw // 2
    padded = np.pad(x, [(0, 0), (ph, kh - 1 - ph), (pw, kw - 1 - pw), (0, 0)])
    out = np.zeros(x.shape[:3] + (w.shape[3],))
    for i in range(kh):
        for j in range(kw):
            out += padded[:, i:i + x.shape[1], j:j + x.shape[2], :] @ w[i, j]
    out += b
    return {"relu": _relu, "sigmoid": lambda v: 1 / (1 + np.exp(-v)), "linear": lambda v: v}[act](out)


def _pool(x):
    b, h, w, c = x.shape
    return x.reshape(b, h // 2, 2, w // 2, 2, c).max(axis=(2, 4))


def test_mtan_forward_is_attention_over_the_shared_backbone():
    trunk = mh.MTAN(HEADS, channels=[3, 4])
    _model(trunk, (None, 8, 8, 2))
    x = RNG.normal(size=(2, 8, 8, 2))
    k, feats, att = 2, x, [None, None]
    for j in range(2):
        u = _conv(feats, trunk.first[j], "relu")
        p = _conv(u, trunk.second[j], "relu")
        for t in range(k):
            i = j * k + t
            src = u if att[t] is None else np.concatenate([u, att[t]], -1)
            mask = _conv(_conv(src, trunk.mask_hidden[i], "relu"), trunk.mask_out[i], "sigmoid")
            att[t] = _pool(_conv(mask * p, trunk.project[i], "relu"))
        feats = _pool(p)
    _check(trunk, x, dict(zip(HEADS, att)))


ALL = [
    (lambda: mh.MMoE(HEADS, 4, [5]), (None, 3)),
    (lambda: mh.OMoE(HEADS, 4, [5]), (None, 3)),
    (lambda: mh.CGC(HEADS, 2, 2, [5]), (None, 3)),
    (lambda: mh.PLE(HEADS, 2, 2, [5], levels=2), (None, 3)),
    (lambda: mh.DSelectK(HEADS, 4, 2, [5], entropy_reg=0.1), (None, 3)),
    (lambda: mh.CrossStitch(HEADS, [5, 4]), (None, 3)),
    (lambda: mh.MTAN(HEADS, [3, 4]), (None, 4, 4, 2)),
    (lambda: mh.MTAN(HEADS, [3], batch_norm=True), (None, 4, 4, 2)),
]


@pytest.mark.parametrize("make,shape", ALL,
                         ids=[m().__class__.__name__ + str(i) for i, (m, _) in enumerate(ALL)])
def test_partition_and_keras_round_trip(make, shape, tmp_path):
    model = _model(make(), shape)
    owned = model.trunk.head_owned_layers()
    shared = {id(v) for v in model.trunk_variables}
    for h in HEADS:
        own = [v for layer in owned[h] for v in layer.trainable_variables]
        # var_list(h) = shared trunk variables + h's layer + what the trunk owns for h
        assert [id(v) for v in model.var_list(h)] == (
            [id(v) for v in model.trunk_variables]
            + [id(v) for v in model.heads[h].trainable_variables] + [id(v) for v in own])
        assert not shared & {id(v) for v in own}
    x = np.random.default_rng(1).normal(size=(2,) + shape[1:]).astype("float32")
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    for h in HEADS:
        np.testing.assert_array_equal(loaded(x)[h].numpy(), model(x)[h].numpy())


@pytest.mark.parametrize("make,shape", ALL,
                         ids=[m().__class__.__name__ + str(i) for i, (m, _) in enumerate(ALL)])
def test_each_architecture_trains_a_step_with_finite_losses(make, shape):
    """Every architecture trains in a Trainer step (the fact each shipped config's CLI run, under
    -m slow in tests/experiments/test_architecture_configs.py, shows end to end)."""
    model = _model(make(), shape)
    x = RNG.normal(size=(6,) + shape[1:]).astype("float32")
    y = {h: RNG.normal(size=(6, 1)).astype("float32") for h in HEADS}
    before = {h: [v.numpy() for v in model.heads[h].trainable_variables] for h in HEADS}
    trainer = mh.Trainer(model, {h: mh.Objective("mse", keras.optimizers.SGD(0.1)) for h in HEADS})
    result = trainer.step((x, y))
    for h in HEADS:
        assert np.isfinite(float(result.losses[h])), h
        assert all(np.all(np.isfinite(v.numpy())) for v in model.var_list(h)), h
        assert any(not np.array_equal(v.numpy(), b)
                   for v, b in zip(model.heads[h].trainable_variables, before[h])), h


def test_trunk_must_route_the_models_heads():
    with pytest.raises(ValueError, match=r"routes heads \['a', 'b'\].*build the trunk with heads=\['a', 'c'\]"):
        mh.MultiHeadModel(mh.MMoE(HEADS, 2, [3]), {"a": keras.layers.Dense(1), "c": keras.layers.Dense(1)})


def test_a_layer_owned_for_two_heads_is_an_error_naming_it():
    class Twice(mh.MMoE):
        def head_owned_layers(self):
            return {"a": [self.gates[0]], "b": [self.gates[0], self.gates[1]]}

    model = _model(Twice(HEADS, 2, [3]), (None, 3))
    with pytest.raises(ValueError, match=r"variable '.*kernel.*' is owned by head 'a' and head 'b'"):
        model.partition


def _np_selectors(gate, x, gamma):
    """DSelect-k's single-expert selectors r (batch, k, n) for gate `gate` on x."""
    b, k, m = x.shape[0], gate.k, gate.bits
    z = (x @ _np(gate.selector_logits.kernel) + _np(gate.selector_logits.bias)).reshape(b, k, m)
    s = _np_smooth_step(z, gamma)
    r = np.ones((b, k, 2 ** m))
    for j in range(2 ** m):
        for bit in range(m):
            r[:, :, j] *= s[:, :, bit] if (j >> bit) & 1 else 1 - s[:, :, bit]
    return r


def _spread_selectors(trunk):
    for gate in trunk.gates:  # logits over the whole smooth step, not only its middle
        gate.selector_logits.kernel.assign(RNG.normal(size=gate.selector_logits.kernel.shape))


def test_dselect_k_entropy_regulariser_is_the_authors_and_belongs_to_the_gates_head():
    from multihead.model.network import trunk_losses

    trunk = mh.DSelectK(HEADS, experts=4, k=2, expert_units=[5], entropy_reg=0.5)
    _model(trunk, (None, 3))
    _spread_selectors(trunk)
    x = RNG.normal(size=(6, 3))
    trunk(x.astype("float32"), training=True)
    shared, owned = trunk_losses(trunk)
    assert shared == []
    for t, h in enumerate(HEADS):
        r = _np_selectors(trunk.gates[t], x, 1.0)
        # 0.5 * -sum_{b,i,j} r log(r + 1e-6), summed over the batch as the authors' code does
        expected = 0.5 * -np.sum(r * np.log(r + 1e-6))
        assert len(owned[h]) == 1
        np.testing.assert_allclose(float(owned[h][0]), expected, rtol=1e-5)
    trunk(x.astype("float32"), training=False)
    assert trunk.losses == []  # inference adds no regulariser
    off = mh.DSelectK(HEADS, experts=4, k=2, expert_units=[5])
    _model(off, (None, 3))
    off(x.astype("float32"), training=True)
    assert off.losses == []  # the default, as the authors' gate: none


@pytest.mark.parametrize("trains_trunk", [True, False])
def test_a_step_adds_a_gates_regulariser_to_its_own_heads_objective_only(trains_trunk):
    import tensorflow as tf

    keras.utils.set_random_seed(3)
    trunk = mh.DSelectK(HEADS, experts=4, k=2, expert_units=[5], entropy_reg=0.5)
    model = _model(trunk, (None, 3))
    _spread_selectors(trunk)
    x = RNG.normal(size=(8, 3)).astype("float32")
    y = {h: RNG.normal(size=(8, 1)).astype("float32") for h in HEADS}
    # reference: head h's gradient of mse_h + 0.5 * entropy of h's own gate, by hand
    expected = {}
    for t, h in enumerate(HEADS):
        gate = trunk.gates[t]
        with tf.GradientTape() as tape:
            out = model(x, training=True)
            objective = tf.reduce_mean(tf.square(y[h] - out[h])) + tf.add_n(gate.losses)
        grads = tape.gradient(objective, gate.trainable_variables)
        expected[h] = [v.numpy() - 0.1 * g.numpy() for v, g in zip(gate.trainable_variables, grads)]
    trainer = mh.Trainer(model, {"a": mh.Objective("mse", keras.optimizers.SGD(0.1)),
                                 "b": mh.Objective("mse", keras.optimizers.SGD(0.1),
                                                   trains_trunk=trains_trunk)})
    trainer.step((x, y))
    for t, h in enumerate(HEADS):
        for v, e in zip(trunk.gates[t].trainable_variables, expected[h]):
            np.testing.assert_allclose(v.numpy(), e, atol=1e-6)


def _np_bn(x, gamma, beta, mean, var):
    return gamma * (x - mean) / np.sqrt(var + 1e-5) + beta


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


@pytest.mark.parametrize("training", [False, True])
def test_mtan_with_batch_norm_is_conv_bn_act_in_both_modes(training):
    trunk = mh.MTAN(HEADS, channels=[3, 4], batch_norm=True)
    _model(trunk, (None, 8, 8, 2))
    norms = (trunk.first_norm + trunk.second_norm + trunk.mask_hidden_norm + trunk.mask_out_norm
             + trunk.project_norm)
    for bn in norms:  # moving statistics and scale/offset away from their initial 0/1
        c = bn.gamma.shape[0]
        bn.gamma.assign(RNG.uniform(0.5, 1.5, c)), bn.beta.assign(RNG.normal(size=c))
        bn.moving_mean.assign(RNG.normal(size=c)), bn.moving_variance.assign(RNG.uniform(0.5, 2, c))
    before = {id(bn): (_np(bn.moving_mean), _np(bn.moving_variance)) for bn in norms}
    x = RNG.normal(size=(3, 8, 8, 2))

    def block(inp, conv, bn, act):
        y = _conv(inp, conv, "linear")
        mm, mv = before[id(bn)]
        if training:  # batch statistics over (batch, height, width), biased variance
            mean, var = y.mean((0, 1, 2)), y.var((0, 1, 2))
            # the moving statistics move by momentum 0.9
            np.testing.assert_allclose(_np(bn.moving_mean), 0.9 * mm + 0.1 * mean, atol=1e-5)
            np.testing.assert_allclose(_np(bn.moving_variance), 0.9 * mv + 0.1 * var, atol=1e-5)
        else:
            mean, var = mm, mv
        return act(_np_bn(y, _np(bn.gamma), _np(bn.beta), mean, var))

    out = trunk(x.astype("float32"), training=training)
    k, feats, att = 2, x, [None, None]
    for j in range(2):
        u = block(feats, trunk.first[j], trunk.first_norm[j], _relu)
        p = block(u, trunk.second[j], trunk.second_norm[j], _relu)
        for t in range(k):
            i = j * k + t
            src = u if att[t] is None else np.concatenate([u, att[t]], -1)
            hidden = block(src, trunk.mask_hidden[i], trunk.mask_hidden_norm[i], _relu)
            mask = block(hidden, trunk.mask_out[i], trunk.mask_out_norm[i], _sigmoid)
            att[t] = _pool(block(mask * p, trunk.project[i], trunk.project_norm[i], _relu))
        feats = _pool(p)
    for h, expected in zip(HEADS, att):
        np.testing.assert_allclose(out[h].numpy(), expected, atol=1e-5, rtol=0)
    if not training:
        for bn in norms:  # inference leaves the moving statistics alone
            np.testing.assert_array_equal(_np(bn.moving_mean), before[id(bn)][0])


def test_mtan_batch_norm_layers_of_an_attention_module_belong_to_its_head():
    model = _model(mh.MTAN(HEADS, channels=[3], batch_norm=True), (None, 4, 4, 2))
    trunk = model.trunk
    own_a = {id(v) for v in model.head_variables("a")}
    for bn in trunk.mask_hidden_norm[:1] + trunk.mask_out_norm[:1] + trunk.project_norm[:1]:
        assert {id(bn.gamma), id(bn.beta)} <= own_a  # trained by a's optimizer
    shared = {id(v) for v in model.trunk_variables}
    assert {id(trunk.first_norm[0].gamma), id(trunk.second_norm[0].beta)} <= shared
    # the moving statistics (not trainable) are saved and copied with the head's part
    owned_weights = {id(w) for layer in trunk.head_owned_layers()["a"] for w in layer.weights}
    assert id(trunk.project_norm[0].moving_variance) in owned_weights


def test_weight_regularizers_of_a_routing_trunk_split_as_its_variables():
    from multihead.model.network import trunk_losses

    trunk = mh.MMoE(HEADS, experts=3, expert_units=[4])
    _model(trunk, (None, 3))
    expert, gate_a = trunk.experts.stack[0].kernel, trunk.gates[0].kernel
    expert.regularizer = keras.regularizers.L2(0.1)
    gate_a.regularizer = keras.regularizers.L2(0.2)
    shared, owned = trunk_losses(trunk)
    # L2(l)(w) = l * sum(w^2): the experts' to the shared part, a's gate to head a only
    np.testing.assert_allclose([float(v) for v in shared], [0.1 * np.sum(_np(expert) ** 2)], rtol=1e-6)
    np.testing.assert_allclose([float(v) for v in owned["a"]], [0.2 * np.sum(_np(gate_a) ** 2)], rtol=1e-6)
    assert owned["b"] == []


def test_mtan_batch_norm_trains_with_batch_statistics_and_predicts_with_moving_ones():
    keras.utils.set_random_seed(4)
    model = _model(mh.MTAN(HEADS, channels=[2], batch_norm=True), (None, 4, 4, 1))
    norms = model.trunk.first_norm + model.trunk.project_norm
    x = RNG.normal(size=(6, 4, 4, 1)).astype("float32")
    trainer = mh.Trainer(model, {h: mh.Objective("mse", "sgd") for h in HEADS})
    before = [bn.moving_mean.numpy().copy() for bn in norms]
    trainer.step((x, {h: np.zeros((6, 1), "float32") for h in HEADS}))
    # the step calls the trunk with training=True: the moving statistics moved
    assert all(not np.array_equal(bn.moving_mean.numpy(), b) for bn, b in zip(norms, before))
    after = [bn.moving_mean.numpy().copy() for bn in norms]
    predicted = model.predict(x)
    # predict uses training=False: the moving statistics, left unchanged
    assert all(np.array_equal(bn.moving_mean.numpy(), a) for bn, a in zip(norms, after))
    for h in HEADS:
        np.testing.assert_allclose(predicted[h], model(x, training=False)[h].numpy(), atol=1e-6)


@pytest.mark.parametrize("make,shape", ALL,
                         ids=[m().__class__.__name__ + str(i) for i, (m, _) in enumerate(ALL)])
def test_a_checkpoint_restores_every_weight_into_a_fresh_model(make, shape, tmp_path):
    # Keras 3 keeps list attributes (gates, expert stacks, columns, stitch units) in lists
    # TensorFlow's object graph does not follow: every weight must reach the file anyway.
    keras.utils.set_random_seed(1)
    src = _model(make(), shape)
    for w in src.weights:  # nothing left at a shared initial value (zero biases, BN's 0/1)
        w.assign(RNG.normal(size=w.shape).astype("float32") ** 2 + 0.5)
    keras.utils.set_random_seed(2)
    dst = _model(make(), shape)
    path = mh.save_checkpoint(str(tmp_path / "ckpt"), src)
    mh.restore_checkpoint(path, dst)
    assert len(src.weights) == len(dst.weights)
    for s, d in zip(src.weights, dst.weights):
        np.testing.assert_array_equal(d.numpy(), s.numpy())
