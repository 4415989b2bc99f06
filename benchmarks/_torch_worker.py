"""Hand-written PyTorch steps for `benchmarks/torch_peers.py`, run by the peers' own Python (a
separate venv with torch: never a dependency of multihead).

The model of `_timing.mlp_model`: trunk Linear(in, W) relu, Linear(W, W) relu, K Linear(W, 1)
heads, MSE per head, Adam(1e-3). Two steps:

  summed    one loss (the sum of the K losses), one backward, one Adam on every parameter
            (LibMTL's EW step without its framework around it);
  per_head  K backward passes, K Adams each on trunk + its head (this project's default).

Protocol: argv = K IN_DIM WIDTH BATCH; then lines on stdin `VARIANT CALLS`, each answered with
one line `wall_seconds cpu_seconds` for CALLS steps; `quit` ends.
"""

from __future__ import annotations

import sys
import time


def main() -> int:
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    k, in_dim, width, batch = (int(a) for a in sys.argv[1:5])
    trunk = torch.nn.Sequential(torch.nn.Linear(in_dim, width), torch.nn.ReLU(),
                                torch.nn.Linear(width, width), torch.nn.ReLU())
    heads = torch.nn.ModuleList(torch.nn.Linear(width, 1) for _ in range(k))
    x = torch.randn(batch, in_dim)
    y = [torch.randn(batch, 1) for _ in range(k)]
    everything = list(trunk.parameters()) + list(heads.parameters())
    summed_opt = torch.optim.Adam(everything, 1e-3)
    head_opts = [torch.optim.Adam(list(trunk.parameters()) + list(h.parameters()), 1e-3)
                 for h in heads]

    def summed() -> None:
        summed_opt.zero_grad(set_to_none=True)
        features = trunk(x)
        loss = sum(torch.nn.functional.mse_loss(h(features), t) for h, t in zip(heads, y))
        loss.backward()
        summed_opt.step()

    def per_head() -> None:
        for head, target, opt in zip(heads, y, head_opts):
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(head(trunk(x)), target).backward()
            opt.step()

    steps = {"summed": summed, "per_head": per_head}
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        step, calls = steps[words[0]], int(words[1])
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(calls):
            step()
        print(f"{time.perf_counter() - wall} {time.process_time() - cpu}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
