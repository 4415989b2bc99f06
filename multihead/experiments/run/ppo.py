"""`task: ppo`: proximal policy optimization (Schulman et al., 2017) with GAE(lambda).

A trunk feeds a policy head (Categorical logits for a Discrete action space; the means of a
diagonal Gaussian for a Box one, with the state-independent log std a variable of the same
head, `GaussianPolicyHead`) and a value head V. With `ppo.separate_optimizers: true` each
head has its own objective (`multihead.rl.ppo.ppo_losses`: clipped surrogate with entropy
bonus; squared error of V, optionally clipped) and its own optimizer on its own var_list
(trunk + head); with `false`, one objective named for the policy head reads both heads and
trains trunk + both heads on the policy head's optimizer (`policy + <value>.weight * value`).
This module turns the config into those objects and runs the loop: roll out `n_steps` in
`num_envs` environments, compute GAE advantages and returns on the host, then `n_epochs`
passes over shuffled minibatches of `train.batch_size` rows, each one train step (an
update's steps run as one compiled call, one per epoch with `ppo.target_kl`); after
each update, `ppo/approx_kl`, `ppo/clip_fraction`, `ppo/explained_variance`,
`ppo/entropy`, `ppo/clip_range`, `ppo/learning_rate_factor` and `ppo/epochs` go to TensorBoard
at the environment step. With `ppo.target_kl`, an update stops after the first epoch whose
approximate KL on the rollout exceeds `1.5 * target_kl` (Stable-Baselines3's rule, checked per
epoch rather than per minibatch).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np
import tensorflow as tf

from multihead.experiments.build.builders import build_model, build_trunk
from multihead.experiments.config.rl_section import PPOConfig
from multihead.experiments.config.schema import ConfigError, ExperimentConfig
from multihead.experiments.run.rl import (
    EnvSpec,
    RLRun,
    RLRunner,
    RLTask,
    env_and_model,
    research_objectives,
)
from multihead.objectives.objective import HeadLoss, Objective, resolve_optimizer
from multihead.rl.driver import Inference
from multihead.rl.ppo import (
    Categorical,
    DiagonalGaussian,
    Distribution,
    GaussianPolicyHead,
    Rollout,
    combined_prediction,
    minibatches,
    ppo_losses,
    prepare_rollout,
    rollout_statistics,
    update_batches,
)
from multihead.training.keras_model import MultiHeadModel

#: Training environment `i` first starts from `reset(seed=ENV_SEED_SCALE * config.seed + i)`.
ENV_SEED_SCALE = 1000


@dataclasses.dataclass
class PPORunner(RLRunner):
    """Everything built and validated by `prepare`; `run` trains and writes the run.

    Attributes:
        ppo: the `ppo:` section.
        distribution: the policy head's distribution.
        clip_range: `eps` as the losses read it; assigned before each update.
        compiled_updates: run an update's minibatch steps as one compiled call (all its
            epochs, or one epoch per call with `ppo.target_kl`); False: one `Trainer.step`
            per minibatch, the reference the tests hold it to (bitwise the same).
    """

    ppo: PPOConfig
    distribution: Distribution
    clip_range: tf.Variable
    compiled_updates: bool = True

    def _update(self, run: RLRun, rollout: Rollout, batch_size: int, rng: np.random.Generator,
                epochs: int) -> None:
        """`epochs` epochs of minibatch steps on `rollout`: one compiled multi-step call
        (`update_batches`), or with `compiled_updates` False one `Trainer.step` per minibatch;
        the same steps on the same batches either way."""
        if not self.compiled_updates:
            for _ in range(epochs):
                for rows in minibatches(len(rollout.obs), batch_size, rng):
                    run.train(rollout.obs[rows], {k: v[rows] for k, v in rollout.targets.items()})
            return
        steps = epochs * -(-len(rollout.obs) // batch_size)
        run.train_steps(iter(update_batches(rollout, batch_size, rng, epochs)), steps)

    def run(self, run_dir: str | None, verbose: bool = True, resume: bool = False,
            extra_callbacks: Sequence[Any] = ()) -> dict[str, Any]:
        """See `RLRunner`. Returns `RLRun.finish`'s metrics, the last loss of each objective and
        the last update's statistics."""
        ppo, task, seed = self.ppo, self.task, self.task.config.seed
        dist, spec, model = self.distribution, task.env_spec, task.model
        low, high = np.array(spec.action_low, np.float32), np.array(spec.action_high, np.float32)
        outputs = Inference(lambda x: model(x, training=False))

        def policy(obs: np.ndarray) -> np.ndarray:
            return outputs(obs)[ppo.policy_head].numpy()

        def to_env(action: np.ndarray) -> np.ndarray:
            return np.clip(action, low, high) if dist is DiagonalGaussian else action

        run = RLRun(task, run_dir, verbose, lambda obs: to_env(dist.mode(policy(obs))),
                    num_envs=ppo.num_envs, env_seed=ENV_SEED_SCALE * seed, resume=resume,
                    callbacks=extra_callbacks)
        optimizers = list(run.trainer.optimizers.values())
        # Read before a resume restores the optimizers (and their decayed rates).
        base_rates = [float(np.asarray(opt.learning_rate)) for opt in optimizers]
        driver, monitor = run.driver, run.trainer.monitor
        rng = np.random.default_rng(seed)  # sampling actions and shuffling minibatches
        stats: dict[str, float] = {}
        run.start({"sample": rng}, records=stats)
        batch_size = task.config.train.batch_size
        # Epochs per update call: all of them, unless the KL is checked after each epoch.
        per_call = ppo.n_epochs if self.compiled_updates and ppo.target_kl is None else 1
        while run.running:
            steps, actions = [], []
            for _ in range(ppo.n_steps):
                action = dist.sample(policy(driver.obs), rng)
                steps.append(driver.step(to_env(action)))
                actions.append(action)
            remaining = max(0.0, 1.0 - driver.env_steps / run.total)
            clip = ppo.clip_range * (remaining if ppo.clip_range_decay == "linear" else 1.0)
            lr_factor = remaining if ppo.learning_rate_decay == "linear" else 1.0
            self.clip_range.assign(clip)
            for opt, rate in zip(optimizers, base_rates):
                opt.learning_rate = rate * lr_factor
            rollout = prepare_rollout(steps, actions, outputs, dist, ppo.policy_head, ppo.value_head,
                                      ppo.gamma, ppo.gae_lambda)
            for epoch in range(per_call, ppo.n_epochs + 1, per_call):
                self._update(run, rollout, batch_size, rng, per_call)
                if ppo.target_kl is None and epoch < ppo.n_epochs:
                    continue  # without target_kl only the final policy's statistics are needed
                params = outputs(rollout.obs)[ppo.policy_head]
                stats.clear()  # in place: the checkpoint holds this dict
                stats.update(rollout_statistics(dist, params, rollout.targets["action"],
                                                rollout.targets["log_prob"], clip))
                if ppo.target_kl is not None and stats["approx_kl"] > 1.5 * ppo.target_kl:
                    break  # the policy moved far enough from the one that acted
            stats.update(explained_variance=rollout.explained_variance, clip_range=clip,
                         learning_rate_factor=lr_factor, epochs=epoch)
            if monitor is not None:
                monitor.write_scalars(driver.env_steps, {f"ppo/{k}": v for k, v in stats.items()})
            if run.after_steps():
                break
        return {**run.finish(), "final_loss": {h: (v[-1] if v else None) for h, v in run.losses.items()},
                "last_update": stats}


