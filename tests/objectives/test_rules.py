"""Rules between settings (`multihead.settings`): each written once, naming its field,
worded for the Python API and, through the config's spelling, for a config."""

import ast
import pathlib

import pytest

import multihead as mh
from conftest import make_model
from multihead import settings as rules
from multihead.settings import PYTHON, SettingError
from multihead.step.options import check_jit_logging, check_jit_strategy
from multihead.experiments.config.schema import ConfigError, apply_override, from_dict


def _raw(**train):
    raw = {"model": {"trunk": {"mlp": {"units": [4]}}, "heads": {"a": {}, "b": {}}}}
    if train:
        raw["train"] = train
    return raw


def _objectives(**b):
    return {"a": mh.Objective("mse"), "b": mh.Objective("mse", **b)}


# Each case: the rule broken through the Python API, the field the error names, a text
# the API message holds, then the same rule broken through a config and the key path.
CASES = [
    pytest.param(dict(jit_compile=True, log_dir="LOG"), {}, "jit_compile", "set log_dir=None",
                 {"train.jit_compile": "true"}, "train.jit_compile: XLA cannot compile",
                 "set log.tensorboard: false", id="jit-logging"),
    pytest.param(dict(schedule="sequential", trunk={"aggregator": "sum"}), {}, "schedule",
                 "needs schedule='simultaneous'",
                 {"train.schedule": "sequential", "train.trunk": "{aggregator: sum}"},
                 "train.schedule: trunk aggregation needs train.schedule: simultaneous",
                 "or set train.trunk: per_head", id="schedule"),
    pytest.param(dict(trunk={"aggregator": "sum"}), {"every": 2}, "objectives.every",
                 "objectives['b'].every: must be 1",
                 {"train.trunk": "{aggregator: sum}", "model.heads.b.every": "2"},
                 "model.heads.b.every: must be 1 with trunk aggregation",
                 "set model.heads.b.trains_trunk: false", id="every"),
    pytest.param(dict(trunk={"aggregator": "pcgrad", "rep_grad": True}), {}, "trunk.rep_grad",
                 "cannot use rep_grad=True",
                 {"train.trunk": "{aggregator: pcgrad, rep_grad: true}"},
                 "train.trunk.rep_grad: trunk aggregator 'pcgrad' cannot use rep_grad=True", "",
                 id="policy-rep-grad"),
    pytest.param(dict(trunk={"aggregator": "sum", "dtype": "float16"}), {}, "trunk.dtype",
                 "TrunkPolicy.dtype: must be one of",
                 {"train.trunk": "{aggregator: sum, dtype: float16}"},
                 "train.trunk.dtype: must be one of", "", id="policy-dtype"),
    # A method constructor's own check names the field its arguments came from.
    pytest.param(dict(trunk={"aggregator": "gradvac", "options": {"beta": 2.0}}), {},
                 "trunk.options", "aggregator 'gradvac': beta must be a number in [0.0, 1.0]",
                 {"train.trunk": "{aggregator: gradvac, options: {beta: 2.0}}"},
                 "train.trunk.options: aggregator 'gradvac': beta must be", "", id="method-options"),
    pytest.param(dict(trunk={"aggregator": "pcgrad", "loss_weighting": "dwa",
                             "loss_weighting_options": {"temperature": -1.0}}), {},
                 "trunk.loss_weighting_options", "loss weighting 'dwa': temperature must be",
                 {"train.trunk": "{aggregator: pcgrad, loss_weighting: dwa, "
                                 "loss_weighting_options: {temperature: -1.0}}"},
                 "train.trunk.loss_weighting_options: loss weighting 'dwa': temperature", "",
                 id="weighting-options"),
    pytest.param(dict(trunk={"aggregator": "pcgrad", "loss_weighting": "nope"}), {},
                 "trunk.loss_weighting", "TrunkPolicy.loss_weighting: must be one of",
                 {"train.trunk": "{aggregator: pcgrad, loss_weighting: nope}"},
                 "train.trunk.loss_weighting: must be one of", "", id="weighting-name"),
    pytest.param(dict(trunk={"aggregator": {"class_name": "x>Y"}}), {},
                 "trunk.aggregator", "'x>Y' is not a registered Aggregator subclass",
                 {"train.trunk": "{aggregator: {class_name: x>Y}}"},
                 "train.trunk.aggregator: 'x>Y' is not a registered", "", id="aggregator-class"),
]


