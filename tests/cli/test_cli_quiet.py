"""The `multihead` command answers at once and quietly: help and argument errors import no
TensorFlow, and no command prints TensorFlow's start-up lines unless `--verbose`.

(Apart from tests/cli/test_cli.py so that `--dist loadfile` gives the two files' process-heavy
tests to two workers.)"""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import yaml
from test_cli import TINY

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# -- a CLI that answers at once and quietly ----------------------------------------------

COMMANDS = ["train", "validate", "export", "predict", "report", "sweep", "compare"]
# TensorFlow's start-up and C++ log lines: absl's pre-init warning, glog-style `I0000 ...`,
# CUDA probing, cpu-feature and oneDNN notices.
CHATTER = re.compile(r"absl|InitializeLog|cuInit|cudart|cuda drivers|cpu_feature_guard|oneDNN|"
                     r"rebuild TensorFlow|^[IWEF]\d{4} \d\d:\d\d:\d\d", re.IGNORECASE | re.MULTILINE)
_PROBE = """
import contextlib, io, json, runpy, sys
seen = []
for argv in json.loads(sys.argv[1]):
    sys.argv = ["multihead", *argv]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            runpy.run_module("multihead", run_name="__main__", alter_sys=True)
        except SystemExit as stop:
            code = stop.code
    seen.append([argv, code, "tensorflow" in sys.modules])
print(json.dumps(seen))
"""


def _multihead(*args: str, cwd=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": ROOT}
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # the command's own default, not the test runner's
    return subprocess.run([sys.executable, "-m", "multihead", *args], capture_output=True, text=True,
                          timeout=600, env=env, cwd=cwd)


def test_help_and_argument_errors_import_no_tensorflow():
    # `python -m multihead ...` in one process, in order; after each, is TensorFlow loaded?
    argvs = [["--help"], *[[c, "--help"] for c in COMMANDS], ["train"], ["no-such-command"],
             ["predict", "RUN", "--batch-size", "many"], ["validate", "--help"]]
    env = {**os.environ, "PYTHONPATH": ROOT}
    out = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(argvs)], capture_output=True,
                         text=True, timeout=120, env=env, check=True)
    seen = json.loads(out.stdout)
    assert [code for _, code, _ in seen] == [0] * 8 + [2, 2, 2, 0]  # help exits 0, usage errors 2
    assert [argv for argv, _, tf_loaded in seen if tf_loaded] == []


def test_validate_imports_tensorflow_only_to_build(tmp_path):
    # The same probe: `validate` checks the config without TensorFlow; `validate --build`,
    # which builds the model, has it loaded after (so the probe does see an import).
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY))
    env = {**os.environ, "PYTHONPATH": ROOT}
    argvs = [["validate", str(config)], ["validate", str(config), "--build"]]
    out = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(argvs)],
                         capture_output=True, text=True, timeout=300, env=env, check=True)
    assert json.loads(out.stdout) == [[argvs[0], 0, False], [argvs[1], 0, True]]


#: The commands of the default suite's run of the test below: the run, a command that reads
#: it without TensorFlow (report) and one that imports TensorFlow to read it (predict), and
#: a sweep (its own process and its trials'); every command with -m slow.
QUIET_DEFAULT = ["train", "report", "predict", "sweep"]


@pytest.mark.parametrize("commands", [QUIET_DEFAULT, pytest.param(COMMANDS, marks=pytest.mark.slow)],
                         ids=["default", "every"])
def test_every_command_is_quiet_by_default_and_verbose_shows_tensorflow(tmp_path, commands):
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY))
    run = tmp_path / "run"
    x = np.random.default_rng(0).normal(size=(5, 6)).astype(np.float32)
    np.savez(tmp_path / "inputs.npz", x=x)
    calls = [
        ["train", str(config), "--run-dir", str(run)],
        ["validate", str(config), "--build"],
        ["report", str(run)],
        ["compare", str(run)],
        ["export", str(run), str(tmp_path / "saved")],
        ["predict", str(run), "--data", str(tmp_path / "inputs.npz"), "--out", str(tmp_path / "p.npz")],
        ["sweep", str(config), "--grid", "seed=0", "--sweep-dir", str(tmp_path / "sweep"), "--quiet"],
    ]
    assert sorted(c[0] for c in calls) == sorted(COMMANDS)
    for argv in [c for c in calls if c[0] in commands]:
        out = _multihead(*argv, cwd=tmp_path)
        assert out.returncode == 0, (argv, out.stderr)
        found = CHATTER.findall(out.stdout + out.stderr)
        assert not found, (argv[0], found, out.stderr)
    trial_log = (tmp_path / "sweep" / "logs" / "t000.log").read_text()
    assert not CHATTER.search(trial_log), trial_log  # the trials run quietly too
    assert np.load(tmp_path / "p.npz")["y1"].shape == (5, 1)
    # --verbose shows what the default hides: every such line TensorFlow prints when imported
    # bare (none on some machines; on a CPU-only one, absl's warning and CUDA probing).
    bare = subprocess.run([sys.executable, "-c", "import tensorflow as tf; tf.config.list_physical_devices()"],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0"})
    verbose = _multihead("validate", str(config), "--build", "--verbose", cwd=tmp_path)
    assert verbose.returncode == 0, verbose.stderr
    assert set(CHATTER.findall(bare.stderr)) <= set(CHATTER.findall(verbose.stderr)), verbose.stderr


def test_compare_reads_json_and_imports_no_tensorflow(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump(TINY))
    final = {"y1": {"loss": 0.5}, "y2": {"loss": 0.25}}
    (run / "metrics.json").write_text(json.dumps({"steps": 4, "eval": final,
                                                  "evals": [{"step": 4, "eval": final}]}))
    env = {**os.environ, "PYTHONPATH": ROOT}
    out = subprocess.run([sys.executable, "-c", _PROBE, json.dumps([["compare", str(run), "--json"]])],
                         capture_output=True, text=True, timeout=120, env=env, check=True)
    assert json.loads(out.stdout) == [[["compare", str(run), "--json"], 0, False]]


def test_validate_without_build_stays_quiet_when_a_config_rule_imports_tensorflow(tmp_path):
    # An aggregated trunk's method is checked against the aggregation classes, which import
    # TensorFlow on the way: its start-up lines are dropped as a --build would drop them.
    config = tmp_path / "agg.yaml"
    config.write_text(yaml.safe_dump({**TINY, "train": {**TINY["train"], "trunk": {"aggregator": "mgda"}}}))
    out = _multihead("validate", str(config), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert not CHATTER.findall(out.stdout + out.stderr), out.stderr
    assert out.stderr == "" and "were not built" in out.stdout
