"""The contract every aggregation method keeps, built-in or user-defined: run over every class of
the registry and the two methods of docs/own-methods.md.

- output shape and dtype, float32 and float64;
- the train step traces once;
- a step with a head dropped (non-finite labels) leaves that head's state entries alone;
- checkpoint round trip into a fresh instance, then the same next step, bitwise;
- the properties a method promises: no conflict with any head (MGDA, UPGrad, DualProj, ConFIG,
  PCGrad at K = 2), permutation equivariance, and scale behaviour (direction homogeneous of
  degree 1 in G for the scale-free methods).
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from aggregation.docs_methods import docs_methods
from conftest import make_batch, make_model

import multihead as mh
from multihead.aggregation import AGGREGATOR_CLASSES, LOSS_WEIGHTING_CLASSES

HEADS = ("a", "b", "c")

#: Options a method needs (required ones) in these tests, by name.
REQUIRED = {"weights": {"weights": [1.0, 2.0, 0.5]}, "krum": {"n_byzantine": 0},
            "trimmed_mean": {"trim_number": 1}, "epo": {"preference": [1.0, 2.0, 0.5]}}


def _aggregators() -> list:
    """`(id, factory)`: every registered aggregator and the docs' NormBalance."""
    norm_balance, _ = docs_methods()
    cases = [(c.name, lambda c=c: c(**REQUIRED.get(c.name, {}))) for c in AGGREGATOR_CLASSES]
    return cases + [("docs_NormBalance", lambda: norm_balance(decay=0.8))]


def _weightings() -> list:
    _, first_loss = docs_methods()
    cases = [(c.name, c) for c in LOSS_WEIGHTING_CLASSES]
    return cases + [("docs_FirstLossNormalisation", first_loss)]


AGGREGATORS = _aggregators()
WEIGHTINGS = _weightings()


def _losses(k: int) -> np.ndarray:
    return np.linspace(0.5, 2.0, k)


