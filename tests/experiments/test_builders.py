"""Config -> Keras layers, objectives and data, with errors naming the key path."""

import keras
import pytest

from multihead.experiments.build.builders import build_data, build_layer, build_model, build_objectives
from multihead.experiments.config.schema import ConfigError, from_dict


def _config(**heads):
    return from_dict({"model": {"trunk": {"mlp": {"units": [6, 5]}},
                                "heads": heads or {"y1": {}, "y2": {}}},
                      "data": {"train_size": 50, "eval_size": 10, "input_dim": 7}})


def test_keras_serialization_and_mlp_shorthand():
    dense = build_layer({"class_name": "Dense", "config": {"units": 3, "activation": "relu"}}, "p")
    assert isinstance(dense, keras.layers.Dense) and dense.units == 3
    mlp = build_layer({"mlp": {"units": [4, 2], "activation": "tanh", "output_activation": "linear",
                               "dropout": 0.1}}, "p")
    kinds = [type(layer).__name__ for layer in mlp.layers]
    assert kinds == ["Dense", "Dropout", "Dense"]
    assert mlp.layers[0].activation.__name__ == "tanh" and mlp.layers[2].activation.__name__ == "linear"
    stack = build_layer([{"class_name": "Dense", "config": {"units": 2}}, {"mlp": {"units": [1]}}], "p")
    assert isinstance(stack, keras.Sequential) and len(stack.layers) == 2


@pytest.mark.parametrize("spec,message", [
    ({"class_name": "Dnse", "config": {}}, "p.class_name: unknown Keras layer 'Dnse' (did you mean 'Dense'?)"),
    ({"class_name": "Dense", "config": {"unitz": 3}}, "p: cannot build 'Dense'"),
    ({"class_name": "Dense", "config": {"units": 3, "activation": "relux"}}, "p: cannot build 'Dense'"),
    ({"mlp": {"unit": [3]}}, "p.mlp.unit: unknown key (did you mean 'units'?)"),
    ({"mlp": {"units": [0]}}, "p.mlp.units[0]: must be >= 1, got 0"),
    ({"mlp": {"units": 3}}, "p.mlp.units: expected a non-empty list of positive integers"),
    ({"mlp": {"units": [3], "dropout": 1}}, "p.mlp.dropout: must be in [0.0, 1.0), got 1"),
    ({"mlp": {"units": [3], "activation": "relux"}}, "p.mlp: Could not interpret activation"),
    ([], "p: the list of layers is empty"),
    ("dense", "p: expected a Keras layer"),
])
def test_layer_errors(spec, message):
    with pytest.raises(ConfigError) as err:
        build_layer(spec, "p")
    assert message in str(err.value)


def test_model_objectives_and_data_from_config():
    config = _config(y1={"every": 3, "loss": "mae", "optimizer": {"class_name": "SGD",
                                                                   "config": {"learning_rate": 0.1}}},
                     y2={"trains_trunk": False})
    data = build_data(config)
    model = build_model(config, (None, 7))
    assert model.head_names == ("y1", "y2") and data.x_train.shape == (50, 7)
    objectives = build_objectives(config)
    assert objectives["y1"].every == 3 and objectives["y2"].trains_trunk is False


@pytest.mark.parametrize("head,message", [
    ({"loss": "msee"}, "model.heads.y1.loss: head 'y1': unknown loss 'msee'"),
    ({"optimizer": "adamm"}, "model.heads.y1.optimizer: head 'y1': unknown optimizer 'adamm'"),
    ({"optimizer": {"class_name": "Adam", "config": {"learning_rat": 1}}}, "model.heads.y1.optimizer"),
    ({"metrics": ["mae", "nope"]}, "model.heads.y1.metrics[1]: head 'y1': unknown metric 'nope'"),
])
def test_objective_errors_name_the_head_key(head, message):
    with pytest.raises(ConfigError) as err:
        build_objectives(_config(y1=head))
    assert message in str(err.value)


def test_data_tasks_must_cover_the_heads():
    config = _config()
    config.data.tasks = ["y1"]
    with pytest.raises(ConfigError, match="model.heads.y2: the data has no task 'y2'"):
        build_data(config)


def test_mixed_data_makes_the_first_head_a_classification_task():
    config = _config()
    config.data.kind = "mixed"
    assert build_data(config).kinds == {"y1": "classification", "y2": "regression"}


def test_build_trainer_updates_the_target_networks_inside_the_step():
    """RL runs give the trainer their target networks: one `update()` per train step, and
    none in `evaluate`."""
    import numpy as np

    import multihead as mh
    from multihead.experiments.build.builders import build_trainer

    config = _config()
    model = build_model(config, (None, 7))
    target = mh.TargetNetwork(model, heads=["y1"], every=2)
    trainer = build_trainer(config, model, build_objectives(config), None, target_networks=[target])
    x = np.ones((4, 7), "float32")
    batch = (x, {"y1": np.zeros((4, 1), "float32"), "y2": np.zeros((4, 1), "float32")})
    for _ in range(3):
        trainer.step(batch)
    trainer.evaluate(batch)
    assert int(target.counter.numpy()) == 3 and target.num_syncs == 1  # one sync, at update 2 (3 // 2 = 1)
