"""The aggregated trunk update against a hand-written GradientTape reference."""

import glob
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import multihead as mh
from conftest import make_batch, make_model, weights
from multihead.experiments.build.builders import build_trunk
from multihead.experiments.config.schema import ConfigError, load_config
from multihead.step.trunk_update import _PAIRWISE_MAX_HEADS

HEADS = ("a", "b", "c")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _head_opts(heads=HEADS):
    return {h: keras.optimizers.Adam(1e-2) for h in heads}


def _trunk_opt():
    return keras.optimizers.SGD(0.05, momentum=0.9)


def _mse(y, pred):
    return tf.reduce_mean(tf.square(y - pred))


def _flat(grads, variables):
    return tf.concat([tf.reshape(g if g is not None else tf.zeros_like(v), [-1])
                      for g, v in zip(grads, variables)], 0)


def _unflat(vector, variables):
    out, i = [], 0
    for v in variables:
        n = int(np.prod(v.shape))
        out.append(tf.reshape(vector[i:i + n], v.shape))
        i += n
    return out


def _reference(model, name, options, batches, rep_grad=False, seed=0, head_names=HEADS):
    """By hand: one persistent tape, each head's trunk gradient flattened into a K x D matrix
    (or K x (batch*features) at the trunk output), `mh.aggregate` on it, one trunk optimizer
    on the trunk variables and one Adam per head on the head's variables."""
    heads, trunk_opt = _head_opts(head_names), _trunk_opt()
    k = len(head_names)
    trunk_vars = model.trunk_variables
    for h in head_names:
        heads[h].build(model.head_variables(h))
    trunk_opt.build(trunk_vars)
    rng = tf.random.Generator.from_seed(seed)
    state = None  # a stateful aggregator's state, carried from step to step
    for x, y in batches:
        with tf.GradientTape(persistent=True) as tape:
            feats = model.trunk(x, training=True)
            losses = {h: _mse(y[h], model.heads[h](feats, training=True)) for h in head_names}
        extra = {}
        if name in ("pcgrad", "gradvac"):
            extra["order"] = tf.argsort(rng.uniform([k, k]), axis=1)
        if name == "random":
            extra["noise"] = rng.normal([k])
        if name == "graddrop":  # one uniform draw per coordinate, variable by variable
            extra["noise"] = tf.concat([rng.uniform([int(np.prod(v.shape))]) for v in trunk_vars], 0)
        if rep_grad:
            g = tf.stack([tf.reshape(tape.gradient(losses[h], feats), [-1]) for h in head_names])
            w = mh.aggregate(g, name, **options, **extra).weights
            combined = tf.reshape(tf.linalg.matvec(g, w, transpose_a=True), feats.shape)
            trunk_grads = tape.gradient(feats, trunk_vars, output_gradients=combined)
        else:
            g = tf.stack([_flat(tape.gradient(losses[h], trunk_vars), trunk_vars) for h in head_names])
            result = mh.aggregate(g, name, state=state, **options, **extra)
            state = result.state
            trunk_grads = _unflat(result.direction, trunk_vars)
        for h in head_names:
            head_vars = model.head_variables(h)
            heads[h].apply_gradients(zip(tape.gradient(losses[h], head_vars), head_vars))
        trunk_opt.apply_gradients(zip(trunk_grads, trunk_vars))
        del tape


CASES = [
    ("sum", {}, False), ("mean", {}, False), ("weights", {"weights": [0.2, 1.0, 3.0]}, False),
    ("pcgrad", {}, False), ("mgda", {}, False), ("cagrad", {"c": 0.5}, False),
    ("upgrad", {}, False), ("imtl", {}, False),
    ("mean", {}, True), ("mgda", {}, True), ("imtl", {}, True),
    ("nash_mtl", {}, False), ("gradvac", {}, False),
]
SLOW = pytest.mark.slow   # ~10-40 s each on 2 loaded cores: the full set runs with -m slow
CASES_SLOW = [
    ("nash_mtl", {"update_weights_every": 2, "max_norm": 0.0}, False),
    ("fairgrad", {"alpha": 2.0}, False), ("sdmgrad", {}, False),
    ("random", {}, False), ("graddrop", {"leak": 0.2}, False),
    ("trimmed_mean", {"trim_number": 1}, False),
]


