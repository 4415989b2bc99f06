"""The public `MultiHeadModel`: the network (`multihead.model.network`) with Keras'
`compile` / `fit` / `evaluate` through multihead's per-head step (`multihead.training.keras_fit`).

The network lives below the step and the loop; this class sits above them, as a Keras
`Model` sits above its `Trainer`.
"""

from __future__ import annotations

import keras

from multihead.model.network import MultiHeadNetwork
from multihead.training.keras_fit import KerasTraining

__all__ = ["MultiHeadModel"]


@keras.saving.register_keras_serializable(package="multihead")
class MultiHeadModel(KerasTraining, MultiHeadNetwork):
    """A shared trunk feeding several named heads.

    Calling the model returns `{head_name: output}`. Each head sees the trunk's
    output. The trainable variables are partitioned, by object identity, into the
    trunk's and each head's; `var_list(name)` is what head `name`'s optimizer is
    built on.

    A trunk may route heads (MMoE, PLE, MTAN, ...; see `multihead.model.architectures`):
    it returns `{head: features}`, each head reads its own entry, and the layers the
    trunk declares in `head_owned_layers()` (a head's gate, attention module or
    column) belong to that head's part: `var_list(name)` is the shared trunk variables
    plus the head layer's plus those.

    Heads may read an intermediate block of a trunk built from named blocks (a
    `keras.Sequential`): `taps={"aux": "block1"}` makes head `aux` read block `block1`'s
    output, and its var_list holds only the trunk variables of the blocks up to and
    including `block1` (see `multihead.model.taps`, `tap_variables`, `tap_output`).

    Example:
        >>> import keras, multihead as mh
        >>> model = mh.MultiHeadModel(
        ...     trunk=keras.Sequential([keras.layers.Dense(8, activation="relu")]),
        ...     heads={"y1": keras.layers.Dense(1), "y2": keras.layers.Dense(1)},
        ... )
        >>> model.build((None, 4))
        >>> [v.shape for v in model.var_list("y1")]
        [(4, 8), (8,), (8, 1), (1,)]

    `model.save("m.keras")` and `keras.models.load_model("m.keras")` round-trip the model
    (trunk, heads and weights) through Keras' own serialization.

    `model.compile(optimizer={head: ...}, loss={head: ...})` then `model.fit(x, y)` train
    with the per-head step of `multihead.Trainer` (see `multihead.training.keras_fit`).

    Args:
        trunk: any Keras layer or model; its output is every head's input.
        heads: head name -> Keras layer or model. Names start with a letter and
            contain letters, digits, `_` or `-` (they become TensorBoard tags and
            checkpoint keys). A head whose layer has the name Keras made up for it
            (`sequential_1`) is renamed to its head name, and such a trunk to `trunk`,
            so `model.summary()` shows the parts by name; names you gave are kept.
        name: Keras name of the model.
        taps: head -> the trunk block it reads (a block's layer name, its index, or
            `"trunk/<block>"`); the trunk must be a `keras.Sequential`. Heads not
            named read the trunk's output.
        preprocess: a Keras layer applied to the inputs before the trunk, without
            variables (its constants travel in its config, so `.keras` files and exports
            apply it), e.g. `multihead.model.standardize.Standardize(mean, scale)`, what
            `data.normalize` builds.

    Raises:
        ValueError: one line naming the tap, for a head the model does not have, a trunk
            not built from blocks, or a block the trunk does not have.
    """
