"""Speed of `uvmlab advise` (issue 16 goal: gpt2 --oversub 4 under 30 s after the trace is cached).

Usage: python benchmarks/advise_speed.py [--workload gpt2] [--oversub 4]
The first call captures (and caches) every trace the advisor needs; the second, timed, call is the figure.
Prints a table of wall and CPU seconds, and the number of simulations run.
"""

from __future__ import annotations

import argparse
import time

from uvmlab.advise.advisor import advise
from uvmlab.config import RunConfig, WorkloadConfig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="gpt2")
    ap.add_argument("--oversub", type=float, default=4.0)
    args = ap.parse_args()
    cfg = RunConfig(workload=WorkloadConfig(args.workload), oversub=args.oversub, mode="sim")
    rows = []
    for label in ("cold (captures traces)", "warm (traces cached)"):
        w0, c0 = time.perf_counter(), time.process_time()
        adv = advise(cfg)
        rows.append((label, time.perf_counter() - w0, time.process_time() - c0, len(adv.rows)))
    print(f"| {'run':<24} | wall s | CPU s | policies |")
    print(f"|{'-' * 26}|--------|-------|----------|")
    for label, wall, cpu, n in rows:
        print(f"| {label:<24} | {wall:6.1f} | {cpu:5.1f} | {n:8d} |")


if __name__ == "__main__":
    main()
