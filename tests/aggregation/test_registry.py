"""The registry is derived from the method classes, and every list of names follows it: the
public constants, TrunkPolicy's errors, and the table of docs/aggregation.md."""

from __future__ import annotations

import os
import re

import pytest

import multihead as mh
from multihead.aggregation import AGGREGATOR_CLASSES, LOSS_WEIGHTING_CLASSES, get_aggregator

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_names_are_the_classes_names():
    assert mh.AGGREGATORS == tuple(c.name for c in AGGREGATOR_CLASSES)
    assert mh.LOSS_WEIGHTINGS == tuple(c.name for c in LOSS_WEIGHTING_CLASSES)
    assert len(set(mh.AGGREGATORS) | set(mh.LOSS_WEIGHTINGS)) == 31


def test_the_docs_table_lists_every_registered_method_once():
    with open(os.path.join(ROOT, "docs", "aggregation.md"), encoding="utf-8") as fh:
        text = fh.read()
    table = text[text.index("| `aggregator` | paper |"):]
    table = table[:table.index("\n\n")]               # the methods' table, up to its blank line
    listed = re.findall(r"^\| `(\w+)` \|", table, re.M)[1:]   # the header's `aggregator` aside
    assert sorted(listed) == sorted(mh.AGGREGATORS + mh.LOSS_WEIGHTINGS)


def test_an_unknown_name_lists_the_registry():
    with pytest.raises(ValueError, match=r"unknown aggregator 'pcgard' \(did you mean 'pcgrad'\?\)"):
        get_aggregator("pcgard")
    with pytest.raises(ValueError, match="must be one of.*'rlw'"):
        mh.TrunkPolicy(aggregator="nope")


@pytest.mark.parametrize("cls", AGGREGATOR_CLASSES, ids=lambda c: c.name)
def test_config_round_trip_gives_an_equal_method(cls):
    required = {"weights": {"weights": [1.0, 2.0]}, "krum": {"n_byzantine": 0},
                "trimmed_mean": {"trim_number": 0}, "epo": {"preference": [1.0, 2.0]}}
    method = cls(**required.get(cls.name, {}))
    again = cls.from_config(method.get_config())
    assert type(again) is cls and again.get_config() == method.get_config()


def test_a_bad_option_is_refused_in_the_constructor_naming_method_and_option():
    with pytest.raises(ValueError, match=r"aggregator 'cagrad': c must be a number in \[0.0, 1.0\)"):
        mh.aggregation.CAGrad(c=2.0)
    with pytest.raises(ValueError, match="loss weighting 'dwa': period must be a positive integer"):
        mh.aggregation.DWAWeighting(period=0)


def test_options_go_to_an_instance_s_constructor_not_to_the_policy():
    with pytest.raises(ValueError, match="options go to the constructor"):
        mh.TrunkPolicy(aggregator=mh.aggregation.CAGrad(), options={"c": 0.2})


def test_db_mtl_does_not_compose_with_a_loss_weighting():
    with pytest.raises(ValueError, match="'db_mtl' scales the losses itself"):
        mh.TrunkPolicy(aggregator="db_mtl", loss_weighting="dwa")
