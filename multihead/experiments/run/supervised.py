"""`task: supervised`: multi-task regression/classification on the data of `data:` (any kind)."""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any, ClassVar, Sequence

import keras
import tensorflow as tf

from multihead.objectives.parts import prediction_fn

from multihead.experiments.build.baselines import constant_baseline_metrics
from multihead.experiments.build.builders import (
    RunCallbacks,
    build_callbacks,
    build_data,
    build_model,
    build_objectives,
    build_strategy,
    build_trainer,
    build_trunk,
)
from multihead.io.checkpoints import CheckpointManager, save_checkpoint
from multihead.experiments.config.schema import ConfigError, ExperimentConfig
from multihead.experiments.build.data_sources import input_spec
from multihead.experiments.run.dry_run import dry_run
from multihead.experiments.run.guard import RunInterrupted, stop_if_interrupted
from multihead.experiments.run.history import HistoryError, RunHistory
from multihead.experiments.run.inputs_record import (
    check_same_standardization,
    input_standardization,
    write_inputs,
)
from multihead.training.callbacks import Callback, EarlyStopping
from multihead.datasets.multitask import MultiTaskData
from multihead.step.distribute import scope
from multihead.training.keras_model import MultiHeadModel
from multihead.objectives.objective import Objective, resolve_metric
from multihead.training.sampling import TaskSampling
from multihead.training.streams import batches_per_epoch


@dataclasses.dataclass
class SupervisedRunner:
    config: ExperimentConfig
    data: MultiTaskData | dict[str, MultiTaskData]
    model: MultiHeadModel
    objectives: dict[str, Objective]
    trunk: Any = "per_head"
    strategy: Any = None
    standardization: Any = None
    resumable: ClassVar[bool] = True

    def check(self) -> None:
        """One forward and backward pass on a few examples (`dry_run`), so what train would
        run first fails now. Not under a strategy: eager work on distributed variables
        outside the step can wait on the other workers' collectives."""
        if self.strategy is None:
            dry_run(self)

    def _baselines(self, trainer: Any) -> dict[str, dict[str, float]]:
        """Each head's constant-predictor metrics on the eval data (`metrics.json` `baseline`),
        weighted as its evaluation is when it has sample weights."""
        baselines = {}
        for head, objective in self.objectives.items():
            data = self.data[head] if isinstance(self.data, dict) else self.data
            first = tf.nest.map_structure(lambda a: a[:1], _tree(data.x_eval))
            output = prediction_fn(self.model, head, objective)(self.model(first), first)
            baselines[head] = constant_baseline_metrics(
                trainer.loss_fns[head], head, data.y_train[head], data.y_eval[head],
                tuple(output.shape[1:]), [resolve_metric(m, head, objective.loss) for m in objective.metrics],
                w_train=data.w_train.get(head), w_eval=data.w_eval.get(head))
        return baselines

    def run(self, run_dir: str, verbose: bool = True, resume: bool = False,
            extra_callbacks: Sequence[Callback] = ()) -> dict[str, Any]:
        """Trains and writes the run; with `resume`, continues from the run's latest checkpoint.
        `extra_callbacks` go to `fit` too; a `RunWatch` among them that received a signal ends
        the run with a checkpoint of the last step done and `RunInterrupted`."""
        cfg = self.config
        if not resume:
            write_inputs(run_dir, self.data, self.standardization)
        elif self.standardization is not None:
            check_same_standardization(run_dir, self.standardization)
        trainer = build_trainer(cfg, self.model, self.objectives, run_dir, trunk=self.trunk,
                                strategy=self.strategy, write_config=not resume)
        checkpoints = CheckpointManager(os.path.join(run_dir, "checkpoints"), self.model, trainer,
                                        every=cfg.checkpoint.every, keep=cfg.checkpoint.keep)
        callbacks = build_callbacks(cfg, os.path.join(run_dir, "best"))
        train_data, eval_data = _splits(self.data)
        total = total_steps(cfg, train_data)
        resumed_from = None
        if resume:
            resumed_from = os.path.relpath(_restore_for_resume(checkpoints, total), run_dir)
            if verbose:
                print(f"resuming from {resumed_from} (step {trainer.global_step})",
                      file=sys.stderr)
        try:
            history = RunHistory.begin(run_dir, trainer.global_step, resumed_from,
                                       write=trainer.is_chief,
                                       checkpoint_every=cfg.checkpoint.every)
        except HistoryError as err:
            raise ConfigError(f"--resume: {err}") from None
        remaining = total - trainer.global_step
        restored_heads: dict[str, str] = {}
        # A fresh run of train.epochs trains them as fit(epochs=...), whose progress line
        # counts epochs; a resumed one trains the remaining steps.
        length = {"epochs": cfg.train.epochs} if cfg.train.epochs and not trainer.global_step \
            else {"steps": remaining}
        if remaining > 0:
            trainer.fit(train_data, **length, batch_size=cfg.train.batch_size,
                        eval_data=eval_data, eval_every=cfg.train.eval_every,
                        verbose=verbose, seed=cfg.seed, checkpoints=checkpoints,
                        steps_per_execution=cfg.train.steps_per_execution,
                        callbacks=[*callbacks.as_list(), history, *extra_callbacks],
                        sampling=_sampling(cfg))
            try:
                stop_if_interrupted(extra_callbacks, lambda: _checkpoint_now(checkpoints, trainer),
                                    trainer.global_step)
            except RunInterrupted:
                trainer.close()
                raise
            final_eval = _final_eval(history.evals, callbacks.early_stopping)
            if cfg.callbacks.best_checkpoint is not None and cfg.callbacks.best_checkpoint.restore_heads:
                restored_heads = _restore_head_bests(self.model, self.objectives, callbacks, run_dir)
                final_eval = trainer.evaluate(eval_data, batch_size=cfg.train.batch_size, log=False)
        else:
            final_eval = trainer.evaluate(eval_data, batch_size=cfg.train.batch_size)
        _checkpoint_now(checkpoints, trainer)  # the end of the run is always a resumable checkpoint
        # The training-set metrics go to metrics.json only: the eval run in TensorBoard holds
        # evaluations of the eval data.
        final_train = trainer.evaluate(train_data, batch_size=cfg.train.batch_size * 8, log=False)
        baselines = self._baselines(trainer)
        if trainer.is_chief:  # the other workers of a multi-worker run write nothing
            save_checkpoint(os.path.join(run_dir, "checkpoints", "final"), self.model,
                            trainer=trainer)
        trainer.close()
        return {
            "task": "supervised",
            "steps": trainer.global_step,
            "wall_time_s": history.wall_time_s,
            "steps_per_s": history.steps_per_s,
            "segments": history.segments,
            "train": last_logged_losses(run_dir) if trainer.is_chief else {},
            **_affinity(run_dir, bool(cfg.log.affinity_every and trainer.is_chief)),
            "final_train": final_train,
            "eval": final_eval,
            "baseline": baselines,
            "evals": [{"step": step, "eval": metrics} for step, metrics in history.evals],
            "stopped": ({"reason": trainer.stop_reason, "step": trainer.global_step}
                        if trainer.stop_reason is not None else None),
            **_callback_metrics(callbacks, run_dir),
            **({"restored_heads": restored_heads} if restored_heads else {}),
        }


