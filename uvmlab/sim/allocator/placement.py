"""place(): replay a Trace through an allocator model and return where every tensor lives.

Both the UVM simulator and the estimator call this, so every PCA mode goes through the same code.

- ``blocks``: alloc_id, address, block_bytes (the allocator block: rounded, possibly with unsplit slack; the
  exact size for ``nocache``; 0 for a 0-byte tensor, which PyTorch never passes to the allocator), range_id
  (-1 for 0-byte tensors). Allocations after an OOM are not placed (no row).
- ``ranges``: the device ranges the driver manages (what UVM would see as cudaMallocManaged ranges):
  one per PCA segment (cudaMalloc), one per tensor for ``nocache``; for expandable segments one per mapping
  (``segment_map``); an unmap that cuts a mapping closes it and re-opens the mapped remainder as new ranges.
  With expandable segments a block's ``range_id`` is the mapping holding its first byte; the block may run on
  into the next mapping (the VA of one expandable segment is contiguous).
  Columns range_id, address, size_bytes, alloc_seq, free_seq (-1: still mapped at the end).
- ``timeline``: seq, allocated_bytes, reserved_bytes after each event.
"""

from __future__ import annotations

from bisect import bisect_right, insort
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from uvmlab.errors import InputError, OutOfMemoryError
from uvmlab.sim.allocator.allocconf import AllocatorSettings
from uvmlab.sim.allocator.caching import CachingAllocatorSim
from uvmlab.sim.allocator.device import DeviceSim
from uvmlab.sim.allocator.nocache import NoCacheAllocatorSim
from uvmlab.trace.schema import NEVER_FREED

ALLOCATORS = ("pca", "nocache")


@dataclass
class Placement:
    """Result of :func:`place` (tables described in the module docstring)."""

    blocks: pd.DataFrame
    ranges: pd.DataFrame
    timeline: pd.DataFrame
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    oom_seq: int | None
    allocator: str
    settings: AllocatorSettings | None
    stats: dict[str, int] = field(default_factory=dict)
    skipped_on_oom: int = 0
    """Allocations of ``skip_on_oom`` that did not fit and were dropped (see :func:`place`)."""


class _Ranges:
    """Open/closed device ranges keyed by start address (open ranges never overlap)."""

    def __init__(self) -> None:
        self.rows: list[list[int]] = []  # [range_id, address, size, alloc_seq, free_seq]
        self.open: dict[int, int] = {}  # address -> row index
        self.starts: list[int] = []  # sorted addresses of the open ranges

    def add(self, addr: int, size: int, seq: int) -> int:
        rid = len(self.rows)
        self.rows.append([rid, addr, size, seq, NEVER_FREED])
        self.open[addr] = rid
        insort(self.starts, addr)
        return rid

    def close(self, addr: int, seq: int) -> None:
        rid = self.open.pop(addr)
        del self.starts[bisect_right(self.starts, addr) - 1]
        self.rows[rid][4] = seq

    def unmap(self, addr: int, size: int, seq: int) -> None:
        """Close every open range overlapping [addr, addr+size); re-open the parts outside it."""
        end = addr + size
        for start in [s for s in self.open if s < end and s + self.rows[self.open[s]][2] > addr]:
            rid = self.open[start]
            rsize = self.rows[rid][2]
            self.close(start, seq)
            if start < addr:
                self.add(start, addr - start, seq)
            if start + rsize > end:
                self.add(end, start + rsize - end, seq)

    def find(self, addr: int) -> int:
        """The open range containing addr, or -1 (one bisect: open ranges do not overlap)."""
        i = bisect_right(self.starts, addr) - 1
        if i < 0:
            return -1
        rid = self.open[self.starts[i]]
        return rid if addr < self.starts[i] + self.rows[rid][2] else -1


