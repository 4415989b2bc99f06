"""The TensorBoard tag schema: every builder's tag parses back to what built it."""

import pytest

from multihead.monitoring import tags
from multihead.monitoring.tags import Tag

# (built tag, the literal string it must be, what it parses to)
CASES = [
    (tags.loss("a"), "loss/a", Tag("loss", ("a",))),
    (tags.trunk_grad_norm("a"), "grad_norm/a/trunk", Tag("grad_norm", ("a",), "trunk")),
    (tags.head_grad_norm("a"), "grad_norm/a/head", Tag("grad_norm", ("a",), "head")),
    (tags.variable_grad_norm("a", "trunk/0/kernel"), "grad_norm/a/var/trunk/0/kernel",
     Tag("grad_norm", ("a",), "var", "trunk/0/kernel")),
    (tags.grad_norm_clipped("a"), "grad_norm_clipped/a/trunk", Tag("grad_norm_clipped", ("a",), "trunk")),
    (tags.grad_hist("a", "heads/a/1/bias"), "grad_hist/a/heads/a/1/bias",
     Tag("grad_hist", ("a",), None, "heads/a/1/bias")),
    (tags.lr("a"), "lr/a", Tag("lr", ("a",))),
    (tags.update_ratio("a"), "update_ratio/a", Tag("update_ratio", ("a",))),
    (tags.loss_weight("a"), "loss_weight/a", Tag("loss_weight", ("a",))),
    (tags.nonfinite_skips("a"), "nonfinite_skips/a", Tag("nonfinite_skips", ("a",))),
    (tags.grad_cosine("a", "b"), "grad_cosine/a/b", Tag("grad_cosine", ("a", "b"))),
    (tags.agg_weight("a"), "agg_weight/a", Tag("agg_weight", ("a",))),
    (tags.agg_loss_weight("a"), "agg_loss_weight/a", Tag("agg_loss_weight", ("a",))),
    (tags.agg_trunk_grad_norm("a"), "agg_trunk_grad_norm/a", Tag("agg_trunk_grad_norm", ("a",))),
    (tags.agg_cosine("a", "b"), "agg_cosine/a/b", Tag("agg_cosine", ("a", "b"))),
    (tags.AGG_PROJECTIONS, "agg_projections", Tag("agg_projections")),
    (tags.AGG_UPDATE_NORM, "agg_update_norm", Tag("agg_update_norm")),
    (tags.EPISODE_RETURN, "episode/return", Tag("episode/return")),
    (tags.EPISODE_LENGTH, "episode/length", Tag("episode/length")),
    (tags.CONFIG, "config", Tag("config")),
]


@pytest.mark.parametrize("built, literal, parsed", CASES, ids=[c[1] for c in CASES])
def test_each_tag_is_its_documented_string_and_parses_back(built, literal, parsed):
    assert built == literal
    assert tags.parse(built) == parsed


def test_the_pair_format_is_one_for_both_writers():
    # Head names may hold `_` (`a__b` would not split), never `/`.
    assert tags.parse(tags.agg_cosine("x__y", "z")).heads == ("x__y", "z")
    assert tags.parse(tags.grad_cosine("x__y", "z")).heads == ("x__y", "z")


def test_eval_metric_tags():
    assert tags.eval_metric("loss", "a") == tags.loss("a") == "loss/a"
    assert tags.eval_metric("mae", "a") == "mae/a"


@pytest.mark.parametrize("tag", [
    "accuracy", "loss", "loss/", "loss/a/b", "grad_norm/a", "grad_norm/a/middle", "grad_norm/a/var",
    "grad_cosine/a", "grad_cosine/a/b/c", "agg_cosine/a__b", "grad_hist/a", "grad_norm_clipped/a/head",
    "custom_scalars__config__",
])
def test_tags_outside_the_schema_parse_to_none(tag):
    assert tags.parse(tag) is None
