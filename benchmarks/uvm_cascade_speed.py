"""Speed of the concurrent engine on kernels that fault 1e7-1e8 times, and the error of its steady-state
extrapolation (issue 41 section 5; uvmlab.sim.uvm.concurrent, ``UvmKnobs.cascade_steady``).

Part 1 (goal: a kernel that faults 1e8 times in <= 60 s CPU): the shipped uvmbench program file
(``workloads/files/uvmbench.py``, seq_stream: 65,536 threads, one access per 4 KiB page of two arrays) over a working
set far beyond the GPU, the prefetcher off (one fault per page), one launch, through the general replay (automatic
``sim_scale``), with the extrapolation on. Part 2 (the error): smaller kernels of the same kinds, and a round-robin
cascade (``stream_priority`` rotate: every page refaults), simulated round by round and extrapolated; every counter
and the time compared.

    python benchmarks/uvm_cascade_speed.py [--quick]
"""

from __future__ import annotations

import argparse
import time

from rich.console import Console
from rich.table import Table

GiB = 1 << 30


def uvmbench(size_factor: float, total_gib: float, available_gib: float, steady: bool, **knobs: object) -> dict:
    """seq_stream over ``size_factor x total_gib`` on ``available_gib`` of GPU memory (2 warm-ups and one timed
    launch, as the file runs it): the timed launch's counters and the whole run's CPU seconds."""
    from uvmlab.uvm.simulate import shipped_config, simulate

    opts = {"kernel": "seq_stream", "size_factor": size_factor, "total_bytes": int(total_gib * GiB)}
    prefetch = bool(knobs.pop("prefetch_enable", True))
    sim_options = {"cascade_steady": int(steady), **knobs}
    cfg = shipped_config(
        "uvmbench", opts, "H200", int(total_gib * GiB), iterations=1, prefetch=prefetch, sim_options=sim_options
    )
    c0 = time.process_time()
    _, res, result = simulate(cfg, available_bytes=int(available_gib * GiB))
    cpu = time.process_time() - c0
    k = res.kernels
    last = k[k["name"].str.endswith("_kernel")].iloc[-1]
    return {
        "faults": float(last["fault_count"]),
        "raw": float(last["raw_fault_entries"]),
        "htod": float(last["htod_bytes"]),
        "dtoh": float(last["dtoh_bytes"]),
        "ms": float(last["duration_ns"]) / 1e6,
        "cpu": cpu,
        "scale": result["sim_scale"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="part 2 only")
    args = ap.parse_args()
    con = Console()
    if not args.quick:
        t = Table(title="a kernel that faults ~1e8 times (uvmbench seq_stream, prefetcher off; CPU of 3 launches)")
        for c in ("working set", "GPU", "faults", "kernel time", "sim scale", "CPU s", "goal"):
            t.add_column(c)
        r = uvmbench(25.0, 16, 8, True, prefetch_enable=False)
        row = ("400 GiB", "8 GiB", f"{r['faults']:.3g}", f"{r['ms'] / 1e3:.1f} s", str(r["scale"]), f"{r['cpu']:.1f}")
        t.add_row(*row, "<= 60 s CPU")
        con.print(t)
    t = Table(title="steady-state extrapolation against the full simulation (the timed launch)")
    for c in ("case", "faults (full)", "faults", "HtoD", "DtoH", "time", "CPU full / extrapolated"):
        t.add_column(c)
    cases = [
        ("seq_stream 16 GiB on 2 GiB, prefetcher off", (4.0, 4, 2, {"prefetch_enable": False})),
        ("seq_stream 16 GiB on 2 GiB", (4.0, 4, 2, {})),
        ("seq_stream 8 GiB on 3 GiB, rotate (a cascade)", (2.0, 4, 3, {"stream_priority": "rotate"})),
    ]
    for name, (f, tot, avail, kn) in cases:
        full = uvmbench(f, tot, avail, False, **kn)
        fast = uvmbench(f, tot, avail, True, **kn)
        rel = {x: fast[x] / full[x] - 1 if full[x] else 0.0 for x in ("faults", "htod", "dtoh", "ms")}
        t.add_row(
            name,
            f"{full['faults']:.3g}",
            f"{rel['faults']:+.1%}",
            f"{rel['htod']:+.1%}",
            f"{rel['dtoh']:+.1%}",
            f"{rel['ms']:+.1%}",
            f"{full['cpu']:.1f} / {fast['cpu']:.1f}",
        )
    con.print(t)


if __name__ == "__main__":
    main()
