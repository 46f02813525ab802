"""Footprint what-if analysis for the seed grid: working sets, knees, and a cold pad (analysis only, not a knob).

The oversubscription factor is footprint / GPU memory available to UVM (``uvmlab.uvm.simulate.prepare``: available =
footprint / factor, the study's balloon), so a working set of ``ws`` bytes stops fitting beyond the factor
``footprint / ws`` (its *knee*). :func:`working_sets` measures, from the trace's own kernel accesses through the
placement, the chunk-rounded bytes of the 2 MiB VA blocks each kernel touches and the union over each phase of one
steady iteration. :func:`pad_cold` adds never-touched managed ranges so that the footprint equals a target (the
study's Table 2 value, seeds/003): an explanation experiment with the validation target's measured footprint, used
by ``benchmarks/uvm_grid.py --pad-to-study`` and ``tools/uvm_knee.py`` only. No CLI option or default uses it.

Approximation: the pad is one range allocated at the first allocation's seq and never freed or touched; under
cudaMallocManaged untouched pages are populated nowhere (``UvmSim.map_range``), so the pad only raises the
footprint, hence the available memory at every factor. With PCA on it stands for a cached segment (no blocks in
it), with PCA off for a live tensor no kernel reads.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pandas as pd

from uvmlab.errors import InputError
from uvmlab.sim.uvm.knobs import BIG_PAGE_BYTES, VA_BLOCK_BYTES
from uvmlab.sim.uvm.replay import copy_kernels, managed_chunk_bytes, peak_managed_bytes
from uvmlab.trace.schema import NEVER_FREED

PHASES = ("forward", "backward", "optimizer")


def pad_pieces(pad: int) -> list[int]:
    """Sizes of the managed ranges whose driver-rounded sizes (``knobs.rounded_tail_bytes``) sum to ``pad`` (a
    multiple of 64 KiB): the whole 2 MiB blocks in one range, the rest as ranges of 64 KiB x 2^i (one per set bit),
    since a single range's last block is rounded to 64 KiB x 2^i."""
    full = pad // VA_BLOCK_BYTES * VA_BLOCK_BYTES
    tail = (pad - full) // BIG_PAGE_BYTES
    pieces = [full] if full else []
    pieces += [BIG_PAGE_BYTES << i for i in range(tail.bit_length()) if tail >> i & 1]
    return pieces


