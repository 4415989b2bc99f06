"""Every private Keras/TF name the package reads is read in `multihead._keras_internals`,
and each accessor still works on the installed release."""

import pathlib
import re

import keras
import numpy as np
import tensorflow as tf

from multihead import _keras_internals as internals

PACKAGE = pathlib.Path(internals.__file__).parent
# `obj._name`, where obj is a name chain or a call/index result; a `keras.src` import; a
# private name passed as a string (getattr/hasattr).
_PRIVATE = re.compile(r"(?P<obj>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*|[\])])\._(?P<name>[a-z]\w*)"
                      r"|keras\.src|[\"']_[a-z]\w*[\"']\)?")
_NAMEDTUPLE = {"replace", "asdict", "fields", "make"}  # public API despite the underscore


def _private_reads(line: str) -> list[str]:
    """The private names `line` reads on objects other than its own (`self`, `cls`), the
    internals module, or the package's own private modules (`multihead._checks`)."""
    code = line.split("#", 1)[0]
    if code.strip().startswith(("\"", "'")):
        return []
    found = []
    for m in _PRIVATE.finditer(code):
        obj = m.group("obj") or ""
        if obj in {"self", "cls", "internals"} or obj.split(".")[0] == "multihead" \
                or m.group("name") in _NAMEDTUPLE:
            continue
        if m.group("obj") is None and not m.group(0).startswith("keras") and "attr(" not in code:
            continue  # a string that merely starts with an underscore
        found.append(m.group(0))
    return found


def test_no_module_but_the_internals_reads_a_private_name():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "_keras_internals.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if _private_reads(line):
                offenders.append(f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}")
    assert not offenders, "private names read outside _keras_internals:\n" + "\n".join(offenders)


def test_the_grep_catches_a_private_read():
    assert _private_reads("ids = [id(v) for v in optimizer._trainable_variables]")
    assert _private_reads("ids = [id(v) for v in self.optimizer._trainable_variables]")
    assert _private_reads('shapes = getattr(model, "_build_shapes_dict", None)')
    assert _private_reads("from keras.src.optimizers import base_optimizer")
    assert not _private_reads("self._heads = tuple(heads)")
    assert not _private_reads("value = _helper(x)._replace(a=1)")
    assert not _private_reads("from multihead.aggregation._numerics import gramian")


def test_optimizer_accessors_on_the_installed_keras():
    variables = [keras.Variable(np.ones((2, 3), "float32")), keras.Variable(np.zeros(3, "float32"))]
    adam = keras.optimizers.Adam(amsgrad=True)
    adam.build(variables)
    assert [id(v) for v in internals.built_variables(adam)] == [id(v) for v in variables]
    assert internals.has_slot_internals(adam)
    m, v, v_hat = internals.adam_slots(adam, variables[1])
    assert m.shape == v.shape == v_hat.shape == (3,)
    sgd = keras.optimizers.SGD(momentum=0.9)
    sgd.build(variables)
    assert internals.has_slot_internals(sgd)
    assert internals.sgd_momentum(sgd, variables[0]).shape == (2, 3)
    assert not internals.has_slot_internals(keras.optimizers.RMSprop())


def test_optimizer_strategy_is_the_scope_the_optimizer_was_created_in():
    # The trainer refuses a head optimizer created outside `strategy.scope()` by comparing this
    # accessor with the trainer's strategy: it must name the creating scope, and nothing else.
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        inside = keras.optimizers.Adam()
    outside = keras.optimizers.Adam()
    assert internals.optimizer_strategy(inside) is strategy
    assert internals.optimizer_strategy(outside) is not strategy


def test_layer_accessors_on_the_installed_keras():
    dropout = keras.layers.Dropout(0.5, seed=1)
    model = keras.Sequential([keras.layers.Dense(2), dropout])
    model.build((None, 3))
    states = internals.seed_generator_states(model)
    assert len(states) == 1 and states[0] is dropout.seed_generator.state
    dense = model.layers[0]
    assert {id(v) for v in internals.own_variables(dense)} == {id(v) for v in dense.weights}

    class Block(keras.layers.Layer):
        def __init__(self):
            super().__init__()
            self.inner = keras.layers.Dense(1)

        def call(self, x):
            return self.inner(x)

    block = Block()
    block(np.ones((1, 2), "float32"))
    assert internals.direct_sublayers(block) == [block.inner]
    assert internals.all_layers(block) == [block, block.inner]

    class Adds(keras.layers.Layer):
        def call(self, x):
            self.add_loss(tf.reduce_sum(x))
            return x

    adds = Adds()
    adds(np.ones((1, 2), "float32"))
    assert [float(v) for v in internals.own_losses(adds)] == [2.0]
    assert internals.build_shapes(model) == {"input_shape": (None, 3)}
    named = {"a": keras.Input((2,), name="a"), "b": keras.Input((1,), name="b")}
    functional = keras.Model(named, keras.layers.Concatenate()([named["a"], named["b"]]))
    assert set(internals.functional_inputs(functional)) == {"a", "b"}
    assert internals.functional_inputs(model) is None


