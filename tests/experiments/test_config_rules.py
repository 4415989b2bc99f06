"""`multihead validate` refuses, in one line naming the key, every config `train` would fail on
or silently misread (`multihead.experiments.config.value_checks`, `yaml12`, `dry_run`)."""

from __future__ import annotations

import math
import re
import sys
import time

import pytest
import yaml

from multihead.cli.main import main
from multihead.experiments.config.schema import ConfigError, parse_yaml
from multihead.experiments.config.yaml12 import dump_yaml, load_yaml

BASE = """\
seed: 0
data: {kind: mmoe, train_size: 64, eval_size: 16, input_dim: 4}
model:
  trunk: {mlp: {units: [4]}}
  heads:
    y1: {loss: mse, optimizer: {class_name: Adam, config: {learning_rate: 1.0e-3}}}
    y2: {loss: mse}
train: {steps: 2, batch_size: 8}
"""


def _validate(tmp_path, capsys, text=BASE, sets=(), extra=()):
    path = tmp_path / "exp.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    args = ["validate", str(path), "--build"] + [f"--set={s}" for s in sets] + list(extra)
    code = main(args)
    out = capsys.readouterr()
    return code, out.err


@pytest.mark.parametrize("override, key, words", [
    ("model.heads.y1.optimizer={config: {learning_rate: 0.1}}", "model.heads.y1.optimizer",
     "needs class_name"),
    ("seed=99999999999999999999", "seed", "must be in"),
    ("seed=-1", "seed", "a seed must be in [0,"),
    ("model.heads.y1.layers={class_name: Layer}", "model.heads.y1.layers", "abstract base class"),
    ("model.heads.y1.layers={class_name: Dense, config: {units: 1, dtype: int32}}",
     "model.heads.y1.layers.config.dtype", "cannot be trained"),
    ("model.heads.y1.optimizer={class_name: LossScaleOptimizer, config: {inner_optimizer: adam}}",
     "model.heads.y1.optimizer.class_name", "loss scaling"),
    ("model.heads.y1.metrics=[null]", "model.heads.y1.metrics[0]", "expected a metric name"),
    ("train.mixed_precision=float32", "train.mixed_precision", "float16"),
    ("model.heads.y1.optimizer={class_name: Adam, config: {learning_rate: .nan}}",
     "model.heads.y1.optimizer.config.learning_rate", "finite"),
    ("model.heads.y1.optimizer={class_name: Adam, config: {learning_rate: -0.1}}",
     "model.heads.y1.optimizer.config.learning_rate", "> 0"),
    ("model.heads.y1.loss={class_name: Huber, config: {delta: -1.0}}",
     "model.heads.y1.loss.config.delta", "> 0"),
    ("model.heads.y1.layers={class_name: Lambda, config: {function: abc}}",
     "model.heads.y1.layers", "arbitrary code"),
    ("train.steps=!!int abc", "train.steps", "not an integer"),
    ("train.batch_size=99999999999999999999999", "train.batch_size", "must be in"),
    ("model.trunk={mlp: {units: [99999999999]}}", "model.trunk.mlp.units[0]", "integer range"),
    ("data.correlation=.inf", "data.correlation", "finite"),
    ("data.num_sinusoids=1217826", "data.num_sinusoids", "<= 10000"),
    ("data.train_size=2000000000", "data.train_size", "GiB"),
    ("model.heads={1: {}}", "model.heads.1", "keys are strings"),
    ("train.steps=" + "[" * 100 + "]" * 100, "train.steps", "deeper than"),
])
def test_each_bad_input_is_one_line_exit_2_naming_the_key(tmp_path, capsys, override, key, words):
    code, err = _validate(tmp_path, capsys, sets=[override])
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("multihead: error: ") and "Traceback" not in err
    assert key in err and words in err, err


