"""Trunk taps: heads (and objectives) that read an intermediate block of the trunk.

A trunk built from named blocks is a `keras.Sequential`: its layers are the blocks,
named by their layer names, or by their index (`0`, `1`, ...: the index of
`multihead.variable_addresses`' `trunk/<index>/...`). A tap is `trunk/<block>`: the
output of that block. `MultiHeadModel(..., taps={"aux": "conv1"})` makes head `aux`
read block `conv1`'s output instead of the trunk's; its var_list then holds only the
trunk variables that output depends on, the variables of the blocks up to and
including `conv1`, found by object identity from the block layers (never by name).

With taps, the trunk runs block by block and `MultiHeadModel.features` returns a
`TrunkOutputs`: `"trunk"` -> the trunk's output, `"trunk/<index>"` -> a tapped
block's output; each head reads its entry (`head_input`).

Example:
    >>> import keras, multihead as mh
    >>> trunk = keras.Sequential([keras.layers.Dense(8, name="block1"),
    ...                           keras.layers.Dense(8, name="block2")])
    >>> model = mh.MultiHeadModel(trunk, {"main": keras.layers.Dense(1),
    ...                                   "aux": keras.layers.Dense(1)}, taps={"aux": "block1"})
    >>> model.build((None, 4))
    >>> [v.shape for v in model.var_list("aux")]   # block1's kernel and bias, then aux's
    [(4, 8), (8,), (8, 1), (1,)]
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import keras

from multihead._checks import suggest

#: The address of the trunk's output; a tap is `trunk/<block>`.
TRUNK = "trunk"
_PREFIX = TRUNK + "/"


class TrunkOutputs(dict):
    """The trunk's output and some of its blocks' outputs, by address: `"trunk"` -> the
    trunk's output, `"trunk/<index>"` -> block `<index>`'s output. A dict (so `tf.nest`
    maps over it, as `stop_shared` does) of its own type, so a head knows it reads a tap."""


def built_from_blocks(trunk: keras.layers.Layer) -> bool:
    """Whether `trunk` is built from named blocks (a `keras.Sequential`), so it can be tapped."""
    return isinstance(trunk, keras.Sequential)


def blocks(trunk: keras.layers.Layer) -> list[keras.layers.Layer]:
    """The blocks of `trunk`, in order.

    Raises:
        ValueError: the trunk is not built from blocks.
    """
    if not built_from_blocks(trunk):
        raise ValueError(
            f"trunk taps need a trunk built from named blocks (a keras.Sequential), but the "
            f"trunk is a {type(trunk).__name__}; put its layers in a keras.Sequential")
    return list(trunk.layers)


def block_names(trunk: keras.layers.Layer) -> list[str]:
    """The names of `trunk`'s blocks (their layer names), in order."""
    return [layer.name for layer in blocks(trunk)]


def resolve_block(trunk: keras.layers.Layer, block: Any, where: str) -> int:
    """The index of `block` in `trunk`: a block name, an index, or `"trunk/<name or index>"`.

    Args:
        trunk: the trunk.
        block: what names the block.
        where: how an error names the argument (`taps['aux']`, `model.taps.aux`).

    Raises:
        ValueError: one line naming `where`, for an unknown block, listing the blocks.
    """
    names = block_names(trunk)
    key = block[len(_PREFIX):] if isinstance(block, str) and block.startswith(_PREFIX) else block
    if isinstance(key, int) and not isinstance(key, bool) and 0 <= key < len(names):
        return key
    if isinstance(key, str):
        if key in names:
            return names.index(key)
        if key.isdigit() and int(key) < len(names):
            return int(key)
    raise ValueError(
        f"{where}: the trunk has no block {block!r}{suggest(str(key), names)}; its blocks are "
        f"{names} (or their indices 0..{len(names) - 1})")


def resolve_taps(trunk: keras.layers.Layer, taps: Mapping[str, Any] | None,
                 heads: Sequence[str], where: str = "taps") -> dict[str, int]:
    """Head -> the index of the block it reads, validated.

    Args:
        trunk: the trunk.
        taps: head -> block (name, index or `trunk/<block>`); None or {}: no taps.
        heads: the model's heads.
        where: how errors name `taps`; a head's entry is `<where>[<head>]`, or
            `<where>.<head>` when `where` is a config key path (it contains a dot).

    Raises:
        ValueError: one line naming the entry: a head the model does not have, a trunk
            not built from blocks, a block the trunk does not have.
    """
    if not taps:
        return {}
    if not isinstance(taps, Mapping):
        raise ValueError(f"{where}: expected a dict head -> trunk block, got {taps!r}")
    resolved = {}
    for head, block in taps.items():
        entry = f"{where}.{head}" if "." in where else f"{where}[{head!r}]"
        if head not in heads:
            raise ValueError(f"{entry}: the model has no head {head!r}"
                             f"{suggest(str(head), heads)}; its heads are {list(heads)}")
        if not built_from_blocks(trunk):
            raise ValueError(
                f"{entry}: trunk taps need a trunk built from named blocks (a keras.Sequential), "
                f"but the trunk is a {type(trunk).__name__}")
        resolved[head] = resolve_block(trunk, block, entry)
    return resolved


