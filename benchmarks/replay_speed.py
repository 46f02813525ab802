"""Replay speed of the caching allocator simulator (goal: >= 500,000 events/s). Prints a table.

1. The largest real snapshot in ../shared/real-data/snapshots (by trace events): read_snapshot, then the replay
   of its events (initial state, simulation, comparison).
2. A synthetic 1,000,000-event stream (500k malloc + 500k free, sizes from a training-like mix, ~200 live
   tensors) driven straight through CachingAllocatorSim (the hot path), and the same stream through
   ``uvmlab.sim.allocator.placement.place`` (Trace -> tables, what the estimator and the UVM simulator call).

Run: python benchmarks/replay_speed.py [--events N]
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import pandas as pd

from uvmlab.console import print_table
from uvmlab.sim.allocator.caching import CachingAllocatorSim
from uvmlab.sim.allocator.nocache import NoCacheAllocatorSim
from uvmlab.sim.allocator.placement import place
from uvmlab.trace.schema import Trace

REAL = Path(__file__).resolve().parents[1].parent / "shared" / "real-data" / "snapshots"
MiB = 1 << 20


def synthetic_stream(n_events: int, seed: int = 0) -> list[tuple[bool, int, int]]:
    """(is_alloc, alloc_id, size) events: allocations with a bounded live set, then frees."""
    rng = random.Random(seed)
    sizes = [256, 4096, 65536, 512 * 1024, 2 * MiB, 8 * MiB, 16 * MiB, 64 * MiB, 200 * MiB]
    weights = [20, 20, 15, 10, 10, 10, 8, 5, 2]
    out: list[tuple[bool, int, int]] = []
    live: list[int] = []
    nid = 0
    while len(out) < n_events:
        if len(live) < 200 and (not live or rng.random() < 0.5 or len(out) < 400):
            size = rng.choices(sizes, weights)[0] + rng.randrange(0, 4096)
            out.append((True, nid, size))
            live.append(nid)
            nid += 1
        else:
            i = rng.randrange(len(live))
            live[i], live[-1] = live[-1], live[i]
            out.append((False, live.pop(), 0))
    return out


def run_direct(stream: list[tuple[bool, int, int]], sim) -> tuple[float, float]:
    """(wall seconds, CPU seconds) to drive the stream through sim."""
    blocks: dict[int, object] = {}
    c0 = time.process_time()
    t0 = time.perf_counter()
    malloc, free = sim.malloc, sim.free
    for is_alloc, aid, size in stream:
        if is_alloc:
            blocks[aid] = malloc(size)
        else:
            free(blocks.pop(aid))
    return time.perf_counter() - t0, time.process_time() - c0


def timed(fn):
    """(result, wall seconds, CPU seconds) of fn()."""
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0, time.process_time() - c0


def to_trace(stream: list[tuple[bool, int, int]]) -> Trace:
    rows: dict[int, list[int]] = {}
    for seq, (is_alloc, aid, size) in enumerate(stream):
        if is_alloc:
            rows[aid] = [aid, size, seq, -1]
        else:
            rows[aid][3] = seq
    df = pd.DataFrame(list(rows.values()), columns=["alloc_id", "size_bytes", "alloc_seq", "free_seq"])
    df["category"], df["phase"], df["iteration"], df["op"], df["stream"] = "activation", "forward", 0, "x", 0
    return Trace(allocations=df)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3, help="runs per case; the best CPU time is reported")
    args = ap.parse_args()
    rows = []
    if REAL.is_dir():
        from uvmlab.memory.replay import replay_device
        from uvmlab.memory.replay_state import device_events
        from uvmlab.sim.allocator.allocconf import AllocatorSettings
        from uvmlab.trace.snapshot import read_snapshot

        best, best_n = None, -1
        for p in sorted(REAL.glob("*.pickle")):
            n = len(read_snapshot(p).events)
            if n > best_n:
                best, best_n = p, n
        snap, w_read, c_read = timed(lambda: read_snapshot(best))
        rows.append(
            [f"real: {best.name[:60]} read_snapshot", len(snap.events), f"{w_read:.3f}", f"{c_read:.3f}", "", ""]
        )
        settings = AllocatorSettings.from_snapshot(snap.allocator_settings)
        devs = sorted({int(d) for d in snap.events["device"].unique()})
        best_c, w, ok, n = float("inf"), 0.0, True, 0
        for _ in range(args.repeat):
            res, w, c = timed(lambda: [replay_device(device_events(snap, d), settings, d) for d in devs])
            best_c = min(best_c, c)
            ok, n = all(r.identical for r in res), sum(r.events for r in res)
        rows.append(
            [
                "  replay (events -> identical check)",
                n,
                f"{w:.3f}",
                f"{best_c:.3f}",
                f"{n / best_c:,.0f}",
                "identical" if ok else "DIVERGED",
            ]
        )
    stream = synthetic_stream(args.events)
    for label, make in (
        ("synthetic: CachingAllocatorSim direct", CachingAllocatorSim),
        ("synthetic: expandable_segments:True", lambda: CachingAllocatorSim("expandable_segments:True")),
        ("synthetic: NoCacheAllocatorSim direct", NoCacheAllocatorSim),
    ):
        c = float("inf")
        for _ in range(args.repeat):
            sim = make()
            w, c1 = run_direct(stream, sim)
            c = min(c, c1)
        note = f"peak reserved {sim.peak_reserved_bytes / MiB:,.0f} MiB"
        rows.append([label, len(stream), f"{w:.3f}", f"{c:.3f}", f"{len(stream) / c:,.0f}", note])
    trace = to_trace(stream)
    p, w, c = timed(lambda: place(trace, "pca"))
    rows.append(["synthetic: place(trace, 'pca')", len(stream), f"{w:.3f}", f"{c:.3f}", f"{len(stream) / c:,.0f}", ""])
    print_table(
        "Allocator replay speed (goal >= 500,000 events/s); rates per CPU second (the wall clock on a shared machine"
        " is not the simulator's speed)",
        ["case", "events", "wall s", "CPU s", "events/CPU-s", "note"],
        rows,
    )


if __name__ == "__main__":
    main()
