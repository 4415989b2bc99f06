"""Fused optimizer updates (`Trainer(fused_updates=True)`) against Keras' Adam and TF1.

TF1's `AdamOptimizer` updates each variable with one fused kernel
(`ResourceApplyAdam`); Keras 3's Adam makes several elementwise passes. This
script measures, side by side in one process (medians of interleaved repeats,
the load average printed), the setting of `benchmarks/step_throughput.py`
(trunk Dense 64->w->w relu, K Dense(1) heads, batch 256), by default at width
2048, K=4:

* `Trainer.step` with `fused_updates=True` against the default (Keras' Adam), and
  the classic TF1 step (`sess.run` of K `AdamOptimizer.minimize` ops);
* `Trainer.fit` (fused and default) against TF1's `feed_dict` loop, end to end;
* the per-head Adam updates alone (fixed gradients): Keras, the fused kernel, and
  one vectorised update over the K heads' stacked slots (the alternative design);
* how far fused weights are from the default's after 1 and 50 steps from identical
  weights (max |w_fused - w_default|, and the largest ||w_fused - w_default|| /
  ||w_default|| over the variables).

The kernel computes `1 - beta` in float32 (1 - 0.999f = 0.00099998713), Keras in
float64 before the cast (0.001f): a 1.3e-5 relative difference in the second
moment, which Adam's normalisation amplifies wherever a gradient is near zero.

    taskset -c 1 python benchmarks/fused_adam.py                 # width 2048, K=4
    taskset -c 1 python benchmarks/fused_adam.py --width 256 --repeats 5
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from multihead import _keras_internals as internals  # noqa: E402
from multihead.step import adam_sgd_ops  # noqa: E402

import keras  # noqa: E402

import multihead as mh  # noqa: E402
from _timing import interleaved_medians, table  # noqa: E402
from step_throughput import (LR, TF1, HandTF2, batch, calls_for, constant_batch,  # noqa: E402
                             initial_weights, keras_parts, pipeline)


def fused_adam(optimizer, grads, variables) -> None:
    """`optimizer`'s Adam update through TF1's fused kernel, on `optimizer`'s own slots
    (what `fused_updates=True` runs)."""
    adam_sgd_ops.apply_gradients(optimizer, grads, variables, fused=True)


def stacked_adam(optimizers, grads, var_lists) -> None:
    """The alternative: the K heads' Adam updates of each shared variable as one vectorised
    update over their stacked slots (stack, one update, unstack into the slots), the
    heads' own variables one by one. Same formula as the kernel."""
    opts = list(optimizers.values())
    opt = opts[0]
    step = tf.cast(opt.iterations + 1, tf.float32)
    alpha = opt.learning_rate * tf.sqrt(1 - opt.beta_2 ** step) / (1 - opt.beta_1 ** step)
    shared = [v for v in next(iter(var_lists.values())) if all(
        any(v is w for w in vl) for vl in var_lists.values())]
    for i, var in enumerate(shared):
        slots = [internals.adam_slots(o, var) for o in opts]
        m = tf.stack([s[0].value for s in slots])
        v = tf.stack([s[1].value for s in slots])
        g = tf.stack([grads[h][i] for h in optimizers])
        m = m + (g - m) * (1 - opt.beta_1)
        v = v + (tf.square(g) - v) * (1 - opt.beta_2)
        var.assign_sub(tf.reduce_sum(m * alpha / (tf.sqrt(v) + opt.epsilon), axis=0))
        for k, (mk, vk, _) in enumerate(slots):
            mk.assign(m[k])
            vk.assign(v[k])
    for h, o in optimizers.items():
        own = [(g, v) for g, v in zip(grads[h], var_lists[h]) if not any(v is w for w in shared)]
        fused_adam(o, [g for g, _ in own], [v for _, v in own])


class Variant(HandTF2):
    """(a), with the Adam update, the fused kernel, or no update at all (gradients only)."""

    def __init__(self, init, width, update):
        self.update = update
        super().__init__(init, width)

    def _step(self, x, ys):
        with tf.GradientTape(persistent=True) as tape:
            feats = self.trunk(x, training=True)
            losses = {h: tf.reduce_mean(tf.square(ys[h] - head(feats, training=True)))
                      for h, head in self.heads.items()}
        done = []
        for h, opt in self.opts.items():
            grads = tape.gradient(losses[h], self.var_lists[h])
            if self.update == "keras":
                opt.apply_gradients(zip(grads, self.var_lists[h]))
            elif self.update == "fused":
                fused_adam(opt, grads, self.var_lists[h])
            else:
                done.append(tf.add_n([tf.reduce_sum(g) for g in grads]))
        del tape
        return done or losses

    def apply_only(self, grads):
        if self.update == "stacked":
            stacked_adam(self.opts, grads, self.var_lists)
            return
        for h, opt in self.opts.items():
            if self.update == "keras":
                opt.apply_gradients(zip(grads[h], self.var_lists[h]))
            else:
                fused_adam(opt, grads[h], self.var_lists[h])


def trainer(init, width, fused):
    trunk, heads = keras_parts(init, width)
    model = mh.MultiHeadModel(trunk, heads)
    model.build((None, init["trunk"][0].shape[0]))
    return mh.Trainer(model, {h: mh.Objective("mse", keras.optimizers.Adam(LR)) for h in heads},
                      fused_updates=fused)


def weights(t):
    return [v.numpy() for v in t.model.trunk_variables] + [
        v.numpy() for h in t.model.head_names for v in t.model.head_variables(h)]


