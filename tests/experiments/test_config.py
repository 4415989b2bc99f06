"""Loading, validating and overriding experiment configs."""

import textwrap

import pytest

from multihead.experiments.config.schema import ConfigError, apply_override, from_dict, load_config, parse_yaml

MINIMAL = {"model": {"trunk": {"mlp": {"units": [4]}}, "heads": {"y1": {}, "y2": {"every": 2}}}}


def _with(path, value):
    raw = parse_yaml(repr(MINIMAL).replace("'", '"'))  # a deep copy through YAML
    apply_override(raw, f"{path}={value}")
    return raw


def test_defaults_and_types():
    config = from_dict(_with("train.steps", "50"))
    assert config.train.steps == 50 and config.train.schedule == "simultaneous"
    assert config.model.heads["y2"].every == 2 and config.model.heads["y1"].loss == "mse"
    assert config.data.correlation == 0.5


def test_train_length_is_steps_or_epochs():
    assert from_dict(MINIMAL).train.steps == 1000  # the default length
    config = from_dict(_with("train.epochs", "3"))
    assert (config.train.steps, config.train.epochs) == (None, 3)
    raw = _with("train.epochs", "3")
    apply_override(raw, "train.steps=10")
    with pytest.raises(ConfigError, match=r"^<config>: train.epochs: give train.steps or "
                                          r"train.epochs, not both \(steps 10, epochs 3\)"):
        from_dict(raw)
    raw = _with("train.epochs", "3")
    apply_override(raw, "task=dqn")
    with pytest.raises(ConfigError, match="train.epochs: only for task supervised"):
        from_dict(raw)


@pytest.mark.parametrize("path,value,message", [
    ("train.stpes", "5", "train.stpes: unknown key (did you mean 'steps'?)"),
    ("model.heads.y1.optimzer", "adam", "model.heads.y1.optimzer: unknown key (did you mean 'optimizer'?)"),
    ("train.steps", "many", "train.steps: expected an integer, got 'many' (str)"),
    ("train.steps", "0", "train.steps: must be >= 1, got 0"),
    ("train.batch_size", "true", "train.batch_size: expected an integer, got True (bool)"),
    ("model.heads.y1.trains_trunk", "1", "model.heads.y1.trains_trunk: expected true or false"),
    ("train.schedule", "sequental", "did you mean 'sequential'?"),
    ("model.heads", "{}", "model.heads: at least one head is required"),
    ("data.correlation", "[1]", "data.correlation: expected a number"),
    ("data.correlation", ".nan", "data.correlation: must be a finite number, got nan"),
    ("data.scale", "-.inf", "data.scale: must be a finite number, got -inf"),
    ("data.noise_std", "-0.5", "data.noise_std: must be in [0, 1000000.0], got -0.5"),
    ("train.trunk", "{aggregator: pcgard}", "train.trunk.aggregator: must be one of"),
    ("train.trunk", "{aggregator: pcgard}", "got 'pcgard' (did you mean 'pcgrad'?)"),
    ("train.steps_per_execution", "0", "train.steps_per_execution: must be >= 1, got 0"),
    ("train.steps_per_execution", "fast", "train.steps_per_execution: must be one of ['auto'], got 'fast'"),
    ("train.steps_per_execution", "2.5", "train.steps_per_execution: expected an integer, got 2.5"),
])
def test_errors_name_the_file_and_key_path(path, value, message):
    with pytest.raises(ConfigError) as err:
        from_dict(_with(path, value), "x.yaml")
    assert str(err.value).startswith("x.yaml: ")
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_missing_required_key():
    with pytest.raises(ConfigError, match="model.trunk: required key is missing"):
        from_dict({"model": {"heads": {"a": {}}}})


def test_overrides_are_yaml_typed_and_create_missing_levels():
    raw = {}
    apply_override(raw, "model.heads.y1.optimizer.config.learning_rate=3e-4")
    apply_override(raw, "train.eval_every=null")
    apply_override(raw, "model.heads.y1.metrics=[mae, mse]")
    assert raw["model"]["heads"]["y1"]["optimizer"]["config"]["learning_rate"] == 3e-4  # a float
    assert raw["train"]["eval_every"] is None
    assert raw["model"]["heads"]["y1"]["metrics"] == ["mae", "mse"]
    with pytest.raises(ConfigError, match="expected KEY.PATH=VALUE"):
        apply_override(raw, "no-equals-sign")
    with pytest.raises(ConfigError, match="model.heads.y1.metrics is"):
        apply_override(raw, "model.heads.y1.metrics.x=1")


def test_load_config_reads_yaml_safely(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text(textwrap.dedent("""
        model:
          trunk: {mlp: {units: [8]}}
          heads: {a: {loss: mae}}
        train: {steps: 10}
    """))
    config = load_config(path, ["train.steps=20"])
    assert config.train.steps == 20 and config.model.heads["a"].loss == "mae"
    path.write_text("model: !!python/object/apply:os.system ['echo hi']\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(path)
    with pytest.raises(ConfigError, match="cannot read the config"):
        load_config(tmp_path / "missing.yaml")


def test_xla_needs_tensorboard_off():
    with pytest.raises(ConfigError, match="set log.tensorboard: false to train with XLA"):
        from_dict(_with("train.jit_compile", "true"))
    raw = _with("train.jit_compile", "true")
    apply_override(raw, "log.tensorboard=false")
    assert from_dict(raw).train.jit_compile


@pytest.mark.parametrize("data,message", [
    ("{kind: csv}", "data.train: required for kind csv"),
    ("{kind: python}", "data.function: required for kind python"),
    ("{kind: python, function: mymodule}", "data.function: expected module:function"),
    ("{kind: npz, train: a.npz, function: m:f}", "data.function: only used with kind python"),
    ("{kind: mmoe, train: a.npz}", "data.train: only used with kind npz, csv, tfrecord or tfds"),
    ("{kind: tfds}", "data.name: required for kind tfds"),
    ("{kind: npz, train: a.npz, data_dir: d}", "data.data_dir: only used with kind tfds"),
    ("{kind: npz, train: a.npz, dtypes: {x: int32}}", "data.dtypes: only used with kind csv or tfrecord"),
    ("{kind: csv, train: a.csv, dtypes: {x: int8}}", "data.dtypes.x: must be one of"),
    ("{kind: tfrecord, train: a.tfrecord, shapes: {x: [0]}}", "data.shapes.x[0]: must be >= 1"),
    ("{kind: npz, train: a.npz, holdout: 0}", "data.holdout: must be in (0, 1)"),
    ("{kind: npz, train: a.npz, targets: {y1: a, y2: b, y3: c}}", "data.targets.y3: the model has no head 'y3'"),
    ("{kind: npz, train: a.npz, on_nan: skip}", "data.on_nan: must be one of ['error', 'drop', 'keep']"),
    ("{kind: npy}", "data.kind: must be one of"),
])
def test_data_section_errors_name_the_key(data, message):
    with pytest.raises(ConfigError) as err:
        from_dict(_with("data", data), "x.yaml")
    assert message in str(err.value) and "\n" not in str(err.value)


def test_file_data_sections_load():
    config = from_dict(_with("data", "{kind: csv, train: t.csv, features: {a: [c1, c2], b: c3}, "
                                     "targets: {y1: t1, y2: [t2, t3]}, dtypes: {t1: int32}}"))
    assert config.data.kind == "csv" and config.data.features == {"a": ["c1", "c2"], "b": "c3"}
    assert config.data.on_nan == "error" and config.data.holdout == 0.2
