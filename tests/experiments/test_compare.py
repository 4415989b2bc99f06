"""`mh.compare` / `multihead compare`: grouping over seeds, mean ± std, best, and Δm% against
single-task baselines, checked against hand arithmetic on fixed numbers."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import yaml

import multihead as mh
from multihead.cli.main import main
from multihead.experiments.results.compare import CompareError, DeltaMError, delta_m, direction


def _run(path, config: dict, final: dict, evals=()) -> str:
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    (path / "metrics.json").write_text(json.dumps(
        {"eval": final, "evals": [{"step": s, "eval": e} for s, e in evals], "wall_time_s": 1.0}))
    return str(path)


def _config(aggregator: str, seed: int, heads=("a", "b")) -> dict:
    return {"seed": seed, "model": {"heads": {h: {"loss": "mse"} for h in heads}},
            "train": {"trunk": {"aggregator": aggregator}}}


def _close(tree: dict, expected: dict) -> bool:
    return tree.keys() == expected.keys() and all(tree[h] == pytest.approx(expected[h]) for h in expected)


@pytest.fixture
def runs(tmp_path):
    """Two aggregators x two seeds; head a: loss and mae (lower-better), head b: accuracy
    (higher-better) and loss. The pcgrad group's means are the fixed numbers of the test."""
    pcgrad = [({"a": {"loss": 0.8, "mae": 1.1}, "b": {"accuracy": 0.75, "loss": 0.45}}),
              ({"a": {"loss": 1.0, "mae": 1.3}, "b": {"accuracy": 0.85, "loss": 0.55}})]
    out = {"pcgrad": [], "sum": [], "baseline": []}
    for seed, final in enumerate(pcgrad):
        evals = [(10, {"a": {"loss": 0.7 + seed, "mae": 2.0}, "b": {"accuracy": 0.9, "loss": 1.0}}),
                 (20, final)]
        out["pcgrad"].append(_run(tmp_path / f"pcgrad{seed}", _config("pcgrad", seed), final, evals))
        out["sum"].append(_run(tmp_path / f"sum{seed}", _config("sum", seed),
                               {"a": {"loss": 2.0, "mae": 2.0}, "b": {"accuracy": 0.5, "loss": 0.4}}))
    # baselines: head a over two seeds (means loss 1.0, mae 1.0), head b once
    out["baseline"].append(_run(tmp_path / "base_a0", _config("sum", 0, ("a",)), {"a": {"loss": 0.9, "mae": 0.8}}))
    out["baseline"].append(_run(tmp_path / "base_a1", _config("sum", 1, ("a",)), {"a": {"loss": 1.1, "mae": 1.2}}))
    out["baseline"].append(_run(tmp_path / "base_b", _config("sum", 0, ("b",)), {"b": {"accuracy": 0.5, "loss": 0.4}}))
    return out


def test_delta_m_equals_the_hand_computation_with_mixed_directions(runs):
    result = mh.compare(runs["pcgrad"] + runs["sum"], baseline=runs["baseline"])
    assert [g.label for g in result.groups] == ["aggregator=pcgrad", "aggregator=sum"]
    pcgrad, plain = result.groups
    assert pcgrad.runs == runs["pcgrad"]
    # group means over the two seeds: a/loss (0.8+1.0)/2 = 0.9, a/mae (1.1+1.3)/2 = 1.2,
    # b/accuracy (0.75+0.85)/2 = 0.8, b/loss (0.45+0.55)/2 = 0.5; std of a/loss |0.8-1.0|/2 = 0.1
    assert _close(pcgrad.mean, {"a": {"loss": 0.9, "mae": 1.2}, "b": {"accuracy": 0.8, "loss": 0.5}})
    assert pcgrad.std["a"]["loss"] == pytest.approx(0.1)
    # baselines: a/loss (0.9+1.1)/2 = 1.0, a/mae (0.8+1.2)/2 = 1.0, b/accuracy 0.5, b/loss 0.4
    assert _close(result.baseline, {"a": {"loss": 1.0, "mae": 1.0}, "b": {"accuracy": 0.5, "loss": 0.4}})
    # Δm% = 100/4 * [ (0.9-1.0)/1.0      a/loss, lower-better:   -0.10
    #               + (1.2-1.0)/1.0      a/mae, lower-better:    +0.20
    #               - (0.8-0.5)/0.5      b/accuracy, higher:     -0.60
    #               + (0.5-0.4)/0.4 ]    b/loss, lower-better:   +0.25
    #        = 100/4 * (-0.25) = -6.25   (negative: better than single-task)
    assert pcgrad.delta_m == pytest.approx(-6.25, rel=1e-12)
    # sum: a (2-1)/1 = +1 twice, b/accuracy -(0.5-0.5)/0.5 = 0, b/loss (0.4-0.4)/0.4 = 0:
    # 100/4 * 2 = +50
    assert plain.delta_m == pytest.approx(50.0, rel=1e-12)
    assert plain.std["a"]["loss"] == 0.0