def distance(k, width, xt, yt, steps):
    """(max |w_fused - w_default|, max over variables of ||w_fused - w_default|| / ||w_default||)
    after `steps`."""
    init = initial_weights(k, width)
    default, fused = trainer(init, width, False), trainer(init, width, True)
    for _ in range(steps):
        default.step((xt, yt))
        fused.step((xt, yt))
    pairs = list(zip(weights(fused), weights(default)))
    return (max(float(np.max(np.abs(a - b))) for a, b in pairs),
            max(float(np.linalg.norm(a - b) / np.linalg.norm(b)) for a, b in pairs))


def updates_section(k, width, repeats):
    init = initial_weights(k, width)
    keras_u, fused_u, stacked_u = (Variant(init, width, u) for u in ("keras", "fused", "stacked"))
    rng = np.random.default_rng(3)
    grads = {h: [tf.constant(rng.standard_normal(v.shape).astype("float32")) for v in keras_u.var_lists[h]]
             for h in keras_u.heads}
    variants = {f"Adam updates only, {u}": (lambda f: lambda: f(grads))(tf.function(v.apply_only))
                for u, v in (("Keras", keras_u), ("fused kernel", fused_u), ("stacked slots", stacked_u))}
    for fn in variants.values():
        fn()
    return interleaved_medians(variants, calls_for(next(iter(variants.values()))), repeats)


def trainer_section(k, width, size, repeats, fit_steps):
    init = initial_weights(k, width)
    x, ys, xt, yt = constant_batch(k, size)
    default, fused, tf1 = trainer(init, width, False), trainer(init, width, True), TF1(init, width)
    fit_default, fit_fused = trainer(init, width, False), trainer(init, width, True)
    ds = pipeline(k, size)
    x_all, ys_all = batch(k, size * 64, seed=2)
    rng = np.random.default_rng(0)

    def tf1_loop():  # the classic input path: a permutation per epoch, fancy-indexed batches
        order = rng.permutation(len(x_all))
        for i in range(fit_steps):
            idx = order[(i * size) % len(x_all):][:size]
            out = tf1.step(x_all[idx], {h: y[idx] for h, y in ys_all.items()})
        return out

    variants = {
        "Trainer.step, default (Keras Adam)": lambda: default.step((xt, yt)),
        "Trainer.step, fused_updates=True": lambda: fused.step((xt, yt)),
        "TF1 step (sess.run, feed_dict)": lambda: tf1.step(x, ys),
    }
    for fn in variants.values():
        fn()
    t = interleaved_medians(variants, calls_for(variants["TF1 step (sess.run, feed_dict)"]), repeats)
    loops = {
        f"Trainer.fit {fit_steps} steps, default": lambda: fit_default.fit(ds, steps=fit_steps, verbose=False),
        f"Trainer.fit {fit_steps} steps, fused": lambda: fit_fused.fit(ds, steps=fit_steps, verbose=False),
        f"TF1 feed_dict loop {fit_steps} steps": tf1_loop,
    }
    for fn in loops.values():
        fn()
    t.update(interleaved_medians(loops, 1, repeats))
    return t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--fit-steps", type=int, default=20)
    args = parser.parse_args()
    k, width = args.heads, args.width
    _, _, xt, yt = constant_batch(k, args.batch)
    load = os.getloadavg()
    print(f"K={k}, trunk 64->{width}->{width}, batch {args.batch}; medians of {args.repeats} "
          f"interleaved repeats; load average before {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, "
          f"{os.cpu_count()} cores, allowed {sorted(os.sched_getaffinity(0))}", flush=True)
    first, fifty = distance(k, width, xt, yt, 1), distance(k, width, xt, yt, 50)
    t = trainer_section(k, width, args.batch, args.repeats, args.fit_steps)
    t.update(updates_section(k, width, args.repeats))
    rows = [["variant", "ms per call"]] + [[name, f"{s * 1e3:.2f}"] for name, s in t.items()]
    print(table(rows))
    step_d, step_f = t["Trainer.step, default (Keras Adam)"], t["Trainer.step, fused_updates=True"]
    fit_d = t[f"Trainer.fit {args.fit_steps} steps, default"]
    fit_f = t[f"Trainer.fit {args.fit_steps} steps, fused"]
    tf1_step, tf1_fit = t["TF1 step (sess.run, feed_dict)"], t[f"TF1 feed_dict loop {args.fit_steps} steps"]
    u = {name.rpartition(", ")[2]: s for name, s in t.items() if name.startswith("Adam updates only")}
    print(f"fused vs default: Trainer.step {step_d / step_f:.2f}x, fit {fit_d / fit_f:.2f}x faster")
    print(f"speed vs TF1 (TF1's time / ours): step fused {tf1_step / step_f:.2f}x "
          f"(default {tf1_step / step_d:.2f}x); fit fused {tf1_fit / fit_f:.2f}x "
          f"(default {tf1_fit / fit_d:.2f}x)")
    print(f"updates only vs Keras: fused kernel {u['Keras'] / u['fused kernel']:.2f}x, "
          f"stacked slots {u['Keras'] / u['stacked slots']:.2f}x faster")
    print(f"weights, fused vs default Trainer: after 1 step max|diff| {first[0]:.1e} "
          f"(relative, L2 per variable: {first[1]:.1e}); after 50 steps {fifty[0]:.1e} ({fifty[1]:.1e})")
    load = os.getloadavg()
    print(f"load average after {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    main()
