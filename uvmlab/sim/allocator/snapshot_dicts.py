"""Simulated allocator state as PyTorch snapshot dicts (allocator.md section 3), for write_snapshot.

``time_us`` of a simulated trace entry is its index in the event log (there is no clock in the allocator model)
and ``frames`` are empty lists; ``uvmlab.export.snapshot.annotate`` then adds op/category/phase/iteration frames
and, for ``uvmlab run``, the simulated time.
"""

from __future__ import annotations

from typing import Any


def _block_dict(b: Any) -> dict[str, Any]:
    return {
        "address": b.ptr,
        "size": b.size,
        "requested_size": b.requested_size,
        "state": "active_allocated" if b.allocated else "inactive",
        "frames": [],
    }


def segment_dict(device: int, blocks: list[Any], seg: Any) -> dict[str, Any]:
    """One snapshot segment dict made of ``blocks`` (address order) of ``seg``."""
    alloc = sum(b.size for b in blocks if b.allocated)
    return {
        "device": device,
        "address": blocks[0].ptr,
        "total_size": sum(b.size for b in blocks),
        "allocated_size": alloc,
        "active_size": alloc,
        "requested_size": sum(b.requested_size for b in blocks if b.allocated),
        "stream": seg.stream,
        "segment_type": "small" if seg.small else "large",
        "segment_pool_id": (0, 0),
        "is_expandable": seg.expandable,
        "frames": [],
        "blocks": [_block_dict(b) for b in blocks],
    }


def trace_entry(action: str, addr: int, size: int, stream: int, index: int) -> dict[str, Any]:
    """One TraceEntry dict; an ``oom`` entry carries ``device_free`` instead of ``addr``."""
    if action == "oom":
        return {"action": action, "device_free": addr, "size": size, "stream": stream, "time_us": index, "frames": []}
    return {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": index, "frames": []}


def device_traces(sim: Any) -> list[list[dict[str, Any]]]:
    """The simulator's event log as ``device_traces`` (every action with ``record_events``, else the segment
    events), empty lists for the devices before ``sim.device_index``."""
    if sim.record_events:
        log = sim.events
    else:
        log = [(a, addr, size, stream) for _, a, addr, size, stream in sim.segment_events]
    trace = [trace_entry(a, addr, size, stream, i) for i, (a, addr, size, stream) in enumerate(log)]
    return [[] for _ in range(sim.device_index)] + [trace]


class SnapshotExport:
    """CachingAllocatorSim's export to PyTorch's snapshot format (a mixin)."""

    def to_snapshot_dicts(self) -> tuple[list[dict[str, Any]], list[list[dict[str, Any]]]]:
        """(segments, device_traces): one segment per cudaMalloc, or per contiguous mapped range if expandable."""
        by_seg: dict[Any, list[Any]] = {}
        for b in self.all_blocks():
            by_seg.setdefault(b.segment, []).append(b)
        segments = []
        for seg, blocks in by_seg.items():
            blocks.sort(key=lambda b: b.ptr)
            run: list[Any] = []
            for b in blocks:
                if b.mapped:
                    run.append(b)
                elif run:
                    segments.append(segment_dict(self.device_index, run, seg))
                    run = []
            if run:
                segments.append(segment_dict(self.device_index, run, seg))
        segments.sort(key=lambda s: s["address"])
        return segments, device_traces(self)
