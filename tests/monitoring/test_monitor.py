"""The Monitor's logged values, read back from the event files, against a hand-written
GradientTape + Keras optimizer loop on the same batches and initial weights."""

from __future__ import annotations

import collections
import glob
import itertools
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import multihead as mh
from conftest import make_batch, make_model, make_tapped
from multihead.model.addresses import variable_addresses
from multihead.monitoring import tags
from multihead.monitoring.gradient_stats import cosine, global_norm, histogram_buckets

HEADS = ("a", "b", "c")
EVERY = {"a": 1, "b": 1, "c": 2}
WEIGHT = {"a": 1.0, "b": 0.5, "c": 2.0}


def _optimizers():
    decay = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=1, decay_rate=0.5)
    return {"a": keras.optimizers.Adam(1e-2), "b": keras.optimizers.SGD(decay, momentum=0.9),
            "c": keras.optimizers.Adam(3e-2)}


def _mse(y, pred):
    return tf.reduce_mean(tf.square(y - pred))


def read_events(log_dir: str) -> dict[str, dict[int, np.ndarray]]:
    """tag -> step -> value, straight from the TFRecord event files (independent of report.py)."""
    out: dict[str, dict[int, np.ndarray]] = collections.defaultdict(dict)
    for path in sorted(glob.glob(os.path.join(log_dir, "events.out.tfevents.*"))):
        for record in tf.data.TFRecordDataset(path):
            event = tf.compat.v1.Event.FromString(record.numpy())
            for value in event.summary.value:
                out[value.tag][event.step] = tf.make_ndarray(value.tensor)
    return dict(out)


def _variable_tag(logged, tag_of, model, variable) -> str:
    """The logged per-variable tag of `variable`: named by its stable address when the step
    binds the monitor with addresses, else by its Keras path."""
    address = {id(v): a for a, v in variable_addresses(model).items()}[id(variable)]
    by_address = tag_of(address)
    return by_address if by_address in logged else tag_of(variable.path)


def _norm(arrays) -> float:
    return float(np.sqrt(sum(np.sum(np.square(a.astype(np.float64))) for a in arrays)))


def _flat(arrays) -> np.ndarray:
    return np.concatenate([a.astype(np.float64).ravel() for a in arrays])


def _reference(schedule, batches):
    """Hand-written loop; returns the values the monitor should log: tag -> step -> value,
    each step's values at the number of updates done after it (the first step at 1)."""
    model = make_model(HEADS, seed=3)
    opts = _optimizers()
    for h in HEADS:
        opts[h].build(model.var_list(h))
    n_trunk = len(model.trunk_variables)
    logged: dict[str, dict[int, float]] = collections.defaultdict(dict)
    for step, (x, y) in enumerate(batches):
        due = [h for h in HEADS if step % EVERY[h] == 0]
        if schedule == "simultaneous":
            with tf.GradientTape(persistent=True) as tape:
                feats = model.trunk(x, training=True)
                losses = {h: _mse(y[h], model.heads[h](feats, training=True)) for h in HEADS}
                weighted = {h: WEIGHT[h] * losses[h] for h in HEADS}
            grads = {h: tape.gradient(weighted[h], model.var_list(h)) for h in due}
        trunk_grads = {}
        for h in due:
            if schedule == "sequential":  # at the parameters the previous head left
                with tf.GradientTape() as tape:
                    loss = _mse(y[h], model.heads[h](model.trunk(x, training=True), training=True))
                    weighted = WEIGHT[h] * loss
                losses = {h: loss}
                grads = {h: tape.gradient(weighted, model.var_list(h))}
            g = [t.numpy() for t in grads[h]]
            before = [v.numpy() for v in model.var_list(h)]
            lr = float(keras.ops.convert_to_numpy(opts[h].learning_rate))  # the lr apply will use
            opts[h].apply_gradients(zip(grads[h], model.var_list(h)))
            after = [v.numpy() for v in model.var_list(h)]
            logged[f"loss/{h}"][step + 1] = float(losses[h])
            logged[f"grad_norm/{h}/trunk"][step + 1] = _norm(g[:n_trunk])
            logged[f"grad_norm/{h}/head"][step + 1] = _norm(g[n_trunk:])
            logged[f"lr/{h}"][step + 1] = lr
            # ||w_after - w_before|| / ||w_before||
            logged[f"update_ratio/{h}"][step + 1] = _norm([a - b for a, b in zip(after, before)]) / _norm(before)
            trunk_grads[h] = _flat(g[:n_trunk])
        for a, b in itertools.combinations(due, 2):
            ga, gb = trunk_grads[a], trunk_grads[b]
            # cos = <ga, gb> / (|ga| |gb|)
            logged[f"grad_cosine/{a}/{b}"][step + 1] = float(ga @ gb / np.linalg.norm(ga) / np.linalg.norm(gb))
    return logged


