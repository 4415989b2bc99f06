"""The applier is the one place a train step writes variables through an optimizer: it applies
exactly what it is given, only when due, and a guarded plan with a non-finite loss or gradient
leaves every variable and slot bitwise unchanged."""

import ast
import pathlib

import keras
import numpy as np
import pytest
import tensorflow as tf

import multihead
from multihead.step.applier import Applier, PlannedUpdate

PACKAGE = pathlib.Path(multihead.__file__).parent


def _variables(seed=0):
    rng = np.random.default_rng(seed)
    return [keras.Variable(rng.normal(size=(3, 2)).astype("float32")),
            keras.Variable(rng.normal(size=(2,)).astype("float32"))]


def _gradients(seed=1, bad=False):
    rng = np.random.default_rng(seed)
    grads = [rng.normal(size=(3, 2)).astype("float32"), rng.normal(size=(2,)).astype("float32")]
    if bad:
        grads[1][0] = np.nan
    return [tf.constant(g) for g in grads]


def _sgd(learning_rate):
    """Fresh variables and an SGD optimizer built on them."""
    variables = _variables()
    opt = keras.optimizers.SGD(learning_rate)
    opt.build(variables)
    return variables, opt


def _state(variables, optimizer):
    return [v.numpy().copy() for v in variables] + [v.numpy().copy() for v in optimizer.variables]


def _run(compiled, fn):
    return tf.function(fn)() if compiled else fn()


@pytest.mark.parametrize("compiled", [False, True])
def test_a_plan_applies_what_keras_apply_gradients_applies(compiled):
    ours, reference = _variables(), _variables()
    opt, ref_opt = keras.optimizers.Adam(0.1), keras.optimizers.Adam(0.1)
    opt.build(ours)
    ref_opt.build(reference)
    applier = Applier()
    step = tf.constant(0, tf.int64)
    for i in range(3):
        grads = _gradients(seed=i)
        plan = PlannedUpdate(opt, grads, ours, head="a", guarded=True, loss=tf.constant(1.0))
        updated, skipped = _run(compiled, lambda: applier.apply(plan, step))
        ref_opt.apply_gradients(zip(grads, reference))
        assert bool(updated) and not bool(skipped)
    for a, b in zip(ours, reference):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("bad", ["gradient", "loss", "verdict"])
def test_a_guarded_plan_with_a_non_finite_value_writes_nothing(compiled, bad):
    variables = _variables()
    opt = keras.optimizers.Adam(0.1)
    opt.build(variables)
    opt.apply_gradients(zip(_gradients(seed=5), variables))  # non-zero slots
    before = _state(variables, opt)
    loss = tf.constant(np.inf if bad == "loss" else 0.5)
    # "verdict": finite gradients, but the rule checked more than it applies and found a NaN
    finite = tf.constant(False) if bad == "verdict" else None
    plan = PlannedUpdate(opt, _gradients(bad=bad == "gradient"), variables, head="a", guarded=True,
                         loss=loss, finite=finite)
    updated, skipped = _run(compiled, lambda: Applier().apply(plan, tf.constant(0, tf.int64)))
    assert not bool(updated) and bool(skipped)
    for a, b in zip(_state(variables, opt), before):
        np.testing.assert_array_equal(a, b)  # variables, slots and iteration count


def test_an_unguarded_plan_applies_even_a_non_finite_gradient():
    variables = _variables()
    opt = keras.optimizers.SGD(0.1)
    opt.build(variables)
    plan = PlannedUpdate(opt, _gradients(bad=True), variables, head="a", loss=tf.constant(1.0))
    updated, skipped = Applier().apply(plan, tf.constant(0, tf.int64))
    assert bool(updated) and not bool(skipped)
    assert np.isnan(variables[1].numpy()[0])


@pytest.mark.parametrize("compiled", [False, True])
def test_a_head_is_updated_only_on_its_due_steps_and_its_gradient_taken_only_then(compiled):
    variables = _variables()
    opt = keras.optimizers.SGD(0.5)
    opt.build(variables)
    expected = [v.numpy().copy() for v in variables]
    taken = []
    applier = Applier()

    def gradients():
        taken.append(1)  # Python side effect: once per call eagerly, once per trace compiled
        return _gradients()

    for step in range(4):
        plan = PlannedUpdate(opt, gradients, variables, head="a", loss=tf.constant(0.0), every=3)
        updated, _ = _run(compiled, lambda: applier.apply(plan, tf.constant(step, tf.int64)))
        assert bool(updated) == (step % 3 == 0)
        if step % 3 == 0:  # SGD: w - lr * g, computed by hand
            expected = [e - np.float32(0.5) * g.numpy() for e, g in zip(expected, _gradients())]
        for v, e in zip(variables, expected):
            np.testing.assert_allclose(v.numpy(), e, rtol=1e-6)
    assert len(taken) == (2 if not compiled else 4)  # eagerly: only the due steps take it


