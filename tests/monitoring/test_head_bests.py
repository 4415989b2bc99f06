"""`versus_baseline`: how much better than the constant baseline a value is, the same way for
every metric direction, and `head_bests` on records that may come from anywhere."""

import math

import pytest

from multihead.monitoring.head_bests import format_versus, head_bests, versus_baseline


@pytest.mark.parametrize("metric,value,base,expected", [
    ("loss", 0.3, 0.4, 25.0),                 # lower is better: (B - M) / |B|
    ("loss", 0.5, 0.4, -25.0),
    ("accuracy", 0.9, 0.6, 50.0),             # higher is better: (M - B) / |B|
    ("accuracy", 0.3, 0.6, -50.0),
    ("mean_absolute_error", 1.0, 4.0, 75.0),
    ("r2", 0.5, -0.5, 200.0),                 # a negative baseline: relative to |B|
])
def test_percent_better_than_the_baseline_by_direction(metric, value, base, expected):
    sign = 1 if metric in ("loss", "mean_absolute_error") else -1
    assert expected == pytest.approx(100 * sign * (base - value) / abs(base))  # the definition
    assert versus_baseline(metric, value, base) == pytest.approx(expected)


@pytest.mark.parametrize("metric,value,base", [
    ("loss", 0.3, 0.0), ("loss", math.nan, 0.4), ("loss", 0.3, math.inf),
    ("my_score", 0.3, 0.4), ("loss", None, 0.4), ("loss", 0.3, None)])
def test_undefined_comparisons_show_a_dash(metric, value, base):
    assert versus_baseline(metric, value, base) is None
    assert format_versus(None) == "-"


def test_format_says_better_or_worse():
    assert format_versus(12.34) == "+12.3% better" and format_versus(-4.0) == "-4.0% worse"


def test_records_of_the_wrong_type_read_as_missing():
    crafted = {"head_early_stopping": {"a": {"best_value": "x", "best_step": 2.5,
                                            "stopped_step": True, "monitor": 7}, "b": []},
               "head_best_checkpoints": "nope", "eval": {"a": {"loss": 0.5}}}
    bests = head_bests(crafted)
    assert set(bests) == {"a", "b"}
    a = bests["a"]
    assert (a.best_value, a.best_step, a.frozen_step, a.monitor, a.final_value) == \
        (None, None, None, "eval/a/loss", 0.5)
    assert a.final_is_best is None
    assert head_bests({"head_early_stopping": None}) == {}