def _trainer(model, log_dir, schedule="simultaneous", **kwargs):
    opts = _optimizers()
    objectives = {h: mh.Objective("mse", opts[h], weight=WEIGHT[h], every=EVERY[h]) for h in HEADS}
    kwargs.setdefault("histograms_every", 0)
    return mh.Trainer(model, objectives, schedule=schedule, log_dir=log_dir, **kwargs)


@pytest.mark.parametrize("schedule", ["simultaneous", "sequential"])
def test_logged_values_equal_the_gradient_tape_reference(tmp_path, schedule):
    batches = [make_batch(HEADS, seed=s) for s in range(5)]
    trainer = _trainer(make_model(HEADS, seed=3), str(tmp_path), schedule, log_every=1)
    for batch in batches:
        trainer.step(batch)
    trainer.close()
    logged = read_events(str(tmp_path / "train"))
    expected = _reference(schedule, batches)
    step_tags = {t for t in logged if t.split("/")[0] in
                 ("loss", "grad_norm", "lr", "update_ratio", "grad_cosine")}
    assert step_tags == set(expected)  # the same tags: no cosine for a pair never updated together
    for tag, by_step in expected.items():
        assert sorted(logged[tag]) == sorted(by_step), tag  # c (every=2): on steps 1, 3, 5 only
        ours = np.array([float(logged[tag][s]) for s in sorted(by_step)])
        ref = np.array([by_step[s] for s in sorted(by_step)])
        np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-7, err_msg=tag)
    # The decaying learning rate of b was logged as applied: 0.1 * 0.5**k at its k-th update.
    np.testing.assert_allclose([float(logged["lr/b"][s]) for s in range(1, 6)],
                               [0.1 * 0.5**k for k in range(5)], rtol=1e-6)


def test_sequential_logs_the_applied_gradient_not_the_one_at_the_step_start(tmp_path):
    """Under `sequential`, b's gradient is taken after a's update: the logged norm must be that
    one, and it differs measurably from b's gradient at the step's starting parameters."""
    batch = make_batch(HEADS, seed=0)
    trainer = _trainer(make_model(HEADS, seed=3), str(tmp_path), "sequential", log_every=1)
    start = make_model(HEADS, seed=3)  # bitwise the same initial weights
    x, y = batch
    with tf.GradientTape() as tape:
        loss = WEIGHT["b"] * _mse(y["b"], start.heads["b"](start.trunk(x, training=True)))
    at_start = _norm([g.numpy() for g in tape.gradient(loss, start.trunk_variables)])
    trainer.step(batch)
    trainer.close()
    logged = float(read_events(str(tmp_path / "train"))["grad_norm/b/trunk"][1])
    assert abs(logged - at_start) / at_start > 1e-3


