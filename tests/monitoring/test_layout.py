"""The Custom Scalars layout: a chart per written tag, one tag each, grouped by head."""

from __future__ import annotations

import os
import re

import keras
import pytest

import multihead as mh
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


def _layout_and_written(log_dir):
    """(tags the Custom Scalars layout charts, scalar tags the train run holds), read from the
    event files."""
    import glob

    import tensorflow as tf
    from tensorboard.compat.proto import event_pb2
    from tensorboard.plugins.custom_scalar import layout_pb2

    from multihead._records import read_records
    from multihead.monitoring.report import read_scalars

    charted = set()
    for path in glob.glob(os.path.join(log_dir, "train", "events.out.tfevents.*")):
        for record in read_records(path, partial_tail=True):
            for value in event_pb2.Event.FromString(record).summary.value:
                if value.tag == "custom_scalars__config__":
                    layout = layout_pb2.Layout.FromString(tf.make_ndarray(value.tensor).item())
                    charted |= {re.sub(r"\\(.)", r"\1", t[1:-1]) for c in layout.category
                                for chart in c.chart for t in chart.multiline.tag}
    return charted, set(read_scalars(os.path.join(log_dir, "train")))


def _float16_model():
    keras.utils.set_random_seed(0)
    dtype = keras.DTypePolicy("mixed_float16")
    model = mh.MultiHeadModel(keras.Sequential([keras.layers.Dense(8, "tanh", dtype=dtype)]),
                              {h: keras.layers.Dense(1, dtype=dtype) for h in ("a", "b")})
    model.build((None, 5))
    return model


@pytest.mark.parametrize("case", ["per_head", "aggregated_with_loss_weighting", "float16", "taps",
                                  "missing_labels"])
def test_the_layout_charts_exactly_the_scalar_tags_the_run_writes(case, tmp_path):
    """The tags the monitor is told of (the trunk rule's and the step's `summary_tags()`, its
    own) and the tags written are one list: every scalar of the train run has its chart and
    every chart a scalar."""
    from conftest import make_batch, make_model, make_tapped

    heads, kwargs, objective = ("a", "b"), {}, {}
    model = make_model(heads, seed=0)
    if case == "aggregated_with_loss_weighting":
        kwargs = {"trunk": mh.TrunkPolicy(aggregator="pcgrad", loss_weighting="dwa")}
    elif case == "float16":
        model = _float16_model()
    elif case == "taps":
        model, heads = make_tapped(), ("main", "aux")
    elif case == "missing_labels":
        objective = {"missing_label": float("nan")}
    trainer = mh.Trainer(model, {h: mh.Objective("mse", keras.optimizers.SGD(0.05), **objective)
                                 for h in heads},
                         log_dir=str(tmp_path), log_every=1, histograms_every=0, **kwargs)
    for s in range(3):
        trainer.step(make_batch(heads, seed=s))
    trainer.close()
    charted, written = _layout_and_written(str(tmp_path))
    assert written, "nothing written"
    assert charted == written, (sorted(written - charted), sorted(charted - written))


def test_each_eval_metric_gets_a_chart_right_after_its_head_s_loss():
    written = [tags.loss("a"), tags.trunk_grad_norm("a"), tags.loss("b")]
    layout = custom_scalars_layout(["a", "b"], written, {"a": ["mean_absolute_error", "loss"],
                                                         "b": ["accuracy"], "c": ["auc"]})
    titles = {c.title: [chart.title for chart in c.chart] for c in layout.category}
    assert titles == {
        "a": ["a: loss (loss/a)", "a: eval mean_absolute_error (mean_absolute_error/a)",
              "a: trunk gradient norm (grad_norm/a/trunk)"],
        "b": ["b: loss (loss/b)", "b: eval accuracy (accuracy/b)"]}
    sections = _sections(layout)
    assert [r for r in sections["b"] if re.fullmatch(r, "accuracy/b")] == ["^accuracy/b$"]


def test_a_run_charts_every_metric_its_evaluations_write(tmp_path):
    """Read back from the event files: the layout's eval charts are exactly the eval run's
    metric tags (`<metric>/<head>`, the loss aside), for the objectives' metrics."""
    from conftest import make_batch, make_model

    from multihead.monitoring.report import read_scalars

    heads = ("a", "b")
    metrics = {"a": ["mae", keras.metrics.RootMeanSquaredError()], "b": ["mse"]}
    trainer = mh.Trainer(make_model(heads, seed=0),
                         {h: mh.Objective("mse", "sgd", metrics=metrics[h]) for h in heads},
                         log_dir=str(tmp_path), log_every=1, histograms_every=0)
    batch = make_batch(heads, seed=1)
    trainer.step(batch)
    trainer.evaluate(batch)
    trainer.close()
    charted, written = _layout_and_written(str(tmp_path))
    evaluated = set(read_scalars(os.path.join(tmp_path, "eval")))
    expected = {"mean_absolute_error/a", "root_mean_squared_error/a", "mean_squared_error/b"}
    assert evaluated - {"loss/a", "loss/b"} == expected  # Keras' names of the metrics given
    assert charted - written == expected
