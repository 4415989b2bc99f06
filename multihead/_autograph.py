"""User code inside the compiled step, converted by autograph as `tf.function` converts it.

The step's own code branches in Python only on Python values: it is traced as plain Python,
autograph off. Transpiling it was most of a first step's time (86% of a PPO trainer's first
step, 9.3 s of a 10.8 s trace; docs/performance.md). The user code that runs inside the step
(a research loss, a weight or trunk_scale schedule, a `combine`, an aggregation method or a
loss weighting) may still branch in Python on tensors, as in any `tf.function`: `converted(fn)`
calls `fn` as autograph-converted code calls a function, by autograph's own rules (a function
of TensorFlow or Keras, or one marked `do_not_convert`, runs as it is).
"""

from __future__ import annotations

from typing import Any, Callable

import tensorflow as tf


def converted(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn`, called as code converted by autograph would call it (see the module docstring)."""
    return tf.autograph.to_graph(lambda *args, **kwargs: fn(*args, **kwargs))


def plain(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` traced as plain Python: autograph leaves it and everything it calls alone."""
    return tf.autograph.experimental.do_not_convert(fn)