def test_best_is_per_metric_direction_and_final_is_the_last(runs):
    result = mh.compare(runs["pcgrad"])
    first = result.runs[0]
    assert first.final["a"]["loss"] == 0.8
    assert first.best["a"] == {"loss": 0.7, "mae": 1.1}  # min over evals 10 and 20
    assert first.best["b"] == {"accuracy": 0.9, "loss": 0.45}  # accuracy: max
    assert result.groups[0].label == "all" and len(result.groups) == 1  # they differ only in seed
    # seed 0: min(0.7, 0.8) = 0.7; seed 1: min(1.7, 1.0) = 1.0; mean 0.85
    assert result.groups[0].best_mean["a"]["loss"] == pytest.approx((0.7 + 1.0) / 2)
    assert result.groups[0].delta_m is None and result.baseline == {}


def test_directions():
    assert [direction(m) for m in ("loss", "mean_absolute_error", "accuracy",
                                   "sparse_categorical_accuracy", "auc", "weird")] == \
        ["min", "min", "max", "max", "max", None]
    value, skipped = delta_m({"a": {"weird": 2.0, "loss": 2.0}}, {"a": {"weird": 1.0, "loss": 1.0}})
    assert value == 100.0 and skipped == ["a/weird"]
    assert delta_m({"a": {"weird": 2.0}}, {"a": {"weird": 1.0}}, {"weird": "max"})[0] == -100.0


def test_cli_json_png_and_sweep_dirs(runs, tmp_path, capsys):
    sweep = tmp_path / "sweep"
    for name in ("pcgrad0", "pcgrad1", "sum0"):  # a sweep's trials are inside it
        shutil.copytree(tmp_path / name, sweep / "trials" / name)
    (sweep / "sweep.json").write_text(json.dumps({"trials": [
        {"run_dir": f"trials/pcgrad{i}", "status": "done"} for i in range(2)] +
        [{"run_dir": "trials/sum0", "status": "failed"}]}))
    png = tmp_path / "curves.png"
    assert main(["compare", str(sweep), *runs["sum"], "--baseline", *runs["baseline"],
                 "--json", "--png", str(png)]) == 0
    printed = json.loads(capsys.readouterr().out)
    expected = mh.compare([str(sweep)] + runs["sum"], baseline=runs["baseline"]).to_dict()
    assert printed == json.loads(json.dumps(expected))
    assert [len(g["runs"]) for g in printed["groups"]] == [2, 2]  # the failed trial is left out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["compare", *runs["pcgrad"], *runs["sum"], "--baseline", *runs["baseline"]]) == 0
    table = capsys.readouterr().out
    assert "-6.25" in table and "+50.00" in table and "0.9 ± 0.1" in table
    assert main(["compare", str(tmp_path / "nope")]) == 2
    assert "neither a finished run" in capsys.readouterr().err


def test_to_dataframe(runs):
    pd = pytest.importorskip("pandas")
    frame = mh.compare(runs["pcgrad"], baseline=runs["baseline"]).to_dataframe()
    assert isinstance(frame, pd.DataFrame)
    row = frame[(frame["head"] == "b") & (frame["metric"] == "accuracy")].iloc[0]
    assert row["mean"] == pytest.approx(0.8) and row["baseline"] == 0.5 and row["n"] == 2
    np.testing.assert_allclose(frame["delta_m"].unique(), [-6.25])


# The fixture's pcgrad group means (M), baselines (B) and directions (s), as numpy arrays.
PAIRS = [("a", "loss"), ("a", "mae"), ("b", "accuracy"), ("b", "loss")]
M, B, S = np.array([0.9, 1.2, 0.8, 0.5]), np.array([1.0, 1.0, 0.5, 0.4]), np.array([1, 1, -1, 1])