def test_a_non_utf8_file_and_duplicate_keys_are_refused(tmp_path, capsys):
    code, err = _validate(tmp_path, capsys, BASE.encode() + b"# caf\xe9\n")
    assert code == 2 and "not UTF-8 text (byte 0xe9" in err and err.count("\n") == 1
    code, err = _validate(tmp_path, capsys, BASE + "seed: 1\n")
    assert code == 2 and "duplicate key 'seed' (first on line 1) (line 9" in err


def test_yaml_is_read_as_yaml_1_2_in_files_and_in_set(tmp_path, capsys):
    # YAML 1.1 would read: True, 8, 90, a date, False.
    assert load_yaml("a: yes\nb: 010\nc: 1:30\nd: 2020-01-01\ne: off\nf: 0o10\ng: 0x1f\nh: 3e-4\n") == {
        "a": "yes", "b": 10, "c": "1:30", "d": "2020-01-01", "e": "off", "f": 8, "g": 31, "h": 3e-4}
    assert math.isnan(load_yaml(".nan")) and load_yaml("-.inf") == -math.inf
    from multihead.experiments.config.schema import load_config

    code, err = _validate(tmp_path, capsys, BASE.replace("y2:", "yes:"), sets=["train.steps=010"])
    assert code == 0, err
    config = load_config(tmp_path / "exp.yaml", ["train.steps=010"])
    assert list(config.model.heads) == ["y1", "yes"] and config.train.steps == 10
    with pytest.raises(ConfigError, match="expected an integer, got '1:30'"):
        load_config(tmp_path / "exp.yaml", ["train.steps=1:30"])
    # What a run writes reads back the same in both YAML versions.
    tricky = {"s": ["yes", "010", "1:30", "0o10", "3e-4", "true", "null", "2020-01-01"]}
    text = dump_yaml(tricky)
    assert load_yaml(text) == tricky == yaml.safe_load(text)


def test_an_alias_bomb_fails_fast(tmp_path, capsys):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    text = "\n".join(lines) + "\nbomb: *a9\n"
    assert len(text) < 700  # 9**10 = 3.5e9 nodes expanded
    started = time.process_time()
    with pytest.raises(ConfigError, match="expands to more than 100000 nodes"):
        parse_yaml(text, "bomb.yaml")
    assert time.process_time() - started < 5  # CPU time of the parse, not a wall-clock race


def test_env_id_with_a_module_prefix_is_refused_and_imports_nothing(tmp_path, capsys):
    pytest.importorskip("gymnasium")
    assert "this" not in sys.modules  # `import this` prints the Zen of Python
    rl = """\
task: dqn
env: {id: "this:CartPole-v1"}
model: {trunk: {mlp: {units: [4]}}, heads: {q: {layers: {class_name: Dense, config: {units: 2}}}}}
dqn: {head: q}
train: {steps: 2, batch_size: 4}
"""
    code, err = _validate(tmp_path, capsys, rl)
    assert code == 2 and err.count("\n") == 1
    assert "env.id: 'this:CartPole-v1' would make gymnasium import the Python module 'this'" in err
    assert "--allow-import this" in err and "this" not in sys.modules
    code, err = _validate(tmp_path, capsys, rl.replace("this:CartPole-v1", "CartPole-v7"))
    assert code == 2 and "not a registered gymnasium environment (did you mean 'CartPole-v1'?)" in err


def test_validate_runs_every_head_on_a_tiny_batch(tmp_path, capsys):
    """What building alone accepts but the first step would fail on."""
    code, err = _validate(tmp_path, capsys, sets=[
        "model.heads.y1.loss=sparse_categorical_crossentropy"])
    # mmoe labels are regression values: a sparse cross-entropy would truncate them to classes
    assert code == 2 and "model.heads.y1.loss: a sparse cross-entropy takes integer class labels" \
        in err, err
    assert err.count("\n") == 1
    code, err = _validate(tmp_path, capsys, sets=[
        "model.heads.y1.loss=categorical_crossentropy",
        "model.heads.y1.layers={class_name: Dense, config: {units: 3}}"])
    assert code == 2 and "model.heads.y1.loss: cannot compute it on a batch" in err, err
    assert err.count("\n") == 1


