"""`train.mixed_precision: float16 | bfloat16`: the builders give every layer they make the
mixed dtype policy; float16 gives each head a loss scale; what it cannot do is refused."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from conftest import assert_train_refuses

from multihead import _keras_internals as internals
from multihead.experiments.build.builders import build_model, build_objectives, build_trainer
from multihead.experiments.config.schema import ConfigError, from_dict, parse_yaml

BASE = """\
seed: 0
data: {kind: mmoe, train_size: 64, eval_size: 16, input_dim: 4}
model:
  trunk: {mlp: {units: [4], dropout: 0.1}}
  heads:
    y1: {layers: [{class_name: Dense, config: {units: 3}}, {class_name: Dense, config: {units: 1}}]}
    y2: {layers: {mlp: {units: [2, 1], output_activation: linear}}}
train: {steps: 2, batch_size: 8}
log: {tensorboard: false}
"""


def _config(**train):
    raw = parse_yaml(BASE)
    raw["train"].update(train)
    return from_dict(raw)


def _policies(*parts):
    """The policies of the layers of `parts` that compute (not of `keras.Sequential`s)."""
    return {layer.dtype_policy.name for part in parts for layer in internals.all_layers(part)
            if not isinstance(layer, (keras.Model, keras.layers.InputLayer))}


@pytest.mark.parametrize("precision,policy,scaled", [
    (None, "float32", False), ("bfloat16", "mixed_bfloat16", False),
    ("float16", "mixed_float16", True)])
def test_every_layer_but_the_heads_outputs_takes_the_policy(precision, policy, scaled):
    config = _config(mixed_precision=precision)
    model = build_model(config, (None, 4))
    hidden = [model.heads["y1"].layers[0], model.heads["y2"].layers[0]]
    assert _policies(model.trunk, *hidden) == {policy}
    outputs = [model.heads["y1"].layers[-1], model.heads["y2"].layers[-1]]
    assert _policies(*outputs) == {"float32"}
    x = np.ones((2, 4), "float32")
    assert {h: out.dtype.name for h, out in model(x).items()} == {"y1": "float32", "y2": "float32"}
    assert {v.dtype for v in model.weights} == {"float32"}
    trainer = build_trainer(config, model, build_objectives(config), None)
    assert (trainer.loss_scales is not None) == scaled


def test_an_architecture_trunk_takes_the_policy_too():
    raw = parse_yaml(BASE)
    raw["model"]["trunk"] = {"mmoe": {"experts": 2, "expert": {"mlp": {"units": [4]}}}}
    raw["train"]["mixed_precision"] = "bfloat16"
    assert _policies(build_model(from_dict(raw), (None, 4)).trunk) == {"mixed_bfloat16"}


def test_a_layer_config_that_names_its_dtype_keeps_it():
    raw = parse_yaml(BASE)
    raw["model"]["heads"]["y1"]["layers"][0]["config"]["dtype"] = "float32"
    raw["model"]["heads"]["y1"]["layers"][1]["config"]["dtype"] = "mixed_float16"
    raw["train"]["mixed_precision"] = "float16"
    model = build_model(from_dict(raw), (None, 4))
    assert [layer.dtype_policy.name for layer in model.heads["y1"].layers] == [
        "float32", "mixed_float16"]


def test_float16_with_trunk_aggregation_is_refused_naming_the_trunk():
    with pytest.raises(ConfigError, match=r"^<config>: train.trunk: trunk aggregation does not support "
                                          r"float16 loss scaling .*train.trunk: per_head.*"
                                          r"bfloat16") as err:
        _config(mixed_precision="float16", trunk={"optimizer": "adam", "aggregator": "mean"})
    assert "\n" not in str(err.value)
    _config(mixed_precision="bfloat16", trunk={"optimizer": "adam", "aggregator": "mean"})


def test_train_refuses_a_bad_precision_in_one_line_writing_nothing(tmp_path, capsys):
    config = tmp_path / "exp.yaml"
    config.write_text(BASE)
    assert_train_refuses(config, "train.mixed_precision=half", "train.mixed_precision", tmp_path,
                         capsys)


def test_a_keras_dtype_policy_object_is_what_the_layers_hold():
    model = build_model(_config(mixed_precision="float16"), (None, 4))
    assert isinstance(model.trunk.layers[0].dtype_policy, keras.DTypePolicy)
    assert model.trunk.layers[0].compute_dtype == "float16"
