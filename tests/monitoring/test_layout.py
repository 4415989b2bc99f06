"""The Custom Scalars layout: a chart per written tag, one tag each, grouped by head."""

from __future__ import annotations

import re

from multihead.monitoring import tags
from multihead.monitoring.layout import AGGREGATION_SECTION, custom_scalars_layout


def _sections(layout) -> dict[str, list[str]]:
    """Section title -> the one tag regex of each chart (asserting there is one)."""
    out = {}
    for category in layout.category:
        regexes = []
        for chart in category.chart:
            (regex,) = chart.multiline.tag
            regexes.append(regex)
        out[category.title] = regexes
    return out


def test_only_written_tags_get_a_chart_and_each_matches_exactly_its_tag():
    written = [tags.loss("a"), tags.loss("b"), tags.head_grad_norm("a"), tags.trunk_grad_norm("b"),
               tags.grad_cosine("a", "b"), "gate/a/entropy", "not/a/tag"]
    sections = _sections(custom_scalars_layout(["a", "b", "c"], written))
    assert list(sections) == ["a", "b"]  # c writes nothing: no empty section
    matched = {name: [t for t in written if any(re.fullmatch(r, t) for r in regexes)]
               for name, regexes in sections.items()}
    assert matched == {"a": ["loss/a", "grad_norm/a/head", "grad_cosine/a/b"],
                       "b": ["loss/b", "grad_norm/b/trunk", "grad_cosine/a/b"]}
    assert not any(re.fullmatch(r, "loss/ab") for r in sections["a"])  # exact, not a prefix


def test_aggregation_section_names_each_line_in_its_chart_title():
    heads = ["a", "b"]
    written = [tags.loss(h) for h in heads] + [tags.agg_weight(h) for h in heads] + [
        tags.agg_trunk_grad_norm("a"), tags.agg_cosine("a", "b"), tags.AGG_UPDATE_NORM]
    layout = custom_scalars_layout(heads, written)
    (aggregation,) = [c for c in layout.category if c.title == AGGREGATION_SECTION]
    titles = [chart.title for chart in aggregation.chart]
    assert titles == ["aggregated trunk gradient norm (agg_update_norm)",
                      "a: aggregation weight (agg_weight/a)", "b: aggregation weight (agg_weight/b)",
                      "a: trunk gradient norm fed to the aggregator (agg_trunk_grad_norm/a)",
                      "a, b: trunk gradient cosine fed to the aggregator (agg_cosine/a/b)"]
