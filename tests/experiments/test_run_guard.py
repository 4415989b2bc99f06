"""Run directories are never lost and never reach outside themselves: `multihead train` under
SIGINT, concurrent writers, failures and a full disk; `--resume` with a tampered
`checkpoints/` folder (`multihead.experiments.run.guard`, `multihead.io.manager`)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from multihead.cli.main import main
from multihead.experiments.run.experiment import run_experiment
from multihead.experiments.run.guard import RunLock, read_status
from multihead.io.manager import scan_checkpoints

CONFIG = """\
seed: 5
data: {kind: mmoe, train_size: 128, eval_size: 32, input_dim: 6}
model:
  trunk: {mlp: {units: [8], activation: relu, dropout: 0.1}}
  heads:
    a: {layers: {mlp: {units: [1], output_activation: linear}},
        optimizer: {class_name: Adam, config: {learning_rate: 1e-3}}}
    b: {layers: [{class_name: Dense, config: {units: 1}}], optimizer: sgd, every: 2}
train: {steps: STEPS, batch_size: 16, eval_every: 10, steps_per_execution: 1}
log: {every: 5, histograms_every: 0}
checkpoint: {every: EVERY, keep: 5}
"""


def _config(tmp_path, steps=30, every=0):
    path = tmp_path / "exp.yaml"
    path.write_text(CONFIG.replace("STEPS", str(steps)).replace("EVERY", str(every)))
    return path


def _env():
    env = dict(os.environ, TF_DETERMINISTIC_OPS="1", TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
    return env


def _tensors(prefix):
    reader = tf.train.load_checkpoint(str(prefix))
    return {key: reader.get_tensor(key) for key in reader.get_variable_to_shape_map()
            if not key.startswith(("_CHECKPOINTABLE_OBJECT_GRAPH", "save_counter", "run/"))}


def _assert_same_state(a, b):
    left, right = _tensors(a), _tensors(b)
    assert set(left) == set(right) and left
    for key, value in right.items():
        np.testing.assert_array_equal(left[key], value, err_msg=key)


def _train(*args):
    return main(["train", *map(str, args), "--quiet"])


def _run(config, run_dir, *overrides):
    """A run reached through the library call (the tests of the CLI itself use `_train`)."""
    return run_experiment(str(config), run_dir=str(run_dir), overrides=overrides,
                          quiet=True).exit_code


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """A 40-step run with checkpoints every 10 steps: what every resume must end equal to."""
    tmp = tmp_path_factory.mktemp("reference")
    assert _run(_config(tmp, steps=40, every=10), tmp / "run") == 0
    return tmp / "run" / "checkpoints" / "ckpt-40"


@pytest.fixture(scope="module")
def stopped_at_30(tmp_path_factory):
    """The same run, ended at step 30 (checkpoints 10, 20, 30)."""
    tmp = tmp_path_factory.mktemp("stopped")
    assert _run(_config(tmp, steps=30, every=10), tmp / "run") == 0
    return tmp / "run"


def _resume(tmp_path, run, steps=40, *extra):
    # keep: 1 makes the resumed manager rotate out every checkpoint it believes it has.
    return _train(_config(tmp_path, steps=steps, every=10), "--resume", run,
                  "--set", "checkpoint.keep=1", *extra)


# -- SIGINT / SIGTERM ------------------------------------------------------------------------


def _signal_at_first_evaluation(monkeypatch, signum):
    """Sends `signum` to this process from inside the first evaluation (step 10, in the main
    thread, so the handler runs there): a real signal at a known step."""
    from multihead.training.trainer import Trainer

    evaluate, sent = Trainer.evaluate, []

    def evaluate_then_signal(self, *args, **kwargs):
        out = evaluate(self, *args, **kwargs)
        if not sent:
            sent.append(signum)
            os.kill(os.getpid(), signum)
        return out

    monkeypatch.setattr(Trainer, "evaluate", evaluate_then_signal)


def test_sigint_keeps_the_run_and_resume_is_bitwise_the_uninterrupted_run(
        tmp_path, reference, monkeypatch, capsys):
    config, run = _config(tmp_path, steps=1_000_000, every=0), tmp_path / "run"
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN when the suite runs as a background job
    _signal_at_first_evaluation(monkeypatch, signal.SIGINT)
    assert _train(config, "--run-dir", run) == 130
    monkeypatch.undo()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("multihead: interrupted by SIGINT at step 10; ")
    assert f"resume with: multihead train {config} --resume {run}" in err
    status = read_status(str(run))
    assert status["status"] == "interrupted" and status["signal"] == "SIGINT"
    assert status["step"] == 10 and status["checkpoint"] == "checkpoints/ckpt-10"
    assert (run / "config.yaml").is_file() and list((run / "train").glob("events.out.tfevents.*"))
    assert signal.getsignal(signal.SIGINT) is before  # handlers restored
    assert _resume(tmp_path, run) == 0  # to step 40: bitwise the uninterrupted 40-step run
    assert read_status(str(run))["status"] == "completed"
    _assert_same_state(run / "checkpoints" / "ckpt-40", reference)


def test_sigterm_exits_143_with_a_checkpoint_of_the_step_it_stopped_at(tmp_path, monkeypatch,
                                                                       capsys):
    run = tmp_path / "run"
    before = signal.getsignal(signal.SIGTERM)
    _signal_at_first_evaluation(monkeypatch, signal.SIGTERM)
    assert _train(_config(tmp_path, steps=1_000_000), "--run-dir", run) == 143
    assert "interrupted by SIGTERM at step 10" in capsys.readouterr().err
    status = read_status(str(run))
    assert status["status"] == "interrupted" and status["exit_code"] == 143
    assert scan_checkpoints(str(run / "checkpoints")) == [str(run / "checkpoints" / "ckpt-10")]
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.slow
def test_sigint_to_the_cli_process_exits_130_and_resumes(tmp_path, reference):
    config, run = _config(tmp_path, steps=1_000_000, every=10), tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "multihead", "train", str(config),
                             "--run-dir", str(run), "--quiet"], env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not scan_checkpoints(run / "checkpoints"):  # mid-run: a step was done
            assert proc.poll() is None, proc.stderr.read()[-2000:]
            assert time.monotonic() < deadline, "no checkpoint within 120 s"
            time.sleep(0.05)
        # mid-run, status.json names the newest checkpoint and the step as soon as they exist
        while (running := read_status(str(run)))["checkpoint"] is None:
            assert proc.poll() is None, proc.stderr.read()[-2000:]
            assert time.monotonic() < deadline, f"status.json names no checkpoint: {running}"
            time.sleep(0.05)
        assert running["status"] == "running"
        named = int(running["checkpoint"].removeprefix("checkpoints/ckpt-"))
        assert named in [int(p.rsplit("-", 1)[1]) for p in scan_checkpoints(run / "checkpoints")]
        assert running["step"] >= named
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == 130
    last = err.strip().splitlines()[-1]
    assert last.startswith("multihead: interrupted by SIGINT at step ") and \
        f"--resume {run}" in last, err[-2000:]
    status = read_status(str(run))
    assert status["status"] == "interrupted" and status["checkpoint"] == f"checkpoints/ckpt-{status['step']}"
    total = max(40, status["step"])
    assert _resume(tmp_path, run, total) == 0
    if total == 40:
        _assert_same_state(run / "checkpoints" / "ckpt-40", reference)


# -- the lock -------------------------------------------------------------------------------


@pytest.mark.slow
def test_two_concurrent_trains_on_one_run_dir_exactly_one_proceeds(tmp_path):
    config, run = _config(tmp_path, steps=20), tmp_path / "run"
    cmd = [sys.executable, "-m", "multihead", "train", str(config), "--run-dir", str(run), "--quiet"]
    procs = [subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    try:
        results = [(p.wait(timeout=180), p.stderr.read()) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
            p.stderr.close()
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    loser = next(err for code, err in results if code == 2).strip().splitlines()[-1]
    assert "in use by another multihead process" in loser or "exists and is not empty" in loser
    assert read_status(str(run))["status"] == "completed"


def test_a_locked_run_dir_refuses_a_second_writer_with_exit_2(tmp_path, stopped_at_30, capsys):
    run = tmp_path / "run"
    shutil.copytree(stopped_at_30, run)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(run / '.lock')!r}, os.O_RDWR)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(60)")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert _resume(tmp_path, run) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "is in use by another multihead process" in err
    finally:
        holder.kill()
        holder.wait(timeout=30)
        holder.stdout.close()
    with RunLock(str(run)):  # the lock died with its holder
        pass


# -- failures -------------------------------------------------------------------------------


def test_a_failed_run_keeps_its_directory_logs_and_status(tmp_path, capsys, monkeypatch):
    from multihead.training.trainer import Trainer

    calls = {"n": 0}
    evaluate = Trainer.evaluate

    def failing(self, *args, **kwargs):  # the second evaluation (step 20) fails
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(28, "No space left on device")
        return evaluate(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "evaluate", failing)
    run = tmp_path / "run"
    assert _train(_config(tmp_path, steps=30), "--run-dir", run) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "run failed at step 20: disk full" in err
    status = read_status(str(run))
    assert status["status"] == "failed" and status["step"] == 20
    assert "No space left on device" in status["error"] and "Traceback" in status["traceback"]
    assert list((run / "train").glob("events.out.tfevents.*")) and (run / "config.yaml").is_file()


@pytest.mark.slow
def test_disk_full_on_a_small_tmpfs_keeps_a_consistent_resumable_run(tmp_path, reference):
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96k", "tmpfs", str(mount)],
                          capture_output=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        run = mount / "run"
        proc = subprocess.run([sys.executable, "-m", "multihead", "train",
                               str(_config(tmp_path, steps=1_000_000, every=10)),
                               "--run-dir", str(run), "--quiet"], env=_env(),
                              capture_output=True, text=True, timeout=300, check=False)
        assert proc.returncode == 1, proc.stderr[-2000:]
        last = proc.stderr.strip().splitlines()[-1]
        assert "run failed at step" in last and "disk full" in last and "--resume" in last
        status = read_status(str(run))
        assert status["status"] == "failed" and "disk full" in status["error"]
        moved = tmp_path / "moved"
        shutil.copytree(run, moved, symlinks=True)
    finally:
        subprocess.run(["umount", str(mount)], check=False)
    found = scan_checkpoints(str(moved / "checkpoints"))
    assert found and all(os.path.getsize(p + ".index") for p in found)
    steps = max(40, int(found[-1].rsplit("-", 1)[1]) + 10)
    assert _resume(tmp_path, moved, steps) == 0  # in its new place
    assert read_status(str(moved))["status"] == "completed"
    if steps == 40:
        _assert_same_state(moved / "checkpoints" / "ckpt-40", reference)


# -- resume trusts nothing outside the run directory ------------------------------------------


def _state_file(run, text):
    (run / "checkpoints" / "checkpoint").write_text(text)


@pytest.mark.parametrize("damage", [
    pytest.param("missing", marks=pytest.mark.slow), pytest.param("empty", marks=pytest.mark.slow),
    "garbage", "newest_index_gone", pytest.param("stale", marks=pytest.mark.slow), "outside"])
def test_resume_continues_from_the_newest_intact_checkpoint(tmp_path, stopped_at_30, reference,
                                                            damage):
    run = tmp_path / "run"
    shutil.copytree(stopped_at_30, run)
    (run / "checkpoints" / "final.index").unlink()  # only periodic checkpoints count
    outside = tmp_path / "victim"
    outside.mkdir()
    for name in ("ckpt-99.index", "ckpt-99.data-00000-of-00001"):
        (outside / name).write_text("not yours")
    if damage == "missing":
        (run / "checkpoints" / "checkpoint").unlink()
    elif damage == "empty":
        _state_file(run, "")
    elif damage == "garbage":
        _state_file(run, "\x00\xff{{not a proto")
    elif damage == "newest_index_gone":
        (run / "checkpoints" / "ckpt-30.index").unlink()
    elif damage == "stale":  # killed between writing ckpt-30 and the state file naming it
        _state_file(run, 'model_checkpoint_path: "ckpt-10"\nall_model_checkpoint_paths: "ckpt-10"\n')
    else:  # a state file naming a checkpoint outside the run, to be rotated out with keep: 1
        victim = outside / "ckpt-99"
        _state_file(run, f'model_checkpoint_path: "{victim}"\n'
                         + "".join(f'all_model_checkpoint_paths: "{p}"\n'
                                   f"all_model_checkpoint_timestamps: {time.time()}\n"
                                   for p in (victim, victim, victim)))
    assert _resume(tmp_path, run) == 0
    _assert_same_state(run / "checkpoints" / "ckpt-40", reference)
    assert sorted(p.read_text() for p in outside.iterdir()) == ["not yours"] * 2


def test_resume_touches_nothing_behind_a_symlink(tmp_path, stopped_at_30, capsys):
    run = tmp_path / "run"
    shutil.copytree(stopped_at_30, run)
    other = tmp_path / "other_run_events"
    shutil.copytree(run / "train", other)
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in other.iterdir()}
    (run / "train" / "linked").symlink_to(other, target_is_directory=True)
    # The crashed run logged past the checkpoint: the rewind runs, and must skip the link.
    for path in other.iterdir():
        os.utime(path)
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in other.iterdir()}
    assert _resume(tmp_path, run) == 0
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in other.iterdir()} == before
    # A run folder that is itself a symlink is refused before anything is read or written.
    shutil.rmtree(run / "eval")
    (run / "eval").symlink_to(other, target_is_directory=True)
    capsys.readouterr()
    assert _resume(tmp_path, run, 50) == 2
    assert "eval is a symlink" in capsys.readouterr().err
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in other.iterdir()} == before


def test_scan_ignores_symlinked_checkpoints(tmp_path, stopped_at_30):
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    source = stopped_at_30 / "checkpoints"
    for name in ("ckpt-10.index", "ckpt-10.data-00000-of-00001"):
        shutil.copy(source / name, checkpoints / name)
    (checkpoints / "ckpt-20.index").symlink_to(source / "ckpt-20.index")
    shutil.copy(source / "ckpt-20.data-00000-of-00001", checkpoints)
    shutil.copy(source / "ckpt-30.index", checkpoints)
    (checkpoints / "ckpt-30.data-00000-of-00001").symlink_to(source / "ckpt-30.data-00000-of-00001")
    assert scan_checkpoints(str(checkpoints)) == [str(checkpoints / "ckpt-10")]
    assert json.loads(json.dumps(scan_checkpoints(str(tmp_path / "absent")))) == []


# -- what the run directory's files look like ---------------------------------------------------


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_every_file_of_a_run_directory_is_readable_as_the_umask_allows(tmp_path, umask):
    run = tmp_path / "run"
    previous = os.umask(umask)  # the process's umask, as a user's shell sets it
    try:
        assert _run(_config(tmp_path, steps=20, every=10), run,
                    "callbacks.best_checkpoint.monitor=eval/mean_loss") == 0
    finally:
        os.umask(previous)
    modes = {}
    for root, dirs, files in os.walk(run):
        for name in files + dirs:
            path = os.path.join(root, name)
            modes[os.path.relpath(path, run)] = os.stat(path).st_mode & 0o777
    for name in ("config.yaml", "metrics.json", "status.json", "best/best.json",
                 "checkpoints/checkpoint"):
        assert name in modes, sorted(modes)
    wanted = {rel: (0o777 if os.path.isdir(run / rel) else 0o666) & ~umask for rel in modes}
    assert modes == wanted  # e.g. 0o644 for every file under umask 022, as TF's own files


def test_status_json_holds_its_json_only(tmp_path):
    from multihead.experiments.run.guard import write_status

    assert write_status(str(tmp_path), "running", step=3)
    text = (tmp_path / "status.json").read_text()
    status = json.loads(text)
    assert status["status"] == "running" and status["step"] == 3
    assert text == json.dumps(status, indent=2) + "\n"  # no padding


def test_status_json_is_rewritten_in_place_when_the_disk_is_full(tmp_path, monkeypatch):
    import multihead.experiments.run.guard as guard

    assert guard.write_status(str(tmp_path), "running", step=3)
    allocated = os.stat(tmp_path / "status.json").st_blocks * 512

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(guard, "temp_file", disk_full)  # the atomic write's new file
    assert guard.write_status(str(tmp_path), "failed", step=7, error="disk full: " + "x" * 9000,
                              traceback="Traceback ...")
    status = read_status(str(tmp_path))
    assert status["status"] == "failed" and status["step"] == 7
    assert status["error"].startswith("disk full: xxx") and "traceback" not in status
    # within the blocks the file had: a rewrite that needs no new block
    assert os.path.getsize(tmp_path / "status.json") <= max(allocated, 512)
