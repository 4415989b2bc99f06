"""Multi-task architectures beyond one shared trunk, as Keras layers that route heads.

Each layer here is a trunk for `MultiHeadModel(trunk=..., heads=...)`: it is built
with the model's head names, returns `{head: features}` (each head reads its own
entry) and declares, in `head_owned_layers()`, the layers that belong to one head
(its gate, its task experts, its attention module, its column). The model's
partition puts those into the head's part, so a head's optimizer is built on the
shared variables plus exactly what the head owns (`multihead.model.partition`).

| layer         | paper                               | owned by a head            | shared            |
|---------------|-------------------------------------|----------------------------|-------------------|
| `MMoE`        | Ma et al., KDD 2018                 | its gate                   | the experts       |
| `OMoE`        | the same paper's one-gate ablation  | nothing                    | experts, the gate |
| `CGC`, `PLE`  | Tang et al., RecSys 2020            | its experts and gates      | shared experts, shared gates |
| `DSelectK`    | Hazimeh et al., NeurIPS 2021        | its gate (k selectors)     | the experts       |
| `CrossStitch` | Misra et al., CVPR 2016             | its column                 | the stitch units  |
| `MTAN`        | Liu et al., CVPR 2019               | its attention modules      | the conv backbone |

Experts are one batched operation: the kernels of all experts of a group are one
`(in, experts, out)` variable and an expert layer is one matmul (or einsum), never a
Python loop over experts. Loops run over heads and levels only.

Every sub-layer takes the layer's dtype policy (`dtype=keras.DTypePolicy("mixed_float16")`
or `"mixed_bfloat16"`): variables stay float32, the computation runs in the policy's
compute dtype.

Gated layers also expose `gate_weights(inputs)`, `{head: (batch, experts)}`, the
mixture weights each head's features are made of (read by the monitor: expert
utilisation per head).

Example:
    >>> import keras, numpy as np, multihead as mh
    >>> trunk = mh.MMoE(heads=["a", "b"], experts=4, expert_units=[8])
    >>> model = mh.MultiHeadModel(trunk, {"a": keras.layers.Dense(1), "b": keras.layers.Dense(1)})
    >>> model.build((None, 3))
    >>> len(model.var_list("a")) - len(model.trunk_variables)   # a's tower (2) + a's gate (1)
    3
"""

from __future__ import annotations

import inspect
import math
from typing import Any, Mapping, Sequence

import keras
import numpy as np
import tensorflow as tf

from multihead import _keras_internals as internals
from multihead._checks import check_float, check_int
from multihead.model.dselect import DSelectGate


def _check_heads(heads: Sequence[str], where: str) -> tuple[str, ...]:
    if isinstance(heads, str) or not heads or not all(isinstance(h, str) for h in heads):
        raise ValueError(f"{where}: heads must be a non-empty list of head names, got {heads!r}")
    if len(set(heads)) != len(heads):
        raise ValueError(f"{where}: heads {list(heads)} name a head twice")
    return tuple(heads)


def _check_positive(value: Any, what: str) -> int:
    return check_int(value, what, minimum=1)


def _check_units(units: Any, what: str) -> list[int]:
    if isinstance(units, (int, np.integer)) and not isinstance(units, bool):
        units = [units]
    if not isinstance(units, (list, tuple)) or not units:
        raise ValueError(f"{what}: must be a non-empty list of layer widths, got {units!r}")
    return [_check_positive(u, f"{what}[{i}]") for i, u in enumerate(units)]