def pad_cold(prep: Any, target_bytes: int, oversub: float = 1.0) -> tuple[Any, int]:
    """``prep`` (a ``uvmlab.uvm.simulate.Prepared``) with cold managed ranges padding its footprint to
    ``target_bytes``.

    Returns the new Prepared (footprint = target, available = target / ``oversub``, capped at the GPU's usable
    memory) and the pad's size; pad 0 and ``prep`` unchanged when the footprint already reaches the target.
    The pad is a multiple of 64 KiB (footprints and targets are); it is one range when its size is whole 2 MiB
    blocks, plus one range per power of two of its 64 KiB remainder (:func:`pad_pieces`), so that the chunk-rounded
    sizes add up to it.
    """
    ranges = prep.placement.ranges
    pad = int(target_bytes) - int(prep.footprint_bytes)
    if pad <= 0:
        return prep, 0
    if pad % BIG_PAGE_BYTES:
        raise InputError(f"footprint pad {pad} bytes is not a multiple of 64 KiB: give the target in whole MiB")
    end = int((ranges["address"] + ranges["size_bytes"]).max()) if len(ranges) else 0
    address = -(-end // VA_BLOCK_BYTES) * VA_BLOCK_BYTES + VA_BLOCK_BYTES  # a gap: no range is adjacent
    first = int(ranges["alloc_seq"].min()) if len(ranges) else 0
    next_id = int(ranges["range_id"].max()) + 1 if len(ranges) else 0
    rows = []
    for i, size in enumerate(pad_pieces(pad)):
        rows.append(
            {
                "range_id": next_id + i,
                "address": address,
                "size_bytes": size,
                "alloc_seq": first,
                "free_seq": NEVER_FREED,
            }
        )
        address += -(-size // VA_BLOCK_BYTES) * VA_BLOCK_BYTES + VA_BLOCK_BYTES
    pad_rows = pd.DataFrame(rows, columns=ranges.columns).astype(ranges.dtypes.to_dict())  # a new column: fails
    padded = pd.concat([ranges, pad_rows], ignore_index=True)
    reserved = prep.placement.peak_reserved_bytes + (pad if prep.placement.allocator == "pca" else 0)  # a segment
    placement = dataclasses.replace(prep.placement, ranges=padded, peak_reserved_bytes=reserved)
    footprint = peak_managed_bytes(padded)
    available = min(int(footprint / oversub), prep.gpu.usable_bytes)
    return dataclasses.replace(prep, placement=placement, footprint_bytes=footprint, available_bytes=available), pad


def study_target_bytes(study_mib: float) -> int:
    """The study's footprint (Table 2, MiB) in bytes, rounded down to whole 64 KiB big pages."""
    return int(study_mib * 2**20) // BIG_PAGE_BYTES * BIG_PAGE_BYTES


def _block_table(prep: Any) -> pd.DataFrame:
    """Every access as the (range, VA block) pairs it touches, with each block's chunk bytes and the kernel."""
    trace, placement = prep.trace, prep.placement
    acc = trace.accesses[trace.accesses["size_bytes"] > 0]
    acc = acc[~acc["kernel_id"].isin(copy_kernels(trace))]
    acc = acc.merge(placement.blocks[["alloc_id", "range_id", "address"]], on="alloc_id").dropna(subset=["range_id"])
    rng = placement.ranges[["range_id", "address", "size_bytes"]].rename(
        columns={"address": "range_address", "size_bytes": "range_bytes"}
    )
    acc = acc.merge(rng, on="range_id")
    off = (acc["address"] - acc["range_address"] + acc["offset_bytes"]).to_numpy(dtype=np.int64)
    b0 = off // VA_BLOCK_BYTES
    b1 = (off + acc["size_bytes"].to_numpy(dtype=np.int64) - 1) // VA_BLOCK_BYTES
    n = (b1 - b0 + 1).astype(np.int64)
    rep = np.repeat(np.arange(len(acc)), n)
    blk = np.repeat(b0, n) + (np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n))
    rbytes = acc["range_bytes"].to_numpy(dtype=np.int64)[rep]
    rest = rbytes - blk * VA_BLOCK_BYTES
    chunk = np.where(rest >= VA_BLOCK_BYTES, VA_BLOCK_BYTES, managed_chunk_bytes(np.maximum(rest, 0)))
    out = pd.DataFrame(
        {
            "kernel_id": acc["kernel_id"].to_numpy()[rep],
            "range_id": acc["range_id"].to_numpy(dtype=np.int64)[rep],
            "block": blk,
            "chunk": chunk,
        }
    )
    return out.merge(trace.kernels[["kernel_id", "iteration", "phase"]], on="kernel_id")


def working_sets(prep: Any, iteration: int | None = None) -> dict[str, int]:
    """Chunk-rounded bytes of the 2 MiB VA blocks touched in one steady iteration (default: the last one).

    Keys: ``kernel_max`` (the largest single kernel), ``<phase>_union`` for each of :data:`PHASES` (blocks touched
    anywhere in that phase: the cyclic sweep's size), ``<phase>_kernel_max`` and ``iteration_union``.
    With PCA off a freed tensor's range is not reused, so a union also counts ranges that were never live together:
    there it is the volume the phase touches (an upper bound on what must be resident at once); with PCA on the
    segments persist and the union is the set of blocks the phase cycles through.
    """
    t = _block_table(prep)
    if iteration is None:
        iteration = int(t["iteration"].max())
    t = t[t["iteration"] == iteration].drop_duplicates(["kernel_id", "range_id", "block"])

    def union(d: pd.DataFrame) -> int:
        return int(d.drop_duplicates(["range_id", "block"])["chunk"].sum())

    per_kernel = t.groupby("kernel_id")["chunk"].sum()
    out = {"iteration": iteration, "kernel_max": int(per_kernel.max()) if len(per_kernel) else 0}
    for ph in PHASES:
        d = t[t["phase"] == ph]
        out[f"{ph}_union"] = union(d)
        pk = d.groupby("kernel_id")["chunk"].sum()
        out[f"{ph}_kernel_max"] = int(pk.max()) if len(pk) else 0
    out["iteration_union"] = union(t)
    return out


def knee(footprint_bytes: float, ws_bytes: float) -> float:
    """The oversubscription factor beyond which ``ws_bytes`` no longer fits (footprint / working set)."""
    return float(footprint_bytes) / ws_bytes if ws_bytes > 0 else float("inf")
