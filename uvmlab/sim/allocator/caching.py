"""CachingAllocatorSim: PyTorch's CUDACachingAllocator (the default "native" backend) on the CPU.

Follows reference/allocator.md section 2 (PCA-2.5 unless a setting picks main26 behaviour): round_size with
roundup_power2_divisions, small/large pools, segment sizes, best fit by (stream, size, tie), split rules,
coalescing, max_split_size and the over-size rule, garbage_collection_threshold with a memory fraction, the OOM
path (free-memory callbacks are a no-op, release_available_cached_blocks, release_cached_blocks, retry) and
expandable segments (``expandable.py``). Device memory, addresses and cudaMalloc failures come from
:class:`~uvmlab.sim.allocator.device.DeviceSim`.

Not modelled (approximations, also in docs/allocator.md): record_stream / cross-stream deferred frees (every
free completes at once, as in all 48 real traces), CUDA-graph and MemPool private pools, IPC, the main26 OOM
rejection policy and MemPool fallback, ``mallocWithHint``.
"""

from __future__ import annotations

from bisect import bisect_left, insort

from uvmlab.errors import InputError, OutOfMemoryError
from uvmlab.sim.allocator.allocconf import AllocatorSettings
from uvmlab.sim.allocator.blocks import SEG_COUNTER_SHIFT, SIZE_SHIFT, Block, Pool, Segment
from uvmlab.sim.allocator.checks import InvariantChecks
from uvmlab.sim.allocator.constants import K_MIN_BLOCK_SIZE_BYTES, K_SMALL_SIZE_BYTES
from uvmlab.sim.allocator.device import DeviceSim
from uvmlab.sim.allocator.expandable import ExpandableSegments, best_expandable_fit
from uvmlab.sim.allocator.release import CachedBlockRelease
from uvmlab.sim.allocator.rounding import allocation_size, round_size
from uvmlab.sim.allocator.seed import SegmentSeeding
from uvmlab.sim.allocator.snapshot_dicts import SnapshotExport

STAT_NAMES = (
    "allocated_bytes",
    "reserved_bytes",
    "requested_bytes",
    "allocation",
    "segment",
)
"""Stats with current and peak values, named as in ``torch.cuda.memory_stats`` (``<name>.all.current``)."""


