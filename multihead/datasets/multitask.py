"""Embedded data (no download) and the conversion of user data into batches.

The synthetic multi-task generator follows Ma et al., "Modeling Task
Relationships in Multi-task Learning with Multi-gate Mixture-of-Experts"
(KDD 2018), section "Synthetic Data Generation":

1. orthogonal unit vectors u_1, ..., u_K in R^d;
2. task weight vectors w_k = c * sum_j L[k, j] u_j, where L is the Cholesky
   factor of the K x K matrix with 1 on the diagonal and the correlation p off
   it, so that cos(w_j, w_k) = p for every pair. For K = 2 this is exactly the
   paper's w_1 = c u_1, w_2 = c (p u_1 + sqrt(1 - p^2) u_2);
3. inputs x ~ N(0, I_d);
4. labels y_k = w_k^T x + sum_{i=1..m} sin(alpha_i w_k^T x + beta_i) + eps_k,
   with alpha_i, beta_i ~ N(0, 1) shared by all tasks and eps_k ~ N(0, noise_std^2).

The paper's settings are d = 100, c = 1, m = 10 and eps ~ N(0, 0.01) (noise_std 0.1).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import tensorflow as tf

from multihead._checks import check_int

REGRESSION = "regression"
CLASSIFICATION = "classification"


@dataclasses.dataclass(frozen=True)
class MultiTaskData:
    """A train/eval split of a multi-task data set.

    Attributes:
        x_train, x_eval: inputs, float32 `(n, input_dim)`.
        y_train, y_eval: task name -> labels, float32 `(n, 1)`.
        kinds: task name -> `"regression"` or `"classification"` (labels 0/1).
        task_correlation: the cosine similarity of the tasks' weight vectors.
        w_train, w_eval: head -> per-example sample weights, float32 `(n,)`, for the heads
            that have them (`data.sample_weights`); empty without.
    """

    x_train: np.ndarray
    y_train: dict[str, np.ndarray]
    x_eval: np.ndarray
    y_eval: dict[str, np.ndarray]
    kinds: dict[str, str]
    task_correlation: float
    w_train: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    w_eval: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)

    @property
    def train(self) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        return self.x_train, self.y_train

    @property
    def eval(self) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        return self.x_eval, self.y_eval


def _task_weights(num_tasks: int, input_dim: int, correlation: float, scale: float,
                  rng: np.random.Generator, clusters: Sequence[Sequence[int]] | None = None,
                  ) -> np.ndarray:
    gram = np.full((num_tasks, num_tasks), correlation)
    if clusters is not None:  # correlated within a cluster, orthogonal across
        same = np.zeros((num_tasks, num_tasks), bool)
        for members in clusters:
            same[np.ix_(members, members)] = True
        gram = np.where(same, gram, 0.0)
    gram = gram + (1.0 - correlation) * np.eye(num_tasks)
    try:
        factor = np.linalg.cholesky(gram)
    except np.linalg.LinAlgError:  # correlation 1: singular but positive semi-definite
        vals, vecs = np.linalg.eigh(gram)
        factor = vecs * np.sqrt(np.clip(vals, 0.0, None))
    basis, _ = np.linalg.qr(rng.standard_normal((input_dim, num_tasks)))
    return scale * factor @ basis.T  # (K, d), row k is w_k


def mmoe_synthetic(
    tasks: int | Sequence[str] = 2,
    correlation: float = 0.5,
    train_size: int = 8000,
    eval_size: int = 2000,
    input_dim: int = 100,
    num_sinusoids: int = 10,
    scale: float = 1.0,
    noise_std: float = 0.1,
    classification: Sequence[str] = (),
    seed: int = 0,
    clusters: Sequence[Sequence[str]] | None = None,
) -> MultiTaskData:
    """Generates the MMoE synthetic multi-task regression data (see module docstring).

    Args:
        tasks: number of tasks (named `y1`, `y2`, ...) or their names.
        correlation: cosine similarity p of every pair of task weight vectors,
            in (-1/(K-1), 1].
        train_size, eval_size: number of examples in each split.
        input_dim: input dimension d (at least the number of tasks).
        num_sinusoids: m, the number of sinusoids in each label.
        scale: c, the norm of every task weight vector.
        noise_std: standard deviation of the label noise.
        classification: task names whose label is binarised at the training
            median (the mixed classification + regression variant).
        seed: seed of the generator; equal seeds give equal data.
        clusters: groups of task names, each task in one: `correlation` is then the cosine
            of two tasks of one cluster, and tasks of different clusters are orthogonal
            (cosine 0; their labels are independent). None: one cluster of every task.

    Returns:
        The train and eval splits.

    Example:
        >>> data = mmoe_synthetic(tasks=["a", "b"], correlation=0.9, train_size=64, eval_size=8)
        >>> data.x_train.shape, data.y_train["a"].shape
        ((64, 100), (64, 1))
    """
    names = [f"y{i + 1}" for i in range(tasks)] if isinstance(tasks, int) else list(tasks)
    k = len(names)
    if k < 1 or len(set(names)) != k:
        raise ValueError(f"tasks must be a positive count or distinct names, got {tasks!r}")
    groups = _correlated_groups(clusters, names, correlation)
    if input_dim < k:
        raise ValueError(f"input_dim ({input_dim}) must be at least the number of tasks ({k})")
    train_size = check_int(train_size, "train_size", minimum=1)
    eval_size = check_int(eval_size, "eval_size", minimum=1)
    unknown = [c for c in classification if c not in names]
    if unknown:
        raise ValueError(f"classification names task {unknown[0]!r}, but the tasks are {names}")

    rng = np.random.default_rng(seed)
    weights = _task_weights(k, input_dim, correlation, scale, rng, groups)
    alpha = rng.standard_normal(num_sinusoids)
    beta = rng.standard_normal(num_sinusoids)
    x = rng.standard_normal((train_size + eval_size, input_dim))
    linear = x @ weights.T  # (n, K)
    waves = np.sin(linear[:, :, None] * alpha + beta).sum(axis=-1)
    labels = linear + waves + noise_std * rng.standard_normal(linear.shape)

    kinds = {n: CLASSIFICATION if n in classification else REGRESSION for n in names}
    ys = {}
    for i, name in enumerate(names):
        y = labels[:, i : i + 1]
        if kinds[name] == CLASSIFICATION:
            y = (y > np.median(y[:train_size])).astype(np.float64)
        ys[name] = y.astype(np.float32)
    x = x.astype(np.float32)
    return MultiTaskData(
        x_train=x[:train_size],
        y_train={n: y[:train_size] for n, y in ys.items()},
        x_eval=x[train_size:],
        y_eval={n: y[train_size:] for n, y in ys.items()},
        kinds=kinds,
        task_correlation=float(correlation),
    )


def _correlated_groups(clusters: Sequence[Sequence[str]] | None, names: Sequence[str],
                       correlation: float) -> list[list[int]]:
    """The positions in `names` of each cluster's tasks (every task in exactly one cluster;
    None: one cluster of all), checked against the range of `correlation`."""
    groups = [list(range(len(names)))]
    if clusters is not None:
        seen = [t for cluster in clusters for t in cluster]
        if sorted(seen) != sorted(names):
            raise ValueError(f"clusters must hold every task once, got {list(map(list, clusters))} "
                             f"for tasks {list(names)}")
        groups = [[list(names).index(t) for t in cluster] for cluster in clusters if cluster]
    size = max(len(g) for g in groups)
    lower = -1.0 / (size - 1) if size > 1 else -1.0
    if not lower < correlation <= 1.0:
        raise ValueError(f"correlation must be in ({lower:.4g}, 1] for {size} tasks, got {correlation}")
    return groups


class DataPosition(tf.Module):
    """Where `Trainer.fit` is in its stream of batches, as variables a checkpoint saves.

    `fit` reads a dataset epoch by epoch, one new iterator per epoch (a shuffled
    dataset reshuffles each time). The position is the number of iterators
    started before the current one (`epoch`) and the batches taken from the
    current one (`batch`). After a restore, `epochs` fast-forwards a fresh
    dataset to that position: it starts (and drops) `epoch` iterators, which draws
    the same reshuffle seeds as the original run, then skips `batch` batches. So a
    resumed run sees exactly the batches the uninterrupted run saw, for any
    dataset that is deterministic given its seeds (array data is shuffled by
    `as_dataset` with a fixed seed). The tf.data iterator itself is not
    checkpointed: its checkpoint does not restore a reshuffling pipeline exactly.

    Args:
        heads: names of per-head streams (`fit(data={head: ...})`), each with a
            position of its own in `self.heads[name]`.
    """

    def __init__(self, heads: Sequence[str] = ()) -> None:
        super().__init__(name="data_position")
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
        self.batch = tf.Variable(0, dtype=tf.int64, trainable=False, name="batch")
        #: Head name -> the position of that head's own dataset.
        self.heads = {head: StreamPosition() for head in heads}
        self._resume = False
        self._per_epoch: int | None = None  # batches an epoch, for `repeated`

    @property
    def restored(self) -> bool:
        """Whether a restore moved the position since the stream was last started."""
        return self._resume or any(p.restored for p in self.heads.values())

    def mark_restored(self) -> None:
        """The next `epochs` continues from the (restored) position instead of restarting
        (here and in every per-head position)."""
        self._resume = True
        for position in self.heads.values():
            position.mark_restored()

    def clear_restored(self) -> None:
        """Forgets a restore of this position alone (its per-head streams started instead)."""
        self._resume = False

    def advance(self, batches: int) -> None:
        """Counts `batches` more batches taken (from the current epoch's iterator, or from
        the `repeated` one, whose epochs are `per_epoch` batches long)."""
        if self._per_epoch is None:
            self.batch.assign_add(batches, read_value=False)
            return
        epochs, batch = divmod(int(self.batch.numpy()) + batches, self._per_epoch)
        if epochs:
            self.epoch.assign_add(epochs, read_value=False)
        self.batch.assign(batch, read_value=False)

    def repeated(self, dataset: tf.data.Dataset, per_epoch: int) -> Iterator[Any]:
        """One iterator over `dataset` repeated forever, fast-forwarded to the restored
        position, for a dataset of `per_epoch` batches an epoch. It takes exactly the
        batches of `epochs`' iterators (each repetition draws the next reshuffle seed, as
        a new iterator does) without starting a Python iterator per epoch, which costs
        tens of milliseconds. Whoever takes batches from it calls `advance`.

        Raises:
            ValueError: the restored position is past the end of an epoch of `dataset`
                (it is not the data the checkpoint was trained on).
        """
        epoch, skip = self._start()
        if skip > per_epoch:
            raise ValueError(self._cannot_resume(epoch, skip, per_epoch))
        self._per_epoch = per_epoch
        # Prefetched across epochs: a prefetch inside the repetition restarts cold each epoch.
        return iter(dataset.repeat().skip(epoch * per_epoch + skip).prefetch(tf.data.AUTOTUNE))

    def _start(self) -> tuple[int, int]:
        """The position a new stream starts from: the restored one, else (0, 0)."""
        if not self._resume:
            self.epoch.assign(0)
            self.batch.assign(0)
        self._resume = False
        return int(self.epoch.numpy()), int(self.batch.numpy())

    @staticmethod
    def _cannot_resume(epoch: int, skip: int, batches: int) -> str:
        return (f"cannot resume the data stream at epoch {epoch}, batch {skip}: this epoch has "
                f"only {batches} batches; resume with the data (and batch size and seed) the "
                "checkpoint was trained on, or restore without the 'data' part")

    def epochs(self, dataset: tf.data.Dataset) -> Iterator[Iterator[Any]]:
        """One iterator per epoch of `dataset`, forever; the first is fast-forwarded to
        the restored position. Whoever takes batches from them calls `advance`.

        Raises:
            ValueError: an epoch yields no batch, or fewer than the restored
                position needs (it is not the data the checkpoint was trained on).
        """
        epoch, skip = self._start()
        self._per_epoch = None
        for _ in range(epoch):
            iter(dataset)  # draws this epoch's reshuffle seed, as the original run did
        while True:
            iterator = iter(dataset)
            for i in range(skip):
                if next(iterator, None) is None:
                    raise ValueError(self._cannot_resume(epoch, skip, i))
            yield iterator
            if int(self.batch.numpy()) == 0:
                raise ValueError("the training data yielded no batch")
            epoch, skip = epoch + 1, 0
            self.epoch.assign(epoch)
            self.batch.assign(0)

    def cycle(self, dataset: tf.data.Dataset) -> Iterator[Any]:
        """Batches of `dataset`, epoch after epoch, forever, counting the position."""
        for iterator in self.epochs(dataset):
            for batch in iterator:
                self.advance(1)
                yield batch


class StreamPosition(tf.Module):
    """How many batches a per-head stream (`fit(data={head: ...})`) has drawn from its
    dataset repeated forever, as a variable a checkpoint saves.

    A resumed stream is the dataset, built anew, repeated and fast-forwarded by that
    count. Each repetition of a shuffled dataset draws the next reshuffle seed of that
    dataset object, so a fresh dataset replays the original run's epochs exactly (for
    any dataset that is deterministic given its seeds, as `as_dataset`'s is).
    """

    def __init__(self) -> None:
        super().__init__(name="stream_position")
        self.drawn = tf.Variable(0, dtype=tf.int64, trainable=False, name="drawn")
        self._resume = False

    @property
    def restored(self) -> bool:
        """Whether a restore moved the position since the stream was last started."""
        return self._resume

    def mark_restored(self) -> None:
        """The next `stream` continues from the (restored) position instead of restarting."""
        self._resume = True

    def stream(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        """`dataset` repeated forever, from the restored position (else from its start).
        Whoever takes batches from it calls `advance`."""
        if not self._resume:
            self.drawn.assign(0)
        self._resume = False
        return dataset.repeat().skip(int(self.drawn.numpy())).prefetch(tf.data.AUTOTUNE)

    def advance(self, batches: int) -> None:
        """Counts `batches` more batches drawn."""
        self.drawn.assign_add(batches, read_value=False)


def _leaves(tree: Any, what: str) -> list[tuple[str, Any]]:
    """(name, leaf) of an array tree: `what`, or `what['key']` for a dict's entries."""
    if isinstance(tree, Mapping):
        return [pair for key, value in tree.items() for pair in _leaves(value, f"{what}[{key!r}]")]
    if isinstance(tree, (tuple, list)) and tree and not np.isscalar(tree[0]):
        return [pair for i, value in enumerate(tree) for pair in _leaves(value, f"{what}[{i}]")]
    return [(what, tree)]


