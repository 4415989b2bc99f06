"""`StepStats`: what a step measures inside its conditionals leaves them as outputs, present
only where the branch taken measured it."""

import numpy as np
import pytest
import tensorflow as tf

from multihead.monitoring.step_stats import StepStats, present_entries


def _measured(pred_value: bool, index_value: int) -> tuple[dict, dict]:
    @tf.function(autograph=False)
    def step(pred, index):
        stats = StepStats(tf.constant(1, tf.int64), tf.constant(True))
        stats.record("before", 1.0)

        def taken():
            stats.record("inner", 2.0)
            stats.keep(("grad", "a"), tf.constant([3.0, 4.0]))
            return tf.constant(10.0)

        out = stats.cond(pred, taken, lambda: tf.constant(20.0))
        # a later measurement reads what the branch kept, present only when it was taken
        grad, present = stats.get(("grad", "a"))
        stats.record("norm", tf.norm(grad), present)
        stats.switch_case(index, [lambda i=i: stats.record("case", float(i)) for i in range(3)])
        stats.gated(tf.logical_not(pred), lambda: stats.record("gated", 5.0))
        return out, stats.outputs()

    out, outputs = step(tf.constant(pred_value), tf.constant(index_value))
    scalars, _ = present_entries(outputs)
    return float(out), {tag: float(outputs.scalars[i]) for i, tag in scalars.items()}


def test_entries_measured_in_a_branch_leave_it_present_only_when_taken():
    out, taken = _measured(True, 2)
    assert out == 10.0
    assert taken == {"before": 1.0, "inner": 2.0, "norm": 5.0, "case": 2.0}
    out, other = _measured(False, 0)
    assert out == 20.0
    assert other == {"before": 1.0, "case": 0.0, "gated": 5.0}


def test_a_branch_that_records_what_the_first_did_not_is_refused():
    @tf.function(autograph=False)
    def step(index):
        stats = StepStats(tf.constant(1, tf.int64), tf.constant(True))
        stats.switch_case(index, [lambda: stats.record("a", 1.0), lambda: stats.record("b", 1.0)])
        return stats.outputs()

    with pytest.raises(RuntimeError, match=r"a branch recorded \['b'\] that the first branch did not"):
        step(tf.constant(0))


def test_histograms_are_returned_apart_from_scalars():
    @tf.function(autograph=False)
    def step():
        stats = StepStats(tf.constant(1, tf.int64), tf.constant(True))
        stats.record("h", tf.ones([30, 3], tf.float64), histogram=True)
        stats.record("s", 1.0)
        stats.record("s_absent", 2.0, present=False)
        return stats.outputs()

    outputs = step()
    assert present_entries(outputs) == ({0: "s"}, {0: "h"})
    np.testing.assert_array_equal(outputs.histograms[0], np.ones([30, 3]))
