"""Seed a CachingAllocatorSim with segments that exist before a replay starts (snapshot replays)."""

from __future__ import annotations

from uvmlab.errors import InputError
from uvmlab.sim.blocks import Segment
from uvmlab.sim.caching import CachingAllocatorSim


def seed_segment(
    sim: CachingAllocatorSim,
    address: int,
    size: int,
    stream: int,
    small: bool,
    allocated: list[tuple[int, int, int]],
) -> list:
    """Add a non-expandable segment holding ``allocated`` blocks (ptr, block_size, requested_size); the gaps
    between them become free blocks in the pool. Returns the allocated Block objects (address order)."""
    sim._seg_counter += 1
    seg = Segment(address, size, stream, small, sim._seg_counter)
    pool = sim.small_pool if small else sim.large_pool
    pieces: list[tuple[int, int, int | None]] = []
    pos = address
    for ptr, bsize, req in sorted(allocated):
        if ptr < pos or ptr + bsize > address + size:
            raise InputError(f"block {ptr:#x}+{bsize} overlaps its neighbour or leaves segment {address:#x}+{size}")
        if ptr > pos:
            pieces.append((pos, ptr - pos, None))
        pieces.append((ptr, bsize, req))
        pos = ptr + bsize
    if pos < address + size:
        pieces.append((pos, address + size - pos, None))
    sim.device.adopt(address, size)
    sim.segments[address] = seg
    out, prev = [], None
    for ptr, bsize, req in pieces:
        b = sim._new_block(ptr, bsize, stream, seg)
        b.prev = prev
        if prev is not None:
            prev.next = b
        prev = b
        if req is None:
            sim._insert(pool, b)
        else:
            b.allocated = True
            b.requested_size = req
            sim.active_blocks[ptr] = b
            sim.allocation += 1
            sim.allocated_bytes += bsize
            sim.requested_bytes += req
            out.append(b)
    sim.segment += 1
    sim._bump_reserved(size)
    sim.peak_segment = max(sim.peak_segment, sim.segment)
    sim.peak_allocation = max(sim.peak_allocation, sim.allocation)
    sim.peak_allocated_bytes = max(sim.peak_allocated_bytes, sim.allocated_bytes)
    sim.peak_requested_bytes = max(sim.peak_requested_bytes, sim.requested_bytes)
    return out
