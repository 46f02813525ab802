"""Seed a CachingAllocatorSim with segments that exist before a replay starts (snapshot replays)."""

from __future__ import annotations

from uvmlab.errors import InputError
from uvmlab.sim.allocator.blocks import Segment


class SegmentSeeding:
    """CachingAllocatorSim's seeding of pre-existing segments for snapshot replays (a mixin)."""

    def seed_segment(
        self,
        address: int,
        size: int,
        stream: int,
        small: bool,
        allocated: list[tuple[int, int, int]],
    ) -> list:
        """Add a non-expandable segment holding ``allocated`` blocks (ptr, block_size, requested_size); the gaps
        between them become free blocks in the pool. Returns the allocated Block objects (address order)."""
        self._seg_counter += 1
        seg = Segment(address, size, stream, small, self._seg_counter)
        pool = self.small_pool if small else self.large_pool
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
        self.device.adopt(address, size)
        self.segments[address] = seg
        out, prev = [], None
        for ptr, bsize, req in pieces:
            b = self._new_block(ptr, bsize, stream, seg)
            b.prev = prev
            if prev is not None:
                prev.next = b
            prev = b
            if req is None:
                self._insert(pool, b)
            else:
                b.allocated = True
                b.requested_size = req
                self.active_blocks[ptr] = b
                self.allocation += 1
                self.allocated_bytes += bsize
                self.requested_bytes += req
                out.append(b)
        self.segment += 1
        self._bump_reserved(size)
        self.peak_segment = max(self.peak_segment, self.segment)
        self.peak_allocation = max(self.peak_allocation, self.allocation)
        self.peak_allocated_bytes = max(self.peak_allocated_bytes, self.allocated_bytes)
        self.peak_requested_bytes = max(self.peak_requested_bytes, self.requested_bytes)
        return out
