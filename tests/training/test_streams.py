"""The batch streams of `fit` (`multihead.training.streams`): which batches each call takes,
and the checkpointed position after it, against the arithmetic of the data's order."""

import types

import numpy as np
import pytest
import tensorflow as tf

from multihead.datasets.multitask import DataPosition
from multihead.training.streams import DataKey, HeadStreams, Stream
from multihead.training.sampling import as_sampling


class _RecordingStep:
    """Stands for the compiled step: takes up to `steps` batches, records their values."""

    def __init__(self, heads=("a",)):
        self.seen = []
        self.heads = heads
        self.step = 0

    def run(self, iterator, steps, own_batches=False):
        first, count = self.step, 0
        for _ in range(steps):
            batch = next(iterator, None)
            if batch is None:
                break
            inputs = batch[0]
            self.seen.append({h: int(inputs[h][0]) for h in self.heads} if own_batches
                             else int(inputs[0]))
            count += 1
        self.step += count
        zeros = tf.zeros([count, len(self.heads)])
        return types.SimpleNamespace(count=tf.constant(count), first_step=tf.constant(first),
                                     losses=zeros, updated=zeros, skipped=zeros)


def _dataset(n, known_length=True):
    """`n` batches of one example: inputs 0..n-1, in order."""
    data = tf.data.Dataset.range(n).map(lambda i: (tf.reshape(i, [1]), {"a": tf.reshape(i, [1])}))
    if not known_length:  # a filter hides the cardinality from TF
        data = data.filter(lambda x, y: True)
    return data


def _position(position):
    return int(position.epoch.numpy()), int(position.batch.numpy())


def test_a_stream_of_known_length_continues_across_epochs():
    step, position = _RecordingStep(), DataPosition()
    stream = Stream("key", step, position, _dataset(5), per_epoch=5)
    runs = [stream.run(3), stream.run(4), stream.run(5)]
    assert [r.count for r in runs] == [3, 4, 5] and [r.first for r in runs] == [0, 3, 7]
    assert step.seen == [i % 5 for i in range(12)]  # 12 batches of a 5-batch epoch
    assert _position(position) == divmod(12, 5)      # (epoch 2, batch 2)


def test_a_stream_of_unknown_length_ends_each_epoch_with_an_empty_call():
    step, position = _RecordingStep(), DataPosition()
    stream = Stream("key", step, position, _dataset(5, known_length=False), per_epoch=None)
    counts = [stream.run(3).count for _ in range(4)]
    assert counts == [3, 2, 0, 3]                    # the third call meets the end of epoch 0
    assert step.seen == [0, 1, 2, 3, 4, 0, 1, 2]
    assert _position(position) == (1, 3)


def test_a_restored_position_starts_a_new_stream_where_it_stopped():
    position = DataPosition()
    Stream("key", _RecordingStep(), position, _dataset(5), per_epoch=5).run(7)
    position.mark_restored()
    step = _RecordingStep()
    Stream("key", step, position, _dataset(5), per_epoch=5).run(4)
    assert step.seen == [2, 3, 4, 0]                 # batches 7..10 of the repeated data
    assert _position(position) == divmod(11, 5)


def test_an_empty_dataset_is_an_error():
    stream = Stream("key", _RecordingStep(), DataPosition(), _dataset(0, known_length=False),
                    per_epoch=None)
    with pytest.raises(ValueError, match="yielded no batch"):
        stream.run(2)


def test_per_head_streams_advance_each_head_on_its_own_cycle():
    position = DataPosition(heads=["a", "b"])
    datasets = {"a": _dataset(3).map(lambda x, y: (x, y["a"])),
                "b": _dataset(4).map(lambda x, y: (x, y["a"]))}
    step = _RecordingStep(heads=("a", "b"))
    streams = HeadStreams("key", step, position.heads, datasets, as_sampling("all", 0), None,
                          tf.Variable(0, dtype=tf.int64))
    assert streams.run(5).count == 5 and streams.run(2).count == 2
    assert step.seen == [{"a": i % 3, "b": i % 4} for i in range(7)]
    for head in ("a", "b"):
        assert int(position.heads[head].drawn.numpy()) == 7


def test_a_data_key_is_the_same_objects_with_the_same_settings():
    x, y = np.zeros((4, 2)), {"a": np.zeros((4, 1))}
    assert DataKey((x, y), 2, 0) == DataKey((x, y), 2, 0)
    assert DataKey((x, y), 2, 0) != DataKey((x.copy(), y), 2, 0)   # equal values, other array
    assert DataKey((x, y), 2, 0) != DataKey((x, y), 4, 0)
    assert DataKey((x, y), 2, 0) != DataKey((x, y), 2, 1)
    data = _dataset(3)
    assert DataKey(data, None, 0) == DataKey(data, None, 0) != DataKey(_dataset(3), None, 0)
