"""The Custom Scalars layout of a run: one chart per tag the run writes, grouped by head.

TensorBoard colours a Custom Scalars line by its run, not by its tag, so two tags of
one run in one chart cannot be told apart. Every chart here therefore holds exactly one
tag (matched exactly), and its title says what the line is and names the tag. A chart
is made only for a tag the run writes, so no chart is empty (an evaluation metric's from the
first evaluation on):

* one section per head: its loss, then each of its evaluation metrics (accuracy, MAE, ...:
  the eval run's `<metric>/<head>`, one chart each), then its trunk and head gradient norms,
  clipped trunk norm, learning rate, update ratio, loss scale (float16), loss weight, updates dropped as
  non-finite, due steps without a label, and its trunk-gradient cosine with each other head;
* with an aggregated trunk (`TrunkPolicy`), a section `trunk aggregation`: the norm
  of the aggregated trunk gradient, each head's aggregation weight, loss weight and
  trunk-gradient norm fed to the aggregator, each pair's cosine, PCGrad's projections;
* with affinity logging, a section `inter-task affinity`: one chart per ordered pair
  `i -> j` (`affinity/<i>/<j>`, see `multihead.step.affinity`).

The same tag in the `eval` run (`loss/<head>`) is a second line, in the eval run's colour.

Example:
    >>> layout = custom_scalars_layout(["a", "b"], ["loss/a", "loss/b", "grad_cosine/a/b"])
    >>> [c.title for c in layout.category]
    ['a', 'b']
    >>> [chart.title for chart in layout.category[0].chart]
    ['a: loss (loss/a)', 'a, b: trunk gradient cosine (grad_cosine/a/b)']
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, Sequence

from multihead.monitoring import tags

if TYPE_CHECKING:  # annotation only: the proto module is imported where the layout is built
    from tensorboard.plugins.custom_scalar import layout_pb2

#: The title of the section of an aggregated trunk's tags.
AGGREGATION_SECTION = "trunk aggregation"

#: The title of the section of the inter-task affinities.
AFFINITY_SECTION = "inter-task affinity"

#: What a line is, by (kind, part) of its tag; the order is the charts' order in a section.
_HEAD_CHARTS = (
    ((tags.LOSS, None), "loss"),
    ((tags.GRAD_NORM, tags.TRUNK), "trunk gradient norm"),
    ((tags.GRAD_NORM, tags.HEAD), "head gradient norm"),
    ((tags.GRAD_NORM_CLIPPED, tags.TRUNK), "trunk gradient norm after clipping"),
    ((tags.LR, None), "learning rate"),
    ((tags.UPDATE_RATIO, None), "update ratio"),
    ((tags.LOSS_SCALE, None), "loss scale"),
    ((tags.LOSS_WEIGHT, None), "loss weight"),
    ((tags.NONFINITE_SKIPS, None), "updates dropped as non-finite"),
    ((tags.MISSING_LABEL_SKIPS, None), "due steps without a label"),
    ((tags.GRAD_COSINE, None), "trunk gradient cosine"),
)
_AGGREGATION_CHARTS = (
    ((tags.AGG_UPDATE_NORM, None), "aggregated trunk gradient norm"),
    ((tags.AGG_WEIGHT, None), "aggregation weight"),
    ((tags.AGG_LOSS_WEIGHT, None), "loss weight"),
    ((tags.AGG_TRUNK_GRAD_NORM, None), "trunk gradient norm fed to the aggregator"),
    ((tags.AGG_COSINE, None), "trunk gradient cosine fed to the aggregator"),
    ((tags.AGG_PROJECTIONS, None), "PCGrad projections"),
)
_AFFINITY_CHARTS = (((tags.AFFINITY, None), "inter-task affinity"),)


def _charts(chart_kinds: Sequence[tuple[tuple[str, str | None], str]],
            parsed: Sequence[tuple[str, tags.Tag]], keep: Callable[[tags.Tag], bool],
            ) -> list[layout_pb2.Chart]:
    """One chart per tag of `parsed` that `keep` accepts, in the order of `chart_kinds`."""
    from tensorboard.plugins.custom_scalar import layout_pb2

    charts = []
    for (kind, part), what in chart_kinds:
        for tag, p in parsed:
            if p.kind == kind and p.part == part and keep(p):
                joined = (" -> " if kind == tags.AFFINITY else ", ").join(p.heads)  # directed
                title = f"{joined}: {what} ({tag})" if p.heads else f"{what} ({tag})"
                charts.append(layout_pb2.Chart(title=title, multiline=layout_pb2.MultilineChartContent(
                    tag=[f"^{re.escape(tag)}$"])))
    return charts


def _eval_chart(head: str, metric: str) -> layout_pb2.Chart:
    """The chart of one evaluation metric of `head`: the eval run's `<metric>/<head>`."""
    from tensorboard.plugins.custom_scalar import layout_pb2

    tag = tags.eval_metric(metric, head)
    return layout_pb2.Chart(title=f"{head}: eval {metric} ({tag})",
                            multiline=layout_pb2.MultilineChartContent(tag=[f"^{re.escape(tag)}$"]))


def custom_scalars_layout(heads: Sequence[str], written: Iterable[str],
                          eval_metrics: Mapping[str, Sequence[str]] | None = None,
                          ) -> layout_pb2.Layout:
    """The layout of a run whose train run writes the scalar tags `written`.

    Args:
        heads: the heads, in order (one section each, in this order).
        written: the scalar tags the run writes (tags of other kinds are left out).
        eval_metrics: head -> the metrics its evaluations write to the eval run
            (`<metric>/<head>`, the loss aside): a chart each, after the head's loss.

    Returns:
        A `layout_pb2.Layout`: a section per head with at least one chart, then the
        aggregation section when the run aggregates, then the affinity section when it
        logs affinities; one tag per chart.
    """
    from tensorboard.plugins.custom_scalar import layout_pb2

    order = {h: i for i, h in enumerate(heads)}
    parsed = [(t, p) for t in dict.fromkeys(written) if (p := tags.parse(t)) is not None]
    # Pairs sort by their other head; a pair chart shows in both heads' sections.
    parsed.sort(key=lambda tp: [order.get(h, len(order)) for h in tp[1].heads])
    categories = []
    for head in heads:
        charts = _charts(_HEAD_CHARTS, parsed, lambda p, head=head: head in p.heads)
        metrics = [m for m in (eval_metrics or {}).get(head, ()) if m != tags.LOSS]
        at = 1 if charts and charts[0].title.startswith(f"{head}: loss ") else 0
        charts[at:at] = [_eval_chart(head, metric) for metric in metrics]
        if charts:
            categories.append(layout_pb2.Category(title=head, chart=charts))
    aggregation = _charts(_AGGREGATION_CHARTS, parsed, lambda p: True)
    if aggregation:
        categories.append(layout_pb2.Category(title=AGGREGATION_SECTION, chart=aggregation))
    affinity = _charts(_AFFINITY_CHARTS, parsed, lambda p: True)
    if affinity:
        categories.append(layout_pb2.Category(title=AFFINITY_SECTION, chart=affinity))
    return layout_pb2.Layout(category=categories)