def test_recursive_aliases_are_refused_at_once():
    for text in ("x: &loop [1, *loop]\n", "x: &loop {a: {b: [*loop]}}\n",
                 "model: &m {trunk: *m, heads: {}}\n"):
        started = time.process_time()
        with pytest.raises(ConfigError, match="an alias refers to a node that contains it"):
            parse_yaml(text, "loop.yaml")
        assert time.process_time() - started < 1  # CPU time: a cycle is seen, not walked


def _multiplied_layers(levels: int) -> str:
    """A flow list of 10**levels Dense specs in a few hundred bytes: each level's anchor is
    defined at its first use and aliased nine more times."""
    text = "&l0 {class_name: Dense, config: {units: 2}}"
    for i in range(1, levels + 1):
        text = f"&l{i} [" + text + ", " + ", ".join([f"*l{i - 1}"] * 9) + "]"
    return text


def test_layer_lists_multiplied_through_aliases_are_refused_before_building(tmp_path, capsys):
    text = BASE.replace("trunk: {mlp: {units: [4]}}", "trunk: " + _multiplied_layers(4))
    assert len(text) < 1000
    started = time.process_time()
    code, err = _validate(tmp_path, capsys, text)
    assert time.process_time() - started < 5  # CPU time: counted, not built
    assert code == 2 and err.count("\n") == 1 and "model: more than 2000 layers" in err, err


@pytest.mark.parametrize("path, value, words", [
    ("data.on_nan", "drop", None),
    ("data.on_nonfinite", "drop", None),
    ("data.tasks", ["y1", "y2", "y1"], "data.tasks[2]: task 'y1' is listed twice"),
    ("data.tasks", ["y1", "y2", "y3"], "data.tasks[2]: task 'y3' has no head"),
    ("data.scale", 1e30, "data.scale: must be in [-1000000.0, 1000000.0], got 1e+30"),
    ("model.heads.y1.optimizer", {"class_name": "SGD", "config": {"clipvalue": -0.5}},
     "model.heads.y1.optimizer.config.clipvalue: must be a finite number > 0, got -0.5"),
    ("model.heads.y1.optimizer", {"class_name": "Adam", "config": {"beta_1": 1.0}},
     "model.heads.y1.optimizer.config.beta_1: must be in [0, 1), got 1.0"),
    # Keras takes a list as epsilon and fails inside the compiled step (found by the slow fuzz)
    ("model.heads.y1.optimizer", {"class_name": "Adam", "config": {"epsilon": []}},
     "model.heads.y1.optimizer.config.epsilon: must be a finite number, got []"),
    ("train.trunk", {"aggregator": "famo", "options": {"gamma": 1e30}},
     "train.trunk.options.gamma: |1e+30| is beyond 1e+06"),
])
def test_ranges_of_the_supervised_schema(path, value, words):
    from multihead.experiments.config.schema import from_dict, to_dict

    raw = load_yaml(BASE)
    node = raw
    for key in path.split(".")[:-1]:
        node = node.setdefault(key, {})
    node[path.split(".")[-1]] = value
    if words is None:  # on_nan is the former name of on_nonfinite: both end equal
        config = from_dict(raw, "x.yaml")
        assert config.data.on_nonfinite == config.data.on_nan == value
        again = from_dict(to_dict(config), "x.yaml")  # what a run writes reads back the same
        assert to_dict(again) == to_dict(config)
        return
    with pytest.raises(ConfigError) as err:
        from_dict(raw, "x.yaml")
    assert str(err.value) == f"x.yaml: {words}" or str(err.value).startswith(f"x.yaml: {words}"), err.value