def _check(config: ExperimentConfig, ppo: PPOConfig) -> None:
    """The settings the schema cannot check alone, each error naming its key."""
    heads = config.model.heads
    if heads[ppo.policy_head].loss != "mse":  # the default: left out
        raise ConfigError(
            f"model.heads.{ppo.policy_head}.loss: the policy head's loss is set by the task (clipped "
            f"surrogate with entropy bonus ppo.ent_coef); leave it out, got {heads[ppo.policy_head].loss!r}")
    if heads[ppo.value_head].loss != "mse":
        raise ConfigError(f"model.heads.{ppo.value_head}.loss: PPO's value loss is the squared error "
                          f"(clipped with ppo.clip_range_vf); leave it out or say mse, got "
                          f"{heads[ppo.value_head].loss!r}")
    weight = heads[ppo.value_head].weight
    if not ppo.separate_optimizers and not isinstance(weight, (int, float)):
        raise ConfigError(f"model.heads.{ppo.value_head}.weight: with ppo.separate_optimizers: false "
                          f"it is the value loss's coefficient in the one objective: give a number, "
                          f"got {weight!r}")
    batch = config.train.batch_size
    if batch > ppo.num_envs * ppo.n_steps:
        raise ConfigError(f"train.batch_size: the minibatch ({batch}) is larger than a rollout "
                          f"(ppo.num_envs * ppo.n_steps = {ppo.num_envs * ppo.n_steps} rows); lower it")


