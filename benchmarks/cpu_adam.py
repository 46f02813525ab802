"""Throughput of torch's CPU Adam (foreach, fp32, one thread): the source of
``uvmlab.trace.offload.CPU_ADAM_PARAMS_PER_S`` (policy offload-optimizer). Prints a table.

Run: python benchmarks/cpu_adam.py [--params-m 25] [--repeats 5]
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--params-m", type=int, default=25, help="millions of parameters (1M per tensor)")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    params = [torch.zeros(1_000_000, requires_grad=True) for _ in range(args.params_m)]
    for p in params:
        p.grad = torch.randn(1_000_000)
    opt = torch.optim.Adam(params, lr=1e-4, foreach=True)
    opt.step()  # creates the state
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for _ in range(args.repeats):
        opt.step()
    cpu = (time.process_time() - cpu0) / args.repeats
    wall = (time.perf_counter() - wall0) / args.repeats
    n = args.params_m * 1e6
    print("| torch | threads | parameters | M params / CPU-second | M params / s wall |")
    print("|---|---|---|---|---|")
    print(f"| {torch.__version__} | 1 | {n:,.0f} | {n / cpu / 1e6:.1f} | {n / wall / 1e6:.1f} |")


if __name__ == "__main__":
    main()
