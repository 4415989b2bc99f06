"""The batches `Trainer.fit` and `evaluate` take from the user's data.

`DataFeed` turns data (a dataset, arrays, or a dict head -> that head's data) into
checked datasets of `(inputs, {head: labels})` and, for `fit`, into a stream that
continues where the last `fit` on the same data stopped: `Stream` for one dataset,
`HeadStreams` for a dataset per head. Their positions are checkpointed variables
(`DataPosition`), so a resumed run sees the same batches.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Mapping, NamedTuple, Sequence

import numpy as np
import tensorflow as tf

from multihead._checks import check_int
from multihead.datasets.multitask import DataPosition, StreamPosition, as_dataset, check_array_data
from multihead.model.input_shape import check_input_width
from multihead.objectives.labels import LabelCheck
from multihead.model.model_view import HeadsModel
from multihead.objectives.objective import with_sample_weights
from multihead.settings import PYTHON, check_rep_grad_data
from multihead.training.sampling import TaskSampling, as_sampling
from multihead.step.train_step import TrainStep


def zeros_for_spec(spec: tf.TensorSpec) -> tf.Tensor:
    """A one-example zero batch for a tensor spec (unknown dimensions become 1)."""
    return tf.zeros([1 if d is None else d for d in spec.shape], spec.dtype)


def is_empty(dataset: tf.data.Dataset) -> bool:
    """Whether `dataset` yields nothing: from its cardinality when TF knows it (no pipeline
    start), else by taking one element."""
    known = int(dataset.cardinality())
    if known != int(tf.data.UNKNOWN_CARDINALITY):
        return known == 0
    return next(iter(dataset.take(1)), None) is None


def batches_per_epoch(data: Any, batch_size: int | None) -> int:
    """The steps of one epoch of `fit`'s `data`: the batches of one pass over it, or for a
    dict head -> data, of one pass over the largest head's data (the head with the most
    batches; the smaller heads' data cycles meanwhile).

    Raises:
        ValueError: a dataset's length is unknown (e.g. after `filter`) or infinite
            (`repeat()`), or it yields no batch; the message names the data.
    """
    if isinstance(data, Mapping):
        return max(_batches(d, batch_size, f"data[{h!r}]") for h, d in data.items())
    return _batches(data, batch_size, "data")


def _batches(data: Any, batch_size: int | None, what: str) -> int:
    """The batches of one pass over one head's (or every head's) data."""
    if isinstance(data, tf.data.Dataset):
        count = int(data.cardinality())
        if count == int(tf.data.INFINITE_CARDINALITY):
            raise ValueError(f"epochs: {what} repeats forever, so an epoch has no length; give "
                             "steps instead, or drop its repeat()")
        if count == int(tf.data.UNKNOWN_CARDINALITY):
            raise ValueError(f"epochs: the length of {what} is unknown to tf.data (e.g. after "
                             "filter or from a generator); give steps instead, or apply "
                             "tf.data.experimental.assert_cardinality(n)")
    else:
        leaves = tf.nest.flatten(data)
        if not leaves:
            raise ValueError(f"epochs: {what} holds no arrays")
        size = check_int(batch_size, "batch_size", minimum=1, hint="array data needs a batch size")
        count = -(-len(leaves[0]) // size)
    if count == 0:
        raise ValueError(f"epochs: {what} yields no batch; give it some examples")
    return count


class DataKey:
    """Identifies the data of a `fit` call: the same dataset object, or the same array
    objects with the same batch size and seed."""

    def __init__(self, data: Any, batch_size: int | None, seed: int | None) -> None:
        self.leaves = [data] if isinstance(data, tf.data.Dataset) else tf.nest.flatten(data)
        self.settings = (batch_size, seed)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, DataKey) and self.settings == other.settings
                and len(self.leaves) == len(other.leaves)
                and all(a is b for a, b in zip(self.leaves, other.leaves)))


class StepsRun(NamedTuple):
    """What one call of a stream ran: `count` steps from `first`; per step (rows) and head
    (columns) the loss, whether the head updated and whether its update was dropped."""

    first: int
    count: int
    losses: np.ndarray
    updated: np.ndarray
    skipped: np.ndarray


class Stream:
    """The batches `fit` takes from one dataset: the current epoch's iterator and the next
    epochs, run through the compiled step several steps per call."""

    def __init__(self, key: Any, train_step: TrainStep, position: DataPosition,
                 dataset: Any, per_epoch: int | None) -> None:
        self.key = key
        self.train_step = train_step
        self._position = position
        self._epochs: Iterator[Any] | None = None
        if per_epoch:  # a known length: the epochs as one repeated stream
            self._iterator = position.repeated(dataset, per_epoch)
        else:
            self._epochs = position.epochs(dataset)
            self._iterator = next(self._epochs)

    def run(self, steps: int) -> StepsRun:
        """Up to `steps` steps; 0 at the end of an epoch (the next call starts the next)."""
        out = self.train_step.run(self._iterator, steps)
        count = int(out.count)
        if count == 0:
            if self._epochs is None:
                raise ValueError("the training data yielded no batch")
            self._iterator = next(self._epochs)  # raises if an epoch yields no batch
        else:
            self._position.advance(count)
        return StepsRun(int(out.first_step), count, out.losses.numpy(), out.updated.numpy(),
                        out.skipped.numpy())


class HeadStreams:
    """The batches `fit` takes from per-head datasets: each head's own dataset, repeated
    forever, with a checkpointed count of the batches drawn (`StreamPosition`).

    With `sampling="all"` the heads' streams are zipped and run in the compiled loop,
    several steps per call, as one dataset is; a sampled head is drawn per step in
    Python (`TaskSampling.head_at`) and its step is one compiled call.
    """

    def __init__(self, key: Any, train_step: TrainStep, positions: Mapping[str, StreamPosition],
                 datasets: Mapping[str, tf.data.Dataset], sampling: TaskSampling,
                 probabilities: np.ndarray | None, step: tf.Variable) -> None:
        self.key = key
        self.train_step = train_step
        self._positions = {h: positions[h] for h in datasets}
        streams = {h: positions[h].stream(ds) for h, ds in datasets.items()}
        self._probabilities = probabilities
        self._sampling = sampling
        self._step = step
        if probabilities is None:
            zipped = tf.data.Dataset.zip(streams).map(
                lambda batches: ({h: b[0] for h, b in batches.items()},
                                 {h: b[1] for h, b in batches.items()}))
            self._zipped = iter(zipped)
        else:
            self._iterators = {h: iter(stream) for h, stream in streams.items()}

    def run(self, steps: int) -> StepsRun:
        """`steps` steps."""
        if self._probabilities is None:
            out = self.train_step.run(self._zipped, steps, own_batches=True)
            count = int(out.count)  # the streams never end (each was checked to have a batch)
            for position in self._positions.values():
                position.advance(count)
            return StepsRun(int(out.first_step), count, out.losses.numpy(), out.updated.numpy(),
                            out.skipped.numpy())
        first = int(self._step.numpy())
        heads = list(self._iterators)
        outputs = []
        for step in range(first, first + steps):
            head = heads[self._sampling.head_at(step, self._probabilities)]
            inputs, targets = next(self._iterators[head])
            self._positions[head].advance(1)
            outputs.append(self.train_step(inputs, targets, heads=(head,)))
        return StepsRun(first, steps, *(np.stack([getattr(o, f).numpy() for o in outputs])
                                        for f in ("losses", "updated", "skipped")))


class DataFeed:
    """Checked datasets and streams of the user's data for one trainer.

    Args:
        model: the trained model.
        names: the objectives' names, in order (per-head data is keyed by them).
        labels: the trainer's label check.
        ensure_built: builds the model and train step from a zero batch of inputs
            (if not built yet) and returns the train step.
        position: the trainer's checkpointed data position.
        step: the trainer's step counter (sampled heads are drawn from it).
        strategy: the `tf.distribute` strategy, or None.
        rep_grad: whether the trunk combines gradients at its output (needs one batch).
    """

    def __init__(self, model: HeadsModel, names: Sequence[str], labels: LabelCheck,
                 ensure_built: Callable[[Any], TrainStep], position: DataPosition,
                 step: tf.Variable, strategy: tf.distribute.Strategy | None,
                 rep_grad: bool) -> None:
        self._model = model
        self._names = tuple(names)
        self._labels = labels
        self._ensure_built = ensure_built
        self._position = position
        self._step = step
        self._strategy = strategy
        self._rep_grad = rep_grad
        self._last: Stream | HeadStreams | None = None

    def stream(self, data: Any, batch_size: int | None, seed: int | None,
               sampling: str | TaskSampling | Mapping[str, Any]) -> Stream | HeadStreams:
        """The batch stream of `data`: the last `fit`'s, continued, when `data` is the
        same data (and no checkpoint moved the position since); a new one otherwise."""
        per_head = isinstance(data, Mapping)
        sampling = as_sampling(sampling, seed)
        if per_head:
            key: Any = (tuple((h, DataKey(d, batch_size, seed)) for h, d in data.items()), sampling)
        else:
            if sampling.kind != "all":
                raise ValueError(f"sampling={sampling.kind!r} draws one head's dataset per step: "
                                 "give data as a dict head -> that head's data")
            key = DataKey(data, batch_size, seed)
        if self._last is not None and self._last.key == key and not self._position.restored:
            return self._last
        self._last = None
        if per_head:
            self._last = self._head_streams(key, data, batch_size, seed, sampling)
            return self._last
        dataset = self.labelled(as_dataset(data, batch_size, shuffle=True, seed=seed))
        inputs_spec, targets_spec = dataset.element_spec
        self.check_inputs(inputs_spec, "data")
        zeros = tf.nest.map_structure(zeros_for_spec, inputs_spec)
        train_step = self._ensure_built(zeros)
        self._labels(targets_spec, None, zeros)
        per_epoch = int(dataset.cardinality())
        if self._strategy is not None:  # each global batch is split across the replicas
            dataset = self._strategy.experimental_distribute_dataset(dataset)
            per_epoch = 0
        self._last = Stream(key, train_step, self._position, dataset,
                            per_epoch if per_epoch > 0 else None)
        return self._last

    def release(self) -> None:
        """Drops the last `fit`'s stream now, so its iterators and their threads end here
        and not at some later garbage collection (with a strategy, an iterator collected
        while a function traces can stall it for minutes: docs/distributed.md). The next
        `fit` continues from the position, as after a restore."""
        if self._last is not None:
            self._last = None
            self._position.mark_restored()

    def _head_streams(self, key: Any, data: Mapping[str, Any], batch_size: int | None,
                      seed: int | None, sampling: TaskSampling) -> HeadStreams:
        """Per-head streams: each head's data shuffled with its own seed (`seed` + the
        head's index), checked against that head alone."""
        self.check_head_data(data, "data")
        if self._strategy is not None:
            raise ValueError("per-head datasets are not supported with a strategy yet; give one "
                             "dataset of (inputs, {head: labels}), or train on one device")
        check_rep_grad_data(self._rep_grad, per_head_data=True, spell=PYTHON)
        datasets, sizes = {}, {}
        for i, head in enumerate(self._names):
            head_seed = None if seed is None else seed + i
            datasets[head] = self.head_dataset(head, data[head], batch_size, True, head_seed)
            if is_empty(datasets[head]):
                raise ValueError(f"data[{head!r}] yields no batch; give that head some examples")
            leaves = [] if isinstance(data[head], tf.data.Dataset) else tf.nest.flatten(data[head])
            sizes[head] = len(leaves[0]) if leaves else None
        probabilities = sampling.probabilities(list(datasets), sizes) if sampling.samples else None
        train_step = self._ensure_built(None)  # built by head_dataset above: no inputs needed
        streams = HeadStreams(key, train_step, self._position.heads, datasets, sampling,
                              probabilities, self._step)
        self._position.clear_restored()  # the per-head positions carry the resume
        return streams

    def check_head_data(self, data: Mapping[str, Any], what: str) -> None:
        """Every key of `data` is an objective, and every objective has data."""
        unknown = [k for k in data if k not in self._names]
        if unknown:
            raise ValueError(f"{what} names head {unknown[0]!r}, but the model's heads are "
                             f"{list(self._names)}")
        missing = [h for h in self._names if h not in data]
        if missing:
            raise ValueError(f"{what}: head {missing[0]!r} has no dataset; with per-head data "
                             f"every head needs its own (given: {sorted(data)})")

    def head_dataset(self, head: str, data: Any, batch_size: int | None, shuffle: bool,
                     seed: int | None) -> tf.data.Dataset:
        """Head `head`'s own data as batches `(inputs, {head: labels})`, checked."""
        dataset = as_dataset(data, batch_size, shuffle=shuffle, seed=seed)
        spec = dataset.element_spec
        if not (isinstance(spec, tuple) and len(spec) == 2):
            raise TypeError(f"data[{head!r}] must yield pairs (inputs, labels); its elements "
                            f"are {spec}")
        if isinstance(spec[1], Mapping):
            if head not in spec[1]:
                raise ValueError(f"data[{head!r}] has no labels for head {head!r} (its target "
                                 f"keys are {sorted(spec[1])})")
            dataset = dataset.map(lambda x, y: (x, {head: y[head]}))
        else:
            dataset = dataset.map(lambda x, y: (x, {head: y}))
        inputs_spec, targets_spec = dataset.element_spec
        self.check_inputs(inputs_spec, f"data[{head!r}]")
        zeros = tf.nest.map_structure(zeros_for_spec, inputs_spec)
        self._ensure_built(zeros)
        self._labels(targets_spec, (head,), zeros)
        return dataset

    def eval_dataset(self, data: Any, batch_size: int | None) -> tf.data.Dataset:
        """`data` (one dataset or arrays for every head) as checked evaluation batches."""
        dataset = self.labelled(as_dataset(data, batch_size or 1024, shuffle=False))
        inputs_spec, targets_spec = dataset.element_spec
        self.check_inputs(inputs_spec, "data")
        zeros = tf.nest.map_structure(zeros_for_spec, inputs_spec)
        self._ensure_built(zeros)
        self._labels(targets_spec, None, zeros)
        return dataset

    def check_inputs(self, inputs_spec: Any, what: str) -> None:
        """The inputs' dtypes (real) and width (the model's, once built), before any trace."""
        check_array_data(inputs_spec, f"{what} inputs")
        check_input_width(self._model, inputs_spec, f"{what} inputs")

    def labelled(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        """A single-head dataset with bare labels becomes `(inputs, {head: labels})`;
        triples `(inputs, targets, sample_weight)` become pairs whose weighted heads' labels
        are `Weighted` (see `multihead.objectives.objective.with_sample_weights`)."""
        spec = dataset.element_spec
        if not (isinstance(spec, tuple) and len(spec) in (2, 3)):
            raise TypeError(
                "the training data must yield pairs (inputs, targets) with targets a dict "
                "head -> labels, or triples (inputs, targets, sample_weight); its elements "
                f"are {spec}"
            )
        as_dict = self._labels.as_dict
        if len(spec) == 3:
            with_sample_weights(as_dict(spec[1]), as_dict(spec[2]))  # checked here, once
            return dataset.map(lambda x, y, w: (x, with_sample_weights(as_dict(y), as_dict(w))))
        heads = self._names
        if not isinstance(spec[1], Mapping) and len(heads) == 1:
            head = heads[0]
            return dataset.map(lambda x, y: (x, {head: y}))
        return dataset