def test_scalar_and_histogram_cadence_and_histogram_contents(tmp_path):
    model = make_model(("a", "b"), seed=1)
    trainer = mh.Trainer(model, {"a": mh.Objective("mse", "sgd"),
                                 "b": mh.Objective("mse", "sgd", every=3)},
                         log_dir=str(tmp_path), log_every=2, histograms_every=3)
    kernel = model.trunk_variables[0]
    x, y = make_batch(("a", "b"), seed=0)
    with tf.GradientTape() as tape:
        loss = _mse(y["a"], model.heads["a"](model.trunk(x, training=True)))
    grad0 = tape.gradient(loss, kernel).numpy()  # a's gradient of the first trunk kernel at step 0
    for s in range(7):
        trainer.step(make_batch(("a", "b"), seed=s) if s else (x, y))
    trainer.close()
    logged = read_events(str(tmp_path / "train"))
    # Steps are counted as updates done: the 7 steps are 1..7, the first one logs.
    assert sorted(logged["loss/a"]) == [1, 2, 4, 6]          # the first and every 2
    assert sorted(logged["loss/b"]) == [1, 4]                 # logging and b due (1, 4, 7)
    assert sorted(logged["grad_cosine/a/b"]) == [1, 4]        # only when both were updated
    tag = _variable_tag(logged, lambda name: tags.grad_hist("a", name), model, kernel)
    assert sorted(logged[tag]) == [1, 3, 6]                   # the first and every 3
    tag_b = _variable_tag(logged, lambda name: tags.grad_hist("b", name), model, kernel)
    assert sorted(logged[tag_b]) == [1]                       # and b due (1, 4, 7)
    hist = logged[tag][1]                                     # rows (left, right, count)
    assert hist.shape == (30, 3)
    assert hist[:, 2].sum() == grad0.size
    np.testing.assert_allclose([hist[0, 0], hist[-1, 1]], [grad0.min(), grad0.max()], rtol=1e-6)
    # count in each bin, by numpy over the same edges
    edges = np.append(hist[:, 0], hist[-1, 1])
    np.testing.assert_array_equal(hist[:, 2], np.histogram(grad0.astype(np.float64), edges)[0])


def test_cadence_follows_the_step_counter_when_it_is_set_from_outside(tmp_path):
    """Which steps log is decided from the step counter itself, so a counter moved by a
    restored checkpoint (or by hand) logs at the right steps, with `fit` and `step` alike."""
    trainer = mh.Trainer(make_model(("a", "b"), seed=0),
                         {"a": mh.Objective("mse", "sgd"), "b": mh.Objective("mse", "sgd")},
                         log_dir=str(tmp_path), log_every=5, histograms_every=0)
    batch = make_batch(("a", "b"), seed=0)
    # A step is logged at the number of updates done after it.
    trainer.step(batch)                                       # step 1: the first logs
    trainer.step_variable.assign(8)
    trainer.step(batch)                                       # step 9: quiet
    trainer.step(batch)                                       # step 10: logs
    trainer.step(batch)                                       # step 11: quiet
    trainer.step_variable.assign(13)
    x, y = batch
    trainer.fit((x, y), steps=9, batch_size=4, steps_per_execution=4, verbose=False)  # 14..22
    trainer.close()
    # 15 and 20 by the cadence, 22 as the last step of the fit
    assert sorted(read_events(str(tmp_path / "train"))["loss/a"]) == [1, 10, 15, 20, 22]


