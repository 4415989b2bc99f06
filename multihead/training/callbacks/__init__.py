"""Callbacks: what `Trainer.fit` calls around its compiled steps.

`fit` runs several steps per compiled call. After each call it hands every step's
result to the callbacks, then evaluates if an evaluation is due, then tells the
callbacks the call ended. A callback that needs the model's *state* at certain
steps (to save it, to restore it) sets `every`: calls end at multiples of it, so
`on_call_end(step)` sees the state of those steps. Nothing else forces a call to
end, so callbacks cost nothing per step of the graph.

Step numbers are counts of steps done: `on_step_end(step, result)` gets
`step = result.step + 1`, the same numbering as evaluations and checkpoints.

Example:
    >>> import multihead as mh
    >>> class PrintLoss(mh.Callback):
    ...     def on_step_end(self, step, result):
    ...         if step % 100 == 0:
    ...             print(step, result.losses)

One callback per module; this package re-exports them, so
`from multihead.training.callbacks import EarlyStopping` works.
"""

from multihead.training.callbacks.base import Callback, Metrics, TrainerView
from multihead.training.callbacks.callback_list import CallbackList
from multihead.training.callbacks.early_stopping import EarlyStopping
from multihead.training.callbacks.keras_adapter import KerasCallbackAdapter
from multihead.training.callbacks.lambda_callback import LambdaCallback
from multihead.training.callbacks.monitored import MODES, MonitoredQuantity
from multihead.training.callbacks.nonfinite_guard import NonFiniteGuard
from multihead.training.callbacks.progress import ProgressCallback
from multihead.training.callbacks.reduce_lr_on_plateau import ReduceLROnPlateau
from multihead.training.callbacks.terminate_on_nonfinite import TerminateOnNonFinite

__all__ = [
    'Callback', 'CallbackList', 'EarlyStopping', 'KerasCallbackAdapter', 'LambdaCallback',
    'MODES', 'Metrics', 'MonitoredQuantity', 'NonFiniteGuard', 'ProgressCallback',
    'ReduceLROnPlateau', 'TerminateOnNonFinite', 'TrainerView',
]
