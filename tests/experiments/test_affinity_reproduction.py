"""TAG's finding on data where the answer is known (slow; benchmarks/task_groupings.py runs
three seeds and docs/affinity.md gives the figures): two clusters of correlated tasks from
the MMoE generator, orthogonal across clusters. The affinity is higher within the clusters
than across, the proposed 2-group split is the clusters, and the grouped runs beat the
all-in-one run on Δm% against the single-task baselines."""

from __future__ import annotations

import pytest
import yaml

import multihead as mh
from multihead.experiments.results.compare import delta_m

HEADS = ("y1", "y2", "y3", "y4")
CLUSTERS = [["y1", "y2"], ["y3", "y4"]]
HEAD = {"layers": {"mlp": {"units": [16, 1], "activation": "relu", "output_activation": "linear"}},
        "loss": "mse", "optimizer": {"class_name": "Adam", "config": {"learning_rate": 1e-3}}}
CONFIG = {
    "seed": 0,
    "data": {"kind": "mmoe", "correlation": 0.9, "clusters": CLUSTERS, "train_size": 8000,
             "eval_size": 2000},
    "model": {"trunk": {"mlp": {"units": [16], "activation": "relu"}},
              "heads": {h: HEAD for h in HEADS}},
    # one trunk Adam on the summed gradients: every run takes one trunk step per step, whatever
    # its number of heads (with per-head optimizers each head's Adam steps the trunk)
    "train": {"steps": 3000, "batch_size": 128,
              "trunk": {"aggregator": "sum", "optimizer": {"class_name": "Adam",
                                                           "config": {"learning_rate": 1e-3}}}},
    "log": {"every": 100, "histograms_every": 0, "affinity_every": 10},
}


def _train(path, run_dir, overrides=()):
    result = mh.run_experiment(str(path), run_dir=str(run_dir), overrides=list(overrides),
                               quiet=True)
    assert result.exit_code == 0, result.message
    return result.metrics


def _losses(metrics, heads):
    return {h: {"loss": metrics["eval"][h]["loss"]} for h in heads}


@pytest.mark.slow
def test_affinity_finds_the_clusters_and_the_grouped_runs_beat_the_all_in_one_run(tmp_path):
    path = tmp_path / "clusters.yaml"
    path.write_text(yaml.safe_dump(CONFIG))
    everyone = _train(path, tmp_path / "all")
    z = everyone["affinity"]
    within = [z[i][j] for c in CLUSTERS for i in c for j in c if i != j]
    across = [z[i][j] for i in HEADS for j in HEADS if not any(i in c and j in c for c in CLUSTERS)]
    assert sum(within) / len(within) > sum(across) / len(across)
    grouping = mh.task_groupings(z, 2)
    assert sorted(list(g.heads) for g in grouping.groups) == CLUSTERS
    grouped, single = {}, {}
    for n, group in enumerate(CLUSTERS):
        run = _train(path, tmp_path / f"group{n}", [f"train.only_heads=[{', '.join(group)}]",
                                                    "log.affinity_every=0"])
        grouped.update(_losses(run, group))
    for head in HEADS:
        run = _train(path, tmp_path / f"single-{head}", [f"train.only_heads=[{head}]",
                                                         "log.affinity_every=0"])
        single.update(_losses(run, [head]))
    assert delta_m(grouped, single)[0] < delta_m(_losses(everyone, HEADS), single)[0]