def _check_constant_rates(objectives: Mapping[str, Objective], ppo: PPOConfig) -> None:
    """With `ppo.learning_rate_decay: linear`, every optimizer's learning rate is a number (the
    loop scales it); the optimizer specs are valid (`research_objectives` checked them)."""
    if ppo.learning_rate_decay != "linear":
        return
    for head, objective in objectives.items():
        rate = resolve_optimizer(objective.optimizer, head).get_config()["learning_rate"]
        if not isinstance(rate, (int, float)):
            raise ConfigError(f"model.heads.{head}.optimizer: ppo.learning_rate_decay: linear "
                              "scales a constant learning rate; give a number, not a schedule, "
                              "or set ppo.learning_rate_decay: constant")


def _build(config: ExperimentConfig, ppo: PPOConfig, spec: EnvSpec) -> MultiHeadModel:
    """The model of `model:` on the observations; for a Box, the policy head's layers (the
    means) wrapped with the log std (`GaussianPolicyHead`)."""
    model = build_model(config, (None,) + spec.obs_shape)
    action_dim = len(spec.action_low)
    out = model(np.zeros((1,) + spec.obs_shape, np.float32), training=False)
    for head, units, what in ((ppo.policy_head, spec.num_actions or action_dim, "policy"),
                              (ppo.value_head, 1, "value")):
        if tuple(out[head].shape[1:]) != (units,):
            raise ConfigError(
                f"model.heads.{head}.layers: the {what} head must output {units} value"
                f"{'s' if units != 1 else ''} per example{' (the means)' if action_dim and units > 1 else ''}, "
                f"it outputs shape {tuple(out[head].shape[1:])}; make its last layer Dense(units={units})")
    if not action_dim:
        return model
    heads = dict(model.heads)
    heads[ppo.policy_head] = GaussianPolicyHead(heads[ppo.policy_head], action_dim, ppo.log_std_init,
                                                name=ppo.policy_head)
    gaussian = MultiHeadModel(model.trunk, heads, taps=config.model.taps)
    gaussian.build((None,) + spec.obs_shape)
    gaussian.partition  # noqa: B018 - validates the trunk/head partition now, log_std included
    return gaussian


def prepare(config: ExperimentConfig) -> PPORunner:
    """Builds the envs, model and objectives of a `task: ppo` config."""
    ppo = config.ppo or PPOConfig()
    env_cfg, spec, model = env_and_model(
        config, {"ppo.policy_head": ppo.policy_head, "ppo.value_head": ppo.value_head},
        lambda spec: _build(config, ppo, spec))
    _check(config, ppo)
    distribution: Distribution = Categorical if spec.num_actions else DiagonalGaussian
    clip_range = tf.Variable(ppo.clip_range, dtype=tf.float32, trainable=False, name="clip_range")

    def make_losses(separate: bool) -> dict[str, HeadLoss]:
        return ppo_losses(distribution, ppo.policy_head, ppo.value_head, clip_range, ppo.ent_coef,
                          ppo.clip_range_vf, ppo.normalize_advantages, separate,
                          vf_coef=float(config.model.heads[ppo.value_head].weight)
                          if not separate else 0.0)

    objectives = research_objectives(config, lambda: make_losses(True),
                                     losses_set_by_task=[ppo.policy_head])
    _check_constant_rates(objectives, ppo)
    if not model.trunk_variables:  # e.g. an Identity trunk: each head has its own network
        objectives = {h: dataclasses.replace(o, trains_trunk=False) for h, o in objectives.items()}
    if not ppo.separate_optimizers:
        objectives = {ppo.policy_head: dataclasses.replace(
            objectives[ppo.policy_head], loss=make_losses(False)[ppo.policy_head],
            reads=(ppo.policy_head, ppo.value_head),
            combine=combined_prediction(ppo.policy_head, ppo.value_head))}
    task = RLTask(config, env_cfg, spec, model, objectives, {}, build_trunk(config))
    return PPORunner(task, ppo, distribution, clip_range)