def place(
    trace: Any,
    allocator: str = "pca",
    settings: AllocatorSettings | str | None = None,
    capacity_bytes: int | None = None,
    context_bytes: int = 0,
    release_at_seqs: Sequence[int] = (),
    skip_on_oom: Collection[int] = (),
) -> Placement:
    """Replay ``trace`` (a uvmlab Trace) through the ``pca`` or ``nocache`` model; see the module docstring.

    With ``capacity_bytes`` the device is that big (minus ``context_bytes``) and the OOM path runs as on a real
    device; ``oom_seq`` is the seq of the allocation that failed (the replay stops there).
    ``release_at_seqs``: ``torch.cuda.empty_cache()`` runs just before the first event at or after each of these
    seqs (e.g. the first event of every iteration: cached blocks released between iterations).
    ``skip_on_oom``: alloc ids whose OOM is caught by the caller and does not stop the run (cuDNN convolution
    workspaces: PyTorch's ``try_configs`` catches ``c10::OutOfMemoryError`` and runs the next engine config,
    aten/src/ATen/native/cudnn/Conv_v8.cpp at 06ca69ca); such an allocation is dropped (size 0, the fallback
    engine's workspace taken as 0: APPROXIMATION) and counted in ``skipped_on_oom``.
    """
    if allocator not in ALLOCATORS:
        raise InputError(f"unknown allocator {allocator!r}; use one of {ALLOCATORS}")
    if isinstance(settings, str):
        settings = AllocatorSettings.parse(settings)
    device = DeviceSim(capacity_bytes, context_bytes)
    if allocator == "pca":
        sim: Any = CachingAllocatorSim(settings, device)
        settings = sim.settings
    else:
        sim = NoCacheAllocatorSim(device)
        settings = None
    ev = trace.events()
    ranges = _Ranges()
    live: dict[int, Any] = {}
    b_ids: list[int] = []
    b_addr: list[int] = []
    b_bytes: list[int] = []
    b_rid: list[int] = []
    t_alloc: list[int] = []
    t_res: list[int] = []
    oom_seq: int | None = None
    skipped = 0
    fallible = set(skip_on_oom)
    seen = 0
    seg_events = sim.segment_events
    expandable = settings is not None and settings.expandable_segments
    malloc, free, open_ranges = sim.malloc, sim.free, ranges.open
    add_id, add_addr, add_bytes, add_rid = b_ids.append, b_addr.append, b_bytes.append, b_rid.append
    add_alloc, add_res = t_alloc.append, t_res.append
    seqs = ev["seq"].tolist()
    releases = sorted(release_at_seqs, reverse=True)
    next_release = releases.pop() if releases else None
    for seq, alloc_id, size, is_alloc, stream in zip(
        seqs,
        ev["alloc_id"].tolist(),
        ev["size_bytes"].tolist(),
        ev["is_alloc"].tolist(),
        ev["stream"].tolist(),
        strict=True,
    ):
        if next_release is not None and seq >= next_release:
            sim.empty_cache()
            seen = _sync_ranges(seg_events, seen, ranges, seq)
            while next_release is not None and seq >= next_release:
                next_release = releases.pop() if releases else None
        if is_alloc:
            b = None
            if size > 0:
                try:
                    b = malloc(size, stream)
                except OutOfMemoryError:
                    if alloc_id not in fallible:
                        oom_seq = seq
                        _sync_ranges(seg_events, seen, ranges, seq)
                        break
                    skipped += 1  # the caller's fallback: no block (a failed malloc may still free cached ones)
                    if len(seg_events) > seen:
                        seen = _sync_ranges(seg_events, seen, ranges, seq)
            if b is None:
                add_id(alloc_id)
                add_addr(0)
                add_bytes(0)
                add_rid(-1)
                live[alloc_id] = None
            else:
                live[alloc_id] = b
                if len(seg_events) > seen:
                    seen = _sync_ranges(seg_events, seen, ranges, seq)
                add_id(alloc_id)
                add_addr(b.ptr)
                add_bytes(b.size)
                add_rid(ranges.find(b.ptr) if expandable else open_ranges[b.segment.address])
        else:
            b = live.pop(alloc_id, None)
            if b is not None:
                free(b)
                if len(seg_events) > seen:
                    seen = _sync_ranges(seg_events, seen, ranges, seq)
        add_alloc(sim.allocated_bytes)
        add_res(sim.reserved_bytes)
    t_seq = seqs[: len(t_alloc)]
    blocks = pd.DataFrame(
        {"alloc_id": b_ids, "address": b_addr, "block_bytes": b_bytes, "range_id": b_rid}, dtype="int64"
    )
    rng = pd.DataFrame(
        ranges.rows, columns=["range_id", "address", "size_bytes", "alloc_seq", "free_seq"], dtype="int64"
    )
    timeline = pd.DataFrame({"seq": t_seq, "allocated_bytes": t_alloc, "reserved_bytes": t_res}, dtype="int64")
    return Placement(
        blocks=blocks,
        ranges=rng,
        timeline=timeline,
        peak_allocated_bytes=sim.peak_allocated_bytes,
        peak_reserved_bytes=sim.peak_reserved_bytes,
        oom_seq=oom_seq,
        allocator=allocator,
        settings=settings,
        stats=sim.stats,
        skipped_on_oom=skipped,
    )


def _sync_ranges(seg_events: list, seen: int, ranges: _Ranges, seq: int) -> int:
    """Apply the allocator's new segment events to the range table."""
    for _, action, addr, size, _ in seg_events[seen:]:
        if action in ("segment_alloc", "segment_map"):
            ranges.add(addr, size, seq)
        elif action == "segment_free":
            ranges.close(addr, seq)
        else:
            ranges.unmap(addr, size, seq)
    return len(seg_events)