def test_tensorflow_accessors_on_the_installed_tensorflow(tmp_path):
    writer = tf.summary.create_file_writer(str(tmp_path))
    assert internals.summary_writer_resource(writer) is not None

    @tf.function
    def f(flag):
        graph = tf.compat.v1.get_default_graph()
        start = len(graph.get_operations())
        out = tf.cond(flag, lambda: tf.constant(1.0), lambda: tf.constant(2.0))
        for op in graph.get_operations()[start:]:
            if op.type in ("If", "StatelessIf"):
                internals.keep_cond_functional(op)
                assert op.get_attr("_lower_using_switch_merge") is False
        return out

    assert float(f(tf.constant(True))) == 1.0
    writer.close()


def test_flat_call_equals_the_structured_call_of_the_concrete_function():
    # Nested dicts whose keys are not in sorted order, lists and tuples: the flat inputs are
    # `tf.nest.flatten`'s order, the outputs come back structured, and variables the function
    # captured are read (and written) as by the structured call.
    counter = tf.Variable(0.0)

    @tf.function(autograph=False)
    def f(inputs, rest):
        counter.assign_add(1.0)
        return {"sum": inputs["z"] - 2.0 * inputs["b"] + 3.0 * inputs["m"]["y"] - inputs["m"]["a"]
                + 5.0 * rest[0] - 7.0 * rest[1][0] + counter}, rest[1]

    def args(seed):
        rng = np.random.default_rng(seed)
        values = [tf.constant(rng.normal(size=3).astype("float32")) for _ in range(6)]
        return ({"z": values[0], "b": values[1], "m": {"y": values[2], "a": values[3]}},
                [values[4], (values[5],)])

    call = internals.flat_call(f.get_concrete_function(*args(0)))
    for seed in (1, 2):
        flat_out = call(tf.nest.flatten(args(seed)))
        expected = f(*args(seed))
        tf.nest.assert_same_structure(flat_out, expected)
        np.testing.assert_array_equal(flat_out[0]["sum"].numpy(),
                                      expected[0]["sum"].numpy() - 1.0)  # one assign earlier
        np.testing.assert_array_equal(flat_out[1][0].numpy(), args(seed)[1][1][0].numpy())
    assert float(counter.numpy()) == 4.0


def test_fit_passes_evaluate_only_the_private_arguments_listed():
    # A plain Keras model whose evaluate records what Keras' fit gives it for validation_data.
    seen = {}

    class Recording(keras.Sequential):
        def evaluate(self, *args, **kwargs):
            seen.update(kwargs)
            return super().evaluate(*args, **kwargs)

    model = Recording([keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.ones((4, 2), "float32"), np.zeros((4, 1), "float32")
    model.fit(x, y, epochs=1, verbose=0, validation_data=(x, y))
    assert {k for k in seen if k.startswith("_")} == set(internals.FIT_EVALUATE_KWARGS)


def test_has_auto_name_on_the_installed_keras():
    named = {"a": keras.Input((2,), name="a")}
    made_up = [keras.layers.Dense(1), keras.layers.Dense(1), keras.Sequential(),
               keras.Model(named, keras.layers.Dense(1)(named["a"])), keras.layers.LayerNormalization()]
    assert [internals.has_auto_name(layer) for layer in made_up] == [True] * 5
    chosen = [keras.layers.Dense(1, name="head"), keras.Sequential(name="dense"),
              keras.layers.Dense(1, name="dense_x")]
    assert [internals.has_auto_name(layer) for layer in chosen] == [False] * 3


def test_end_cluster_process_returns_in_a_process_outside_a_cluster():
    assert internals.end_cluster_process(0) is None  # still here: nothing ended the process
