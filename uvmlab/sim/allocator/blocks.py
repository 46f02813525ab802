"""Data model of the caching allocator simulator: Block, Segment and the free-block Pool (allocator.md 2.3).

Plain ``__slots__`` classes; the hot path touches only ints. A pool keeps, per stream, a sorted Python list of
integer sort keys ``(size << 96) | tie`` (tie = address, block counter or segment counter + address, see
``CachingAllocatorSim._key``), so "first block with (stream, size, tie) >= (stream, size, 0)" is one C bisect.
A plain list with ``bisect.insort`` / ``del`` (C memmove) was measured ~1.4x faster per event than
``sortedcontainers.SortedList`` for the free-list lengths seen in practice (hundreds to a few thousand blocks per
pool); insertion is O(n) memmove, still only tens of microseconds at 100,000 free blocks.
"""

from __future__ import annotations

from bisect import bisect_left, insort

SIZE_SHIFT = 96
"""Bits below the size in a pool sort key (addresses and counters fit below)."""
SEG_COUNTER_SHIFT = 56
"""Bits below the segment counter in a ``segment_counter`` tie (device addresses are < 2**56)."""


class Segment:
    """One cudaMalloc'd range, or one expandable segment's whole VA reservation."""

    __slots__ = ("address", "counter", "expandable", "mapped_bytes", "page_bytes", "size", "small", "stream")

    def __init__(self, address: int, size: int, stream: int, small: bool, counter: int, expandable: bool = False):
        self.address = address
        self.size = size
        self.stream = stream
        self.small = small
        self.counter = counter
        self.expandable = expandable
        self.page_bytes = 0
        self.mapped_bytes = 0

    def __repr__(self) -> str:
        kind = "expandable " if self.expandable else ""
        return f"Segment({kind}{'small' if self.small else 'large'} {self.address:#x}+{self.size} s{self.stream})"


class Block:
    """A piece of a segment: allocated, free (in a pool) or, for expandable segments, unmapped."""

    __slots__ = (
        "allocated",
        "counter",
        "gc_base",
        "key",
        "mapped",
        "next",
        "prev",
        "ptr",
        "requested_size",
        "segment",
        "size",
        "stream",
    )

    def __init__(self, ptr: int, size: int, stream: int, segment: Segment, counter: int):
        self.ptr = ptr
        self.size = size
        self.requested_size = 0
        self.stream = stream
        self.segment = segment
        self.allocated = False
        self.mapped = True
        self.prev: Block | None = None
        self.next: Block | None = None
        self.key = -1
        self.counter = counter
        self.gc_base = 0

    @property
    def address(self) -> int:
        """The block's device address (``ptr``)."""
        return self.ptr

    @property
    def is_split(self) -> bool:
        """True when the block has a neighbour in its segment."""
        return self.prev is not None or self.next is not None

    def __repr__(self) -> str:
        state = "alloc" if self.allocated else ("free" if self.mapped else "unmapped")
        return f"Block({self.ptr:#x}+{self.size} {state} req={self.requested_size} s{self.stream})"


class Pool:
    """One BlockPool (small or large): free mapped blocks per stream, sorted; unmapped ranges by address."""

    __slots__ = ("blocks", "by_key", "call_count", "small", "unmapped", "unmapped_by_ptr")

    def __init__(self, small: bool):
        self.small = small
        self.blocks: dict[int, list[int]] = {}
        self.by_key: dict[int, Block] = {}
        self.unmapped: dict[int, list[int]] = {}
        self.unmapped_by_ptr: dict[int, Block] = {}
        self.call_count = 0

    def stream_list(self, stream: int) -> list[int]:
        """The sorted key list of one stream (created on first use)."""
        sl = self.blocks.get(stream)
        if sl is None:
            sl = self.blocks[stream] = []
        return sl

    def __len__(self) -> int:
        return len(self.by_key)

    def iter_blocks(self) -> list[Block]:
        """Free mapped blocks in PyTorch's pool order (stream, size, tie)."""
        by_key = self.by_key
        return [by_key[k] for s in sorted(self.blocks) for k in self.blocks[s]]

    def add_unmapped(self, b: Block) -> None:
        """Insert an unmapped block (ordered by (stream, address))."""
        sl = self.unmapped.get(b.stream)
        if sl is None:
            sl = self.unmapped[b.stream] = []
        insort(sl, b.ptr)
        self.unmapped_by_ptr[b.ptr] = b

    def remove_unmapped(self, b: Block) -> None:
        """Remove an unmapped block."""
        sl = self.unmapped[b.stream]
        del sl[bisect_left(sl, b.ptr)]
        del self.unmapped_by_ptr[b.ptr]