@pytest.mark.parametrize("kwargs,b,field,api_text,overrides,key_text,config_fix", CASES)
def test_a_rule_names_its_field_in_python_and_its_key_path_in_a_config(
        tmp_path, kwargs, b, field, api_text, overrides, key_text, config_fix):
    if "log_dir" in kwargs:
        kwargs = {**kwargs, "log_dir": str(tmp_path)}
    with pytest.raises(SettingError) as err:
        mh.Trainer(make_model(), _objectives(**b), **kwargs)
    assert err.value.field == field
    assert err.value.head == ("b" if field.startswith("objectives.") else None)
    assert api_text in str(err.value) and "\n" not in str(err.value)
    raw = _raw()
    for key, value in overrides.items():
        apply_override(raw, f"{key}={value}")
    with pytest.raises(ConfigError) as cerr:
        from_dict(raw, "x.yaml")
    message = str(cerr.value)
    assert message.startswith(f"x.yaml: {key_text}"), message
    assert config_fix in message and "\n" not in message


def test_the_strategy_limits_name_their_fields():
    where = "a strategy (MirroredStrategy)"
    for kwargs, field in [(dict(rep_grad=True), "trunk.rep_grad"),
                          (dict(loss_weighting="uw"), "trunk.aggregator")]:
        args = {**dict(rep_grad=False, loss_weighting=None), **kwargs}
        with pytest.raises(SettingError) as err:
            rules.check_strategy_limits(where, spell=PYTHON, **args)
        assert err.value.field == field and str(err.value).startswith(f"{field}: ")
        rules.check_strategy_limits(None, spell=PYTHON, **args)  # one device: no limit
    # XLA's limit sits with its option (multihead.step.options), worded the same way
    with pytest.raises(SettingError) as err:
        check_jit_strategy(True, where, PYTHON)
    assert err.value.field == "jit_compile" and str(err.value).startswith("jit_compile: ")
    check_jit_strategy(True, None, PYTHON)


def test_strategy_limits_in_a_config_name_the_key_path():
    raw = _raw(jit_compile=True)
    raw["log"] = {"tensorboard": False}
    raw["distribute"] = {"strategy": "mirrored"}
    with pytest.raises(ConfigError, match=r"^x.yaml: train.jit_compile: true is not supported with "
                                          r"distribute.strategy mirrored; set train.jit_compile: false$"):
        from_dict(raw, "x.yaml")
    raw = _raw(trunk={"aggregator": "dwa"})
    raw["distribute"] = {"strategy": "mirrored"}
    with pytest.raises(ConfigError, match=r"^x.yaml: train.trunk.aggregator: dwa \(a loss weighting\)"):
        from_dict(raw, "x.yaml")


def test_rep_grad_with_per_head_data_is_refused_by_the_config_as_by_fit():
    """The rule fit applies (one batch for all heads) now refuses the config at load."""
    raw = _raw(trunk={"aggregator": "mgda", "rep_grad": True})
    raw["data"] = {"per_head": {h: {} for h in ("a", "b")}}
    with pytest.raises(ConfigError, match=r"^x.yaml: train.trunk.rep_grad: train.trunk.rep_grad: "
                                          r"true combines .* one batch for all heads"):
        from_dict(raw, "x.yaml")
    with pytest.raises(SettingError, match="one batch for all heads") as err:
        rules.check_rep_grad_data(True, per_head_data=True, spell=PYTHON)
    assert err.value.field == "trunk.rep_grad"


def test_no_rule_passes_when_settings_agree():
    check_jit_logging(True, logging=False, spell=PYTHON)
    check_jit_logging(False, logging=True, spell=PYTHON)
    rules.check_trunk_aggregation("simultaneous", {"a": (True, 1), "b": (False, 3)}, PYTHON)
    rules.check_rep_grad_trunk(True, "Sequential", routes_heads=False, spell=PYTHON)
    rules.check_rep_grad_data(False, per_head_data=True, spell=PYTHON)


def test_setting_error_is_a_value_error_whose_text_is_the_message():
    err = SettingError("trunk.rep_grad", "trunk.rep_grad: bad")
    assert isinstance(err, ValueError) and str(err) == "trunk.rep_grad: bad"
    assert (err.field, err.head) == ("trunk.rep_grad", None)


def test_the_rules_module_imports_neither_tensorflow_nor_keras():
    """The config layer calls the rules while validating a file."""
    tree = ast.parse(pathlib.Path(rules.__file__).read_text())
    imported = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    imported += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    assert not [m for m in imported if m.split(".")[0] in ("tensorflow", "keras", "multihead")]


def test_the_config_maps_fields_without_reading_messages():
    """A rule's error text is free to change: the config reads `.field`, never the text."""
    source = pathlib.Path(from_dict.__code__.co_filename).read_text()
    assert "in str(err)" not in source


def test_a_routing_trunk_refuses_rep_grad_naming_the_field():
    with pytest.raises(SettingError) as err:
        rules.check_rep_grad_trunk(True, "MMoE", routes_heads=True, spell=PYTHON)
    assert err.value.field == "trunk.rep_grad"
    assert str(err.value).startswith("trunk.rep_grad: trunk.rep_grad=True combines")
