"""Expandable segments (``expandable_segments:True``), PCA-2.5 "Note [Expandable Segments]"; allocator.md 2.13.

One segment per (pool, stream) reserves VA for 9/8 of the device memory; physical pages (2 MiB small pool,
``large_segment_size`` = 20 MiB large pool) are mapped on demand at the lowest address that fits, and fully free
pages are unmapped by release_cached_blocks. Functions here operate on a CachingAllocatorSim (they are its
methods, split out to keep modules small).
"""

from __future__ import annotations

from uvmlab.errors import InvariantError
from uvmlab.sim.allocator.blocks import Block, Pool, Segment
from uvmlab.sim.allocator.constants import EXPANDABLE_VA_FACTOR_DEN, EXPANDABLE_VA_FACTOR_NUM, K_SMALL_BUFFER_BYTES


def _esize(b: Block) -> int:
    """Best-fit size of an expandable block: its size plus the unmapped range right after it."""
    n = b.next
    return b.size + (n.size if n is not None and not n.mapped else 0)


def best_expandable_fit(pool: Pool, sl: list[int], idx: int, b: Block) -> Block:
    """get_free_block's walk: prefer a following block whose expandable size is smaller (allocator.md 2.7)."""
    n = len(sl)
    while b.segment.expandable and idx + 1 < n:
        nb = pool.by_key[sl[idx + 1]]
        if _esize(nb) < _esize(b):
            b, idx = nb, idx + 1
        else:
            break
    return b


class ExpandableSegments:
    """CachingAllocatorSim's expandable-segment methods (a mixin: it uses the allocator's pools and counters)."""

    def _try_merge(self, pool: Pool, dst: Block, src: Block | None) -> int:
        """try_merge_blocks: absorb ``src`` into ``dst`` (same mapped state, src free); dst is in no set."""
        if src is None or src.allocated or dst.mapped != src.mapped:
            return 0
        if dst.prev is src:
            dst.ptr = src.ptr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size
        if src.mapped:
            self._remove(pool, src)
        else:
            pool.remove_unmapped(src)
        return src.size

    def _find_expandable_block(self, pool: Pool, stream: int, size: int) -> Block:
        usl = pool.unmapped.get(stream)
        if usl:
            for ptr in list(usl):
                c = pool.unmapped_by_ptr[ptr]
                if c.prev is not None and not c.prev.allocated:
                    c = c.prev
                total, b = 0, c
                while total < size and b is not None and not b.allocated:
                    total += b.size
                    b = b.next
                if total >= size:
                    return c
        page = K_SMALL_BUFFER_BYTES if pool.small else self.settings.large_segment_size_bytes
        total_mem = self.device.total_bytes
        va = total_mem * EXPANDABLE_VA_FACTOR_NUM // EXPANDABLE_VA_FACTOR_DEN
        va_size = (va + page - 1) // page * page
        addr = self.device.reserve_va(va_size)
        self._seg_counter += 1
        seg = Segment(addr, va_size, stream, pool.small, self._seg_counter, expandable=True)
        seg.page_bytes = page
        self.expandable_segments[addr] = seg
        cand = self._new_block(addr, va_size, stream, seg)
        cand.mapped = False
        pool.add_unmapped(cand)
        return cand

    def _map_block(self, pool: Pool, to_map: Block, size: int) -> bool:
        seg = to_map.segment
        page = seg.page_bytes
        off = to_map.ptr - seg.address
        begin = off // page
        end = (off + size + page - 1) // page
        mapped_size = (end - begin) * page
        if not self.device.map_pages(mapped_size):
            return False
        mapped_ptr = seg.address + begin * page
        if mapped_ptr != to_map.ptr:
            raise InvariantError(f"unmapped block {to_map!r} is not page aligned in {seg!r}")
        pool.remove_unmapped(to_map)
        to_map.mapped = True
        if mapped_size < to_map.size:
            rem = self._new_block(to_map.ptr + mapped_size, to_map.size - mapped_size, to_map.stream, seg)
            rem.mapped = False
            rem.prev, rem.next = to_map, to_map.next
            if to_map.next is not None:
                to_map.next.prev = rem
            to_map.next = rem
            pool.add_unmapped(rem)
            to_map.size = mapped_size
        self._try_merge(pool, to_map, to_map.prev)
        self._try_merge(pool, to_map, to_map.next)
        self._insert(pool, to_map)
        seg.mapped_bytes += mapped_size
        self._bump_reserved(mapped_size)
        self.num_device_alloc += 1
        self._seg_log("segment_map", mapped_ptr, mapped_size, to_map.stream)
        return True

    def _try_allocate_expandable_block(self, pool: Pool, stream: int, size: int) -> Block | None:
        """Map enough pages at the lowest fitting address and return the (free, unpooled) block to allocate."""
        c = self._find_expandable_block(pool, stream, size)
        if not c.mapped and not self._map_block(pool, c, min(c.size, size)):
            return None
        while c.size < size:
            nc = c.next
            if nc is None or not self._map_block(pool, nc, min(size - c.size, nc.size)):
                return None
            c = nc
        self._remove(pool, c)
        return c

    def _unmap_block(self, pool: Pool, block: Block) -> None:
        """Unmap the whole free pages of a free expandable block (SEGMENT_UNMAP)."""
        seg = block.segment
        page = seg.page_bytes
        base = seg.address
        begin = (block.ptr - base + page - 1) // page
        end = (block.ptr + block.size - base) // page
        if begin >= end:
            return
        self._remove(pool, block)
        uptr, usize = base + begin * page, (end - begin) * page
        before = uptr - block.ptr
        if before > 0:
            bf = self._new_block(block.ptr, before, block.stream, seg)
            bf.prev, bf.next = block.prev, block
            if block.prev is not None:
                block.prev.next = bf
            block.prev = bf
            self._insert(pool, bf)
        after = block.size - before - usize
        if after > 0:
            af = self._new_block(uptr + usize, after, block.stream, seg)
            af.prev, af.next = block, block.next
            if block.next is not None:
                block.next.prev = af
            block.next = af
            self._insert(pool, af)
        block.ptr, block.size, block.mapped = uptr, usize, False
        self._try_merge(pool, block, block.prev)
        self._try_merge(pool, block, block.next)
        pool.add_unmapped(block)
        seg.mapped_bytes -= usize
        self.reserved_bytes -= usize
        self.device.unmap_pages(usize)
        self.num_device_free += 1
        self._seg_log("segment_unmap", uptr, usize, block.stream)

    def _release_expandable_segment(self, pool: Pool, block: Block) -> None:
        """Free the VA reservation of an expandable segment that has nothing mapped any more."""
        seg = block.segment
        if block.size != seg.size or block.mapped:
            raise InvariantError(f"release_expandable_segment: {block!r} disagrees with {seg!r}")
        pool.remove_unmapped(block)
        del self.expandable_segments[seg.address]
        self.device.free_va(seg.address)
