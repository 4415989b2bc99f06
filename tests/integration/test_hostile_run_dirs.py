"""Hostile run and sweep directories (issue 26's escapes): a crafted directory must not make
any command delete, change, write or read a file outside it, run code, or hang.

Each test copies one finished run (trained once for the module), crafts it, places victims
in a sibling directory, and runs the command bounded in time (in this process under an
alarm, or as a subprocess with a timeout where a bomb or an import must stay out of the
test process): a hang fails the test, not the suite. It then checks: exit 2 with one line on stderr, victims unchanged
(content and mtime), no marker file, and, for reads, that what was used is the run's own.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import yaml

import multihead as mh
from multihead.cli.main import main
from multihead.experiments.run.experiment import run_experiment
from multihead.experiments.config.schema import ConfigError
from multihead.experiments.run.guard import RunLock

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMEOUT = 240  # a TensorFlow import on a busy 2-core machine; a hang is far beyond
ALARM = 120  # an in-process command that only reads and refuses


class _Hang(Exception):
    pass


def _cli(*args: str, cwd: str | None = None, env: dict | None = None,
         isolated: bool = False) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `multihead ARGS`, bounded in time: in this process under
    an alarm, or (`isolated`: a memory bomb, code that must not be imported here) in a
    subprocess with a timeout."""
    if not isolated:
        assert cwd is None and env is None
        return _in_process([str(a) for a in args])
    full_env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
        "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})}
    try:
        out = subprocess.run([sys.executable, "-m", "multihead", *map(str, args)], cwd=cwd,
                             env=full_env, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"multihead {' '.join(map(str, args))} hung (> {TIMEOUT} s)")
    return out.returncode, out.stdout, out.stderr


def _in_process(args: list[str]) -> tuple[int, str, str]:
    def hang(signum, frame):
        raise _Hang

    out, err = io.StringIO(), io.StringIO()
    previous = signal.signal(signal.SIGALRM, hang)
    signal.alarm(ALARM)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(args)
    except _Hang:
        pytest.fail(f"multihead {' '.join(args)} hung (> {ALARM} s)")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    return code, out.getvalue(), err.getvalue()


#: TensorFlow's C++ start-up log lines (absl), which are not the command's output.
_TF_LOG = re.compile(r"^(?:[IWEF]\d{4} |WARNING: All log messages before absl)")


