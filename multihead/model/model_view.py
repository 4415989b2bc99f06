"""`HeadsModel`: what the training engine reads of a `multihead.MultiHeadModel`.

The engine (`trainer`, `step`, `streams`, `evaluation`, `labels`, `addresses`) names
the model by this protocol instead of importing `multihead.model.network`: the model
offers Keras' `compile` / `fit` through the engine (`multihead.training.keras_fit`), so the
model sits above the engine, as a Keras `Model` sits above its `Trainer`.
"""

from __future__ import annotations

from typing import Any, Iterable, Protocol, runtime_checkable

import keras


@runtime_checkable
class HeadsModel(Protocol):
    """A shared trunk feeding named heads, with its variables partitioned per head.

    `isinstance(model, HeadsModel)` checks the members below. Once built, the model
    also has `trunk_variables` (a property that raises before, so it is left out of
    the check).
    """

    trunk: keras.layers.Layer
    heads: dict[str, keras.layers.Layer]

    @property
    def head_names(self) -> tuple[str, ...]: ...

    @property
    def routes_heads(self) -> bool: ...

    def var_list(self, head: str, trains_trunk: bool = True) -> list[keras.Variable]: ...

    def features(self, inputs: Any, training: bool | None = None) -> Any: ...

    def head_output(self, head: str, features: Any, training: bool | None = None) -> Any: ...

    def stop_shared(self, features: Any) -> Any: ...

    def trunk_losses(self) -> tuple[list[Any], dict[str, list[Any]]]: ...

    def check_heads(self, names: Iterable[str], what: str) -> None: ...
