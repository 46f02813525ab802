"""Releasing cached memory: release_block, release_available_cached_blocks, release_cached_blocks (empty_cache)
and garbage_collect_cached_blocks (reference/allocator.md 2.10, 2.11; PCA-2.5). Functions of a
CachingAllocatorSim (its mixin ``CachedBlockRelease``), kept apart to keep the allocator module small.
"""

from __future__ import annotations

from bisect import bisect_left

from uvmlab.errors import InvariantError
from uvmlab.sim.allocator.blocks import SIZE_SHIFT, Block, Pool


class CachedBlockRelease:
    """CachingAllocatorSim's release paths (a mixin: it uses the allocator's pools, device and counters)."""

    def _release_block(self, pool: Pool, b: Block) -> None:
        """cudaFree a whole free non-expandable segment."""
        seg = b.segment
        if b.prev is not None or b.next is not None or seg.expandable or b.size != seg.size:
            raise InvariantError(f"release_block on a split or expandable block {b!r}")  # PyTorch asserts too
        self.num_device_free += 1
        self._seg_log("segment_free", b.ptr, b.size, b.stream)
        self.device.free(b.ptr)
        self.reserved_bytes -= b.size
        self.segment -= 1
        if b.size >= self._max_split:
            self.oversize_segments -= 1
        self._remove(pool, b)
        del self.segments[seg.address]

    def _release_available_cached_blocks(self, pool: Pool, stream: int, size: int) -> bool:
        """Free one big-enough over-size cached block, or over-size blocks from the largest down (2.11)."""
        if not self.settings.max_split_set:
            return False
        m = self._max_split
        key_size = max(size, m)
        sl = pool.blocks.get(stream)
        if not sl:
            return False
        idx = bisect_left(sl, key_size << SIZE_SHIFT)
        if idx < len(sl):
            self._release_one(pool, pool.by_key[sl[idx]])
            return True
        released = 0
        i = idx - 1
        while i >= 0 and released < key_size:
            b = pool.by_key[sl[i]]
            if b.size < m:
                break
            released += b.size
            self._release_one(pool, b)
            i -= 1
        return released >= key_size

    def _release_one(self, pool: Pool, b: Block) -> None:
        if b.segment.expandable:  # PR #134338 (2.5+): release_available_cached_blocks skips expandable blocks
            return
        self._release_block(pool, b)

    def _release_cached_blocks(self) -> None:
        """empty_cache / the last OOM step: release every unsplit free segment, unmap free expandable pages."""
        self.num_sync_all_streams += 1
        self._release_blocks(self.large_pool)
        self._release_blocks(self.small_pool)

    def _release_blocks(self, pool: Pool) -> None:
        to_unmap = []
        for b in pool.iter_blocks():
            if b.segment.expandable:
                to_unmap.append(b)
            elif b.prev is None and b.next is None:
                self._release_block(pool, b)
        for b in to_unmap:
            self._unmap_block(pool, b)
            if b.prev is None and b.next is None:
                self._release_expandable_segment(pool, b)

    def _garbage_collect(self) -> None:
        """garbage_collect_cached_blocks (allocator.md 2.10): release old unsplit large blocks."""
        threshold = int(self.settings.garbage_collection_threshold * self._allowed_max)
        if self.reserved_bytes <= threshold:
            return
        target = self.reserved_bytes - threshold
        pool = self.large_pool
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
                    self._release_block(pool, b)