def _refused(result: tuple[int, str, str], *needles: str) -> str:
    code, _, err = result
    lines = [line for line in err.strip().splitlines() if not _TF_LOG.match(line)]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, (code, err)
    assert lines[0].startswith("multihead: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


class Victims:
    """Files in a sibling directory that no command may touch."""

    def __init__(self, root) -> None:
        self.dir = root / "victim"
        self.dir.mkdir()
        for name in ("secret.txt", "secret.keep", "final.index", "notes.yaml"):
            (self.dir / name).write_text(f"victim {name}\n")
        (self.dir / "trial").mkdir()
        (self.dir / "trial" / "precious.txt").write_text("precious\n")
        self.before = self.snapshot()

    def snapshot(self) -> dict[str, tuple[bytes, int]]:
        found = {}
        for base, _, files in os.walk(self.dir):
            for name in files:
                path = os.path.join(base, name)
                found[os.path.relpath(path, self.dir)] = (open(path, "rb").read(),
                                                          os.stat(path).st_mtime_ns)
        return found

    def check(self) -> None:
        assert self.snapshot() == self.before, "a victim file was deleted, changed or added"


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    """A finished run with periodic checkpoints, a best checkpoint, and early stopping that
    restored the best weights (so `final` differs from the stop step's checkpoint)."""
    root = tmp_path_factory.mktemp("base")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((96, 4)).astype(np.float32)
    np.savez(root / "d.npz", x=x, y1=x[:, :1] * 2.0, y2=np.sin(x[:, 1:2]))
    config = {
        "seed": 3,
        "data": {"kind": "npz", "train": str(root / "d.npz"), "holdout": 0.25},
        "model": {"trunk": {"mlp": {"units": [8]}}, "heads": {"y1": {}, "y2": {}}},
        "train": {"steps": 40, "batch_size": 16, "eval_every": 5},
        "checkpoint": {"every": 5},
        # the first evaluation is the best (nothing beats it by 1e6): stop at the second,
        # restoring the first one's weights
        "callbacks": {"early_stopping": {"patience": 1, "min_delta": 1.0e6},
                      "best_checkpoint": {}},
        "log": {"every": 5, "histograms_every": 0},
    }
    (root / "c.yaml").write_text(yaml.safe_dump(config))
    assert run_experiment(str(root / "c.yaml"),
                          run_dir=str(root / "run"), quiet=True).exit_code == 0
    np.savez(root / "in.npz", x=x[:20])
    return root


@pytest.fixture
def run(base_run, tmp_path):
    shutil.copytree(base_run / "run", tmp_path / "run", symlinks=True)
    return tmp_path / "run"


@pytest.fixture
def victims(tmp_path):
    return Victims(tmp_path)


def _predict(run_dir, base_run, out, *extra) -> tuple[int, str, str]:
    return _cli("predict", run_dir, "--data", base_run / "in.npz", "--out", out, *extra)


def _victim_checkpoint(base_run, victims) -> str:
    """A checkpoint of the run's model with other weights (+1), in the victim directory."""
    loaded = mh.load_run(base_run / "run")
    for var in loaded.model.weights:
        var.assign(var + 1.0)
    return mh.save_checkpoint(str(victims.dir / "w"), loaded.model,
                              parts=["trunk", "heads/y1", "heads/y2"])


# -- train --resume --------------------------------------------------------------------


def test_resume_refuses_a_best_json_path_out_of_the_run(run, victims, tmp_path):
    record = json.loads((run / "best" / "best.json").read_text())
    record["path"] = os.path.relpath(victims.dir / "secret", run / "best")  # ../../victim/secret
    (run / "best" / "best.json").write_text(json.dumps(record))
    shutil.copy(run / "config.yaml", tmp_path / "c.yaml")
    _refused(_cli("train", tmp_path / "c.yaml", "--resume", run, "--set", "train.steps=60"),
             "best.json: path must name a best-<step> checkpoint")
    victims.check()


@pytest.mark.parametrize("name", ["final.index", "ckpt-60.index", "ckpt-60_temp"])
def test_resume_refuses_symlinks_planted_at_checkpoint_names(run, victims, tmp_path, name):
    target = victims.dir / ("trial" if name.endswith("_temp") else "final.index")
    if os.path.lexists(run / "checkpoints" / name):
        os.unlink(run / "checkpoints" / name)
    os.symlink(target, run / "checkpoints" / name)
    shutil.copy(run / "config.yaml", tmp_path / "c.yaml")
    _refused(_cli("train", tmp_path / "c.yaml", "--resume", run, "--set", "train.steps=60"),
             f"checkpoints/{name} is a symlink")
    victims.check()


@pytest.mark.parametrize("kind", ["symlink", "directory"])
def test_resume_with_a_lock_that_is_not_a_file_is_one_line(run, victims, tmp_path, kind):
    os.unlink(run / ".lock")
    if kind == "symlink":
        os.symlink(victims.dir / "secret.txt", run / ".lock")
    else:
        (run / ".lock").mkdir()
    shutil.copy(run / "config.yaml", tmp_path / "c.yaml")
    _refused(_cli("train", tmp_path / "c.yaml", "--resume", run, "--set", "train.steps=60"),
             ".lock: ")
    victims.check()


def test_checkpoint_writers_never_write_through_a_planted_symlink(tmp_path):
    """The library's own guard (the CLI refuses such runs first): a manager save, `final`
    and a best checkpoint replace a symlink at their names with their own file."""
    from conftest import make_batch, make_model

    victims = Victims(tmp_path)
    model = make_model(seed=1)
    trainer = mh.Trainer(model, {h: mh.Objective("mse") for h in "ab"})
    trainer.step(make_batch())
    ckpt = tmp_path / "run" / "checkpoints"
    ckpt.mkdir(parents=True)
    os.symlink(victims.dir / "final.index", ckpt / "ckpt-1.index")
    os.symlink(victims.dir / "secret.txt", ckpt / "final.index")
    os.symlink(victims.dir / "trial", ckpt / "final_temp")
    manager = mh.CheckpointManager(ckpt, model, trainer, every=1)
    saved = manager.save()
    final = mh.save_checkpoint(str(ckpt / "final"), model, trainer=trainer)
    victims.check()
    for prefix in (saved, final):
        assert not os.path.islink(prefix + ".index") and os.path.getsize(prefix + ".index") > 0
    fresh = make_model(seed=2)
    mh.restore_checkpoint(final, fresh, parts=["trunk"])
    np.testing.assert_array_equal(fresh.trunk_variables[0].numpy(), model.trunk_variables[0].numpy())


# -- sweep --resume ----------------------------------------------------------------------


def _sweep_dir(tmp_path, base_run, trials) -> str:
    sweep = tmp_path / "sweep"
    (sweep / "trials").mkdir(parents=True)
    shutil.copy(base_run / "run" / "config.yaml", sweep / "config.yaml")
    (sweep / "sweep.json").write_text(json.dumps({
        "version": 1, "config": "config.yaml", "search": "grid", "objective": "eval/mean_loss",
        "direction": "minimize", "axes": ["seed"], "trials": trials}))
    return sweep


def _trial(tid="t000", run_dir="trials/t000", status="pending"):
    return {"id": tid, "overrides": {"seed": 1}, "run_dir": run_dir, "status": status,
            "error": None, "metrics": None, "objective": None}


@pytest.mark.parametrize("trial, needle", [
    (dict(run_dir="../../victim/trial"), "run_dir: must be trials/<name>"),
    (dict(run_dir="trials/../../victim/trial"), "run_dir: must be trials/<name>"),
    (dict(tid="../../victim/evil"), ".id: must be a unique plain name"),
    (dict(run_dir="trials/link"), "trials/link' is a symlink"),
])
def test_sweep_resume_refuses_trials_out_of_the_sweep(tmp_path, base_run, victims, trial, needle):
    sweep = _sweep_dir(tmp_path, base_run, [_trial(**trial)])
    os.symlink(victims.dir / "trial", sweep / "trials" / "link")
    _refused(_cli("sweep", "--resume", sweep, "--quiet"), needle)
    victims.check()
    assert not (tmp_path / "evil.log").exists() and not (sweep / "logs").exists()


@pytest.mark.parametrize("text, needle", [
    ("{not json", "sweep.json: not valid JSON"),
    ('{"trials": 3, "objective": "eval/mean_loss", "direction": "minimize"}',
     "trials must be a list"),
    ('[1]', "expected a JSON object"),
])
def test_sweep_resume_with_a_garbage_index_is_one_line(tmp_path, base_run, text, needle):
    sweep = _sweep_dir(tmp_path, base_run, [])
    (sweep / "sweep.json").write_text(text)
    _refused(_cli("sweep", "--resume", sweep, "--quiet"), needle)


def test_a_second_sweep_on_a_locked_sweep_directory_touches_nothing(tmp_path, base_run):
    sweep = _sweep_dir(tmp_path, base_run, [_trial()])
    (sweep / "trials" / "t000").mkdir()
    (sweep / "trials" / "t000" / "live.txt").write_text("a running trial's file\n")
    index_before = (sweep / "sweep.json").read_bytes()
    with RunLock(str(sweep)):  # the sweep that proceeds
        _refused(_cli("sweep", "--resume", sweep, "--quiet"),
                 "sweep directory", "is in use by another multihead process")
    # without the lock, a resume would have cleared the pending trial's directory
    assert (sweep / "trials" / "t000" / "live.txt").read_text() == "a running trial's file\n"
    assert (sweep / "sweep.json").read_bytes() == index_before and not (sweep / "logs").exists()


# -- predict, export, load_run -----------------------------------------------------------


def test_predict_and_load_run_refuse_a_symlinked_final(run, base_run, victims, tmp_path):
    victim = _victim_checkpoint(base_run, victims)
    victims.before = victims.snapshot()
    for name in os.listdir(run / "checkpoints"):
        if name.startswith("final."):
            os.unlink(run / "checkpoints" / name)
            os.symlink(victim + name[len("final"):], run / "checkpoints" / name)
    _refused(_predict(run, base_run, tmp_path / "p.npz"), "final.", "is a symlink")
    assert not (tmp_path / "p.npz").exists()
    with pytest.raises(ConfigError, match="is a symlink"):
        mh.load_run(run)
    victims.check()


@pytest.mark.parametrize("name", ["config.yaml", "inputs.json"])
def test_predict_refuses_a_symlinked_run_file(run, base_run, victims, tmp_path, name):
    shutil.copy(run / name, victims.dir / name)
    victims.before = victims.snapshot()
    os.unlink(run / name)
    os.symlink(victims.dir / name, run / name)
    _refused(_predict(run, base_run, tmp_path / "p.npz"), name, "is a symlink")
    with pytest.raises(ConfigError, match="is a symlink"):
        mh.load_run(run)
    assert not (tmp_path / "p.npz").exists()
    victims.check()


def test_checkpoint_best_ignores_the_state_file_and_a_best_json_out_of_the_run(
        run, base_run, victims, tmp_path):
    victim = _victim_checkpoint(base_run, victims)
    victims.before = victims.snapshot()
    own = mh.load_run(run, checkpoint="best")
    expected = own.model.predict(np.load(base_run / "in.npz")["x"])
    # TensorFlow's state file in best/ names the victim: never read
    (run / "best" / "checkpoint").write_text(f'model_checkpoint_path: "{victim}"\n')
    os.unlink(run / "best" / "best.json")
    assert _predict(run, base_run, tmp_path / "p.npz", "--checkpoint", "best")[0] == 0
    with np.load(tmp_path / "p.npz") as got:
        for head in ("y1", "y2"):
            np.testing.assert_array_equal(got[head], expected[head])
    # best.json naming the victim: refused
    (run / "best" / "best.json").write_text(json.dumps(
        {"path": os.path.relpath(victim, run / "best"), "step": 5, "value": 0.1,
         "monitor": "eval/mean_loss", "mode": "min"}))
    _refused(_predict(run, base_run, tmp_path / "q.npz", "--checkpoint", "best"),
             "best.json: path must name a best-<step> checkpoint")
    victims.check()


def test_export_refuses_a_symlinked_checkpoints_folder(run, base_run, victims, tmp_path):
    shutil.copytree(run / "checkpoints", victims.dir / "checkpoints")
    victims.before = victims.snapshot()
    shutil.rmtree(run / "checkpoints")
    os.symlink(victims.dir / "checkpoints", run / "checkpoints")
    _refused(_cli("export", run, tmp_path / "out"), "checkpoints' is a symlink")
    assert not (tmp_path / "out").exists()
    victims.check()


def test_no_command_builds_the_data_of_a_run_without_inputs_json(run, tmp_path):
    """A config whose data source is code (`data.kind: python`) is never run by predict,
    export or load_run: inputs.json is the input's only source."""
    (tmp_path / "mods").mkdir()
    marker = tmp_path / "marker"
    (tmp_path / "mods" / "evil_data.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\n"
        "def make():\n    raise SystemExit('ran')\n")
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["data"] = {"kind": "python", "function": "evil_data:make"}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    os.unlink(run / "inputs.json")
    env = {"PYTHONPATH": os.pathsep.join([ROOT, str(tmp_path / "mods")])}
    outcomes = [
        _cli("predict", run, "--data", tmp_path / "none.npz", "--out", tmp_path / "p.npz",
             cwd=str(tmp_path / "mods"), env=env, isolated=True),
        _cli("export", run, tmp_path / "out", cwd=str(tmp_path / "mods"), env=env, isolated=True),
    ]
    for outcome in outcomes:
        line = _refused(outcome)
        assert "inputs.json" in line or "--allow-import" in line, line
    sys.path.insert(0, str(tmp_path / "mods"))
    try:
        with pytest.raises(ConfigError, match="--allow-import evil_data"):
            mh.load_run(run)
        # Even with the module allowed, load_run learns input shapes from inputs.json only: it
        # never builds the run's data, so nothing is imported.
        with pytest.raises(ConfigError, match="inputs.json: missing"):
            mh.load_run(run, allow_import=["evil_data"])
    finally:
        sys.path.remove(str(tmp_path / "mods"))
    assert not marker.exists() and "evil_data" not in sys.modules
    assert not (tmp_path / "p.npz").exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize("text", ["{", "[]", '{"shape": "big"}', '{"shape": [null, -3]}',
                                  '{"x": {"shape": [null, 1e300]}}', ""])
def test_garbage_inputs_json_is_one_line(run, base_run, tmp_path, text):
    (run / "inputs.json").write_text(text)
    _refused(_predict(run, base_run, tmp_path / "p.npz"), "inputs.json")


def test_export_after_restore_best_equals_predict_bitwise(run, base_run, tmp_path):
    metrics = json.loads((run / "metrics.json").read_text())
    stop = metrics["early_stopping"]
    assert stop["restored_best"] and stop["best_step"] < stop["stopped_step"]
    x = np.load(base_run / "in.npz")["x"]
    assert _cli("export", run, tmp_path / "out")[0] == 0
    assert _predict(run, base_run, tmp_path / "p.npz")[0] == 0
    loaded = tf.saved_model.load(str(tmp_path / "out"))
    stopped = mh.load_run(run, checkpoint=f"ckpt-{stop['stopped_step']}").model.predict(x)
    with np.load(tmp_path / "p.npz") as predicted:
        for head in ("y1", "y2"):
            served = loaded.signatures[head](tf.constant(x))[head].numpy()
            np.testing.assert_array_equal(served, predicted[head])
            assert not np.array_equal(served, stopped[head])  # the stop step's weights differ


# -- report, compare ---------------------------------------------------------------------


def test_report_does_not_hang_on_a_fifo_named_like_an_event_file(run, tmp_path):
    shutil.rmtree(run / "train")
    (run / "train").mkdir()
    os.mkfifo(run / "train" / "events.out.tfevents.1.host")
    _refused(_cli("report", run))  # the FIFO is skipped, not opened


def test_report_refuses_a_symlinked_train_folder(run, victims, tmp_path):
    shutil.copytree(run / "train", victims.dir / "train")
    victims.before = victims.snapshot()
    shutil.rmtree(run / "train")
    os.symlink(victims.dir / "train", run / "train")
    _refused(_cli("report", run), "train' is a symlink")
    victims.check()


def test_compare_refuses_an_alias_bomb_and_reads_only_the_run(run, victims, tmp_path):
    bomb = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    bomb += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    (run / "config.yaml").write_text("\n".join(bomb) + "\n")
    _refused(_cli("compare", run, isolated=True), "config.yaml", "invalid YAML")
    os.unlink(run / "config.yaml")
    os.symlink(victims.dir / "notes.yaml", run / "config.yaml")
    _refused(_cli("compare", run), "config.yaml", "is a symlink")
    os.unlink(run / "config.yaml")
    os.mkfifo(run / "config.yaml")
    _refused(_cli("compare", run), "config.yaml", "is a FIFO")
    victims.check()


@pytest.mark.parametrize("text, needle", [
    ("{", "metrics.json: not valid JSON"),
    ('{"eval": {"y1": {"loss": "low"}}}', "metrics.json: not a metrics record"),
    ('{"eval": {}, "evals": [{"eval": 3}]}', "metrics.json: not a metrics record"),
])
def test_compare_with_garbage_metrics_is_one_line(run, text, needle):
    (run / "metrics.json").write_text(text)
    _refused(_cli("compare", run), needle)


def test_compare_refuses_a_sweep_trial_out_of_the_sweep(run, tmp_path, victims):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    shutil.copytree(run, victims.dir / "run")
    victims.before = victims.snapshot()
    (sweep / "sweep.json").write_text(json.dumps(
        {"trials": [{"run_dir": "../victim/run", "status": "done"}]}))
    _refused(_cli("compare", sweep), "run_dir: must be trials/<name>")
    victims.check()


# -- run-directory edges -----------------------------------------------------------------


def test_run_dir_that_is_a_file_and_out_that_is_a_directory(run, base_run, tmp_path):
    (tmp_path / "file").write_text("mine\n")
    shutil.copy(run / "config.yaml", tmp_path / "c.yaml")
    _refused(_cli("train", tmp_path / "c.yaml", "--run-dir", tmp_path / "file"),
             "exists and is not a directory")
    assert (tmp_path / "file").read_text() == "mine\n"
    (tmp_path / "out.npz").mkdir()
    _refused(_predict(run, base_run, tmp_path / "out.npz"), "is not a regular file")
    assert os.listdir(tmp_path / "out.npz") == []
