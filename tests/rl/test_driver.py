"""The environment driver: stepping with auto-reset, episode bookkeeping, seeded greedy
evaluation, the evaluation schedule and the episode log, against scripted environments."""

import io

import numpy as np
import pytest

from multihead.monitoring.progress import Progress
from multihead.rl.driver import Driver, EpisodeLog, Evaluations, Inference, evaluate


class CountingEnv:
    """Observation = [seed, steps in episode]; reward 1 per step, plus the action; the episode
    terminates after `length` steps, or is truncated after `truncate_at` if that comes first."""

    def __init__(self, length=3, truncate_at=None):
        self.length, self.truncate_at = length, truncate_at
        self.seed, self.t, self.resets, self.closed = None, 0, [], False

    def reset(self, *, seed=None):
        self.resets.append(seed)
        if seed is not None:
            self.seed = seed
        self.t = 0
        return np.array([self.seed, 0.0], "float32"), {}

    def step(self, action):
        self.t += 1
        truncated = self.truncate_at is not None and self.t >= self.truncate_at
        return (np.array([self.seed, self.t], "float32"), 1.0 + action, self.t >= self.length,
                truncated and self.t < self.length, {})

    def close(self):
        self.closed = True


def test_driver_steps_resets_and_counts_episodes():
    made, ended = [], []

    def make():
        made.append(CountingEnv(length=2 + len(made)))  # env 0 ends every 2 steps, env 1 every 3
        return made[-1]

    driver = Driver(make, num_envs=2, seed=7, on_episode_end=lambda *a: ended.append(a))
    assert [env.resets for env in made] == [[7], [8]]
    np.testing.assert_array_equal(driver.obs, [[7, 0], [8, 0]])
    steps = [driver.step([a, 0]) for a in (0, 1, 0)]
    # env 0: step 1 -> t=1; step 2 -> t=2 terminal (return 1 + 2 = 3, length 2), reset; step 3 -> t=1
    # env 1: t = 1, 2, 3: terminal at its 3rd step (return 3, length 3)
    # env steps count env by env: env 0's 2nd step is env step 3, env 1's 3rd is env step 6
    assert ended == [(3, 3.0, 2), (6, 3.0, 3)]
    assert driver.env_steps == 6
    np.testing.assert_array_equal(steps[1].terminated, [1, 0])
    np.testing.assert_array_equal(steps[1].next_obs[0], [7, 2])  # the final observation, not the reset one
    np.testing.assert_array_equal(steps[2].obs[0], [7, 0])  # acted on after the reset
    np.testing.assert_array_equal(steps[2].ended, [0, 1])
    np.testing.assert_array_equal(steps[1].reward, [2, 1])
    assert steps[0].action.dtype == np.int64 and steps[0].reward.dtype == np.float32
    assert made[0].resets == [7, None]  # later resets continue the env's own stream
    driver.close()
    assert all(env.closed for env in made)


def test_truncation_ends_an_episode_without_terminating_it():
    driver = Driver(lambda: CountingEnv(length=10, truncate_at=2), num_envs=1, seed=0)
    driver.step([0])
    step = driver.step([0])
    assert step.ended[0] == 1.0 and step.terminated[0] == 0.0


def test_driver_rejects_a_bad_number_of_envs():
    with pytest.raises(ValueError, match="^Driver.num_envs: must be >= 1, got 0$"):
        Driver(CountingEnv, num_envs=0, seed=0)


def test_evaluate_seeds_episode_i_with_seed_plus_i_and_acts_in_batches():
    made, batches = [], []

    def make():
        made.append(CountingEnv(length=2 + len(made)))
        return made[-1]

    def act(obs):
        batches.append(obs[:, 0].tolist())
        return np.ones(len(obs), int)

    result = evaluate(make, act, episodes=3, seed=100)
    assert [env.resets for env in made] == [[100], [101], [102]]
    assert batches == [[100, 101, 102], [100, 101, 102], [101, 102], [102]]  # finished ones drop out
    np.testing.assert_array_equal(result.lengths, [2, 3, 4])
    np.testing.assert_array_equal(result.returns, [4, 6, 8])  # 2 per step with action 1
    assert result.mean_return == 6.0


