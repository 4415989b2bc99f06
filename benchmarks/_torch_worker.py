"""PyTorch steps for `benchmarks/torch_peers.py`, run by the peers' own Python (a separate venv
with torch, optionally LibMTL: never dependencies of multihead).

The model of `_timing.mlp_model`: trunk Linear(in, W) relu, Linear(W, W) relu, K Linear(W, 1)
heads, MSE per head, Adam(1e-3). Three steps:

  summed     hand-written: one loss (the sum of the K losses), one backward, one Adam on every
             parameter (LibMTL's EW step without its framework around it);
  per_head   hand-written: K backward passes, K Adams each on trunk + its head (this project's
             default);
  libmtl_ew  LibMTL's own `Trainer` (weighting `EW`, architecture `HPS`, optimizer 'adam'), its
             training loop body without the data loader: forward, `process_preds`,
             `_compute_loss` (LibMTL's loss objects, which record each loss's `.item()`),
             `meter.update` (a metric that computes nothing: the user's metric is not timed),
             `optimizer.zero_grad()`, `model.backward(losses)` (EW), `optimizer.step()`.
             Built on first use, so the other steps run without LibMTL.

Protocol: argv = K IN_DIM WIDTH BATCH; then lines on stdin `VARIANT CALLS`, each answered with
one line `wall_seconds cpu_seconds` for CALLS steps; `quit` ends. With argv = `check` K IN_DIM
WIDTH BATCH instead, it prints one line: `ok LIBMTL_VERSION MAX_ABS_DIFF` (every parameter
after 3 LibMTL EW steps against 3 summed steps from the same weights) or `error: WHY`.
"""

from __future__ import annotations

import contextlib
import copy
import sys
import time
import types


def import_libmtl():
    """Import LibMTL. Its PyPI release (1.1.5) imports `torchvision.models.utils`'s
    `load_state_dict_from_url` at import time (for its ResNets' pretrained weights, not on the EW
    path), a module torchvision removed in 0.11 (LibMTL issue #62; its GitHub head falls back to
    `torch.hub`): where it is missing, it is pointed at `torch.hub.load_state_dict_from_url`."""
    import importlib

    import torch

    try:
        importlib.import_module("torchvision.models.utils")
    except ImportError:
        shim = types.ModuleType("torchvision.models.utils")
        shim.load_state_dict_from_url = torch.hub.load_state_dict_from_url
        for name in ("torchvision", "torchvision.models"):
            try:
                __import__(name)
            except ImportError:
                sys.modules[name] = types.ModuleType(name)
        sys.modules["torchvision.models.utils"] = shim
    import LibMTL

    return LibMTL


def libmtl_ew(trunk, heads):
    """A LibMTL `Trainer` (EW, HPS, Adam 1e-3) whose encoder and decoders start from copies of
    `trunk` and `heads`: (the trainer, {task name: head index}, its loop body as a function of
    (x, {task name: target}))."""
    import torch

    LibMTL = import_libmtl()
    from LibMTL.loss import AbsLoss
    from LibMTL.metrics import AbsMetric

    class MSELoss(AbsLoss):  # LibMTL's GitHub head has this class; its 1.1.5 release does not
        def __init__(self):
            super().__init__()
            self.loss_fn = torch.nn.MSELoss()

        def compute_loss(self, pred, gt):
            return self.loss_fn(pred, gt)

    class NoMetric(AbsMetric):
        def update_fun(self, pred, gt):
            pass

        def score_fun(self):
            return [0.0]

    class CPUTrainer(LibMTL.Trainer):
        def _prepare_model(self, *args):
            self.device = torch.device("cpu")  # its __init__ sets cuda:0 just before this call
            super()._prepare_model(*args)

    names = [f"h{i}" for i in range(len(heads))]
    task_dict = {n: {"metrics": ["none"], "metrics_fn": NoMetric(), "loss_fn": MSELoss(),
                     "weight": [0]} for n in names}
    with contextlib.redirect_stdout(sys.stderr):  # it prints its parameter count and log format
        trainer = CPUTrainer(
            task_dict=task_dict, weighting=LibMTL.weighting.EW,
            architecture=LibMTL.architecture.HPS,
            encoder_class=lambda: copy.deepcopy(trunk),
            decoders=torch.nn.ModuleDict({n: copy.deepcopy(h) for n, h in zip(names, heads)}),
            rep_grad=False, multi_input=False, optim_param={"optim": "adam", "lr": 1e-3},
            scheduler_param=None, weight_args={}, arch_args={})
    trainer.model.train()

    def step(x, gts) -> None:  # LibMTL 1.1.5's Trainer.train loop body, not multi_input
        preds = trainer.process_preds(trainer.model(x))
        losses = trainer._compute_loss(preds, gts)
        trainer.meter.update(preds, gts)
        trainer.optimizer.zero_grad()
        trainer.model.backward(losses, **trainer.kwargs["weight_args"])
        trainer.optimizer.step()

    return trainer, dict(zip(names, range(len(names)))), step


