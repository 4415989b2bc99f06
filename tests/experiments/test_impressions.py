"""The impression -> click -> conversion generator: seeded, conversions seen only on clicks,
labels drawn from the probabilities it reports, and the sample-selection bias ESMM is about."""

import math

import numpy as np
import pytest

import multihead as mh
from multihead.datasets.impressions import TASKS, impressions
from multihead.experiments.build.data_sources import load_data
from multihead.experiments.config.schema import ConfigError

FIELDS = ("x", "p_ctr", "p_cvr", "click", "conversion")


@pytest.fixture(scope="module")
def data():
    return impressions(train_size=200_000, eval_size=1_000, seed=5)


def test_equal_seeds_give_equal_data_and_other_seeds_other_data():
    a, b = (impressions(train_size=500, eval_size=100, seed=3) for _ in range(2))
    c = impressions(train_size=500, eval_size=100, seed=4)
    for split in ("train", "eval"):
        for field in FIELDS:
            np.testing.assert_array_equal(getattr(getattr(a, split), field),
                                          getattr(getattr(b, split), field))
        assert not np.array_equal(getattr(a, split).x, getattr(c, split).x)
    assert mh.impressions is impressions


def test_conversions_are_labelled_on_clicked_impressions_only(data):
    for split in (data.train, data.eval):
        clicked = split.click[:, 0] == 1
        assert set(np.unique(split.click)) == {0.0, 1.0}
        assert np.isnan(split.conversion[~clicked]).all()
        assert set(np.unique(split.conversion[clicked])) == {0.0, 1.0}
        expected_ctcvr = np.where(clicked, np.nan_to_num(split.conversion[:, 0]), 0.0)
        np.testing.assert_array_equal(split.ctcvr[:, 0], expected_ctcvr)
        labels = split.labels()
        assert list(labels) == list(TASKS)
        assert all(v.shape == (len(split.x), 1) and v.dtype == np.float32 for v in labels.values())


def _within_sampling_error(outcomes, probabilities, sigmas=4.0):
    """|sum of Bernoulli outcomes - sum of their probabilities| within `sigmas` standard
    deviations of that sum (independent draws: variance sum p (1 - p))."""
    outcomes, p = np.asarray(outcomes, np.float64), np.asarray(probabilities, np.float64)
    return abs(outcomes.sum() - p.sum()) <= sigmas * math.sqrt((p * (1 - p)).sum())


def test_clicks_and_conversions_follow_the_known_probabilities(data):
    train = data.train
    p_ctr, p_cvr, click = train.p_ctr[:, 0], train.p_cvr[:, 0], train.click[:, 0]
    clicked = click == 1
    # the intercepts are solved for the requested means over the training impressions
    assert p_ctr.mean() == pytest.approx(0.04, abs=1e-9)
    assert p_cvr.mean() == pytest.approx(0.15, abs=1e-9)
    # overall and within each decile of the known probability, the empirical rate matches
    assert _within_sampling_error(click, p_ctr)
    for part in np.array_split(np.argsort(p_ctr), 10):
        assert _within_sampling_error(click[part], p_ctr[part])
    conversion = train.conversion[clicked, 0]
    assert _within_sampling_error(conversion, p_cvr[clicked])
    for part in np.array_split(np.argsort(p_cvr[clicked]), 5):
        assert _within_sampling_error(conversion[part], p_cvr[clicked][part])


def test_the_click_space_is_small_and_biased(data):
    """Data sparsity: clicks are a few percent; sample-selection bias: the clicked impressions
    convert far more often than impressions at large, as their features differ."""
    train = data.train
    clicked = train.click[:, 0] == 1
    assert 0.03 < clicked.mean() < 0.05
    assert train.p_cvr[clicked].mean() > 1.5 * train.p_cvr.mean()
    shift = np.abs(train.x[clicked].mean(axis=0) - train.x.mean(axis=0))
    assert shift.max() > 0.5  # features of clicked impressions are not those of all impressions


def test_bad_options_are_named():
    with pytest.raises(ValueError, match="click_rate"):
        impressions(click_rate=1.5)
    with pytest.raises(ValueError, match="hidden"):
        impressions(hidden=1)


def test_data_kind_esmm_gives_the_labels_of_the_heads():
    section = {"kind": "esmm", "options": {"train_size": 300, "eval_size": 50},
               "missing_label": {"cvr": "nan"}, "seed": 2}
    loaded = load_data(section, heads=["ctr", "cvr"])
    direct = impressions(train_size=300, eval_size=50, seed=2)
    np.testing.assert_array_equal(loaded.x_train, direct.train.x)
    np.testing.assert_array_equal(loaded.y_eval["cvr"], direct.eval.conversion)
    assert sorted(loaded.y_train) == ["ctr", "cvr"]
    with pytest.raises(ConfigError, match="model.heads.ctx: data kind esmm has no task 'ctx'"):
        load_data({**section, "missing_label": {}}, heads=["ctx"])
    with pytest.raises(ConfigError, match=r"data.missing_label.cvr: .* set data.missing_label"):
        load_data({**section, "missing_label": {}}, heads=["cvr"])
    with pytest.raises(ConfigError, match="data.options.click_rate"):
        load_data({**section, "options": {"click_rate": 0}}, heads=["ctr", "cvr"])
