"""`StepOptions` (multihead.step.options): one frozen object, built once, passed whole.

An option is named where it is documented (its field), where it is read (its
consumer) and at most one place more; the Trainer's keywords and a config's
`train:` keys reach it by name.
"""

import ast
import dataclasses
import pathlib
import re

import pytest

import multihead as mh
from conftest import make_model
from multihead.experiments.config.schema import ConfigError, TrainConfig, from_dict
from multihead.step import options as options_module
from multihead.step.options import StepOptions, config_options, options_of

PACKAGE = pathlib.Path(mh.__file__).parent


def _modules_naming(word: str) -> list[str]:
    """The modules of the package whose text (code, strings, docstrings, comments) holds
    `word` as a word, as `grep -rlw` finds them."""
    pattern = re.compile(rf"(?<![A-Za-z0-9_]){re.escape(word)}(?![A-Za-z0-9_])")
    return sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                  if pattern.search(p.read_text(encoding="utf-8")))


@pytest.mark.parametrize("word,consumer", [("fused_updates", "step/applier.py"),
                                           ("jit_compile", "step/compiled.py"),
                                           ("batched_backward", "step/trunk_rule.py"),
                                           ("one_pass_backward", "step/trunk_update.py")])
def test_an_option_is_named_by_its_field_its_consumer_and_at_most_one_more(word, consumer):
    modules = _modules_naming(word)
    assert "step/options.py" in modules and consumer in modules
    assert len(modules) <= 3, f"{word} is named in {modules}: pass StepOptions whole instead"


def test_the_options_module_imports_neither_tensorflow_nor_keras():
    """The config layer reads the fields while validating a file (its one TensorFlow import,
    of `DynamicLossScale`, is made only when a loss scale object is given)."""
    tree = ast.parse(pathlib.Path(options_module.__file__).read_text())
    top = [a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names]
    top += [n.module for n in tree.body if isinstance(n, ast.ImportFrom) and n.module]
    assert not [m for m in top if m.split(".")[0] in ("tensorflow", "keras")]
    assert [m for m in top if m.startswith("multihead.")] == ["multihead._checks",
                                                              "multihead.settings"]


def test_options_are_frozen_and_checked_on_their_fields():
    options = StepOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.fused_updates = True  # type: ignore[misc]
    with pytest.raises(ValueError, match=r"^schedule: must be one of \['simultaneous', "
                                         r"'sequential'\], got 'sequental' \(did you mean"):
        StepOptions(schedule="sequental")
    with pytest.raises(ValueError, match=r"^batched_backward: expected 'auto', True or False, "
                                         r"got 1$"):
        StepOptions(batched_backward=1)
    with pytest.raises(TypeError, match=r"^loss_scale must be 'auto', a DynamicLossScale or "
                                        r"None, got 2.0$"):
        StepOptions(loss_scale=2.0)
    assert StepOptions(loss_scale=mh.DynamicLossScale(initial=8.0)).loss_scale.initial == 8.0
    assert (StepOptions().batched, StepOptions(batched_backward=True).batched) == (False, True)


def test_the_trainer_builds_its_options_from_its_keywords():
    trainer = mh.Trainer(make_model(), {"a": mh.Objective("mse"), "b": mh.Objective("mse")},
                         "sequential", fused_updates=True, batched_backward=False, loss_scale=None)
    assert trainer.options == StepOptions(schedule="sequential", fused_updates=True,
                                          batched_backward=False, loss_scale=None)
    assert trainer.schedule == "sequential"
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'fused_update' "
                                        r"\(did you mean 'fused_updates'\?\)"):
        mh.Trainer(make_model(), {"a": mh.Objective("mse"), "b": mh.Objective("mse")},
                   fused_update=True)


def test_a_config_sets_the_options_by_their_field_names():
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    assert set(config_options()) <= names
    assert "loss_scale" not in config_options()  # train.mixed_precision: float16 sets it
    raw = {"model": {"trunk": {"mlp": {"units": [4]}}, "heads": {"a": {}}},
           "train": {"schedule": "sequential", "fused_updates": True, "batched_backward": True,
                     "jit_compile": True},
           "log": {"tensorboard": False}}
    config = from_dict(raw)
    assert StepOptions(**options_of(config.train)) == StepOptions(
        schedule="sequential", fused_updates=True, batched_backward=True, jit_compile=True)
    raw["log"]["tensorboard"] = True  # the rule between the option and logging, with its key
    with pytest.raises(ConfigError, match=r"^<config>: train.jit_compile: XLA cannot compile"):
        from_dict(raw)