# Up to trunk_policy._PAIRWISE_MAX_HEADS heads the step sums the Gramian from pairwise inner
# products; with one head more it stacks the heads' gradients: both ways are checked.
MORE_HEADS = tuple("abcdefgh"[: _PAIRWISE_MAX_HEADS + 1])
assert len(HEADS) <= _PAIRWISE_MAX_HEADS
MORE_HEADS_CASES = [  # constant weights never need the Gramian
    ("pcgrad", {}, False), ("mgda", {}, False), ("cagrad", {"c": 0.5}, False),
    ("upgrad", {}, False), ("mgda", {}, True), ("imtl", {}, True),
    ("graddrop", {}, False),
]
MORE_HEADS_SLOW = [
    ("nash_mtl", {}, False), ("gradvac", {}, False), ("sdmgrad", {}, False),
    ("random", {}, False), ("trimmed_mean", {"trim_number": 1}, False),
]


@pytest.mark.parametrize("name,options,rep_grad,heads",
                         [c + (HEADS,) for c in CASES] + [c + (MORE_HEADS,) for c in MORE_HEADS_CASES]
                         + [pytest.param(*c, HEADS, marks=SLOW) for c in CASES_SLOW]
                         + [pytest.param(*c, MORE_HEADS, marks=SLOW) for c in MORE_HEADS_SLOW])
def test_aggregated_step_equals_hand_written_reference(name, options, rep_grad, heads):
    # SDMGrad's inner loop (projected SGD, learning rate 5) amplifies rounding ~1e4-fold per
    # step, so two summation orders of the same float32 Gramian part after a step or two:
    # compared over one step (its state is checked in test_aggregation_reference.py).
    batches = [make_batch(heads, seed=s) for s in range(1 if name == "sdmgrad" else 4)]
    ours, ref = make_model(heads, seed=4), make_model(heads, seed=4)
    trainer = mh.Trainer(ours, {h: mh.Objective("mse", o) for h, o in _head_opts(heads).items()},
                         trunk=mh.TrunkPolicy(_trunk_opt(), name, options, rep_grad=rep_grad))
    for batch in batches:
        trainer.step(batch)
    _reference(ref, name, options, batches, rep_grad=rep_grad, head_names=heads)
    # SDMGrad's inner loop amplifies the rounding of the float32 Gramian (summed here in
    # another order than the reference's) ~1e4-fold; every other method agrees to 1e-6.
    atol = 1e-5 if name == "sdmgrad" else 1e-6
    for a, b in zip(ours.trainable_variables, ref.trainable_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0, atol=atol)
    assert trainer.trace_count == 1


def test_one_trunk_optimizer_holds_the_trunk_slots_and_no_head_optimizer_any():
    model = make_model(HEADS)
    opts = _head_opts()
    trainer = mh.Trainer(model, {h: mh.Objective("mse", o) for h, o in opts.items()},
                         trunk={"optimizer": keras.optimizers.Adam(1e-3), "aggregator": "pcgrad"})
    trainer.step(make_batch(HEADS))
    trunk_ids = [id(v) for v in model.trunk_variables]
    assert [id(v) for v in trainer.trunk_optimizer._trainable_variables] == trunk_ids
    trunk_slot_shapes = sorted(tuple(v.shape) for v in trainer.trunk_optimizer.variables if len(v.shape))
    assert trunk_slot_shapes == sorted(2 * [tuple(v.shape) for v in model.trunk_variables])
    for h, opt in opts.items():
        assert not set(trunk_ids) & {id(v) for v in opt._trainable_variables}
        slot_shapes = sorted(tuple(v.shape) for v in opt.variables if len(v.shape))
        assert slot_shapes == sorted(2 * [tuple(v.shape) for v in model.head_variables(h)])
    assert int(trainer.trunk_optimizer.iterations) == 1