def check_array_data(tree: Any, what: str) -> None:
    """Array data (or `tf.TensorSpec`s) as a step takes it: real numbers, and for arrays at
    least one row.

    Args:
        tree: an array, a tensor or spec, or a dict/tuple of them.
        what: the argument the messages name, e.g. `fit(x=...)`.

    Raises:
        TypeError: a complex array (the model computes in real numbers: the imaginary part
            would be dropped without a word).
        ValueError: an array with 0 rows.
    """
    for name, leaf in _leaves(tree, what):
        dtype = getattr(leaf, "dtype", None)
        if dtype is None:
            continue
        if isinstance(dtype, tf.dtypes.DType):
            complex_ = dtype.is_complex
        else:
            complex_ = np.issubdtype(np.dtype(dtype), np.complexfloating)
        if complex_:
            raise TypeError(f"{name}: complex values ({getattr(dtype, 'name', dtype)}) are not "
                            "supported: the model computes in real numbers and would drop the "
                            "imaginary part; give real features, e.g. np.real(x) and np.imag(x) "
                            "as two columns")
        shape = getattr(leaf, "shape", None)
        if not isinstance(leaf, tf.TensorSpec) and shape is not None and len(shape) > 0 \
                and shape[0] == 0:
            raise ValueError(f"{name}: 0 rows (shape {tuple(shape)}); give at least one example")