def test_no_summary_work_runs_on_steps_that_do_not_log(tmp_path):
    """tfdbg records every op the compiled step executes. With the monitor on, a step that
    does not log executes exactly the ops of the same step without a monitor (plus reading
    the step counter); a logging step executes the norms and the summary writes."""
    from tensorflow.python.debug.lib import debug_events_reader

    dump = str(tmp_path / "dump")
    writer = tf.debugging.experimental.enable_dump_debug_info(
        dump, tensor_debug_mode="NO_TENSOR", circular_buffer_size=-1)
    try:
        def make(log_dir):
            return mh.Trainer(make_model(("a", "b"), seed=0),
                              {"a": mh.Objective("mse", "adam"), "b": mh.Objective("mse", "adam")},
                              log_dir=log_dir, log_every=3, histograms_every=6)

        on, off = make(str(tmp_path / "run")), make(None)
        marker = tf.function(lambda: tf.math.cumprod(tf.ones([2])))  # delimits the steps
        for s in range(7):
            batch = make_batch(("a", "b"), seed=s)
            on.step(batch)
            marker()
            off.step(batch)
            marker()
        writer.FlushNonExecutionFiles()
        writer.FlushExecutionFiles()
        with debug_events_reader.DebugDataReader(dump) as reader:
            reader.update()
            ops = [t.op_type for t in reader.graph_execution_traces()]
    finally:
        tf.debugging.experimental.disable_dump_debug_info()
    calls, current = [], collections.Counter()
    for op in ops:
        if op == "Cumprod":
            calls.append(current)
            current = collections.Counter()
        else:
            current[op] += 1
    assert len(calls) == 14
    # monitored minus plain step, by the number of updates done after it (1..7)
    extra = {s + 1: calls[2 * s] - calls[2 * s + 1] for s in range(7)}
    gating = {"FloorMod", "Equal", "LogicalOr", "LogicalAnd", "Const", "Identity", "Placeholder",
              "ReadVariableOp", "AddV2"}
    for s in (2, 4, 5, 7):  # not the first step, nor multiples of 3 or 6
        assert set(extra[s]) <= gating, (s, extra[s])
    assert {"Sqrt", "Square", "Sum"} <= set(extra[3]), extra[3]        # scalars: norms
    assert "HistogramFixedWidth" not in extra[3]
    assert "HistogramFixedWidth" in extra[6] and "HistogramFixedWidth" in extra[1]
    # Ops without outputs are not traced by tfdbg: check those in the compiled graphs.
    # Steps that do not log run a variant without a single summary op, and no flush.
    x, y = make_batch(("a", "b"), seed=0)
    # the compiled variants, keyed (monitored, heads, own batches) -> (one step, many)
    variant = on._runner.train_step.loops.functions  # noqa: SLF001
    quiet = _op_types(variant((False, ("a", "b"), False))[0].get_concrete_function(x, y).graph)
    monitored = variant((True, ("a", "b"), False))[0].get_concrete_function(x, y).graph
    plain = _op_types(off._runner.train_step.loops.functions((False, ("a", "b"), False))[0]  # noqa: SLF001
                      .get_concrete_function(x, y).graph)
    assert not {"WriteSummary", "FlushSummaryWriter"} & quiet
    assert quiet == plain  # the monitor adds no op type (no cond) to a step that does not log
    # The variant that measures writes nothing either: it returns its statistics, and the
    # monitor writes them after the call (the events: the other tests of this file).
    assert not {"WriteSummary", "FlushSummaryWriter"} & _op_types(monitored)


def _op_types(graph) -> set[str]:
    """Op types of `graph` and of every function it calls (cond branches included)."""
    graph_def = graph.as_graph_def()
    types = {node.op for node in graph_def.node}
    for function in graph_def.library.function:
        types |= {node.op for node in function.node_def}
    return types


def test_head_that_does_not_train_the_trunk_has_no_trunk_norm_and_no_cosine(tmp_path):
    model = make_model(HEADS, seed=0)
    trainer = mh.Trainer(model, {"a": mh.Objective("mse"), "b": mh.Objective("mse"),
                                 "c": mh.Objective("mse", trains_trunk=False)},
                         log_dir=str(tmp_path), log_every=1, histograms_every=0)
    trainer.step(make_batch(HEADS))
    trainer.close()
    tags = set(read_events(str(tmp_path / "train")))
    assert {"grad_norm/c/head", "loss/c", "grad_norm/a/trunk", "grad_cosine/a/b"} <= tags
    assert not {"grad_norm/c/trunk", "grad_cosine/a/c", "grad_cosine/b/c"} & tags


def test_variable_norms_are_the_norms_of_each_applied_gradient(tmp_path):
    model, ref = make_model(("a", "b"), seed=2), make_model(("a", "b"), seed=2)
    trainer = mh.Trainer(model, {"a": mh.Objective("mse"), "b": mh.Objective("mse")},
                         log_dir=str(tmp_path), log_every=1, histograms_every=0,
                         log_variable_norms=True)
    x, y = make_batch(("a", "b"), seed=4)
    trainer.step((x, y))
    trainer.close()
    with tf.GradientTape() as tape:
        loss = _mse(y["b"], ref.heads["b"](ref.trunk(x, training=True)))
    grads = tape.gradient(loss, ref.var_list("b"))
    logged = read_events(str(tmp_path / "train"))
    for v, g in zip(model.var_list("b"), grads):
        tag = _variable_tag(logged, lambda name: tags.variable_grad_norm("b", name), model, v)
        np.testing.assert_allclose(float(logged[tag][1]),  # the first step is step 1
                                   np.linalg.norm(g.numpy().astype(np.float64)), rtol=1e-5)