@pytest.mark.parametrize("name", ["sum", "mean"])
def test_rep_grad_gives_the_parameter_space_direction_for_sum_and_mean(name):
    batches = [make_batch(HEADS, seed=s) for s in range(3)]
    results = []
    for rep_grad in (False, True):
        model = make_model(HEADS, seed=1)
        trainer = mh.Trainer(model, {h: mh.Objective("mse", keras.optimizers.SGD(0.1)) for h in HEADS},
                             trunk=mh.TrunkPolicy(keras.optimizers.SGD(0.1), name, rep_grad=rep_grad))
        before = weights(model.trunk_variables)
        for batch in batches:
            trainer.step(batch)
        results.append([a - b for a, b in zip(weights(model.trunk_variables), before)])
    for param, rep in zip(*results):
        np.testing.assert_allclose(rep, param, rtol=0, atol=1e-6)
    assert any(np.abs(d).max() > 1e-3 for d in results[0])


# -- loss weightings -------------------------------------------------------------------


def _weighted_reference(model, scheme, batches):
    """Uncertainty / DWA / GradNorm by hand (numpy state), sum of weighted gradients on the trunk."""
    heads, trunk_opt = _head_opts(), _trunk_opt()
    trunk_vars = model.trunk_variables
    log_vars = tf.Variable(tf.fill([3], -0.5))   # UW's initial log-variance (LibMTL's)
    for h in HEADS:
        heads[h].build(model.head_variables(h))
    trunk_opt.build(trunk_vars + ([log_vars] if scheme == "uncertainty" else []))
    history, gn_weights, initial = [], np.ones(3), None
    for x, y in batches:
        with tf.GradientTape(persistent=True) as tape:
            feats = model.trunk(x, training=True)
            per_head = [_mse(y[h], model.heads[h](feats, training=True)) for h in HEADS]
            losses = tf.stack(per_head)
            if scheme == "uncertainty":
                lam = 0.5 * tf.exp(-log_vars)               # Kendall et al.: 1 / (2 sigma^2)
                s_objective = tf.reduce_sum(lam * tf.stop_gradient(losses) + 0.5 * log_vars)
            elif scheme == "dwa":                            # period 2: epoch = 2 steps
                epochs = [np.mean(history[i:i + 2], axis=0) for i in range(0, len(history) - 1, 2)]
                if len(epochs) >= 2:
                    r = epochs[-1] / epochs[-2]
                    lam = tf.constant(3 * np.exp(r / 2.0) / np.exp(r / 2.0).sum(), tf.float32)
                else:
                    lam = tf.ones([3])
            else:
                lam = tf.constant(gn_weights, tf.float32)
            objectives = [lam[i] * losses[i] for i in range(3)]
        trunk_grads = [tf.add_n([g[j] for g in [tape.gradient(o, trunk_vars) for o in objectives]])
                       for j in range(len(trunk_vars))]
        extra = []
        if scheme == "uncertainty":
            extra = [(tape.gradient(s_objective, log_vars), log_vars)]
        for i, h in enumerate(HEADS):
            head_vars = model.head_variables(h)
            heads[h].apply_gradients(zip(tape.gradient(objectives[i], head_vars), head_vars))
        if scheme == "gradnorm":   # Chen et al.: norms of the unweighted trunk gradients
            norms = np.array([np.linalg.norm(_flat(tape.gradient(loss, trunk_vars), trunk_vars))
                              for loss in per_head])
            loss_np = losses.numpy()
            initial = loss_np if initial is None else initial
            g = gn_weights * norms
            rel = (loss_np / initial) / np.mean(loss_np / initial)
            target = g.mean() * rel**1.5
            new = np.maximum(gn_weights - 0.025 * np.sign(g - target) * norms, 0)
            gn_weights = 3 * new / new.sum()
        trunk_opt.apply_gradients(list(zip(trunk_grads, trunk_vars)) + extra)
        history.append(losses.numpy())
        del tape
    return log_vars, gn_weights


