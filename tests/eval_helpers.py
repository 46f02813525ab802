"""Synthetic traces and jobs shared by the evaluation tests (evaluation, planner, fragmentation, collocation)."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from uvmlab.memory.colocate import Job
from uvmlab.trace.schema import NEVER_FREED, Trace


def make_trace(ops: list[tuple[int, int]], phases: list[str] | None = None) -> Trace:
    """ops: (size_bytes, lifetime in events; 0 = never freed). Allocation i happens at event i's slot."""
    rows = []
    seq = 0
    pending: list[tuple[int, int]] = []  # (free at step, alloc index)
    for i, (size, life) in enumerate(ops):
        for f in sorted(p for p in pending if p[0] <= i):
            rows[f[1]]["free_seq"] = seq
            seq += 1
            pending.remove(f)
        phase = phases[i] if phases else "forward"
        rows.append(
            {
                "alloc_id": i,
                "size_bytes": size,
                "alloc_seq": seq,
                "free_seq": NEVER_FREED,
                "category": "activation",
                "phase": phase,
                "iteration": 0,
                "op": "x",
                "stream": 0,
            }
        )
        seq += 1
        if life:
            pending.append((i + life, i))
    for f in sorted(pending):
        rows[f[1]]["free_seq"] = seq
        seq += 1
    t = Trace(allocations=pd.DataFrame(rows).astype({"iteration": "int32", "stream": "int32"}))
    t.validate()
    return t


@dataclass
class FakePlacement:
    """One managed range per tensor (what the nocache allocator does), for unit tests of the loop."""

    blocks: pd.DataFrame
    ranges: pd.DataFrame
    peak_reserved_bytes: int


def synthetic_job(name: str, n_tensors: int, tensor_bytes: int, n_kernels: int) -> Job:
    """n_tensors live all run; each kernel reads every tensor and writes the first one."""
    alloc = pd.DataFrame(
        {
            "alloc_id": range(n_tensors),
            "size_bytes": tensor_bytes,
            "alloc_seq": range(n_tensors),
            "free_seq": NEVER_FREED,
            "category": "activation",
            "phase": "forward",
            "iteration": 0,
            "op": "x",
            "stream": 0,
        }
    ).astype({"iteration": "int32", "stream": "int32"})
    kernels = pd.DataFrame(
        {
            "kernel_id": range(n_kernels),
            "seq": range(n_tensors, n_tensors + n_kernels),
            "name": "k",
            "phase": "forward",
            "iteration": 0,
            "flops": 1e9,
            "stream": 0,
        }
    ).astype({"iteration": "int32", "stream": "int32"})
    acc = pd.DataFrame(
        [(k, t, 0, tensor_bytes, t == 0) for k in range(n_kernels) for t in range(n_tensors)],
        columns=["kernel_id", "alloc_id", "offset_bytes", "size_bytes", "is_write"],
    )
    trace = Trace(allocations=alloc, kernels=kernels, accesses=acc)
    blocks = pd.DataFrame(
        {
            "alloc_id": range(n_tensors),
            "address": [i * tensor_bytes for i in range(n_tensors)],
            "block_bytes": tensor_bytes,
            "range_id": range(n_tensors),
        }
    )
    ranges = pd.DataFrame(
        {
            "range_id": range(n_tensors),
            "address": blocks["address"],
            "size_bytes": tensor_bytes,
            "alloc_seq": range(n_tensors),
            "free_seq": NEVER_FREED,
        }
    )
    return Job(name, None, trace, FakePlacement(blocks, ranges, n_tensors * tensor_bytes))
