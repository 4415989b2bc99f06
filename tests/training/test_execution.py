"""`ExecutionSize`: how many steps one compiled call of `fit` runs."""

from multihead.training.execution import ExecutionSize


def test_auto_steps_per_execution_sizes_calls_to_about_50_ms():
    size = ExecutionSize("auto")
    assert size.next == 1  # the first call traces: one step
    size.observe(1, 2.0)  # the trace took 2 s
    assert size.next == 1
    size.observe(1, 0.002)  # 2 ms per step -> 0.05 / 0.002 = 25 steps
    assert size.next == 25
    size.observe(25, 0.025)  # 1 ms per step -> 50
    assert size.next == 50
    size.observe(50, 1e-5)  # faster than the cap allows
    assert size.next == ExecutionSize.MAX_STEPS
    size.observe(3, 30.0)  # a slow model: one step per call
    assert size.next == 1
    size.observe(0, 0.0)  # the end of an epoch, no step: keeps the size
    assert size.next == 1
    fixed = ExecutionSize(7)
    fixed.observe(7, 1e-6)
    assert fixed.next == 7