def test_the_rules_condition_decides_and_a_plan_of_no_head_is_not_reported():
    variables, opt = _sgd(0.5)
    before = [v.numpy().copy() for v in variables]
    plans = [PlannedUpdate(opt, _gradients(), variables, due=tf.constant(False))]
    done = Applier().apply_all(plans, tf.constant(0, tf.int64))
    assert done.updated == {} and done.skipped == {}
    for v, b in zip(variables, before):
        np.testing.assert_array_equal(v.numpy(), b)


@pytest.mark.parametrize("due", [False, True])
def test_the_former_name_of_due_still_decides(due):
    # `PlannedUpdate.when` and `HeadsPass.active`/`takes_part` were renamed to `due`/`is_due`;
    # a user's rule written against the old names plans the same updates.
    variables, opt = _sgd(0.5)
    before = [v.numpy().copy() for v in variables]
    plan = PlannedUpdate(opt, _gradients(), variables, head="a", when=tf.constant(due))
    assert plan.when is plan.due and plan._replace(head="b").due is plan.due
    done = Applier().apply_all([plan], tf.constant(0, tf.int64))
    assert bool(done.updated["a"]) == due
    changed = [not np.array_equal(v.numpy(), b) for v, b in zip(variables, before)]
    assert changed == [due, due]
    heads_pass = multihead.HeadsPass((), {}, tf.constant(0), (), due={"a": tf.constant(due)})
    assert heads_pass.active is heads_pass.due and heads_pass.takes_part("a") is heads_pass.is_due("a")
    assert heads_pass.is_due("b") is None


# What a compiled step runs: the model, objectives, step, aggregation methods, monitoring, the
# RL updates and the loop (its callbacks run between calls; a constant baseline's own Adam, in
# experiments/, and the input pipeline's counters, in datasets/, are no step).
_STEP_PARTS = ("model", "objectives", "step", "aggregation", "monitoring", "rl", "training")
# The applier and its fused optimizer kernels (imported by no other module: checked below).
_WRITER = ("step/applier.py", "step/adam_sgd_ops.py")
# Writes that run eagerly, between calls of the step (a new loss weight between fits, the
# last step of a fit to log).
_EAGER = {"objectives/loss_weights.py:sync", "monitoring/cadence.py:log_last"}
_ASSIGNS = ("assign", "assign_add", "assign_sub", "scatter_update", "scatter_nd_update")


def _writes(path: pathlib.Path) -> list[tuple[str, int]]:
    """(enclosing function, line) of every optimizer write and state assign in `path`."""
    found = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            if isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute):
                attr, value = child.func.attr, child.func.value
                # x.apply_gradients(...) of any x (an optimizer, adam_sgd_ops); optimizer.apply(...)
                receiver = value.attr if isinstance(value, ast.Attribute) else getattr(value, "id", "")
                if (attr == "apply_gradients" or attr in _ASSIGNS
                        or (attr == "apply" and "optimizer" in receiver)):
                    found.append((function, child.lineno))
            visit(child, name)

    visit(ast.parse(path.read_text()), "")
    return found


def test_only_the_applier_writes_variables_inside_the_step():
    writers = []
    for path in sorted(p for part in _STEP_PARTS for p in (PACKAGE / part).rglob("*.py")):
        where = path.relative_to(PACKAGE).as_posix()
        if where in _WRITER or where.startswith("training/callbacks/"):
            continue
        writers += [f"{where}:{line}" for function, line in _writes(path)
                    if f"{where}:{function}" not in _EAGER]
    assert not writers, f"variables written outside step/applier.py: {writers}"
    importers = [p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")
                 if p.relative_to(PACKAGE).as_posix() not in _WRITER and any(
                     "adam_sgd_ops" in (getattr(node, "module", None) or "")
                     or any("adam_sgd_ops" in a.name for a in node.names)
                     for node in ast.walk(ast.parse(p.read_text()))
                     if isinstance(node, (ast.Import, ast.ImportFrom)))]
    assert not importers, f"the applier's optimizer kernels imported elsewhere: {importers}"


def test_the_ast_check_sees_a_write_and_its_function(tmp_path):
    path = tmp_path / "probe.py"
    path.write_text("def f(v):\n    v.assign(1)\n\ndef g(opt):\n    opt.apply_gradients([])\n")
    assert _writes(path) == [("f", 2), ("g", 5)]