@pytest.mark.parametrize("section, key, value, words", [
    ("dqn", "gamma", 1.01, "dqn.gamma: must be in [0, 1], got 1.01"),
    ("dqn", "epsilon_start", 2.0, "dqn.epsilon_start: must be in [0, 1], got 2.0"),
    ("actor_critic", "gamma", 1e30, "actor_critic.gamma: must be in [0, 1], got 1e+30"),
    ("actor_critic", "entropy_coef", 1e30, "actor_critic.entropy_coef: must be in [0, 100.0]"),
    ("actor_critic", "num_envs", 2**30, "actor_critic.num_envs: must be in [1, 4096]"),
])
def test_ranges_of_the_rl_sections(section, key, value, words):
    from multihead.experiments.config.schema import from_dict

    heads = {"q": {"layers": {"class_name": "Dense", "config": {"units": 2}}}} if section == "dqn" \
        else {"policy": {"layers": {"class_name": "Dense", "config": {"units": 2}}},
              "value": {"layers": {"class_name": "Dense", "config": {"units": 1}}}}
    raw = {"task": section, "env": {"id": "CartPole-v1"}, section: {key: value},
           "model": {"trunk": {"mlp": {"units": [4]}}, "heads": heads}}
    with pytest.raises(ConfigError, match="^x.yaml: " + re.escape(words)):
        from_dict(raw, "x.yaml")


def test_a_one_head_baseline_keeps_the_multi_task_data():
    """A task without a head is refused, except with one head: `train --only-head` trains one
    head on the multi-task run's generated data."""
    from multihead.experiments.config.schema import from_dict
    from multihead.experiments.run.single_task import only_head

    baseline = only_head(from_dict(load_yaml(BASE), "x.yaml"), "y2")
    assert baseline.data.tasks == ["y1", "y2"] and list(baseline.model.heads) == ["y2"]


def test_merge_keys_share_settings_between_heads(tmp_path, capsys):
    text = BASE.replace(
        "    y1: {loss: mse, optimizer: {class_name: Adam, config: {learning_rate: 1.0e-3}}}\n"
        "    y2: {loss: mse}\n",
        "    y1: &head {loss: mse, metrics: [mae],\n"
        "               optimizer: {class_name: Adam, config: {learning_rate: 1.0e-3}}}\n"
        "    y2:\n"
        "      <<: *head\n"
        "      loss: huber          # a written key overrides the merged one\n")
    code, err = _validate(tmp_path, capsys, text)
    assert code == 0, err
    from multihead.experiments.config.schema import load_config

    heads = load_config(tmp_path / "exp.yaml").model.heads
    assert heads["y2"].loss == "huber" and heads["y2"].metrics == ["mae"]
    assert heads["y2"].optimizer == heads["y1"].optimizer == {
        "class_name": "Adam", "config": {"learning_rate": 1.0e-3}}


def test_a_list_of_merge_keys_takes_each_key_from_the_first_mapping_that_has_it():
    text = ("a: &a {lr: 1, beta: 2}\nb: &b {lr: 3, decay: 4}\n"
            "x: {<<: [*a, *b], decay: 5}\ny: {<<: [*b, *a]}\n")
    loaded = load_yaml(text)
    assert loaded["x"] == {"lr": 1, "beta": 2, "decay": 5}
    assert loaded["y"] == {"lr": 3, "decay": 4, "beta": 2}


def test_merge_keys_stay_within_the_alias_bound_and_refuse_non_mappings():
    lines = ["a0: &a0 {k0: x}"]
    lines += [f"a{i}: &a{i} {{<<: [" + ", ".join([f"*a{i - 1}"] * 9) + f"], k{i}: x}}"
              for i in range(1, 10)]
    with pytest.raises(ConfigError, match="expands to more than 100000 nodes"):
        parse_yaml("\n".join(lines) + "\n", "bomb.yaml")  # 9**9 merged pairs unbounded
    with pytest.raises(ConfigError, match="expected a mapping or list of mappings for merging"):
        parse_yaml("a: &a [1, 2]\nb: {<<: *a}\n", "bad.yaml")
    with pytest.raises(ConfigError, match="duplicate key 'k'"):
        parse_yaml("a: &a {k: 1}\nb: {<<: *a, k: 2, k: 3}\n", "dup.yaml")