def as_dataset(data: Any, batch_size: int | None = None, shuffle: bool = True,
               seed: int | None = 0) -> tf.data.Dataset:
    """Turns training data into a batched `tf.data.Dataset` of `(inputs, targets)`.

    Args:
        data: a batched `tf.data.Dataset` (returned as is), or a tuple
            `(inputs, targets)` of arrays where `targets` is a dict
            head -> labels.
        batch_size: batch size for array data (required for it).
        shuffle: reshuffle array data every epoch.
        seed: shuffle seed, so runs are reproducible.
    """
    if isinstance(data, tf.data.Dataset):
        return data
    if not (isinstance(data, (tuple, list)) and len(data) in (2, 3)):
        raise TypeError(
            "data must be a tf.data.Dataset or a tuple (inputs, targets) of arrays (or "
            f"(inputs, targets, sample_weight)), got {type(data).__name__}"
        )
    batch_size = check_int(batch_size, "batch_size", minimum=1, hint="array data needs a batch size")
    for part, what in zip(data, ("data inputs", "data labels", "data sample weights")):
        check_array_data(part, what)
    lengths = {len(a) for a in tf.nest.flatten(tuple(data))}
    if len(lengths) != 1:
        raise ValueError(f"inputs and targets have different numbers of examples: {sorted(lengths)}")
    n = lengths.pop()
    arrays = tf.nest.map_structure(tf.convert_to_tensor, tuple(data))
    # One permutation per epoch, then each batch is a slice of it gathered in one op.
    # Per-example tf.data work (slicing examples, or a shuffle buffer of indices)
    # costs per example, a large share of a small model's step; one gather per batch does not.
    if shuffle:
        # A new seed each time the dataset is iterated (each epoch), the same
        # sequence of seeds for the same `seed`: reproducible, and `DataPosition`
        # replays an epoch's order by starting (and dropping) earlier iterators.
        seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).take(1)
        orders = seeds.map(lambda s: tf.random.experimental.stateless_shuffle(
            tf.range(n, dtype=tf.int64), seed=tf.stack([s, tf.constant(0, tf.int64)])))
    else:
        orders = tf.data.Dataset.from_tensors(tf.range(n, dtype=tf.int64))
    batches = -(-n // batch_size)

    def epoch(order: tf.Tensor) -> tf.data.Dataset:
        def gather(i: tf.Tensor) -> Any:
            idx = order[i * batch_size:tf.minimum((i + 1) * batch_size, n)]
            return tf.nest.map_structure(lambda a: tf.gather(a, idx), arrays)
        return tf.data.Dataset.range(batches).map(gather)

    # The known length lets `fit` run epochs as one repeated stream (`DataPosition.repeated`).
    ds = orders.flat_map(epoch).apply(tf.data.experimental.assert_cardinality(batches))
    return ds.prefetch(tf.data.AUTOTUNE)