def test_config_text_and_one_custom_scalars_section_per_head(tmp_path):
    from tensorboard.plugins.custom_scalar import layout_pb2

    trainer = mh.Trainer(make_model(("y1", "y2")), {"y1": mh.Objective("mse"), "y2": mh.Objective("mse")},
                         log_dir=str(tmp_path), histograms_every=0)
    trainer.step(make_batch(("y1", "y2")))  # the step binds the monitor, which writes the layout
    text = "seed: 0\nmodel:\n  heads: {y1: {}, y2: {}}\n"
    trainer.monitor.write_config(text)
    trainer.close()
    logged = read_events(str(tmp_path / "train"))
    written = logged["config"][0].item().decode()
    assert [line.strip() for line in written.splitlines()] == [line.strip() for line in text.splitlines()]
    layout = layout_pb2.Layout.FromString(logged["custom_scalars__config__"][0].item())
    assert [c.title for c in layout.category] == ["y1", "y2"]
    assert any("^loss/y1$" in chart.multiline.tag for chart in layout.category[0].chart)


def test_two_monitors_in_one_process_do_not_interfere(tmp_path):
    first = mh.Trainer(make_model(("a", "b"), seed=0), {"a": mh.Objective("mse"), "b": mh.Objective("mse")},
                       log_dir=str(tmp_path / "one"), log_every=1, histograms_every=0)
    second = mh.Trainer(make_model(("p", "q", "r"), seed=0),
                        {h: mh.Objective("mse") for h in ("p", "q", "r")},
                        log_dir=str(tmp_path / "two"), log_every=2, histograms_every=0)
    for s in range(3):
        first.step(make_batch(("a", "b"), seed=s))
        second.step(make_batch(("p", "q", "r"), seed=s))
    first.close()
    second.close()
    one, two = read_events(str(tmp_path / "one" / "train")), read_events(str(tmp_path / "two" / "train"))
    assert {t.split("/")[1] for t in one if t.startswith("loss/")} == {"a", "b"}
    assert {t.split("/")[1] for t in two if t.startswith("loss/")} == {"p", "q", "r"}
    assert sorted(one["loss/a"]) == [1, 2, 3] and sorted(two["loss/p"]) == [1, 2]
    assert {"grad_cosine/p/q", "grad_cosine/p/r", "grad_cosine/q/r"} <= set(two)