@pytest.mark.parametrize("chosen", [None, ["loss"], ["accuracy", "mae"], ["mae"]])
def test_compare_metrics_chooses_the_quantities_of_delta_m(runs, capsys, chosen):
    keep = np.array([chosen is None or m in chosen for _, m in PAIRS])
    expected = 100.0 * np.mean((S * (M - B) / B)[keep])  # numpy, over the chosen pairs only
    result = mh.compare(runs["pcgrad"], baseline=runs["baseline"], metrics=chosen)
    assert result.groups[0].delta_m == pytest.approx(expected, rel=1e-12)
    assert result.delta_m_pairs == [f"{h}/{m}" for (h, m), k in zip(PAIRS, keep) if k]
    flag = ["--metrics", ",".join(chosen)] if chosen else []
    assert main(["compare", *runs["pcgrad"], "--baseline", *runs["baseline"], "--json", *flag]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["groups"][0]["delta_m"] == pytest.approx(expected, rel=1e-12)
    assert main(["compare", *runs["pcgrad"], "--baseline", *runs["baseline"], *flag]) == 0
    table = capsys.readouterr().out
    assert f"{expected:+.2f}" in table
    assert f"Δm% over {len(result.delta_m_pairs)} pairs: {', '.join(result.delta_m_pairs)}" in table


def test_compare_metrics_names_an_unknown_metric(runs, capsys):
    with pytest.raises(CompareError, match=r"metrics: 'acuracy' is reported by no baseline \(did you mean 'accuracy'\?\)"):
        mh.compare(runs["pcgrad"], baseline=runs["baseline"], metrics=["acuracy"])
    assert main(["compare", *runs["pcgrad"], "--baseline", *runs["baseline"],
                 "--metrics", "loss,acuracy"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--metrics: 'acuracy' is reported by no baseline" in err, err
    assert main(["compare", *runs["pcgrad"], "--metrics", "loss"]) == 2  # no baseline: no Δm%
    assert "--metrics needs --baseline" in capsys.readouterr().err


def test_compare_png_legend_is_outside_every_panel(runs, tmp_path):
    pytest.importorskip("matplotlib")
    from multihead.experiments.results.compare import comparison_figure

    result = mh.compare(runs["pcgrad"] + runs["sum"], baseline=runs["baseline"])
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = comparison_figure(result)
    FigureCanvasAgg(fig).draw()  # lays the figure out as savefig does
    renderer = fig.canvas.get_renderer()
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend()] + list(fig.legends)
    assert len(fig.axes) == 2 and legends
    labels = {t.get_text() for legend in legends for t in legend.get_texts()}
    assert labels == {"aggregator=pcgrad", "single-task"}  # the sum runs have no curves
    for legend in legends:
        box = legend.get_window_extent(renderer)
        for ax in fig.axes:  # the legend covers no panel's data area
            assert not box.overlaps(ax.get_window_extent(renderer)), (box, ax.bbox)
        # and lies inside the figure, not cut off in the PNG
        assert fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1
        assert fig.bbox.y0 <= box.y0 and box.y1 <= fig.bbox.y1


# -- Δm% for every baseline: |B| in the denominator; 0, NaN and inf refused ---------------


@pytest.mark.parametrize("metric, base, value, expected", [
    # positive baseline: as Maninis et al. / LibMTL, 100 * (0.9 - 1.0) / 1.0 (lower-better)
    ("loss", 1.0, 0.9, -10.0),
    # higher-better, positive: 100 * -(0.8 - 0.5) / 0.5
    ("accuracy", 0.5, 0.8, -60.0),
    # negative baseline, higher-better: 100 * -(0.2 - (-0.5)) / |-0.5| = -140 (better);
    # dividing by B (-0.5) gave +140, "worse", for a run whose R² went from -0.5 to 0.2
    ("r2", -0.5, 0.2, -140.0),
    # negative baseline, higher-better, the run worse: 100 * -(-0.9 - (-0.5)) / 0.5 = +80
    ("r2", -0.5, -0.9, 80.0),
    # negative baseline, lower-better (a negative log-likelihood's sign flipped): 100 *
    # (-3.0 - (-2.0)) / |-2.0| = -50 (lower, better)
    ("loss", -2.0, -3.0, -50.0),
])
def test_delta_m_by_hand_for_positive_and_negative_baselines(metric, base, value, expected):
    assert delta_m({"a": {metric: value}}, {"a": {metric: base}})[0] == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("base, side", [(0.0, "baseline"), (-0.0, "baseline"),
                                        (float("nan"), "baseline"), (float("inf"), "baseline"),
                                        (float("-inf"), "baseline")])
def test_delta_m_refuses_a_zero_or_non_finite_baseline(base, side):
    with pytest.raises(DeltaMError) as err:
        delta_m({"a": {"loss": 0.9}, "b": {"loss": 1.0}}, {"a": {"loss": 1.0}, "b": {"loss": base}})
    assert (err.value.head, err.value.metric, err.value.side) == ("b", "loss", side)
    assert str(err.value).startswith("Δm%: the baseline of head 'b' metric 'loss' is ")
    # a metric left out (by --metrics, or of unknown direction) is not refused
    assert delta_m({"a": {"loss": 0.9}, "b": {"weird": 1.0}}, {"a": {"loss": 1.0}, "b": {"weird": base}}) \
        == (pytest.approx(-10.0), ["b/weird"])
    assert delta_m({"a": {"loss": 0.9}, "b": {"mae": 1.0}}, {"a": {"loss": 1.0}, "b": {"mae": base}},
                   chosen=["loss"])[0] == pytest.approx(-10.0)
    with pytest.raises(DeltaMError, match="the metric of head 'a' metric 'loss' is nan"):
        delta_m({"a": {"loss": float("nan")}}, {"a": {"loss": 1.0}})


def _baseline_runs(tmp_path, b_loss):
    """The fixture's baselines, with head b's loss replaced by `b_loss` in its one run."""
    return [_run(tmp_path / "nb_a", _config("sum", 0, ("a",)), {"a": {"loss": 1.0, "mae": 1.0}}),
            _run(tmp_path / "nb_b", _config("sum", 0, ("b",)), {"b": {"accuracy": 0.5, "loss": b_loss}})]


@pytest.mark.parametrize("b_loss", [0.0, float("nan"), float("inf")])
def test_compare_refuses_a_zero_or_non_finite_baseline_in_one_line(runs, tmp_path, capsys, b_loss):
    base = _baseline_runs(tmp_path, b_loss)
    png = tmp_path / "refused.png"
    assert main(["compare", *runs["pcgrad"], "--baseline", *base, "--json", "--png", str(png)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and captured.out == "" and not png.exists(), captured
    assert f"the baseline of head 'b' metric 'loss' is {b_loss!r}" in lines[0]
    assert f"baseline runs {base[1]}" in lines[0] and base[0] not in lines[0]
    # left out by --metrics, the others still compare
    assert main(["compare", *runs["pcgrad"], "--baseline", *base, "--metrics", "mae,accuracy"]) == 0


def test_compare_json_and_png_with_a_negative_baseline(runs, tmp_path, capsys):
    """b/loss's baseline -0.4 (a loss may be negative: a log-likelihood's sign flipped): the
    group's b/loss 0.5 is worse, and counts +, as every other term keeps its sign."""
    base = _baseline_runs(tmp_path, -0.4)
    png = tmp_path / "curves.png"
    assert main(["compare", *runs["pcgrad"], "--baseline", *base, "--json", "--png", str(png)]) == 0
    printed = json.loads(capsys.readouterr().out)
    # 100/4 * [(0.9-1.0)/1.0 + (1.2-1.0)/1.0 - (0.8-0.5)/0.5 + (0.5-(-0.4))/|-0.4|]
    #       = 25 * (-0.1 + 0.2 - 0.6 + 2.25) = 25 * 1.75 = +43.75
    assert printed["groups"][0]["delta_m"] == pytest.approx(43.75, rel=1e-12)
    assert printed["baseline"]["b"]["loss"] == -0.4
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_pareto_marks_and_hypervolume_against_the_baselines_by_hand(runs, tmp_path, capsys):
    """Losses (min) of the fixture's groups: pcgrad (a 0.9, b 0.5), sum (a 2.0, b 0.4). Neither
    dominates the other (pcgrad is better on a, sum on b): both on the front. Against the
    baselines (a 1.0, b 0.4) neither beats the reference in both pairs (pcgrad's b 0.5 > 0.4,
    sum's a 2.0 > 1.0): the hypervolume is 0."""
    result = mh.compare(runs["pcgrad"] + runs["sum"], baseline=runs["baseline"], pareto=True)
    front = result.pareto
    assert front.pairs == ["a/loss", "b/loss"] and front.directions == ["min", "min"]
    assert front.front == ["aggregator=pcgrad", "aggregator=sum"]
    assert front.reference_from == "baselines" and front.reference == pytest.approx([1.0, 0.4])
    assert front.hypervolume == 0.0
    # without baselines, on a's mae (min) and b's accuracy (max): pcgrad (mae 1.2, acc 0.8), sum (mae 2.0, acc 0.5):
    # pcgrad dominates; reference = worst (mae 2.0, acc 0.5): box (2.0-1.2) x (0.8-0.5) = 0.24
    mixed = mh.compare(runs["pcgrad"] + runs["sum"], pareto=True, metrics=["mae", "accuracy"])
    assert mixed.pareto.pairs == ["a/mae", "b/accuracy"]
    assert mixed.pareto.front == ["aggregator=pcgrad"]
    assert mixed.pareto.reference_from == "worst values"
    assert mixed.pareto.hypervolume == pytest.approx(0.24, rel=1e-12)
    # the CLI prints the front and writes it as JSON and PNG
    png = tmp_path / "front.png"
    assert main(["compare", *runs["pcgrad"], *runs["sum"], "--pareto", "--metrics", "mae,accuracy",
                 "--json", "--png", str(png)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["pareto"]["front"] == ["aggregator=pcgrad"]
    assert printed["pareto"]["hypervolume"] == pytest.approx(0.24, rel=1e-12)
    assert png.stat().st_size > 0
    assert main(["compare", *runs["pcgrad"], *runs["sum"], "--pareto"]) == 0
    assert "Pareto front over a/loss (lower is better), b/loss (lower is better): 2 of 2 groups" in \
        capsys.readouterr().out


def test_pareto_refuses_one_objective_and_unknown_directions(runs, capsys):
    with pytest.raises(CompareError, match="pareto: a Pareto front needs at least two"):
        mh.compare(runs["pcgrad"], pareto=True, metrics=["mae"])
    assert main(["compare", *runs["pcgrad"], "--pareto", "--metrics", "mae"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def _resolved(trunk) -> dict:
    """The config a run directory holds: `multihead train` writes the resolved config."""
    from multihead.experiments.config.schema import from_dict, to_dict

    raw = {"seed": 0, "model": {"trunk": {"mlp": {"units": [4]}}, "heads": {"a": {}, "b": {}}},
           "train": {"trunk": trunk}}
    return to_dict(from_dict(raw))


def test_group_names_are_the_short_forms_and_the_best_group_is_marked(tmp_path, capsys):
    finals = {"per_head": {"a": {"loss": 1.0, "accuracy": 0.6}, "b": {"loss": 2.0}},
              "upgrad": {"a": {"loss": 0.8, "accuracy": 0.7}, "b": {"loss": 2.5}},
              "mgda": {"a": {"loss": 0.9, "accuracy": 0.7}, "b": {"loss": 1.5}}}
    paths = [_run(tmp_path / name, _resolved(name if name == "per_head" else {"aggregator": name}), final)
             for name, final in finals.items()]
    result = mh.compare(paths)
    assert [g.label for g in result.groups] == ["trunk=per_head", "trunk=upgrad", "trunk=mgda"]
    # a/loss (min): upgrad 0.8; a/accuracy (max): upgrad and mgda tie at 0.7; b/loss: mgda 1.5
    assert result.best_groups() == {"a/loss": ["trunk=upgrad"], "a/accuracy": ["trunk=upgrad", "trunk=mgda"],
                                     "b/loss": ["trunk=mgda"]}
    table = result.format()
    assert "trunk=mgda" in table and "1.5 ± 0 *" in table and "0.8 ± 0 *" in table
    # an option of one aggregated group differs: it names that group, the defaults stay out
    dtype = _run(tmp_path / "mgda64", _resolved({"aggregator": "mgda", "dtype": "float64"}), finals["mgda"])
    assert [g.label for g in mh.compare(paths + [dtype]).groups] == [
        "trunk=per_head", "trunk=upgrad", "trunk=mgda", "dtype=float64, trunk=mgda"]


def test_the_png_legend_lies_inside_the_figure(runs, tmp_path):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    from multihead.experiments.results.compare import comparison_figure
    from multihead.experiments.results.pareto import pareto_figure

    long = [_run(tmp_path / f"long{i}", {**_config("pcgrad", 0), "train": {"trunk": {
        "aggregator": "pcgrad", "options": {"a_rather_long_option_name": i, "another_long_option": "x" * 30}}}},
        {"a": {"loss": 1.0 + i}, "b": {"loss": 2.0 - i}}) for i in range(3)]
    for figure in (comparison_figure(mh.compare(runs["pcgrad"] + runs["sum"] + long)),
                   pareto_figure(mh.compare(runs["pcgrad"] + runs["sum"] + long, pareto=True).pareto)):
        figure.canvas.draw()
        box, canvas = figure.legends[0].get_window_extent(), figure.bbox
        assert box.x0 >= canvas.x0 - 1 and box.x1 <= canvas.x1 + 1, (box, canvas)
        assert box.y0 >= canvas.y0 - 1 and box.y1 <= canvas.y1 + 1, (box, canvas)