def total_steps(config: ExperimentConfig, train_data: Any) -> int:
    """The steps of the whole run: `train.steps`, or `train.epochs` times the batches of
    one pass over the training data (the largest head's, with `data.per_head`).

    Raises:
        ConfigError: the data has no known length (one line under `train.epochs`).
    """
    train = config.train
    if train.epochs is None:
        return train.steps
    try:
        return train.epochs * batches_per_epoch(train_data, train.batch_size)
    except ValueError as err:
        raise ConfigError(f"train.{err}") from None


def last_logged_losses(run_dir: str) -> dict[str, dict[str, float]]:
    """Head -> `{"loss": the last logged training loss (one batch), "step": its step}`, read
    from the run's event files as `multihead report` reads them."""
    from multihead.monitoring.report import ReportError, load_report

    try:
        summaries = load_report(run_dir).summaries
    except ReportError:  # nothing logged
        return {}
    return {h: {"loss": s.final_loss, "step": s.final_step} for h, s in summaries.items()}


def _affinity(run_dir: str, logged: bool) -> dict[str, dict[str, dict[str, float | None]]]:
    """`{"affinity": [i][j]}`: the mean inter-task affinity of head i onto head j over the run's
    logged steps (`RunReport.affinity`), read from its event files, those of a resumed run's
    earlier segments included; `{}` when the run does not log them (`logged`)."""
    from multihead.monitoring.report import ReportError, load_report

    if not logged:
        return {}
    try:
        return {"affinity": load_report(run_dir).affinity}
    except ReportError:  # nothing logged
        return {"affinity": {}}


def _checkpoint_now(checkpoints: CheckpointManager, trainer: Any) -> str:
    """A periodic checkpoint of the trainer's current step: the latest, or a new one."""
    latest = checkpoints.latest_checkpoint
    if latest is None or checkpoints.step_of(latest) != trainer.global_step:
        latest = checkpoints.save()
    return latest


def _tree(x: Any) -> Any:
    return dict(x) if isinstance(x, dict) else x


def _splits(data: MultiTaskData | dict[str, MultiTaskData]) -> tuple[Any, Any]:
    """What `fit` and `evaluate` take: `(inputs, {head: labels})` (with `{head: weights}`
    third when the data has sample weights) for the train and eval splits, or per head, a
    dict head -> that head's own pair."""
    if isinstance(data, dict):
        return ({h: (d.x_train, {h: d.y_train[h]}) for h, d in data.items()},
                {h: (d.x_eval, {h: d.y_eval[h]}) for h, d in data.items()})
    if data.w_train:  # Keras' (inputs, targets, sample_weight): weighted loss and eval metrics
        return (*data.train, data.w_train), (*data.eval, data.w_eval)
    return data.train, data.eval


