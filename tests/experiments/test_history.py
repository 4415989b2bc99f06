"""`RunHistory`: the run's evaluations and segments on disk after every evaluation, and a
resume that keeps exactly those up to its checkpoint."""

import json

import pytest

from multihead.experiments.run.history import HISTORY_FILE, HistoryError, RunHistory


def _segment(history, steps, evals_at):
    """Drives `history` as `fit` does: `steps` steps from its start, evaluating at `evals_at`."""
    history.on_train_begin()
    start = history.segment["start_step"]
    for step in range(start + 1, start + steps + 1):
        history.on_step_end(step, None)
        if step in evals_at:
            history.on_eval_end(step, {"a": {"loss": 1.0 / step}})


def test_each_evaluation_is_on_disk_before_the_next_step(tmp_path):
    history = RunHistory.begin(str(tmp_path), start_step=0)
    _segment(history, 25, evals_at={10, 20})  # killed after step 25: no on_train_end
    saved = json.loads((tmp_path / HISTORY_FILE).read_text())
    assert saved["evals"] == [{"step": 10, "eval": {"a": {"loss": 0.1}}},
                              {"step": 20, "eval": {"a": {"loss": 0.05}}}]
    assert saved["segments"] == [{"start_step": 0, "resumed_from": None, "end_step": 20,
                                  "wall_time_s": saved["segments"][0]["wall_time_s"]}]


def test_a_resume_keeps_the_evaluations_up_to_its_checkpoint_and_sums_the_segments(tmp_path):
    first = RunHistory.begin(str(tmp_path), start_step=0)
    _segment(first, 25, evals_at={10, 20})  # killed at 25; its checkpoint is at 10
    resumed = RunHistory.begin(str(tmp_path), start_step=10, resumed_from="checkpoints/ckpt-10")
    assert [step for step, _ in resumed.evals] == [10]  # 20 is made again by the resumed run
    _segment(resumed, 20, evals_at={20, 30})
    resumed.on_train_end()
    again = RunHistory.begin(str(tmp_path), start_step=30, resumed_from="checkpoints/ckpt-30")
    assert [step for step, _ in again.evals] == [10, 20, 30]
    segments = again.segments
    assert [(s["start_step"], s["end_step"], s["resumed_from"]) for s in segments] == [
        (0, 20, None), (10, 30, "checkpoints/ckpt-10"), (30, 30, "checkpoints/ckpt-30")]
    assert again.wall_time_s == pytest.approx(sum(s["wall_time_s"] for s in segments))
    # 20 + 20 steps were run (10 of them twice) in that wall time
    assert again.steps_per_s == pytest.approx(40 / again.wall_time_s)


def test_a_new_run_does_not_read_an_old_history(tmp_path):
    (tmp_path / HISTORY_FILE).write_text("not json")
    assert RunHistory.begin(str(tmp_path), start_step=0).evals == []


@pytest.mark.parametrize("text", ["not json", '{"evals": [{"step": "3"}], "segments": []}', "[]"])
def test_a_history_not_written_by_multihead_is_refused_naming_the_file(tmp_path, text):
    (tmp_path / HISTORY_FILE).write_text(text)
    with pytest.raises(HistoryError, match=HISTORY_FILE):
        RunHistory.begin(str(tmp_path), start_step=5, resumed_from="checkpoints/ckpt-5")