@pytest.mark.parametrize("kwargs, match", [
    ({"every": 0}, "^every: must be >= 1, got 0; scalars are written every this many steps$"),
    ({"every": 2.5}, r"^every: expected an integer, got 2.5 \(float\)"),
    ({"every": True}, r"^every: expected an integer, got True \(bool\)"),
    ({"histograms_every": -1}, "^histograms_every: must be >= 0, got -1; 0 disables histograms$"),
])
def test_bad_cadence_fails_at_construction(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        mh.Monitor(str(tmp_path), **kwargs)
    assert not os.path.exists(tmp_path / "train")  # nothing written


def test_monitoring_before_bind_explains_what_to_do(tmp_path):
    monitor = mh.Monitor(str(tmp_path))
    with pytest.raises(RuntimeError, match="bind"):
        monitor.start(tf.constant(0, tf.int64))
    monitor.close()


def test_pure_math():
    # |(3, 4)| = 5 ; |[(1, 2), (2,)]| = sqrt(1 + 4 + 4) = 3
    np.testing.assert_allclose(float(global_norm([tf.constant([3.0, 4.0])])), 5.0)
    np.testing.assert_allclose(float(global_norm([tf.constant([1.0, 2.0]), tf.constant([2.0])])), 3.0)
    assert float(global_norm([])) == 0.0
    # cos = 6 / (2 * 5) = 0.6 ; a zero vector has no direction: 0
    np.testing.assert_allclose(float(cosine(tf.constant(6.0), tf.constant(2.0), tf.constant(5.0))), 0.6)
    assert float(cosine(tf.constant(0.0), tf.constant(0.0), tf.constant(5.0))) == 0.0
    # all-equal values: one bin of width 1 centred on them holds everything
    hist = histogram_buckets(tf.fill([4, 2], 7.0), bins=5).numpy()
    assert hist[:, 2].sum() == 8 and hist[0, 0] == 6.5 and hist[-1, 1] == 7.5


def test_research_loss_with_python_control_flow_trains_on_logging_and_other_steps(tmp_path):
    """The step variant for logging steps converts user losses with autograph like the
    other one: a loss branching in Python on a tensor works on every step."""
    def loss(inputs, targets, outputs):
        err = tf.reduce_mean(tf.square(outputs - targets["a"]))
        if err > 100.0:  # Python `if` on a tensor: needs autograph
            return err / 2.0
        return err

    trainer = mh.Trainer(make_model(("a",), seed=0), {"a": mh.Objective(loss, "sgd")},
                         log_dir=str(tmp_path), log_every=2, histograms_every=0)
    batch = make_batch(("a",), seed=0)
    losses = [trainer.step(batch).losses["a"] for _ in range(4)]  # steps 1, 2 and 4 log
    trainer.close()
    assert losses == sorted(losses, reverse=True)
    assert sorted(read_events(str(tmp_path / "train"))["loss/a"]) == [1, 2, 4]


def _per_variable_tags(model, log_dir, addresses) -> set[str]:
    """Runs one monitored step of `model` (every head, SGD) with a bare Monitor bound with
    `addresses`, and returns the per-variable tags it wrote."""
    heads = model.head_names
    monitor = mh.Monitor(log_dir, every=1, histograms_every=1, variable_norms=True)
    var_lists = {h: list(model.var_list(h)) for h in heads}
    optimizers = {h: keras.optimizers.SGD(0.1) for h in heads}
    for h in heads:
        optimizers[h].build(var_lists[h])
    monitor.bind(var_lists, model.trunk_variables, optimizers, addresses=addresses)
    x, y = make_batch(heads, seed=0)

    @tf.function
    def step(x, y):
        stats = monitor.start(tf.constant(0, tf.int64))  # the step taken at counter 0
        for h in heads:
            with tf.GradientTape() as tape:
                loss = _mse(y[h], model.heads[h](model.trunk(x, training=True), training=True))
            grads = tape.gradient(loss, var_lists[h])
            monitor.updates.before_update(stats, h, var_lists[h], optimizers[h])
            optimizers[h].apply_gradients(zip(grads, var_lists[h]))
            monitor.updates.head_update(stats, h, loss, grads, var_lists[h], optimizers[h])
        return stats.outputs()

    monitor.write_stats(1, step(x, y))  # written after the step, at its number of updates
    monitor.close()
    written = (tags.parse(t) for t in read_events(os.path.join(log_dir, "train")))
    return {(t.kind, t.heads, t.address) for t in written if t is not None and t.address is not None}


def test_per_variable_tags_use_stable_addresses_identical_across_builds(tmp_path):
    first, second = make_model(("a", "b"), seed=0), make_model(("a", "b"), seed=0)
    assert {v.path for v in first.variables} != {v.path for v in second.variables}  # Keras auto-names
    found = [_per_variable_tags(m, str(tmp_path / name),
                                {id(v): a for a, v in variable_addresses(m).items()})
             for m, name in ((first, "one"), (second, "two"))]
    assert found[0] == found[1]
    # every variable of each head's var_list, norms and histograms, by address
    expected = {(kind, (h,), address) for kind in (tags.GRAD_NORM, tags.GRAD_HIST) for h in ("a", "b")
                for address in variable_addresses(first)
                if address.startswith(("trunk/", f"heads/{h}/"))}
    assert found[0] == expected
    assert (tags.GRAD_HIST, ("a",), "trunk/0/kernel") in expected


def test_per_variable_tags_without_addresses_use_the_keras_path(tmp_path):
    model = make_model(("a", "b"), seed=0)
    found = _per_variable_tags(model, str(tmp_path), None)
    assert {address for _, _, address in found} == {v.path for v in model.trainable_variables}


def test_bind_rejects_two_variables_with_one_address(tmp_path):
    model = make_model(("a", "b"), seed=0)
    monitor = mh.Monitor(str(tmp_path))
    with pytest.raises(ValueError, match="addresses: two variables are named 'same'"):
        monitor.bind({h: model.var_list(h) for h in ("a", "b")}, model.trunk_variables,
                     {h: keras.optimizers.SGD() for h in ("a", "b")},
                     addresses={id(v): "same" for v in model.trainable_variables})
    monitor.close()


@pytest.mark.parametrize("clip", [{"clipnorm": 0.05}, {"global_clipnorm": 0.05}, {"clipvalue": 0.001}])
def test_clipped_and_raw_trunk_gradient_norms_are_both_logged(tmp_path, clip):
    """grad_norm/<head>/trunk is the raw gradient; grad_norm_clipped/<head>/trunk is what the
    optimizer applied, read here from the weight change of a plain SGD with lr 1."""
    model = make_model(("a",), seed=0)
    trainer = mh.Trainer(model, {"a": mh.Objective("mse", keras.optimizers.SGD(1.0, **clip))},
                         log_dir=str(tmp_path), log_every=1, histograms_every=0)
    x, y = make_batch(("a",), seed=0)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(y["a"] - model(x)["a"]))
    raw = tape.gradient(loss, model.trunk_variables)
    before = [v.numpy().copy() for v in model.trunk_variables]
    trainer.step((x, y))
    trainer.close()
    applied = [b - v.numpy() for b, v in zip(before, model.trunk_variables)]
    logged = {tag: float(values[1]) for tag, values in read_events(str(tmp_path / "train")).items()
              if 1 in values and values[1].dtype.kind == "f"}  # the first step is step 1
    raw_norm = np.sqrt(sum(np.sum(np.square(g.numpy())) for g in raw))
    applied_norm = np.sqrt(sum(np.sum(np.square(g)) for g in applied))
    assert logged["grad_norm/a/trunk"] == pytest.approx(raw_norm, rel=1e-5)
    assert logged["grad_norm_clipped/a/trunk"] == pytest.approx(applied_norm, rel=1e-4)
    assert applied_norm < raw_norm  # the clip was active