def _random(k: int, d: int = 6, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((k, d))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name,factory", AGGREGATORS, ids=[n for n, _ in AGGREGATORS])
def test_output_shape_and_dtype(name, factory, dtype):
    g = _random(3).astype(dtype)
    result = mh.aggregate(g, factory(), dtype=dtype, losses=_losses(3))
    assert tuple(result.direction.shape) == (6,) and result.direction.dtype == tf.as_dtype(dtype)
    assert np.all(np.isfinite(result.direction.numpy()))
    if result.weights is not None:   # coordinate-wise methods have no row weights
        assert tuple(result.weights.shape) == (3,)
    assert result.projections.dtype == tf.int32


def _permuted_is_same(method, g, perm, losses) -> None:
    d = mh.aggregate(g, method, dtype="float64", losses=losses,
                     **({"noise": np.linspace(-1, 1, len(g))} if method.noise == "normal" else {}))
    extra = {"noise": np.linspace(-1, 1, len(g))[perm]} if method.noise == "normal" else {}
    p = mh.aggregate(g[perm], method, dtype="float64", losses=losses[perm], **extra)
    np.testing.assert_allclose(p.direction.numpy(), d.direction.numpy(), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name,factory", AGGREGATORS, ids=[n for n, _ in AGGREGATORS])
def test_permutation_equivariance(name, factory):
    """Reordering the heads reorders the weights and leaves the direction alone (from the
    initial state; PCGrad and GradVac project in a given order: at K = 2 it plays no role;
    fixed weights and EPO's preference are per head, so they are permuted with the heads; Krum
    at K = 3 scores each gradient by its nearest neighbour, a tie for the nearest pair broken by
    index: K = 4)."""
    method = factory()
    k = {"pcgrad": 2, "gradvac": 2, "krum": 4}.get(name, 3)
    g = _random(k, seed=1)
    perm = {2: np.array([1, 0]), 3: np.array([2, 0, 1]), 4: np.array([3, 0, 2, 1])}[k]
    if name == "weights":
        method_p = mh.aggregation.FixedWeights(list(np.array(method.options["weights"])[perm]))
        d = mh.aggregate(g, method, dtype="float64").direction.numpy()
        p = mh.aggregate(g[perm], method_p, dtype="float64").direction.numpy()
        np.testing.assert_allclose(p, d, rtol=1e-12)
        return
    if name == "epo":
        losses = _losses(k)
        method_p = mh.aggregation.EPO(list(np.array(method.options["preference"])[perm]))
        d = mh.aggregate(g, method, dtype="float64", losses=losses).direction.numpy()
        p = mh.aggregate(g[perm], method_p, dtype="float64", losses=losses[perm]).direction.numpy()
        np.testing.assert_allclose(p, d, rtol=1e-9, atol=1e-12)
        return
    _permuted_is_same(method, g, perm, _losses(k))


#: Methods whose direction is homogeneous of degree 1 in G (their weights are scale-free):
#: d(cG) = c d(G) for c > 0. Not so: Nash-MTL and FairGrad (weights scale with a power of c),
#: MoCo and DB-MTL (they normalise the gradients), ExcessMTL (its ratios), the docs' NormBalance.
HOMOGENEOUS = ("sum", "mean", "weights", "pcgrad", "mgda", "cagrad", "upgrad", "dualproj", "imtl",
               "aligned_mtl", "config", "krum", "gradvac", "sdmgrad", "random", "graddrop",
               "trimmed_mean", "epo")


@pytest.mark.parametrize("name", HOMOGENEOUS)
def test_scale_behaviour(name):
    factory = dict(AGGREGATORS)[name]
    g = _random(3, seed=2)
    d = mh.aggregate(g, factory(), dtype="float64", losses=_losses(3)).direction.numpy()
    scaled = mh.aggregate(7.0 * g, factory(), dtype="float64", losses=_losses(3)).direction.numpy()
    np.testing.assert_allclose(scaled, 7.0 * d, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("name,options,k", [
    ("mgda", {}, 3), ("upgrad", {"reg": 0.0}, 3), ("dualproj", {"reg": 0.0}, 3), ("config", {}, 3),
    ("pcgrad", {}, 2),
])
def test_non_conflicting_methods_conflict_with_no_head(name, options, k):
    """`d . g_k >= 0` for every head, on gradients that conflict (seeds with a negative cosine)."""
    for seed in range(5):
        g = _random(k, d=4, seed=seed)
        g[1] = -0.8 * g[0] + 0.3 * g[1]       # a conflicting pair
        d = mh.aggregate(g, name, dtype="float64", **options).direction.numpy()
        dots = g @ d
        assert np.all(dots >= -1e-9 * np.linalg.norm(g, axis=1) * np.linalg.norm(d)), (seed, dots)


# -- in the train step -------------------------------------------------------------------------


def _trainer(model, aggregator=None, weighting=None):
    policy = mh.TrunkPolicy(keras.optimizers.SGD(0.05), aggregator=aggregator or "sum",
                            loss_weighting=weighting, seed=3)
    return mh.Trainer(model, {h: mh.Objective("mse", keras.optimizers.SGD(0.05)) for h in HEADS},
                      trunk=policy)


def _per_head_rows(state) -> list:
    return [v for v in state.variables if v.shape.rank and v.shape[0] == len(HEADS)]


def _check_in_the_step(make_method, weighting: bool, tmp_path) -> None:
    batches = [make_batch(HEADS, seed=s) for s in range(4)]
    bad = (batches[1][0], dict(batches[1][1], c=np.full_like(batches[1][1]["c"], np.nan)))
    method = make_method()
    trainer = (_trainer(make_model(HEADS, seed=4), weighting=method) if weighting
               else _trainer(make_model(HEADS, seed=4), aggregator=method))
    update = trainer.trunk_update
    trainer.step(batches[0])
    state = update.weighting if weighting else getattr(update, "aggregator_state", None)
    before = {id(v): v.numpy().copy() for v in (state.variables if state is not None else [])}
    assert "c" in trainer.step(bad).skipped
    for v in (_per_head_rows(state) if state is not None else []):   # head c's entries untouched
        np.testing.assert_array_equal(v.numpy()[2], before[id(v)][2], err_msg=v.name)
        if v.shape.rank == 2 and v.shape[1] == len(HEADS):
            np.testing.assert_array_equal(v.numpy()[:, 2], before[id(v)][:, 2], err_msg=v.name)
    trainer.step(batches[2])
    assert trainer.trace_count == 1

    path = mh.save_checkpoint(tmp_path / "ckpt", trainer.model, trainer=trainer)
    fresh_method = type(method).from_config(method.get_config())
    fresh = (_trainer(make_model(HEADS, seed=9), weighting=fresh_method) if weighting
             else _trainer(make_model(HEADS, seed=9), aggregator=fresh_method))
    mh.restore_checkpoint(path, fresh.model, trainer=fresh)
    for a, b in zip(update.variables, fresh.trunk_update.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.name)
    trainer.step(batches[3])
    fresh.step(batches[3])
    for a, b in zip(list(trainer.model.variables) + list(update.variables),
                    list(fresh.model.variables) + list(fresh.trunk_update.variables)):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.name)


#: ~15-30 s each on 2 loaded cores (two trainers traced): one method per base runs fast, the
#: others with -m slow.
FAST_IN_STEP = ("sum", "gradvac", "moco", "graddrop", "docs_NormBalance", "uncertainty",
                "docs_FirstLossNormalisation", "epo")  # epo: the losses reach a Gramian weighting


def _marked(cases: list) -> list:
    return [pytest.param(n, f, id=n, marks=() if n in FAST_IN_STEP else pytest.mark.slow)
            for n, f in cases]


@pytest.mark.parametrize("name,factory", _marked(AGGREGATORS))
def test_aggregator_in_the_step(name, factory, tmp_path):
    _check_in_the_step(factory, weighting=False, tmp_path=tmp_path)


@pytest.mark.parametrize("name,cls", _marked(WEIGHTINGS))
def test_loss_weighting_in_the_step(name, cls, tmp_path):
    _check_in_the_step(cls, weighting=True, tmp_path=tmp_path)