def _sampling(config: ExperimentConfig) -> TaskSampling:
    """How per-head data is drawn (`data.sampling`); "all" for one dataset."""
    data = config.data
    return TaskSampling(data.sampling, temperature=data.temperature,
                        weights=dict(data.sampling_weights) or None, seed=config.seed)


def _final_eval(evals: list[tuple[int, dict[str, dict[str, float]]]],
                early_stopping: EarlyStopping | None) -> dict[str, dict[str, float]]:
    """The evaluation of the weights the run ends with: the last one, or that of the best
    step when early stopping restored the best weights (bitwise, so its evaluation holds)."""
    if early_stopping is not None and early_stopping.restore_best and \
            early_stopping.best_step is not None:
        return dict(evals)[early_stopping.best_step]
    return evals[-1][1]


def _restore_head_bests(model: Any, objectives: Any, callbacks: RunCallbacks,
                        run_dir: str) -> dict[str, str]:
    """Each objective's own heads from its best checkpoint; the trunk stays as the run left
    it. The trunk cannot be at every head's best step at once; the one the run ends with is
    the trunk the heads that trained longest were last evaluated with, and a head frozen
    earlier sent it no gradient since. -> objective -> the checkpoint it came from."""
    from multihead.io.checkpoints import restore_checkpoint

    restored = {}
    for name, best in callbacks.head_best.items():
        if best.path is None:
            continue
        reads = [name] if name in model.heads else getattr(objectives[name], "reads", None) or []
        restore_checkpoint(best.path, model, parts=[f"heads/{h}" for h in reads if h in model.heads])
        restored[name] = os.path.relpath(best.path, run_dir)
    return restored


def _callback_metrics(callbacks: RunCallbacks, run_dir: str) -> dict[str, Any]:
    """What each configured callback did, for `metrics.json`."""
    out: dict[str, Any] = {}
    stop = callbacks.early_stopping
    if stop is not None:
        out["early_stopping"] = {
            "monitor": stop.quantity.name, "mode": stop.quantity.mode,
            "best_step": stop.best_step, "best_value": stop.best_value,
            "stopped_step": stop.stopped_step,
            "restored_best": stop.restore_best and stop.best_step is not None,
        }
    best = callbacks.best_checkpoint
    if best is not None:
        out["best_checkpoint"] = {
            "path": os.path.relpath(best.path, run_dir) if best.path else None,
            "monitor": best.quantity.name, "mode": best.quantity.mode,
            "step": best.best_step, "value": best.best_value,
        }
    heads = callbacks.head_early_stopping
    if heads is not None:
        out["head_early_stopping"] = {
            head: {"monitor": w.quantity.name, "mode": w.quantity.mode, "best_step": w.best_step,
                   "best_value": w.best_value, "stopped_step": w.stopped_step, "reason": w.reason}
            for head, w in heads.watches.items()}
    if callbacks.head_best:
        out["head_best_checkpoints"] = {
            head: {"path": os.path.relpath(b.path, run_dir) if b.path else None,
                   "monitor": b.quantity.name, "mode": b.quantity.mode,
                   "step": b.best_step, "value": b.best_value}
            for head, b in callbacks.head_best.items()}
    if callbacks.reduce_lr_on_plateau:
        out["reduce_lr_on_plateau"] = {
            plateau.head: [{"step": step, "from": old, "to": new}
                           for step, old, new in plateau.reductions]
            for plateau in callbacks.reduce_lr_on_plateau
        }
    return out


def _restore_for_resume(checkpoints: CheckpointManager, steps: int) -> str:
    """Restores the latest checkpoint of the run; returns its path."""
    latest = checkpoints.latest_checkpoint
    if latest is None:
        raise ConfigError(f"--resume: no checkpoint in {checkpoints.directory!r} to resume from")
    if checkpoints.step_of(latest) > steps:
        raise ConfigError(
            f"train.steps: {steps} (the run's length) is below the step of the latest checkpoint "
            f"({checkpoints.step_of(latest)}); set train.steps (or train.epochs) to reach at "
            "least that"
        )
    try:
        checkpoints.restore_latest()
    except ValueError as err:  # mismatch or unreadable: bad input, not a crash
        raise ConfigError(f"--resume: {err}") from None
    return latest


def prepare(config: ExperimentConfig) -> SupervisedRunner:
    strategy = build_strategy(config)  # first: a multi-worker strategy precedes any TF work
    keras.utils.set_random_seed(config.seed)
    data = build_data(config)
    standardization = input_standardization(config, data)
    with scope(strategy):  # mirrored variables
        model = build_model(config, input_spec(data), standardization)
    objectives = build_objectives(config)
    build_callbacks(config, best_dir=None)  # a head's learning-rate schedule fails here, not mid-run
    return SupervisedRunner(config, data, model, objectives, trunk=build_trunk(config),
                            strategy=strategy, standardization=standardization)