def test_grad_cosine_with_a_trunk_tap_pairs_gradients_by_variable(tmp_path):
    # aux reads block conv1: its trunk gradient is zero on conv2 and conv3, so the cosine
    # is the dot over conv1's variables over the norms of both whole trunk gradients
    heads = ("main", "aux")
    model, ref = make_tapped("conv1"), make_tapped("conv1")
    trainer = mh.Trainer(model, {h: mh.Objective("mse", keras.optimizers.SGD(0.1)) for h in heads},
                         log_dir=str(tmp_path), log_every=1, histograms_every=0)
    x, y = make_batch(heads, seed=3)
    trainer.step((x, y))
    trainer.close()
    with tf.GradientTape(persistent=True) as tape:
        out = ref(x, training=True)
        losses = {h: _mse(y[h], out[h]) for h in heads}
    trunk = ref.trunk_variables
    grads = {h: [np.zeros(v.shape) if g is None else g.numpy().astype(np.float64)
                 for g, v in zip(tape.gradient(losses[h], trunk), trunk)] for h in heads}
    dot = sum(np.sum(a * b) for a, b in zip(grads["main"], grads["aux"]))
    expected = dot / (_norm(grads["main"]) * _norm(grads["aux"]))
    logged = read_events(str(tmp_path / "train"))
    np.testing.assert_allclose(float(logged[tags.grad_cosine("main", "aux")][1]), expected,
                               rtol=1e-5)
    np.testing.assert_allclose(float(logged[tags.trunk_grad_norm("aux")][1]),
                               _norm(grads["aux"][:2]), rtol=1e-5)  # conv1's kernel and bias
    table = logged[tags.TRUNK_BLOCKS][0].item().decode()
    assert [line.strip() for line in table.splitlines()] == [
        "head  trunk blocks trained", "main  conv1, conv2, conv3", "aux   conv1"]