def build(k: int, in_dim: int, width: int, batch: int):
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    trunk = torch.nn.Sequential(torch.nn.Linear(in_dim, width), torch.nn.ReLU(),
                                torch.nn.Linear(width, width), torch.nn.ReLU())
    heads = torch.nn.ModuleList(torch.nn.Linear(width, 1) for _ in range(k))
    x = torch.randn(batch, in_dim)
    y = [torch.randn(batch, 1) for _ in range(k)]
    return trunk, heads, x, y


def summed_step(trunk, heads, x, y):
    import torch

    opt = torch.optim.Adam(list(trunk.parameters()) + list(heads.parameters()), 1e-3)

    def summed() -> None:
        opt.zero_grad(set_to_none=True)
        features = trunk(x)
        loss = sum(torch.nn.functional.mse_loss(h(features), t) for h, t in zip(heads, y))
        loss.backward()
        opt.step()

    return summed


def check(k: int, in_dim: int, width: int, batch: int) -> str:
    """LibMTL's EW step against the summed step, 3 steps each from the same weights."""
    try:
        import_libmtl()
        trunk, heads, x, y = build(k, in_dim, width, batch)
        trainer, index, step = libmtl_ew(trunk, heads)
        gts = {n: y[i] for n, i in index.items()}
        summed = summed_step(trunk, heads, x, y)
        before = [p.detach().clone() for p in trunk.parameters()]
        for _ in range(3):
            step(x, gts)
            summed()
        model = trainer.model
        pairs = list(zip(model.encoder.parameters(), trunk.parameters()))
        for n, i in index.items():
            pairs += list(zip(model.decoders[n].parameters(), heads[i].parameters()))
        moved = max(float((a - b.detach()).abs().max()) for a, b in zip(before, trunk.parameters()))
        if moved == 0:
            return "error: the summed steps did not move the trunk"
        from importlib.metadata import version

        diff = max(float((a - b).detach().abs().max()) for a, b in pairs)
        return f"ok {version('LibMTL')} {diff:.3g}"
    except Exception as error:  # noqa: BLE001 - reported to the parent in one line
        return f"error: {type(error).__name__}: {error}".splitlines()[0]


def main() -> int:
    import torch

    if sys.argv[1] == "check":
        print(check(*(int(a) for a in sys.argv[2:6])), flush=True)
        return 0
    k, in_dim, width, batch = (int(a) for a in sys.argv[1:5])
    trunk, heads, x, y = build(k, in_dim, width, batch)
    head_opts = [torch.optim.Adam(list(trunk.parameters()) + list(h.parameters()), 1e-3)
                 for h in heads]

    def per_head() -> None:
        for head, target, opt in zip(heads, y, head_opts):
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(head(trunk(x)), target).backward()
            opt.step()

    start = copy.deepcopy(trunk), copy.deepcopy(heads)  # LibMTL's copy of the starting weights
    steps = {"summed": summed_step(trunk, heads, x, y), "per_head": per_head}
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        if words[0] == "libmtl_ew" and "libmtl_ew" not in steps:
            _, index, libmtl_step = libmtl_ew(*start)
            gts = {n: y[i] for n, i in index.items()}
            steps["libmtl_ew"] = lambda: libmtl_step(x, gts)
        run, calls = steps[words[0]], int(words[1])
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(calls):
            run()
        print(f"{time.perf_counter() - wall} {time.process_time() - cpu}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