def test_evaluations_run_when_due_and_stop_at_the_stop_return():
    log = EpisodeLog(monitor=None, progress=None)
    evals = Evaluations(lambda: CountingEnv(length=5), lambda obs: np.zeros(len(obs), int), episodes=2,
                        seed=0, every=10, total=35, stop_return=None, log=log)
    for env_steps in (5, 10, 12, 25, 29, 30, 35):
        assert evals(env_steps) is False  # no stop_return: never stops
    # 10 is due (next 20); 25 passes 20, so it evaluates (next 30); 30 is due; 35 is the budget
    assert [s for s, _ in evals.history] == [10, 25, 30, 35]
    assert evals.last_mean_return == 5.0 and evals.solved_at is None
    stopping = Evaluations(lambda: CountingEnv(length=5), lambda obs: np.zeros(len(obs), int), episodes=1,
                           seed=0, every=10, total=100, stop_return=5.0, log=log)
    assert stopping(9) is False and stopping(10) is True and stopping.solved_at == 10


def test_episode_log_counts_and_prints_evaluations_below_the_progress_line():
    stream = io.StringIO()
    log = EpisodeLog(monitor=None, progress=Progress(100, stream=stream, log_interval=0.0), window=2)
    assert np.isnan(log.recent_mean)
    for ret in (1.0, 2.0, 6.0):
        log.finished(10, ret, 3)
    assert log.count == 3 and log.recent_mean == 4.0  # the last two: (2 + 6) / 2
    log.stepped(20, {"q": 0.5})
    evals = Evaluations(lambda: CountingEnv(length=5), lambda obs: np.zeros(len(obs), int), episodes=2,
                        seed=0, every=30, total=100, stop_return=None, log=log)
    evals(30)
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("step  20/100") and "q=0.5" in lines[0]
    assert lines[-1] == ("eval at env step 30: mean return 5.0 over 2 episodes; 3 training episodes, "
                         "recent mean return 4.0")


class BoxEnv:
    """A continuous-action environment: observation = last action, reward = -|action|^2, two steps."""

    def __init__(self):
        self.t = 0

    def reset(self, *, seed=None):
        self.t = 0
        return np.zeros(2, "float32"), {}

    def step(self, action):
        assert isinstance(action, np.ndarray) and action.dtype == np.float32 and action.shape == (2,)
        self.t += 1
        return action.copy(), -float(np.sum(action ** 2)), self.t >= 2, False, {}

    def close(self):
        pass


def test_driver_and_evaluation_take_continuous_actions():
    driver = Driver(BoxEnv, num_envs=2, seed=0)
    step = driver.step(np.array([[0.5, -1.0], [2.0, 0.0]]))
    assert step.action.dtype == np.float32 and step.action.shape == (2, 2)
    np.testing.assert_array_equal(step.next_obs, [[0.5, -1.0], [2.0, 0.0]])
    np.testing.assert_allclose(step.reward, [-1.25, -4.0])  # -(0.25 + 1), -(4 + 0)
    result = evaluate(BoxEnv, lambda obs: np.full((len(obs), 2), 0.5), episodes=3, seed=0)
    np.testing.assert_allclose(result.returns, [-1.0] * 3)  # 2 steps of -(0.25 + 0.25)
    np.testing.assert_array_equal(result.lengths, [2, 2, 2])


def test_inference_equals_the_eager_function_for_any_batch_size_and_traces_once_per_dtype():
    import keras
    import tensorflow as tf

    layer = keras.layers.Dense(3, activation="tanh")
    layer.build((None, 4))
    traces = []

    def fn(x):
        traces.append(x.dtype)  # Python side effect: once per trace
        return layer(tf.cast(x, tf.float32))

    act = Inference(fn)
    rng = np.random.default_rng(0)
    for rows in (1, 8, 5, 8):
        x = rng.standard_normal((rows, 4)).astype("float32")
        np.testing.assert_allclose(act(x).numpy(), np.tanh(x @ layer.kernel.numpy() + layer.bias.numpy()),
                                   rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(act(tf.constant(x)).numpy(), act(x).numpy())
    assert traces == [tf.float32]  # one trace for every batch size, arrays and tensors alike
    act(rng.standard_normal((2, 4)))  # float64 observations: their own trace, as tf.function's
    assert traces == [tf.float32, tf.float64]
    pair = Inference(lambda d: d["a"] + d["b"])  # not one array: through the tf.function
    np.testing.assert_array_equal(pair({"a": np.ones(2), "b": np.ones(2)}).numpy(), [2.0, 2.0])
