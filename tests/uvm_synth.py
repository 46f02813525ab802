"""Synthetic traces and placements for the UVM simulator tests (no torch, no other helper's modules)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd

from uvmlab.trace.schema import NEVER_FREED, Trace
from uvmlab.units import MiB


def make_trace(n_iter: int = 3, param_mb: int = 8, act_mb: int = 4, n_layers: int = 3) -> Trace:
    """A toy training loop: parameters (setup copy), per iteration an input copy, forward activations that
    backward frees, gradients, and an optimizer step; one global seq."""
    allocs: list[dict] = []
    kernels: list[dict] = []
    accesses: list[dict] = []
    seq = [0]

    def nxt() -> int:
        seq[0] += 1
        return seq[0]

    def alloc(size: int, cat: str, phase: str, it: int) -> dict:
        a = {
            "alloc_id": len(allocs),
            "size_bytes": size,
            "alloc_seq": nxt(),
            "free_seq": NEVER_FREED,
            "category": cat,
            "phase": phase,
            "iteration": it,
            "op": "x",
            "stream": 0,
        }
        allocs.append(a)
        return a

    def kernel(name: str, phase: str, it: int, reads: list[dict], writes: list[dict], flops: float = 1e6) -> None:
        k = {
            "kernel_id": len(kernels),
            "seq": nxt(),
            "name": name,
            "phase": phase,
            "iteration": it,
            "flops": flops,
            "stream": 0,
        }
        kernels.append(k)
        for a in reads:
            accesses.append(
                {
                    "kernel_id": k["kernel_id"],
                    "alloc_id": a["alloc_id"],
                    "offset_bytes": 0,
                    "size_bytes": a["size_bytes"],
                    "is_write": False,
                }
            )
        for a in writes:
            accesses.append(
                {
                    "kernel_id": k["kernel_id"],
                    "alloc_id": a["alloc_id"],
                    "offset_bytes": 0,
                    "size_bytes": a["size_bytes"],
                    "is_write": True,
                }
            )

    def free(a: dict) -> None:
        a["free_seq"] = nxt()

    params = [alloc(param_mb * MiB, "parameter", "setup", -1) for _ in range(n_layers)]
    for p in params:
        kernel("normal_", "setup", -1, [], [p])
    state = [alloc(param_mb * MiB, "optimizer_state", "setup", -1) for _ in range(n_layers)]
    for st in state:
        kernel("zero_", "setup", -1, [], [st])
    for it in range(n_iter):
        x = alloc(act_mb * MiB, "input", "data", it)
        kernel("copy_", "data", it, [], [x])
        acts = [x]
        for p in params:
            y = alloc(act_mb * MiB, "activation", "forward", it)
            kernel("addmm", "forward", it, [acts[-1], p], [y], flops=1e9)
            acts.append(y)
        grads = []
        for li in reversed(range(n_layers)):
            g = alloc(param_mb * MiB, "gradient", "backward", it)
            kernel("mm", "backward", it, [acts[li], acts[li + 1]], [g], flops=1e9)
            grads.append(g)
            free(acts[li + 1])
        free(x)
        for p, g, s in zip(params, reversed(grads), state, strict=True):
            kernel("adam", "optimizer", it, [p, g, s], [p, s])
        for g in grads:
            free(g)
    return Trace(
        allocations=pd.DataFrame(allocs),
        kernels=pd.DataFrame(kernels),
        accesses=pd.DataFrame(accesses),
        header={"workload": "toy"},
    )


def nocache_placement(trace: Trace) -> SimpleNamespace:
    """PCA off: every allocation is its own managed range."""
    a = trace.allocations
    addr = np.cumsum(np.concatenate([[0], ((a["size_bytes"].to_numpy() + 2 * MiB - 1) // (2 * MiB)) * 2 * MiB]))[:-1]
    addr = addr + 0x7F0000000000
    blocks = pd.DataFrame(
        {"alloc_id": a["alloc_id"], "address": addr, "block_bytes": a["size_bytes"], "range_id": a["alloc_id"]}
    )
    ranges = pd.DataFrame(
        {
            "range_id": a["alloc_id"],
            "address": addr,
            "size_bytes": a["size_bytes"],
            "alloc_seq": a["alloc_seq"],
            "free_seq": a["free_seq"],
        }
    )
    return SimpleNamespace(blocks=blocks, ranges=ranges, peak_allocated_bytes=0, peak_reserved_bytes=0)


def pool_placement(trace: Trace) -> SimpleNamespace:
    """PCA on, crudely: one segment per size class that only grows (first-fit reuse of freed slots of equal size);
    segments are never freed. Enough to give the 'dead data stays resident' behaviour."""
    events = trace.events()
    slots: dict[int, list[tuple[int, int]]] = {}  # size -> [(range_id, busy_alloc or -1)]
    where: dict[int, tuple[int, int]] = {}
    ranges = []
    blocks = []
    base = 0x7F0000000000
    for ev in events.itertuples():
        size = int(ev.size_bytes)
        if ev.is_alloc:
            lst = slots.setdefault(size, [])
            for i, (rid, busy) in enumerate(lst):
                if busy < 0:
                    lst[i] = (rid, ev.alloc_id)
                    break
            else:
                rid = len(ranges)
                seg = -(-size // (2 * MiB)) * 2 * MiB
                ranges.append(
                    {
                        "range_id": rid,
                        "address": base,
                        "size_bytes": seg,
                        "alloc_seq": int(ev.seq),
                        "free_seq": NEVER_FREED,
                    }
                )
                base += seg
                lst.append((rid, ev.alloc_id))
            where[ev.alloc_id] = (rid, size)
            r = ranges[rid]
            blocks.append({"alloc_id": ev.alloc_id, "address": r["address"], "block_bytes": size, "range_id": rid})
        else:
            lst = slots[size]
            for i, (rid, busy) in enumerate(lst):
                if busy == ev.alloc_id:
                    lst[i] = (rid, -1)
    return SimpleNamespace(blocks=pd.DataFrame(blocks), ranges=pd.DataFrame(ranges))


def live_range(sizes: dict[int, int], index: int, offset: int, size: int) -> tuple[int, int, int]:
    """For random-operation tests: the live range ``index`` picks (modulo their count, by id), ``offset`` folded into
    it and ``size`` cut at its end: (range id, offset, size). ``sizes``: live range id -> bytes (not empty)."""
    live = sorted(sizes)
    rid = live[index % len(live)]
    off = offset % sizes[rid]
    return rid, off, min(size, sizes[rid] - off)


def run_one_gemm(sim, gpu, rows: list, flops: float, layouts: str = "", name: str = "aten::mm"):  # type: ignore[no-untyped-def]
    """Replay one fp32 GEMM kernel ``name`` touching ``rows`` on ``sim`` (ranges mapped by the caller) on ``gpu``,
    with the trace column ``layout`` ``layouts`` ("" none); the replayer, after checking the simulator's
    invariants."""
    from uvmlab.sim.uvm.replay import _KernelStatics, _Replayer

    st = _KernelStatics(
        kernel_bytes=np.array([sum(r[2] for r in rows)]),
        native_ns=np.zeros(1),
        allocated_bytes=np.zeros(1, dtype="int64"),
        is_copy=np.zeros(1, dtype=bool),
        api=[""],
        names=[name],
        flops=np.array([float(flops)]),
        layouts=[layouts] if layouts else [],
    )
    rp = _Replayer(sim, sim.costs, 1, "fp32", gpu)
    rp.kernel(0, rows, st)
    sim.check_invariants()
    return rp