def tap_key(index: int | None) -> str:
    """The `TrunkOutputs` key of block `index` (None: the trunk's output)."""
    return TRUNK if index is None else f"{_PREFIX}{index}"


def run_blocks(trunk: keras.layers.Layer, inputs: Any, indices: Iterable[int],
               training: bool | None = None) -> TrunkOutputs:
    """Runs `trunk` block by block: its output, and the outputs of blocks `indices`."""
    wanted = set(indices)
    outputs = TrunkOutputs()
    x = inputs
    for i, layer in enumerate(blocks(trunk)):
        x = layer(x, training=training)
        if i in wanted:
            outputs[tap_key(i)] = x
    outputs[TRUNK] = x
    return outputs


def trunk_features(trunk: keras.layers.Layer, inputs: Any, taps: Mapping[str, int],
                   training: bool | None = None, extra: Iterable[int] = ()) -> Any:
    """The trunk output heads read: `trunk(inputs)` without taps, else a `TrunkOutputs`
    holding the trunk's output and the tapped blocks' (those of `taps` and `extra`)."""
    indices = set(taps.values()) | set(extra)
    if not indices:
        return trunk(inputs, training=training)
    return run_blocks(trunk, inputs, indices, training=training)


def tap_output(features: Any, index: int | None, what: str) -> Any:
    """Block `index`'s output (None: the trunk's) in `features` (a `TrunkOutputs`).

    Raises:
        ValueError: `features` was computed without that block.
    """
    if index is None and not isinstance(features, TrunkOutputs):
        return features
    key = tap_key(index)
    if not isinstance(features, TrunkOutputs) or key not in features:
        held = sorted(features) if isinstance(features, TrunkOutputs) else [TRUNK]
        raise ValueError(f"{what}: the features hold {held}, not {key!r}: compute them with "
                         f"model.features(inputs, taps=[{what!r}])")
    return features[key]


def tap_variables(trunk: keras.layers.Layer, index: int,
                  shared: Sequence[keras.Variable]) -> list[keras.Variable]:
    """The variables of `shared` (the trunk's, in the partition's order) that block
    `index`'s output depends on: those of blocks `0..index`, by object identity."""
    below = {id(v) for layer in blocks(trunk)[:index + 1] for v in layer.trainable_variables}
    return [v for v in shared if id(v) in below]


def blocks_trained(trunk: keras.layers.Layer, variables: Iterable[keras.Variable]) -> list[str]:
    """The names of the blocks of `trunk` that own a variable of `variables` (by identity)."""
    ids = {id(v) for v in variables}
    return [layer.name for layer in blocks(trunk)
            if any(id(v) in ids for v in layer.trainable_variables)]


def with_trunk_reads(model: Any, inputs: Any, outputs: Mapping[str, Any],
                     reads: Iterable[str], training: bool | None = None) -> Mapping[str, Any]:
    """`outputs` (head -> output) plus the trunk outputs among `reads`: `"trunk"` and trunk
    taps `"trunk/<block>"`, computed by `model.features` (what an objective reading them
    sees outside the train step: label checks, evaluation); `outputs` itself without any."""
    wanted = sorted({r for r in reads if r == TRUNK or r.startswith(_PREFIX)})
    if not wanted:
        return outputs
    feats = model.features(inputs, training=training, taps=[r for r in wanted if r != TRUNK])
    return {**outputs, **{r: model.tap_output(feats, r) for r in wanted}}


def blocks_table(trunk: keras.layers.Layer,
                 var_lists: Mapping[str, Iterable[keras.Variable]]) -> str | None:
    """A plain-text table of the trunk blocks each var_list trains (`blocks_trained`), one
    row per name; None unless the trunk is built from blocks and some var_list trains
    some of its blocks but not all (every head trains the whole trunk, or none of it).

    Example:
        >>> print(blocks_table(model.trunk, {h: model.var_list(h) for h in model.head_names}))  # doctest: +SKIP
        head  trunk blocks trained
        main  conv1, conv2, conv3
        aux   conv1
    """
    if not built_from_blocks(trunk):
        return None
    with_variables = [layer.name for layer in blocks(trunk) if layer.trainable_variables]
    trained = {name: blocks_trained(trunk, variables) for name, variables in var_lists.items()}
    if all(len(b) in (0, len(with_variables)) for b in trained.values()):
        return None
    rows = [("head", "trunk blocks trained")]
    rows += [(name, ", ".join(b) or "-") for name, b in trained.items()]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name.ljust(width)}  {b}" for name, b in rows)