class CachingAllocatorSim(ExpandableSegments, CachedBlockRelease, SegmentSeeding, InvariantChecks, SnapshotExport):
    """One device's caching allocator. ``malloc(size, stream) -> Block``, ``free(block)``, ``empty_cache()``.

    One class: its expandable-segment, release, seeding, invariant-check and snapshot-export methods live in the
    mixins of ``uvmlab.sim.allocator`` (expandable, release, seed, checks, snapshot_dicts) to keep modules small.
    """

    def __init__(
        self,
        settings: AllocatorSettings | str | None = None,
        device: DeviceSim | None = None,
        *,
        record_events: bool = False,
        device_index: int = 0,
    ):
        if settings is None or isinstance(settings, str):
            settings = AllocatorSettings.parse(settings or "")
        if settings.backend != "native":
            raise InputError(f"allocator backend {settings.backend!r} is not modelled; only the native one is")
        self.settings = settings
        self.device = device if device is not None else DeviceSim()
        self.device_index = device_index
        self.small_pool = Pool(small=True)
        self.large_pool = Pool(small=False)
        self.active_blocks: dict[int, Block] = {}  # ptr -> allocated block
        self.segments: dict[int, Segment] = {}  # address -> cudaMalloc'd segment (non-expandable)
        self.expandable_segments: dict[int, Segment] = {}  # VA address -> expandable segment
        self._divisions = settings.roundup_power2_divisions if any(settings.roundup_power2_divisions) else None
        self._max_split = settings.max_split_size_bytes
        self._bypass = settings.roundup_bypass_threshold_bytes
        self._tie = settings.tie_break
        self._addr_tie = settings.tie_break == "address"
        self._expandable = settings.expandable_segments
        self._gc_on = settings.memory_fraction is not None and settings.garbage_collection_threshold > 0
        self._allowed_max = (
            int(settings.memory_fraction * self.device.total_bytes) if settings.memory_fraction is not None else None
        )
        self._counter = 0
        self._seg_counter = 0
        # stats (aggregate pool); peaks updated on every increase
        self.allocated_bytes = self.reserved_bytes = self.requested_bytes = 0
        self.peak_allocated_bytes = self.peak_reserved_bytes = 0
        self.peak_requested_bytes = 0
        self.allocation = self.segment = self.peak_allocation = self.peak_segment = 0
        self.num_alloc_retries = self.num_ooms = self.num_sync_all_streams = 0
        self.num_device_alloc = self.num_device_free = 0
        self.oversize_allocations = self.oversize_segments = 0
        self.record_events = record_events
        self.events: list[tuple[str, int, int, int]] = []  # (action, addr, size, stream)
        self.segment_events: list[tuple[int, str, int, int, int]] = []  # (op_index, action, addr, size, stream)
        self.op_index = 0  # number of malloc/free/empty_cache calls so far

    # ------------------------------------------------------------------ helpers
    def _new_block(self, ptr: int, size: int, stream: int, seg: Segment) -> Block:
        self._counter += 1
        return Block(ptr, size, stream, seg, self._counter)

    def _key(self, b: Block) -> int:
        tie = self._tie
        if tie == "address":
            return (b.size << SIZE_SHIFT) | b.ptr
        if tie == "block_counter":
            return (b.size << SIZE_SHIFT) | b.counter
        return (b.size << SIZE_SHIFT) | (b.segment.counter << SEG_COUNTER_SHIFT) | b.ptr

    def _insert(self, pool: Pool, b: Block) -> None:
        """``insert_into_blocks``: put a free mapped block into its pool."""
        key = (b.size << SIZE_SHIFT) | b.ptr if self._addr_tie else self._key(b)
        b.key = key
        b.gc_base = pool.call_count
        sl = pool.blocks.get(b.stream)
        if sl is None:
            sl = pool.stream_list(b.stream)
        insort(sl, key)
        pool.by_key[key] = b

    def _remove(self, pool: Pool, b: Block) -> None:
        sl = pool.blocks[b.stream]
        del sl[bisect_left(sl, b.key)]
        del pool.by_key[b.key]
        b.key = -1

    def _seg_log(self, action: str, addr: int, size: int, stream: int) -> None:
        self.segment_events.append((self.op_index, action, addr, size, stream))
        if self.record_events:
            self.events.append((action, addr, size, stream))

    def round_size(self, size: int) -> int:
        """The block size PyTorch rounds ``size`` to under these settings."""
        return round_size(size, self._divisions, self._bypass)

    # ------------------------------------------------------------------ public API
    def malloc(self, size: int, stream: int = 0) -> Block:
        """Allocate ``size`` bytes on ``stream``; raise OutOfMemoryError like PyTorch (after the retry chain)."""
        if size <= 0:
            raise ValueError(f"malloc size must be positive (PyTorch does not call malloc for 0 bytes), got {size}")
        if size < K_MIN_BLOCK_SIZE_BYTES:
            rsize = K_MIN_BLOCK_SIZE_BYTES
        elif self._divisions is None:
            rsize = (size + K_MIN_BLOCK_SIZE_BYTES - 1) // K_MIN_BLOCK_SIZE_BYTES * K_MIN_BLOCK_SIZE_BYTES
        else:
            rsize = round_size(size, self._divisions, self._bypass)
        pool = self.small_pool if rsize <= K_SMALL_SIZE_BYTES else self.large_pool
        block = self._get_free_block(pool, stream, rsize)
        if block is None:
            alloc_size = allocation_size(rsize, self.settings.large_segment_size_bytes)
            if self._gc_on:
                self._garbage_collect()
            block = self._alloc_block(pool, stream, rsize, alloc_size, False)
            if block is None and self._release_available_cached_blocks(pool, stream, rsize):
                block = self._alloc_block(pool, stream, rsize, alloc_size, False)
            if block is None:
                self._release_cached_blocks()
                block = self._alloc_block(pool, stream, rsize, alloc_size, True)
            if block is None:
                self.num_ooms += 1
                free = self.device.free_bytes
                if self.record_events:
                    self.events.append(("oom", free if free is not None else -1, rsize, stream))
                self.op_index += 1
                raise OutOfMemoryError(
                    f"simulated CUDA out of memory: tried to allocate {alloc_size} B (request {size} B); "
                    f"{self.allocated_bytes} B allocated, {self.reserved_bytes} B reserved, "
                    f"device free {free if free is not None else 'unlimited'} B"
                )
        # should_split + alloc_found_block
        remaining = block.size - rsize
        if pool.small or self._expandable:
            split = remaining >= K_MIN_BLOCK_SIZE_BYTES
        else:
            split = rsize < self._max_split and remaining > K_SMALL_SIZE_BYTES
        if split:
            self._counter += 1
            new = Block(block.ptr, rsize, stream, block.segment, self._counter)
            new.prev = block.prev
            if new.prev is not None:
                new.prev.next = new
            new.next = block
            block.prev = new
            block.ptr += rsize
            block.size = remaining
            self._insert(pool, block)
            block = new
        block.allocated = True
        block.requested_size = size
        self.active_blocks[block.ptr] = block
        bsize = block.size
        self.allocation += 1
        if self.allocation > self.peak_allocation:
            self.peak_allocation = self.allocation
        self.allocated_bytes += bsize
        if self.allocated_bytes > self.peak_allocated_bytes:
            self.peak_allocated_bytes = self.allocated_bytes
        self.requested_bytes += size
        if self.requested_bytes > self.peak_requested_bytes:
            self.peak_requested_bytes = self.requested_bytes
        if bsize >= self._max_split:
            self.oversize_allocations += 1
        if self.record_events:
            self.events.append(("alloc", block.ptr, size, stream))
        self.op_index += 1
        return block

    def free(self, block: Block) -> None:
        """Free an allocated block (free_requested then free_completed at once: no record_stream modelled)."""
        active = self.active_blocks
        other = active.pop(block.ptr, None)
        if other is not block:
            if other is not None:
                active[block.ptr] = other  # a different live block sits there: put it back
            raise ValueError(f"free of a block that is not allocated: {block!r}")
        block.allocated = False
        bsize = block.size
        self.allocation -= 1
        self.allocated_bytes -= bsize
        if bsize >= self._max_split:
            self.oversize_allocations -= 1
        if self.record_events:
            self.events.append(("free_requested", block.ptr, block.requested_size, block.stream))
            self.events.append(("free_completed", block.ptr, block.requested_size, block.stream))
        pool = self.small_pool if block.segment.small else self.large_pool
        self.requested_bytes -= block.requested_size
        block.requested_size = 0
        prev = block.prev
        if prev is not None and not prev.allocated and prev.mapped:
            self._remove(pool, prev)
            block.ptr = prev.ptr
            block.size += prev.size
            block.prev = prev.prev
            if block.prev is not None:
                block.prev.next = block
        nxt = block.next
        if nxt is not None and not nxt.allocated and nxt.mapped:
            self._remove(pool, nxt)
            block.size += nxt.size
            block.next = nxt.next
            if block.next is not None:
                block.next.prev = block
        self._insert(pool, block)
        self.op_index += 1

    def empty_cache(self) -> None:
        """torch.cuda.empty_cache(): release_cached_blocks."""
        self._release_cached_blocks()
        self.op_index += 1

    # ------------------------------------------------------------------ internals (allocator.md 2.7-2.11)
    def _get_free_block(self, pool: Pool, stream: int, size: int) -> Block | None:
        if self._gc_on:
            pool.call_count += 1
        sl = pool.blocks.get(stream)
        if not sl:
            return None
        idx = bisect_left(sl, size << SIZE_SHIFT)
        if idx == len(sl):
            return None
        b = pool.by_key[sl[idx]]
        if b.segment.expandable:
            b = best_expandable_fit(pool, sl, idx, b)
        m = self._max_split
        if size < m and b.size >= m:
            return None
        if size >= m and b.size >= size + self.settings.max_non_split_rounding_bytes:
            return None
        self._remove(pool, b)
        return b

    def _alloc_block(self, pool: Pool, stream: int, size: int, alloc_size: int, is_retry: bool) -> Block | None:
        if is_retry:
            self.num_alloc_retries += 1
        if self._allowed_max is not None and self.reserved_bytes + alloc_size > self._allowed_max:
            return None
        if self.settings.expandable_segments:
            return self._try_allocate_expandable_block(pool, stream, size)
        ptr = self.device.malloc(alloc_size)
        if ptr is None:
            return None
        self._seg_counter += 1
        seg = Segment(ptr, alloc_size, stream, pool.small, self._seg_counter)
        self.segments[ptr] = seg
        self.reserved_bytes += alloc_size
        if self.reserved_bytes > self.peak_reserved_bytes:
            self.peak_reserved_bytes = self.reserved_bytes
        self.segment += 1
        if self.segment > self.peak_segment:
            self.peak_segment = self.segment
        if alloc_size >= self._max_split:
            self.oversize_segments += 1
        self.num_device_alloc += 1
        self._seg_log("segment_alloc", ptr, alloc_size, stream)
        return self._new_block(ptr, alloc_size, stream, seg)

    # ------------------------------------------------------------------ reporting
    @property
    def stats(self) -> dict[str, int]:
        """Counters named as in torch.cuda.memory_stats (aggregate pool only: ``*.all.*``)."""
        out: dict[str, int] = {}
        for name in STAT_NAMES:
            out[f"{name}.all.current"] = getattr(self, name)
            out[f"{name}.all.peak"] = getattr(self, f"peak_{name}")
        # no deferred frees are modelled: active (allocated or pending free) == allocated
        out["active.all.current"] = self.allocation
        out["active.all.peak"] = self.peak_allocation
        out["active_bytes.all.current"] = self.allocated_bytes
        out["active_bytes.all.peak"] = self.peak_allocated_bytes
        for name in (
            "num_alloc_retries",
            "num_ooms",
            "num_sync_all_streams",
            "num_device_alloc",
            "num_device_free",
        ):
            out[name] = getattr(self, name)
        out["oversize_allocations.current"] = self.oversize_allocations
        out["oversize_segments.current"] = self.oversize_segments
        out["max_split_size"] = -1 if not self.settings.max_split_set else self._max_split
        return out

    def all_blocks(self) -> list[Block]:
        """Every block: allocated, free and unmapped."""
        out = list(self.active_blocks.values())
        for pool in (self.small_pool, self.large_pool):
            out.extend(pool.by_key.values())
            out.extend(pool.unmapped_by_ptr.values())
        return out

    @property
    def active_bytes(self) -> int:
        """Allocated plus pending-free bytes; equal to allocated_bytes (no deferred frees are modelled)."""
        return self.allocated_bytes

    def _bump_reserved(self, nbytes: int) -> None:
        self.reserved_bytes += nbytes
        if self.reserved_bytes > self.peak_reserved_bytes:
            self.peak_reserved_bytes = self.reserved_bytes
