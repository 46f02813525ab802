"""Releasing cached memory: release_block, release_available_cached_blocks, release_cached_blocks (empty_cache)
and garbage_collect_cached_blocks (reference/allocator.md 2.10, 2.11; PCA-2.5). Functions of a
CachingAllocatorSim, kept apart to keep the allocator module small.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import TYPE_CHECKING

from uvmlab.errors import InvariantError
from uvmlab.sim import expandable as _exp
from uvmlab.sim.blocks import SIZE_SHIFT, Block, Pool

if TYPE_CHECKING:
    from uvmlab.sim.caching import CachingAllocatorSim


def release_block(sim: CachingAllocatorSim, pool: Pool, b: Block) -> None:
    """cudaFree a whole free non-expandable segment."""
    seg = b.segment
    if b.prev is not None or b.next is not None or seg.expandable or b.size != seg.size:
        raise InvariantError(f"release_block on a split or expandable block {b!r}")  # PyTorch asserts too
    sim.num_device_free += 1
    sim._seg_log("segment_free", b.ptr, b.size, b.stream)
    sim.device.free(b.ptr)
    sim.reserved_bytes -= b.size
    sim.segment -= 1
    if b.size >= sim._max_split:
        sim.oversize_segments -= 1
    sim._remove(pool, b)
    del sim.segments[seg.address]


def release_available_cached_blocks(sim: CachingAllocatorSim, pool: Pool, stream: int, size: int) -> bool:
    """Free one big-enough over-size cached block, or over-size blocks from the largest down (2.11)."""
    if not sim.settings.max_split_set:
        return False
    m = sim._max_split
    key_size = max(size, m)
    sl = pool.blocks.get(stream)
    if not sl:
        return False
    idx = bisect_left(sl, key_size << SIZE_SHIFT)
    if idx < len(sl):
        _release_one(sim, pool, pool.by_key[sl[idx]])
        return True
    released = 0
    i = idx - 1
    while i >= 0 and released < key_size:
        b = pool.by_key[sl[i]]
        if b.size < m:
            break
        released += b.size
        _release_one(sim, pool, b)
        i -= 1
    return released >= key_size


def _release_one(sim: CachingAllocatorSim, pool: Pool, b: Block) -> None:
    if b.segment.expandable:  # PR #134338 (2.5+): release_available_cached_blocks skips expandable blocks
        return
    release_block(sim, pool, b)


def release_cached_blocks(sim: CachingAllocatorSim) -> None:
    """empty_cache / the last OOM step: release every unsplit free segment, unmap free expandable pages."""
    sim.num_sync_all_streams += 1
    _release_blocks(sim, sim.large_pool)
    _release_blocks(sim, sim.small_pool)


def _release_blocks(sim: CachingAllocatorSim, pool: Pool) -> None:
    to_unmap = []
    for b in pool.iter_blocks():
        if b.segment.expandable:
            to_unmap.append(b)
        elif b.prev is None and b.next is None:
            release_block(sim, pool, b)
    for b in to_unmap:
        _exp.unmap_block(sim, pool, b)
        if b.prev is None and b.next is None:
            _exp.release_expandable_segment(sim, pool, b)


def garbage_collect(sim: CachingAllocatorSim) -> None:
    """garbage_collect_cached_blocks (allocator.md 2.10): release old unsplit large blocks."""
    threshold = int(sim.settings.garbage_collection_threshold * sim._allowed_max)
    if sim.reserved_bytes <= threshold:
        return
    target = sim.reserved_bytes - threshold
    pool = sim.large_pool
    cands = [b for b in pool.iter_blocks() if not b.is_split and not b.segment.expandable]
    if not cands:
        return
    total_age = sum(pool.call_count - b.gc_base for b in cands)
    count = len(cands)
    reclaimed, freed = 0, True
    while reclaimed < target and freed and count > 0:
        threshold_age = total_age / count
        freed = False
        for b in pool.iter_blocks():
            if b.is_split or b.segment.expandable:
                continue
            age = pool.call_count - b.gc_base
            if age >= threshold_age:
                freed = True
                reclaimed += b.size
                total_age -= age
                count -= 1
                release_block(sim, pool, b)