@pytest.mark.parametrize("scheme,options", [
    ("uncertainty", {}), ("dwa", {"period": 2}), ("gradnorm", {}),
])
def test_loss_weighting_step_equals_hand_written_reference(scheme, options):
    batches = [make_batch(HEADS, seed=s) for s in range(7)]
    ours, ref = make_model(HEADS, seed=2), make_model(HEADS, seed=2)
    trainer = mh.Trainer(ours, {h: mh.Objective("mse", o) for h, o in _head_opts().items()},
                         trunk=mh.TrunkPolicy(_trunk_opt(), scheme, options))
    for batch in batches:
        trainer.step(batch)
    log_vars, gn_weights = _weighted_reference(ref, scheme, batches)
    for a, b in zip(ours.trainable_variables, ref.trainable_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0, atol=1e-6)
    weighting = trainer.trunk_update.weighting
    if scheme == "uncertainty":
        np.testing.assert_allclose(weighting.log_vars.numpy(), log_vars.numpy(), atol=1e-6)
        assert np.abs(log_vars.numpy()).max() > 1e-3
    if scheme == "gradnorm":
        np.testing.assert_allclose(weighting.loss_weights.numpy(), gn_weights, atol=1e-5)
        assert np.abs(gn_weights - 1).max() > 1e-3


