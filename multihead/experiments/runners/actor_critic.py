"""`task: actor_critic`: synchronous advantage actor-critic (A2C; Mnih et al., ICML 2016).

A shared trunk feeds a policy head (action logits) and a value head V; each head
has its own loss and its own optimizer on its own var_list (trunk + head). The
n-step returns bootstrap from V, or from an exact copy V_target (a
`TargetNetwork` of trunk + value head) when `value_target_every`/`_tau` is set.
Both losses run inside the compiled train step.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Callable

import keras
import numpy as np
import tensorflow as tf

from multihead.experiments.builders import build_model, build_objectives, build_trainer, build_trunk
from multihead.io.checkpoints import save_checkpoint
from multihead.experiments.config import ActorCriticConfig, ConfigError, EnvConfig, ExperimentConfig
from multihead.core.model import MultiHeadModel
from multihead.core.objectives import HeadLoss, Objective, resolve_loss
from multihead.rl.target_network import TargetNetwork
from multihead.experiments.runners.rl import (
    Episodes,
    check_head_outputs,
    check_tau,
    env_factory,
    evaluate,
    greedy_policy,
    head_outputs,
    reject_metrics,
)

#: What the config's `loss` of the policy head may say: the task sets that loss.
POLICY_LOSS_NAMES = ("mse", "policy_gradient")


# -- pure math --------------------------------------------------------------------------


def nstep_returns(reward: Any, terminated: Any, ended: Any, next_value: Any, gamma: float) -> tf.Tensor:
    """Bootstrapped n-step returns of a rollout of `T` steps in `K` environments.

    Backwards over time, with `V(s_{t+1})` = `next_value[t]` (the value of the
    observation that followed step `t`, the final observation if the episode
    ended there):

        R_t = r_t + gamma * (1 - terminated_t) * V(s_{t+1})   if the episode ended at t or t = T-1
        R_t = r_t + gamma * R_{t+1}                           otherwise

    so a time-limit truncation bootstraps from its final observation and a
    termination does not bootstrap.

    Args:
        reward, terminated, ended: `(T, K)`; `ended` is terminated or truncated.
        next_value: `(T, K)` values of the next observations.
        gamma: discount.

    Returns:
        `(T, K)` returns.
    """
    reward = tf.cast(reward, tf.float32)
    terminated = tf.cast(terminated, tf.float32)
    ended = tf.cast(ended, tf.bool)
    next_value = tf.cast(next_value, tf.float32)
    steps = reward.shape[0]
    returns = [None] * steps
    following = next_value[steps - 1]
    for t in reversed(range(steps)):
        bootstrap = tf.where(ended[t], next_value[t], following) if t < steps - 1 else next_value[t]
        returns[t] = reward[t] + gamma * (1.0 - terminated[t]) * bootstrap
        following = returns[t]
    return tf.stack(returns)


def policy_gradient_loss(logits: Any, action: Any, advantage: Any, entropy_coef: float) -> tf.Tensor:
    """`-mean(log pi(a|s) * A) - entropy_coef * mean(H(pi(.|s)))` (Williams, 1992; Mnih et al., 2016).

    `advantage` is treated as a constant (`stop_gradient`).
    """
    log_pi = tf.nn.log_softmax(logits)
    log_pi_a = tf.gather(log_pi, tf.cast(action, tf.int32), axis=-1, batch_dims=1)
    entropy = -tf.reduce_sum(tf.exp(log_pi) * log_pi, axis=-1)
    return -tf.reduce_mean(log_pi_a * tf.stop_gradient(advantage)) - entropy_coef * tf.reduce_mean(entropy)


# -- the losses --------------------------------------------------------------------------


def actor_critic_losses(
    model: MultiHeadModel,
    policy_head: str,
    value_head: str,
    gamma: float,
    entropy_coef: float,
    value_target: TargetNetwork | None = None,
    value_loss: Any = "mse",
    normalize_advantages: bool = False,
) -> tuple[HeadLoss, HeadLoss]:
    """The research losses `(policy_loss, value_loss)` of an A2C rollout batch.

    The batch is `(obs (T*K, ...), {"action" (T*K,), "reward" (T, K),
    "terminated" (T, K), "ended" (T, K), "next_obs" (T*K, ...)})`, rows in
    time-major order. Returns bootstrap from `value_target` (or from V itself,
    under `stop_gradient`, if None).
    """
    elementwise = resolve_loss(value_loss, value_head)

    def bootstrap(next_obs: Any) -> tf.Tensor:
        if value_target is not None:
            return value_target(next_obs)[value_head][:, 0]
        return tf.stop_gradient(model(next_obs, training=False)[value_head][:, 0])

    def returns(targets: Any) -> tf.Tensor:
        shape = tf.shape(targets["reward"])
        next_value = tf.reshape(bootstrap(targets["next_obs"]), shape)
        r = nstep_returns(targets["reward"], targets["terminated"], targets["ended"], next_value, gamma)
        return tf.stop_gradient(tf.reshape(r, [-1]))

    def policy_loss(inputs: Any, targets: Any, logits: Any) -> tf.Tensor:
        value = tf.stop_gradient(model(inputs, training=False)[value_head][:, 0])
        advantage = returns(targets) - value
        if normalize_advantages:
            mean, var = tf.nn.moments(advantage, axes=[0])
            advantage = (advantage - mean) / (tf.sqrt(var) + 1e-8)
        return policy_gradient_loss(logits, targets["action"], advantage, entropy_coef)

    def v_loss(inputs: Any, targets: Any, value: Any) -> tf.Tensor:
        return elementwise(inputs, {value_head: returns(targets)[:, None]}, value)

    return policy_loss, v_loss


# -- the task ----------------------------------------------------------------------------


@dataclasses.dataclass
class ActorCriticRunner:
    """Everything built and validated by `prepare`; `run` trains and writes the run."""

    config: ExperimentConfig
    env: EnvConfig
    ac: ActorCriticConfig
    make_env: Callable[[], Any]
    obs_shape: tuple[int, ...]
    num_actions: int
    model: MultiHeadModel
    objectives: dict[str, Objective]
    value_target: TargetNetwork | None
    trunk: Any = "per_head"

    def run(self, run_dir: str | None, verbose: bool = True) -> dict[str, Any]:
        """Trains for `train.steps` environment steps, or until a greedy evaluation reaches
        `env.stop_return`.

        Args:
            run_dir: where events and the final checkpoints go; None writes nothing.
            verbose: print progress lines (environment steps, episodes, recent mean return).

        Returns:
            The metrics written to `metrics.json`: environment steps, episodes, updates,
            target updates and syncs, losses, every evaluation, wall time.
        """
        cfg, ac, seed = self.config, self.ac, self.config.seed
        trainer = build_trainer(cfg, self.model, self.objectives, run_dir, trunk=self.trunk,
                                strategy=None, write_config=True)
        logits_fn = head_outputs(self.model, ac.policy_head)
        greedy = greedy_policy(logits_fn)

        total = cfg.train.steps
        eval_every = cfg.train.eval_every or total
        rng = np.random.default_rng(seed)
        envs = [self.make_env() for _ in range(ac.num_envs)]
        obs = np.stack([env.reset(seed=seed * 1000 + i)[0] for i, env in enumerate(envs)]).astype(np.float32)
        ep_return, ep_length = np.zeros(ac.num_envs), np.zeros(ac.num_envs, np.int64)
        episodes = Episodes(trainer.monitor, total, verbose)
        T, K = ac.n_steps, ac.num_envs
        losses: dict[str, list[float]] = {h: [] for h in self.objectives}
        evals: list[tuple[int, float]] = []
        solved_at: int | None = None
        start = time.perf_counter()
        env_steps, next_eval = 0, eval_every
        while env_steps < total:
            b_obs = np.zeros((T, K) + self.obs_shape, np.float32)
            b_next = np.zeros_like(b_obs)
            b_action = np.zeros((T, K), np.int64)
            b_reward, b_term, b_ended = (np.zeros((T, K), np.float32) for _ in range(3))
            for t in range(T):
                logits = logits_fn(obs).numpy().astype(np.float64)
                probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
                probs /= probs.sum(axis=-1, keepdims=True)
                actions = (rng.random((K, 1)) > np.cumsum(probs, axis=-1)).sum(axis=-1)
                actions = np.minimum(actions, self.num_actions - 1)
                b_obs[t], b_action[t] = obs, actions
                for k, env in enumerate(envs):
                    o, r, term, trunc, _ = env.step(int(actions[k]))
                    b_next[t, k], b_reward[t, k], b_term[t, k] = o, r, float(term)
                    b_ended[t, k] = float(term or trunc)
                    ep_return[k] += r
                    ep_length[k] += 1
                    env_steps += 1
                    if term or trunc:
                        episodes.finished(env_steps, float(ep_return[k]), int(ep_length[k]))
                        ep_return[k], ep_length[k] = 0.0, 0
                        o, _ = env.reset()
                    obs[k] = o
            targets = {"action": b_action.reshape(-1), "reward": b_reward, "terminated": b_term,
                       "ended": b_ended, "next_obs": b_next.reshape((T * K,) + self.obs_shape)}
            result = trainer.step((b_obs.reshape((T * K,) + self.obs_shape), targets))
            for head, loss in result.losses.items():
                if not np.isfinite(loss):
                    raise FloatingPointError(f"the loss of head {head!r} became {loss} at env step {env_steps}")
                losses[head].append(loss)
            if self.value_target is not None:
                self.value_target.update()
            episodes.progress(env_steps)
            if env_steps >= next_eval or env_steps >= total:
                next_eval += eval_every
                ev = evaluate(self.make_env, greedy, self.env.eval_episodes, seed=10_000 + seed)
                evals.append((env_steps, ev.mean_return))
                episodes.evaluated(env_steps, ev)
                if self.env.stop_return is not None and ev.mean_return >= self.env.stop_return:
                    solved_at = env_steps
                    break
        wall = time.perf_counter() - start
        for env in envs:
            env.close()
        if run_dir is not None:
            targets = {ac.value_head: self.value_target} if self.value_target is not None else None
            save_checkpoint(os.path.join(run_dir, "checkpoints", "final"), self.model, trainer=trainer,
                            targets=targets)
        trainer.close()
        vt = self.value_target
        return {
            "task": "actor_critic",
            "env": self.env.id,
            "env_steps": env_steps,
            "episodes": episodes.count,
            "updates": trainer.global_step,
            "target_updates": int(vt.counter.numpy()) if vt is not None else None,
            "target_syncs": vt.num_syncs if vt is not None and vt.every else None,
            "final_loss": {h: (v[-1] if v else None) for h, v in losses.items()},
            "eval_mean_return": evals[-1][1] if evals else None,
            "eval_episodes": self.env.eval_episodes,
            "evals": [{"env_steps": s, "mean_return": r} for s, r in evals],
            "solved_at_env_steps": solved_at,
            "wall_time_s": wall,
        }


def prepare(config: ExperimentConfig) -> ActorCriticRunner:
    """Builds the envs, model, per-head objectives and V_target of a `task: actor_critic` config."""
    keras.utils.set_random_seed(config.seed)
    env_cfg = config.env or EnvConfig()
    ac = config.actor_critic or ActorCriticConfig()
    check_tau(ac.value_target_tau, ac.value_target_every, "actor_critic.value_target")
    reject_metrics(config)
    make_env, obs_shape, num_actions = env_factory(env_cfg)
    for key, head in (("policy_head", ac.policy_head), ("value_head", ac.value_head)):
        if head not in config.model.heads:
            raise ConfigError(f"actor_critic.{key}: the model has no head {head!r}; "
                              f"its heads are {list(config.model.heads)}")
    if ac.policy_head == ac.value_head:
        raise ConfigError(f"actor_critic.value_head: must differ from policy_head ({ac.policy_head!r})")
    extra = [h for h in config.model.heads if h not in (ac.policy_head, ac.value_head)]
    if extra:
        raise ConfigError(f"model.heads.{extra[0]}: task actor_critic trains a policy and a value head "
                          "only; remove the other heads")
    policy_cfg = config.model.heads[ac.policy_head]
    if policy_cfg.loss not in POLICY_LOSS_NAMES:
        raise ConfigError(
            f"model.heads.{ac.policy_head}.loss: the policy head's loss is set by the task (policy "
            f"gradient with entropy bonus actor_critic.entropy_coef); leave it out, got {policy_cfg.loss!r}"
        )
    model = build_model(config, (None,) + obs_shape)
    check_head_outputs(model, ac.policy_head, num_actions, "policy", "actor_critic.policy_head")
    check_head_outputs(model, ac.value_head, 1, "value", "actor_critic.value_head")
    value_target = None
    if ac.value_target_every is not None or ac.value_target_tau is not None:
        value_target = TargetNetwork(model, heads=[ac.value_head], every=ac.value_target_every,
                                     tau=ac.value_target_tau)
    value_cfg = config.model.heads[ac.value_head]
    checked = dataclasses.replace(config, model=dataclasses.replace(
        config.model, heads={**config.model.heads,
                             ac.policy_head: dataclasses.replace(policy_cfg, loss="mse")}))
    build_objectives(checked)  # validates optimizer/loss names with their key paths
    try:
        policy_loss, value_loss = actor_critic_losses(
            model, ac.policy_head, ac.value_head, ac.gamma, ac.entropy_coef, value_target,
            value_loss=value_cfg.loss, normalize_advantages=ac.normalize_advantages)
    except (ValueError, TypeError) as err:
        raise ConfigError(f"model.heads.{ac.value_head}.loss: {err}") from None
    objectives = {}
    for head, loss, head_cfg in ((ac.policy_head, policy_loss, policy_cfg),
                                 (ac.value_head, value_loss, value_cfg)):
        objectives[head] = Objective(loss=loss, optimizer=head_cfg.optimizer, weight=head_cfg.weight,
                                     every=head_cfg.every, trains_trunk=head_cfg.trains_trunk)
    ordered = {h: objectives[h] for h in config.model.heads}
    return ActorCriticRunner(config, env_cfg, ac, make_env, obs_shape, num_actions, model,
                             ordered, value_target, build_trunk(config))
