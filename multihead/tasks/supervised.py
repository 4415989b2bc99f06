"""`task: supervised`: multi-task regression/classification on the embedded data."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import keras
import yaml

from multihead.baselines import constant_baseline
from multihead.builders import build_data, build_model, build_objectives
from multihead.checkpoints import save_checkpoint
from multihead.config import ExperimentConfig
from multihead.data import MultiTaskData
from multihead.model import MultiHeadModel
from multihead.objectives import Objective
from multihead.trainer import Trainer
from multihead.config import to_dict


@dataclasses.dataclass
class SupervisedRunner:
    config: ExperimentConfig
    data: MultiTaskData
    model: MultiHeadModel
    objectives: dict[str, Objective]

    def run(self, run_dir: str, verbose: bool = True) -> dict[str, Any]:
        cfg = self.config
        trainer = Trainer(self.model, self.objectives, schedule=cfg.train.schedule,
                          log_dir=run_dir, log_every=cfg.log.every,
                          histograms_every=cfg.log.histograms_every,
                          log_variable_norms=cfg.log.variable_norms,
                          jit_compile=cfg.train.jit_compile)
        if trainer.monitor is not None:  # the resolved config, as a text summary at step 0
            trainer.monitor.write_config(yaml.safe_dump(to_dict(cfg), sort_keys=False))
        history = trainer.fit(self.data.train, cfg.train.steps, batch_size=cfg.train.batch_size,
                              eval_data=self.data.eval, eval_every=cfg.train.eval_every,
                              verbose=verbose, seed=cfg.seed)
        final_eval = history.eval[-1][1]
        train_metrics = trainer.evaluate(self.data.train, batch_size=cfg.train.batch_size * 8)
        baselines = {}
        for head in self.model.head_names:
            output_shape = tuple(self.model(self.data.x_eval[:1])[head].shape[1:])
            baselines[head] = constant_baseline(
                trainer.loss_fns[head], head, self.data.y_train[head], self.data.y_eval[head],
                output_shape,
            )
        save_checkpoint(os.path.join(run_dir, "checkpoints", "final"), self.model, trainer=trainer)
        trainer.close()
        return {
            "task": "supervised",
            "steps": trainer.global_step,
            "wall_time_s": history.wall_time,
            "steps_per_s": cfg.train.steps / history.wall_time,
            "train": train_metrics,
            "eval": final_eval,
            "baseline": {h: {"loss": v} for h, v in baselines.items()},
        }


def prepare(config: ExperimentConfig) -> SupervisedRunner:
    keras.utils.set_random_seed(config.seed)
    data = build_data(config)
    model = build_model(config, (None,) + data.x_train.shape[1:])
    objectives = build_objectives(config)
    return SupervisedRunner(config, data, model, objectives)