def test_trunk_update_state_round_trips_through_a_checkpoint(tmp_path):
    def trainer_for(model):
        return mh.Trainer(model, {h: mh.Objective("mse") for h in HEADS},
                          trunk={"optimizer": "adam", "aggregator": "uncertainty"})

    model = make_model(HEADS)
    trainer = trainer_for(model)
    for s in range(3):
        trainer.step(make_batch(HEADS, seed=s))
    path = tf.train.Checkpoint(trunk_update=trainer.trunk_update).write(str(tmp_path / "ckpt"))
    fresh = trainer_for(make_model(HEADS, seed=9))
    tf.train.Checkpoint(trunk_update=fresh.trunk_update).read(path).assert_existing_objects_matched()
    for a, b in zip(trainer.trunk_update.weighting.variables, fresh.trunk_update.weighting.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    for a, b in zip(trainer.trunk_optimizer.variables, fresh.trunk_optimizer.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert int(fresh.trunk_optimizer.iterations) == 3


def test_two_pcgrad_trainers_in_one_process_do_not_interfere():
    batches = [make_batch(HEADS, seed=s) for s in range(4)]

    def run(interleave):
        model = make_model(HEADS, seed=5)
        trainer = mh.Trainer(model, {h: mh.Objective("mse") for h in HEADS}, trunk={"aggregator": "pcgrad"})
        other = mh.Trainer(make_model(HEADS, seed=6), {h: mh.Objective("mse") for h in HEADS},
                           trunk={"aggregator": "pcgrad"})
        for batch in batches:
            trainer.step(batch)
            if interleave:
                other.step(batch)
        return weights(model.trainable_variables)

    for a, b in zip(run(False), run(True)):
        np.testing.assert_array_equal(a, b)


def test_head_that_does_not_train_the_trunk_keeps_its_own_cadence():
    model = make_model(HEADS)
    trainer = mh.Trainer(model, {"a": mh.Objective("mse"), "b": mh.Objective("mse"),
                                 "c": mh.Objective("mse", every=3, trains_trunk=False)},
                         trunk={"aggregator": "mgda"})
    updated = [trainer.step(make_batch(HEADS, seed=s)).updated for s in range(4)]
    assert updated == [("a", "b", "c"), ("a", "b"), ("a", "b"), ("a", "b", "c")]
    assert len(trainer.trunk_update.heads) == 2


# -- monitoring ------------------------------------------------------------------------


def _scalars(log_dir):
    values = {}
    for path in glob.glob(os.path.join(log_dir, "train", "events*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for v in event.summary.value:
                if v.metadata.plugin_data.plugin_name != "scalars":
                    continue
                values.setdefault(v.tag, {})[event.step] = float(tf.make_ndarray(v.tensor))
    return values


def test_monitor_logs_weights_projections_and_trunk_gradient_cosines(tmp_path):
    heads = ("a", "b")
    x, y = make_batch(heads)
    y["b"] = -y["a"]  # opposite targets: the heads' trunk gradients conflict
    model = make_model(heads, seed=3)
    with tf.GradientTape(persistent=True) as tape:   # expected cosine of the first step (1), by hand
        out = model(x)
        losses = {h: _mse(y[h], out[h]) for h in heads}
    ga, gb = (_flat(tape.gradient(losses[h], model.trunk_variables), model.trunk_variables).numpy()
              for h in heads)
    cosine = ga @ gb / np.linalg.norm(ga) / np.linalg.norm(gb)
    trainer = mh.Trainer(model, {h: mh.Objective("mse") for h in heads},
                         trunk={"aggregator": "pcgrad"}, log_dir=str(tmp_path), log_every=2)
    for _ in range(3):
        trainer.step((x, y))
    trainer.close()
    logged = _scalars(str(tmp_path))
    assert sorted(logged["agg_weight/a"]) == [1, 2]               # logging steps only (1, 2 of 3)
    assert logged["agg_cosine/a/b"][1] == pytest.approx(cosine, abs=1e-5)
    assert cosine < 0 and logged["agg_projections"][1] == 2       # both heads were projected
    assert logged["agg_trunk_grad_norm/a"][1] == pytest.approx(np.linalg.norm(ga), rel=1e-5)
    # Two conflicting gradients, both projected once:
    # d = (g_a - (g_a.g_b / |g_b|^2) g_b) + (g_b - (g_a.g_b / |g_a|^2) g_a)
    #   = (1 - g_a.g_b / |g_a|^2) g_a + (1 - g_a.g_b / |g_b|^2) g_b
    dot = ga @ gb
    expected = [1 - dot / (ga @ ga), 1 - dot / (gb @ gb)]
    assert [logged["agg_weight/a"][1], logged["agg_weight/b"][1]] == pytest.approx(expected, rel=1e-4)
    assert "loss/a" in logged                                     # the per-head monitor still runs


def test_constant_weights_log_conflicts_on_logging_steps_too(tmp_path):
    heads = ("a", "b")
    x, y = make_batch(heads, seed=4)
    model = make_model(heads, seed=4)
    with tf.GradientTape(persistent=True) as tape:
        out = model(x)
        losses = {h: _mse(y[h], out[h]) for h in heads}
    ga, gb = (_flat(tape.gradient(losses[h], model.trunk_variables), model.trunk_variables).numpy()
              for h in heads)
    trainer = mh.Trainer(model, {h: mh.Objective("mse") for h in heads},
                         trunk={"aggregator": "sum"}, log_dir=str(tmp_path), log_every=5)
    trainer.step((x, y))
    trainer.close()
    logged = _scalars(str(tmp_path))
    cosine = ga @ gb / np.linalg.norm(ga) / np.linalg.norm(gb)
    assert logged["agg_cosine/a/b"][1] == pytest.approx(cosine, abs=1e-5)
    assert logged["agg_weight/b"][1] == 1.0
    assert "agg_projections" not in logged


# -- validation ------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs,objectives,match", [
    ({"schedule": "sequential", "trunk": {"aggregator": "sum"}}, {}, "schedule='simultaneous'"),
    ({"trunk": {"aggregator": "sum"}}, {"b": mh.Objective("mse", every=2)}, "head 'b' has every=2"),
    ({"trunk": {"aggregator": "pcgrad", "rep_grad": True}}, {}, "cannot use rep_grad=True"),
    ({"trunk": {"aggregator": "pcgard"}}, {}, "did you mean 'pcgrad'"),
    ({"trunk": {"aggregator": "weights", "options": {"weights": [1.0]}}}, {}, "1 entries but 2 heads"),
    ({"trunk": {"aggregatr": "sum"}}, {}, "trunk has no key 'aggregatr'"),
    ({"trunk": "sum"}, {}, "trunk must be 'per_head'"),
    ({"trunk": {"aggregator": "dwa", "options": {"period": 0}}}, {}, "period must be a positive"),
])
def test_bad_trunk_policy_fails_at_construction(kwargs, objectives, match):
    objs = {"a": mh.Objective("mse"), "b": mh.Objective("mse"), **objectives}
    with pytest.raises(ValueError, match=match):
        mh.Trainer(make_model(), objs, **kwargs)


def test_trunk_optimizer_must_be_its_own_object():
    shared = keras.optimizers.Adam()
    with pytest.raises(ValueError, match="the trunk optimizer is head 'a'"):
        mh.Trainer(make_model(), {"a": mh.Objective("mse", shared), "b": mh.Objective("mse")},
                   trunk=mh.TrunkPolicy(shared))


def test_aggregation_experiment_configs_load_and_build():
    paths = sorted(glob.glob(os.path.join(ROOT, "experiments", "aggregation_*.yaml")))
    assert len(paths) >= 4
    built = {}
    for path in paths:
        config = load_config(path)
        trunk = build_trunk(config)
        built[os.path.basename(path)] = trunk if trunk == "per_head" else trunk.aggregator
        assert config.data.correlation <= 0.2
    assert {"per_head", "sum", "pcgrad", "mgda"} <= set(built.values())


def test_config_trunk_errors_name_the_key(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("model: {trunk: {mlp: {units: [4]}}, heads: {a: {}, b: {every: 2}}}\n"
                    "train: {trunk: {aggregator: mgda}}\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: model.heads.b.every: must be 1 with trunk"):
        load_config(path)


def _scalarised(scheme, losses, step, state):
    """The loss each scheme descends, written from its paper (differentiable in the losses)."""
    if scheme == "gls":
        return tf.reduce_prod(losses) ** (1.0 / 3)
    if scheme == "stch":   # warmup_steps=1: sum log L, then the smooth Tchebycheff on L / L(0)
        if step == 0:
            state["nadir"] = tf.stop_gradient(losses)
            return tf.reduce_sum(tf.math.log(losses))
        return 3 * 0.5 * tf.reduce_logsumexp(tf.math.log(losses / state["nadir"]) / 0.5)
    s = state["scale"]     # imtl_l: sum exp(s) L - s
    return tf.reduce_sum(tf.exp(s) * losses - s)


@pytest.mark.parametrize("scheme,options", [
    ("gls", {}), ("stch", {"mu": 0.5, "warmup_steps": 1}), ("imtl_l", {}),
])
def test_new_loss_weighting_step_is_sgd_on_the_scalarised_loss(scheme, options):
    batches = [make_batch(HEADS, seed=s) for s in range(3)]
    ours, ref = make_model(HEADS, seed=2), make_model(HEADS, seed=2)
    trainer = mh.Trainer(ours, {h: mh.Objective("mse", keras.optimizers.SGD(0.1)) for h in HEADS},
                         trunk=mh.TrunkPolicy(keras.optimizers.SGD(0.1), scheme, options))
    for batch in batches:
        trainer.step(batch)
    state = {"scale": tf.Variable(tf.zeros([3]))}
    variables = list(ref.trainable_variables) + ([state["scale"]] if scheme == "imtl_l" else [])
    for step, (x, y) in enumerate(batches):
        with tf.GradientTape() as tape:
            feats = ref.trunk(x, training=True)
            losses = tf.stack([_mse(y[h], ref.heads[h](feats, training=True)) for h in HEADS])
            total = _scalarised(scheme, losses, step, state)
        for v, g in zip(variables, tape.gradient(total, variables)):
            v.assign_sub(0.1 * g)
    for a, b in zip(ours.trainable_variables, ref.trainable_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0, atol=2e-6)
    if scheme == "imtl_l":
        np.testing.assert_allclose(trainer.trunk_update.weighting.loss_scale.numpy(),
                                   state["scale"].numpy(), atol=2e-6)


TRAIN_CONFIG = """\
seed: 0
data: {kind: mmoe, train_size: 64, eval_size: 32, input_dim: 4}
model:
  trunk: {mlp: {units: [8], activation: relu}}
  heads:
    a: {layers: [{class_name: Dense, config: {units: 1}}], optimizer: sgd}
    b: {layers: [{class_name: Dense, config: {units: 1}}], optimizer: sgd}
    c: {layers: [{class_name: Dense, config: {units: 1}}], optimizer: sgd}
train: {steps: 4, batch_size: 16, eval_every: 4, trunk: TRUNK}
log: {every: 1, histograms_every: 0}
checkpoint: {every: 0}
"""

NEW_METHODS = [
    ("nash_mtl", {}), ("gradvac", {}), ("fairgrad", {"alpha": 2.0}), ("sdmgrad", {}),
    ("random", {}), ("graddrop", {}), ("trimmed_mean", {"trim_number": 1}),
    ("gls", {}), ("stch", {"warmup_steps": 2}), ("imtl_l", {}), ("famo", {}), ("rlw", {}),
    ("nash_mtl", {"dtype": "float64"}),
    ("moco", {}), ("db_mtl", {}), ("excess_mtl", {}),
]


#: One of each kind of config runs in the default suite (options, dtype, a loss weighting named
#: as the aggregator, a buffered method); the rest (same config path, ~5 s each) with -m slow.
#: Each method's maths is checked in the default suite by the reference tests above.
_FAST_CONFIGS = {("fairgrad", 2.0), ("nash_mtl", "float64"), ("imtl_l", None), ("db_mtl", None)}


def _config_case(name, options):
    key = (name, next(iter(options.values()), None))
    return pytest.param(name, options, marks=() if key in _FAST_CONFIGS else pytest.mark.slow)


@pytest.mark.parametrize("name,options", [_config_case(n, o) for n, o in NEW_METHODS])
def test_every_new_method_trains_through_multihead_train(tmp_path, name, options):
    # In process (main(...)): ~2-5 s each on an idle machine, TF already imported.
    """`multihead train` with a config (train.trunk.aggregator, options, dtype), 4 steps:
    exit 0 and finite metrics in metrics.json."""
    import json

    from multihead.experiments.run.experiment import run_experiment

    options = dict(options)
    dtype = options.pop("dtype", "float32")
    trunk = {"optimizer": "sgd", "aggregator": name, "options": options, "dtype": dtype}
    config = tmp_path / "exp.yaml"
    config.write_text(TRAIN_CONFIG.replace("TRUNK", json.dumps(trunk)))
    run = tmp_path / "run"
    assert run_experiment(str(config), run_dir=str(run), quiet=True).exit_code == 0
    metrics = json.loads((run / "metrics.json").read_text())
    text = json.dumps(metrics)
    assert "NaN" not in text and "Infinity" not in text, text


class _HalvedGradients(mh.PerHeadRule):
    """A user's rule: every head's gradient halved (then SGD at lr is SGD at lr / 2, bitwise:
    both scale by a power of two)."""

    def plan(self, heads_pass):
        def halved(gradients):
            def take():
                grads = gradients() if callable(gradients) else gradients
                return [None if g is None else g * 0.5 for g in grads]
            return take
        return [p._replace(gradients=halved(p.gradients)) for p in super().plan(heads_pass)]


def test_a_users_trunk_rule_trains_as_its_plans_say():
    batch = make_batch()
    ours = mh.Trainer(make_model(seed=3), {h: mh.Objective("mse", keras.optimizers.SGD(0.1))
                                           for h in "ab"}, trunk=_HalvedGradients())
    half_lr = mh.Trainer(make_model(seed=3), {h: mh.Objective("mse", keras.optimizers.SGD(0.05))
                                              for h in "ab"})
    for _ in range(3):
        ours.step(batch)
        half_lr.step(batch)
    for a, b in zip(weights(ours.model.weights), weights(half_lr.model.weights)):
        np.testing.assert_array_equal(a, b)
    assert any(not np.array_equal(a, b) for a, b in zip(weights(ours.model.weights), weights(make_model(seed=3).weights)))


def test_a_users_rule_that_would_own_the_trunk_update_is_refused():
    class OwnTrunk(mh.PerHeadRule):
        heads_update_trunk = False

    with pytest.raises(ValueError, match="heads_update_trunk = False"):
        mh.Trainer(make_model(), {h: mh.Objective("mse") for h in "ab"}, trunk=OwnTrunk())
