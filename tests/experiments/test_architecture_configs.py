"""A config of each architecture trains as `multihead train` runs it (tiny sizes, few steps), and
bad architecture configs fail with the key path."""

import json
import os

import numpy as np
import pytest
import yaml

from multihead.cli.main import main
from multihead.experiments.run.experiment import run_experiment
from multihead.monitoring import tags
from multihead.monitoring.report import read_scalars

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = os.path.join(ROOT, "experiments", "architectures")
TINY = ["--set", "train.steps=4", "--set", "train.eval_every=4", "--set", "train.batch_size=16",
        "--set", "log.every=2", "--set", "log.histograms_every=0"]
SMALL_DATA = {"mmoe": ["--set", "data.train_size=64", "--set", "data.eval_size=32"],
              "multidigits": ["--set", "data.options={train_size: 64, eval_size: 32, canvas: 12, shift: 1}"]}
#: Gate monitoring of a config run is checked on MMoE (tests/test_architecture_training.py
#: checks the logged values); the others train without TensorBoard, whose second compiled
#: step variant doubles a run's time.
MONITORED = ("mmoe",)
NAMES = sorted(f[:-5] for f in os.listdir(CONFIGS))


@pytest.mark.parametrize("name", NAMES)
def test_each_architecture_config_validates_and_builds_its_model(name, capsys):
    """`multihead validate` loads every shipped config and builds its model (no training)."""
    if name == "mtan":
        pytest.importorskip("sklearn")
    config = os.path.join(CONFIGS, f"{name}.yaml")
    kind = yaml.safe_load(open(config))["data"]["kind"]
    assert main(["validate", config, "--build"] + SMALL_DATA[kind]) == 0
    assert f"{config}: ok" in capsys.readouterr().out


#: A training run per config costs ~5-10 s of CPU each: MMoE (with its gate monitoring) trains
#: in the default suite, the other configs with -m slow (each one's model is built by the
#: validate test above, and each architecture trains in tests/model/test_architectures.py).
@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in MONITORED else pytest.mark.slow)
                                  for n in NAMES])
def test_each_architecture_config_trains(name, tmp_path):
    if name == "mtan":
        pytest.importorskip("sklearn")
    config = os.path.join(CONFIGS, f"{name}.yaml")
    kind = yaml.safe_load(open(config))["data"]["kind"]
    run_dir = tmp_path / "run"
    quiet = [] if name in MONITORED else ["--set", "log.tensorboard=false"]
    overrides = [a for a in TINY + SMALL_DATA[kind] + quiet if a != "--set"]
    assert run_experiment(config, run_dir=str(run_dir), overrides=overrides, quiet=True).exit_code == 0
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["steps"] == 4
    assert all(np.isfinite(m["loss"]) for m in metrics["eval"].values())
    if name not in MONITORED:
        return
    scalars = read_scalars(str(run_dir / "train"))
    gate_tags = [t for t in scalars if t.startswith(tags.GATE + "/")]
    for head in metrics["eval"]:  # utilisation per head, each a distribution over the experts
        means = [scalars[t].values for t in gate_tags if t.startswith(f"gate/{head}/expert_")]
        assert len(means) == 8
        np.testing.assert_allclose(np.sum(means, axis=0), 1.0, atol=1e-5)


@pytest.mark.parametrize("trunk,message", [
    ({"mmeo": {"experts": 2}}, "model.trunk: unknown architecture 'mmeo' (did you mean 'mmoe'?)"),
    ({"mmoe": {"experts": 0, "expert": {"mlp": {"units": [4]}}}}, "model.trunk.mmoe.experts: must be >= 1"),
    ({"mmoe": {"experts": 2}}, "model.trunk.mmoe.expert: missing"),
    ({"mmoe": {"experts": 2, "expert": {"mlp": {"unit": [4]}}}},
     "model.trunk.mmoe.expert.mlp.unit: unknown key (did you mean 'units'?)"),
    ({"dselect_k": {"experts": 6, "k": 2, "expert": {"mlp": {"units": [4]}}}},
     "model.trunk.dselect_k.experts: must be a power of two"),
    ({"mmoe": {"experts": 2, "expert": {"mlp": {"units": [4, 0]}}}}, "model.trunk.mmoe.expert.mlp.units[1]: must be >= 1"),
    ({"dselect_k": {"experts": 4, "k": 2, "gamma": 0, "expert": {"mlp": {"units": [4]}}}},
     "model.trunk.dselect_k.gamma: must be > 0"),
    ({"cross_stitch": {"units": [4], "self_weight": "high"}}, "model.trunk.cross_stitch.self_weight: expected a number"),
    ({"ple": {"shared_experts": 1, "task_experts": 1, "expert": {"mlp": {"units": [4]}}, "levles": 2}},
     "model.trunk.ple.levles: unknown key (did you mean 'levels'?)"),
    ({"dselect_k": {"experts": 4, "k": 2, "entropy_reg": -1, "expert": {"mlp": {"units": [4]}}}},
     "model.trunk.dselect_k.entropy_reg: must be >= 0"),
    ({"mtan": {"channels": [4], "batch_norm": "yes"}},
     "model.trunk.mtan.batch_norm: expected true or false, got 'yes'"),
])
def test_bad_architecture_config_names_the_key(trunk, message, tmp_path, capsys):
    config = yaml.safe_load(open(os.path.join(CONFIGS, "mmoe.yaml")))
    config["model"]["trunk"] = trunk
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    run_dir = tmp_path / "run"
    assert main(["train", str(path), "--run-dir", str(run_dir), "--quiet"] + TINY
                + SMALL_DATA["mmoe"]) == 2
    assert message in capsys.readouterr().err
    assert not run_dir.exists()


def test_architecture_keys_are_the_constructors_arguments():
    """One list (ARCHITECTURES), options from the constructors: a new constructor argument is a
    config key with no second list to edit; the expert MLP's arguments are `expert`."""
    import inspect

    from multihead.experiments.build.architectures import config_keys
    from multihead.model.architectures import ARCHITECTURES

    for name, cls in ARCHITECTURES.items():
        params = [p for p in inspect.signature(cls.__init__).parameters
                  if p not in ("self", "heads", "kwargs")]
        expected = []
        for p in params:
            key = "expert" if p.startswith("expert_") else p
            if key not in expected:
                expected.append(key)
        assert list(config_keys(name)) == expected, name
    assert set(ARCHITECTURES) == {"mmoe", "omoe", "cgc", "ple", "dselect_k", "cross_stitch", "mtan"}


def test_the_docs_table_of_architecture_keys_is_the_generated_one():
    from multihead.experiments.build.architectures import architecture_table

    text = open(os.path.join(ROOT, "docs", "architectures.md")).read()
    start = text.index("<!-- BEGIN architecture keys")
    block = text[text.index("\n", start) + 1:text.index("<!-- END architecture keys -->")]
    assert block.strip() == architecture_table()