def _check_bool(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{what}: expected true or false, got {value!r}")
    return value


@keras.saving.register_keras_serializable(package="multihead")
class StackedDense(keras.layers.Layer):
    """`n` independent Dense layers applied as one batched op over stacked kernels.

    The kernel is `(in, n, units)`, expert i's kernel `kernel[:, i]`.

    Input `(batch, in)` (every expert reads the same input) or `(batch, n, in)`
    (expert i reads row i); output `(batch, n, units)`.

    Args:
        n: number of stacked layers (experts).
        units: output width of each.
        activation: Keras activation applied to each output.
    """

    def __init__(self, n: int, units: int, activation: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.n = _check_positive(n, "StackedDense.n")
        self.units = _check_positive(units, "StackedDense.units")
        self.activation = keras.activations.get(activation)

    def build(self, input_shape: Any) -> None:
        fan_in = int(input_shape[-1])
        # Glorot-uniform per expert: Keras' initializers would count the stack in the fans.
        limit = math.sqrt(6.0 / (fan_in + self.units))
        # (in, n, units): with a shared input, the n layers are one (in, n * units) matmul.
        self.kernel = self.add_weight(shape=(fan_in, self.n, self.units), name="kernel",
                                      initializer=keras.initializers.RandomUniform(-limit, limit))
        self.bias = self.add_weight(shape=(self.n, self.units), name="bias", initializer="zeros")

    def call(self, inputs: Any) -> Any:
        width = self.n * self.units
        if len(inputs.shape) == 2:
            # One plain matmul: no transpose of the kernel (the equivalent einsum makes one).
            flat = tf.matmul(inputs, tf.reshape(self.kernel, [-1, width]))
        else:
            flat = tf.reshape(tf.einsum("bei,ieu->beu", inputs, self.kernel), [-1, width])
        # The bias on the flat (batch, n * units) outputs: its gradient is then one
        # BiasAddGrad, not a reduction over the batch axis of a 3-d tensor. The activation
        # on (batch, n, units): one that reads an axis (softmax) sees each expert's units.
        out = tf.nn.bias_add(flat, tf.reshape(self.bias, [width]))
        return self.activation(tf.reshape(out, [-1, self.n, self.units]))

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "n": self.n, "units": self.units,
                "activation": keras.activations.serialize(self.activation)}


@keras.saving.register_keras_serializable(package="multihead")
class Experts(internals.CheckpointedLists, keras.layers.Layer):
    """`n` expert MLPs with the same widths, as one stack of `StackedDense` layers.

    Input `(batch, in)`; output `(batch, n, units[-1])`.
    """

    def __init__(self, n: int, units: Sequence[int], activation: Any = "relu", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.n = _check_positive(n, "Experts.n")
        self.units = _check_units(units, "Experts.units")
        self.activation = activation
        self.stack = [StackedDense(self.n, u, activation, dtype=self.dtype_policy) for u in self.units]

    def call(self, inputs: Any) -> Any:
        out = inputs
        for layer in self.stack:
            out = layer(out)
        return out

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "n": self.n, "units": self.units,
                "activation": self.activation}


def _mix(gate: Any, experts: Any) -> Any:
    """`sum_i gate[:, i] * experts[:, i, :]`, as a batched matmul `(b, 1, n) @ (b, n, u)`: its
    gradients are two batched matmuls, where a broadcast product and sum takes a tile, two
    products and two reductions (measured faster on CPU: docs/architectures.md, Cost)."""
    return tf.squeeze(tf.matmul(gate[:, None, :], experts), axis=1)


class _RoutedTrunk(internals.CheckpointedLists, keras.layers.Layer):
    """Base of the layers here: the head names, and the routing protocol."""

    def __init__(self, heads: Sequence[str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.head_names = _check_heads(heads, type(self).__name__)

    def build(self, input_shape: Any) -> None:
        # The sub-layers' shapes follow from the input's: one pass on zeros creates them
        # (also when Keras rebuilds a deserialized trunk before loading its weights).
        self.call(tf.zeros([1 if d is None else int(d) for d in input_shape]))

    def head_owned_layers(self) -> dict[str, list[keras.layers.Layer]]:
        """Head -> the layers of this trunk that belong to that head alone."""
        raise NotImplementedError

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "heads": list(self.head_names)}


class _Gated(_RoutedTrunk):
    """A trunk whose head features are gate-weighted mixtures of experts."""

    def forward(self, inputs: Any, training: bool | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """`({head: features}, {head: gate weights (batch, experts)})`."""
        raise NotImplementedError

    def call(self, inputs: Any, training: bool | None = None) -> dict[str, Any]:
        return self.forward(inputs, training=training)[0]

    def gate_weights(self, inputs: Any, training: bool | None = None) -> dict[str, Any]:
        """Head -> its gate's mixture weights `(batch, experts)` on `inputs` (PLE: of the
        last level, the head's own experts first, then the shared ones)."""
        return self.forward(inputs, training=training)[1]


@keras.saving.register_keras_serializable(package="multihead")
class MMoE(_Gated):
    """Multi-gate mixture of experts (Ma et al., KDD 2018).

    `f_i(x)` are `experts` shared expert MLPs; head k's features are
    `sum_i g_k(x)_i f_i(x)` with its own gate `g_k(x) = softmax(W_k x)` (no bias, as
    in the paper). The gates are owned by their heads; the experts are shared.

    Args:
        heads: the model's head names.
        experts: number of experts.
        expert_units: widths of each expert MLP's layers.
        expert_activation: activation of the expert layers.
    """

    #: Its key in a config's `model.trunk: {mmoe: {...}}`.
    config_name = "mmoe"

    def __init__(self, heads: Sequence[str], experts: int, expert_units: Sequence[int],
                 expert_activation: Any = "relu", **kwargs: Any) -> None:
        super().__init__(heads, **kwargs)
        self.num_experts = _check_positive(experts, f"{type(self).__name__}.experts")
        self.expert_units = _check_units(expert_units, f"{type(self).__name__}.expert_units")
        self.expert_activation = expert_activation
        self.experts = Experts(self.num_experts, self.expert_units, expert_activation,
                               dtype=self.dtype_policy)
        self.gates = [self._gate() for _ in self._gate_names()]

    def _gate(self) -> keras.layers.Layer:
        """A new gate: `(batch, in) -> (batch, experts)` mixture weights."""
        return keras.layers.Dense(self.num_experts, activation="softmax", use_bias=False,
                                  dtype=self.dtype_policy)

    def _gate_names(self) -> tuple[str, ...]:
        return self.head_names

    def forward(self, inputs: Any, training: bool | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        expert_out = self.experts(inputs)
        gates = {h: gate(inputs, training=training) for h, gate in zip(self.head_names, self.gates)}
        return {h: _mix(g, expert_out) for h, g in gates.items()}, gates

    def head_owned_layers(self) -> dict[str, list[keras.layers.Layer]]:
        return {h: [gate] for h, gate in zip(self.head_names, self.gates)}

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "experts": self.num_experts,
                "expert_units": self.expert_units, "expert_activation": self.expert_activation}


@keras.saving.register_keras_serializable(package="multihead")
class OMoE(MMoE):
    """One-gate mixture of experts, the MMoE paper's ablation: one shared gate, so every
    head reads the same mixture (owned by no head). Arguments as `MMoE`."""

    #: Its key in a config's `model.trunk: {omoe: {...}}`.
    config_name = "omoe"

    def _gate_names(self) -> tuple[str, ...]:
        return ("shared",)

    def forward(self, inputs: Any, training: bool | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        expert_out = self.experts(inputs)
        gate = self.gates[0](inputs)
        mixed = _mix(gate, expert_out)
        return {h: mixed for h in self.head_names}, {h: gate for h in self.head_names}

    def head_owned_layers(self) -> dict[str, list[keras.layers.Layer]]:
        return {h: [] for h in self.head_names}


@keras.saving.register_keras_serializable(package="multihead")
class PLE(_Gated):
    """Progressive layered extraction (Tang et al., RecSys 2020); `levels=1` is CGC.

    At level j, head k has `task_experts` experts of its own reading `x_k^{j-1}`, and
    `shared_experts` shared experts read `x_s^{j-1}` (level 1: all read the input).
    Head k's gate `softmax(W_k^j x_k^{j-1})` mixes its own experts and the shared ones
    into `x_k^j`; below the last level a shared gate `softmax(W_s^j x_s^{j-1})` mixes
    every expert of the level into `x_s^j`. Head k's features are `x_k^L`.

    A head owns its experts and gates at every level; the shared experts and gates
    are shared.

    Args:
        heads: the model's head names.
        shared_experts: shared experts per level.
        task_experts: experts of each head per level.
        expert_units: widths of each expert MLP's layers (every level).
        levels: extraction levels.
        expert_activation: activation of the expert layers.
    """

    #: Its key in a config's `model.trunk: {ple: {...}}`.
    config_name = "ple"

    def __init__(self, heads: Sequence[str], shared_experts: int, task_experts: int,
                 expert_units: Sequence[int], levels: int = 2, expert_activation: Any = "relu",
                 **kwargs: Any) -> None:
        super().__init__(heads, **kwargs)
        name = type(self).__name__
        self.shared_experts = _check_positive(shared_experts, f"{name}.shared_experts")
        self.task_experts = _check_positive(task_experts, f"{name}.task_experts")
        self.expert_units = _check_units(expert_units, f"{name}.expert_units")
        self.levels = _check_positive(levels, f"{name}.levels")
        self.expert_activation = expert_activation
        k, s, m = len(self.head_names), self.shared_experts, self.task_experts
        units, act = self.expert_units, expert_activation
        dtype = self.dtype_policy
        self.shared_stacks = [Experts(s, units, act, dtype=dtype) for _ in range(self.levels)]
        # Level-major lists (index j * heads + k): Keras tracks flat lists of layers.
        self.task_stacks = [Experts(m, units, act, dtype=dtype) for _ in range(self.levels * k)]
        self.task_gates = [keras.layers.Dense(m + s, activation="softmax", use_bias=False, dtype=dtype)
                           for _ in range(self.levels * k)]
        self.shared_gates = [keras.layers.Dense(k * m + s, activation="softmax", use_bias=False,
                                                dtype=dtype)
                             for _ in range(self.levels - 1)]

    def forward(self, inputs: Any, training: bool | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        k = len(self.head_names)
        shared_in, task_in = inputs, [inputs] * k
        gates: list[Any] = []
        for j in range(self.levels):
            shared = self.shared_stacks[j](shared_in)
            own = [self.task_stacks[j * k + t](task_in[t]) for t in range(k)]
            gates = [self.task_gates[j * k + t](task_in[t]) for t in range(k)]
            next_task = [_mix(gates[t], tf.concat([own[t], shared], axis=1)) for t in range(k)]
            if j < self.levels - 1:
                shared_in = _mix(self.shared_gates[j](shared_in), tf.concat(own + [shared], axis=1))
            task_in = next_task
        return dict(zip(self.head_names, task_in)), dict(zip(self.head_names, gates))

    def head_owned_layers(self) -> dict[str, list[keras.layers.Layer]]:
        k = len(self.head_names)
        return {h: [layer for j in range(self.levels)
                    for layer in (self.task_stacks[j * k + t], self.task_gates[j * k + t])]
                for t, h in enumerate(self.head_names)}

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "shared_experts": self.shared_experts,
                "task_experts": self.task_experts, "expert_units": self.expert_units,
                "levels": self.levels, "expert_activation": self.expert_activation}


@keras.saving.register_keras_serializable(package="multihead")
class CGC(PLE):
    """Customized gate control (Tang et al., RecSys 2020): PLE with one level."""

    #: Its key in a config's `model.trunk: {cgc: {...}}`.
    config_name = "cgc"

    def __init__(self, heads: Sequence[str], shared_experts: int, task_experts: int,
                 expert_units: Sequence[int], expert_activation: Any = "relu", **kwargs: Any) -> None:
        kwargs.pop("levels", None)
        super().__init__(heads, shared_experts, task_experts, expert_units, levels=1,
                         expert_activation=expert_activation, **kwargs)

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        del config["levels"]
        return config


@keras.saving.register_keras_serializable(package="multihead")
class DSelectK(MMoE):
    """Mixture of shared experts with one DSelect-k gate per head (Hazimeh et al., 2021).

    Args:
        heads: the model's head names.
        experts: number of experts (a power of two).
        k: selectors per gate (at most k experts per head).
        expert_units: widths of each expert MLP's layers.
        gamma: width of the smooth step's cubic part.
        expert_activation: activation of the expert layers.
        entropy_reg: weight of the paper's entropy regulariser on each gate's selectors
            (`DSelectGate`), added in training to the loss of the head that owns the
            gate; 0 (the default, as the authors' gate: no regulariser) leaves it out.
    """

    #: Its key in a config's `model.trunk: {dselect_k: {...}}`.
    config_name = "dselect_k"

    def __init__(self, heads: Sequence[str], experts: int, k: int, expert_units: Sequence[int],
                 gamma: float = 1.0, expert_activation: Any = "relu", entropy_reg: float = 0.0,
                 **kwargs: Any) -> None:
        self.k = _check_positive(k, "DSelectK.k")  # read by `_gate` during MMoE's __init__
        self.gamma = check_float(gamma, "DSelectK.gamma", minimum=0, min_open=True)
        self.entropy_reg = check_float(entropy_reg, "DSelectK.entropy_reg", minimum=0)
        super().__init__(heads, experts, expert_units, expert_activation, **kwargs)

    def _gate(self) -> keras.layers.Layer:
        return DSelectGate(self.num_experts, self.k, self.gamma, entropy_reg=self.entropy_reg,
                           dtype=self.dtype_policy)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "k": self.k, "gamma": self.gamma, "entropy_reg": self.entropy_reg}


@keras.saving.register_keras_serializable(package="multihead")
class CrossStitch(_RoutedTrunk):
    """Cross-stitch networks (Misra et al., CVPR 2016), for dense columns.

    Each head has a column of Dense layers (owned by the head). After layer l, the
    shared cross-stitch unit `alpha_l` (heads x heads) mixes the columns:
    `x_k^l = sum_t alpha_l[k, t] h_t^l`, `h_t^l = column_t^l(x_t^{l-1})`.

    Args:
        heads: the model's head names.
        units: widths of each column's layers.
        activation: activation of the column layers.
        self_weight: initial `alpha[k, k]`; the rest of a row shares `1 - self_weight`
            (the paper's (0.9, 0.1) initialisation for two tasks).
    """

    #: Its key in a config's `model.trunk: {cross_stitch: {...}}`.
    config_name = "cross_stitch"

    def __init__(self, heads: Sequence[str], units: Sequence[int], activation: Any = "relu",
                 self_weight: float = 0.9, **kwargs: Any) -> None:
        super().__init__(heads, **kwargs)
        self.units = _check_units(units, "CrossStitch.units")
        self.activation = activation
        self.self_weight = check_float(self_weight, "CrossStitch.self_weight")
        k = len(self.head_names)
        self.columns = [keras.layers.Dense(u, activation=activation, dtype=self.dtype_policy)
                        for u in self.units for _ in range(k)]
        off = 0.0 if k == 1 else (1.0 - self.self_weight) / (k - 1)
        init = np.full((k, k), off, "float32")
        np.fill_diagonal(init, self.self_weight)
        self.stitches = [self.add_weight(shape=(k, k), name=f"stitch_{l}",
                                         initializer=keras.initializers.Constant(init))
                         for l in range(len(self.units))]

    def call(self, inputs: Any, training: bool | None = None) -> dict[str, Any]:
        k = len(self.head_names)
        xs = [inputs] * k
        for l, stitch in enumerate(self.stitches):
            h = tf.stack([self.columns[l * k + t](xs[t]) for t in range(k)])  # (k, b, u)
            mixed = tf.einsum("kt,tbu->kbu", tf.cast(stitch, h.dtype), h)
            xs = [mixed[t] for t in range(k)]
        return dict(zip(self.head_names, xs))

    def head_owned_layers(self) -> dict[str, list[keras.layers.Layer]]:
        k = len(self.head_names)
        return {h: [self.columns[l * k + t] for l in range(len(self.units))]
                for t, h in enumerate(self.head_names)}

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "units": self.units, "activation": self.activation,
                "self_weight": self.self_weight}


@keras.saving.register_keras_serializable(package="multihead")
class MTAN(_RoutedTrunk):
    """Multi-task attention network (Liu et al., CVPR 2019) over a shared conv backbone.

    Backbone block j: `u_j = relu(conv3x3(x_{j-1}))`, `p_j = relu(conv3x3(u_j))`,
    `x_j = maxpool2(p_j)`. Head k's attention module at block j: the mask
    `a = sigmoid(conv1x1(relu(conv1x1(in))))` with `in = u_j` (j = 1) or
    `[u_j, a_k^{j-1}]` (concatenated channels), applied to the shared features,
    `a * p_j`, then `a_k^j = maxpool2(relu(conv3x3(a * p_j)))` with the next block's
    channels. Head k's features are `a_k^L` (batch, H / 2^L, W / 2^L, channels[-1]).

    With `batch_norm`, every convolution is followed by batch normalisation before
    its activation (`act(BN(conv(x)))`), as in the paper's blocks; the normalisation
    layers of a head's attention modules are owned by the head (its optimizer trains
    their scale and offset; their moving statistics are saved with `heads/<name>`),
    the backbone's are shared. Momentum 0.9 and epsilon 1e-5 are the authors' (PyTorch's
    defaults). In training the moving statistics move once per trunk call: once a
    step in the simultaneous schedule, once per head in the sequential one.

    Args:
        heads: the model's head names.
        channels: channels of each backbone block.
        batch_norm: batch normalisation after every convolution. Off by default: it
            changes the layer's variables (configs and checkpoints written without it
            keep their layout), and in training it makes each example's features depend
            on the rest of its batch.
    """

    #: Its key in a config's `model.trunk: {mtan: {...}}`.
    config_name = "mtan"

    def __init__(self, heads: Sequence[str], channels: Sequence[int], batch_norm: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(heads, **kwargs)
        self.channels = _check_units(channels, "MTAN.channels")
        self.batch_norm = _check_bool(batch_norm, "MTAN.batch_norm")
        k, c = len(self.head_names), self.channels

        def conv(n: int, size: int, act: str) -> keras.layers.Layer:
            # With batch normalisation the activation comes after it (`_conv_bn`).
            return keras.layers.Conv2D(n, size, padding="same", activation=None if batch_norm else act,
                                       dtype=self.dtype_policy)

        def norms(count: int) -> list[keras.layers.Layer]:
            return [keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-5, dtype=self.dtype_policy)
                    for _ in range(count)] if batch_norm else []

        self.first = [conv(n, 3, "relu") for n in c]
        self.second = [conv(n, 3, "relu") for n in c]
        self.pool = keras.layers.MaxPooling2D(2, dtype=self.dtype_policy)
        nxt = c[1:] + c[-1:]
        # Block-major lists (index j * heads + k).
        self.mask_hidden = [conv(c[j], 1, "relu") for j in range(len(c)) for _ in range(k)]
        self.mask_out = [conv(c[j], 1, "sigmoid") for j in range(len(c)) for _ in range(k)]
        self.project = [conv(nxt[j], 3, "relu") for j in range(len(c)) for _ in range(k)]
        # Empty without batch normalisation; else one per convolution, indexed alike.
        self.first_norm, self.second_norm = norms(len(c)), norms(len(c))
        self.mask_hidden_norm, self.mask_out_norm = norms(len(c) * k), norms(len(c) * k)
        self.project_norm = norms(len(c) * k)

    def _conv_bn(self, convs: list[Any], norms: list[Any], i: int, x: Any, act: Any,
                 training: bool | None) -> Any:
        """`convs[i](x)`, then, with batch normalisation, `act(norms[i](.))`."""
        y = convs[i](x)
        return act(norms[i](y, training=training)) if self.batch_norm else y

    def call(self, inputs: Any, training: bool | None = None) -> dict[str, Any]:
        k = len(self.head_names)
        relu, sigmoid = tf.nn.relu, tf.sigmoid
        x, att = inputs, [None] * k
        for j in range(len(self.channels)):
            u = self._conv_bn(self.first, self.first_norm, j, x, relu, training)
            p = self._conv_bn(self.second, self.second_norm, j, u, relu, training)
            for t in range(k):
                i = j * k + t
                src = u if att[t] is None else tf.concat([u, att[t]], axis=-1)
                hidden = self._conv_bn(self.mask_hidden, self.mask_hidden_norm, i, src, relu, training)
                mask = self._conv_bn(self.mask_out, self.mask_out_norm, i, hidden, sigmoid, training)
                att[t] = self.pool(self._conv_bn(self.project, self.project_norm, i, mask * p, relu,
                                                 training))
            x = self.pool(p)
        return dict(zip(self.head_names, att))

    def head_owned_layers(self) -> dict[str, list[keras.layers.Layer]]:
        k = len(self.head_names)
        groups = [self.mask_hidden, self.mask_out, self.project]
        if self.batch_norm:
            groups += [self.mask_hidden_norm, self.mask_out_norm, self.project_norm]
        return {h: [layers[j * k + t] for j in range(len(self.channels)) for layers in groups]
                for t, h in enumerate(self.head_names)}

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "channels": self.channels, "batch_norm": self.batch_norm}


#: Config name -> layer class (`model.trunk: {mmoe: {...}}`): the one list of architectures;
#: their options are their constructors' (`architecture_options`).
ARCHITECTURES: Mapping[str, type] = {
    cls.config_name: cls for cls in (MMoE, OMoE, CGC, PLE, DSelectK, CrossStitch, MTAN)}


def architecture_options(cls: type) -> dict[str, inspect.Parameter]:
    """The options of architecture `cls`: its constructor's keyword arguments, but the head
    names (the model's) and Keras' own layer arguments, in signature order."""
    params = inspect.signature(cls.__init__).parameters.values()
    return {p.name: p for p in params if p.name not in ("self", "heads")
            and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
