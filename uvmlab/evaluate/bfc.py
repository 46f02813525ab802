"""A plain best-fit-with-coalescing (BFC) arena: the allocator model of a DNNMem-style baseline estimator.

DNNMem (seeds/001, section 4.4) tracks memory blocks with "a linked-list based memory manager and the best-fit
with coalescing (BFC) algorithm". This model keeps exactly that and none of PyTorch's caching-allocator rules (no
small/large pools, no 2 MiB / 20 MiB segments, no split thresholds, no per-stream pools):

- one contiguous arena that grows at the top when no free chunk fits (the high-water mark is the reserved peak;
  TensorFlow's BFC grows by regions, which we simplify to one growing region);
- requests rounded up to ``BFC_ROUND_BYTES`` (TensorFlow ``bfc_allocator.h``: ``kMinAllocationSize = 256``);
- best fit by (size, address) among free chunks, the remainder split off as a free chunk;
- freed chunks coalesce with free neighbours; a free chunk at the top shrinks the arena (memory returned).

Torch-free; all state in one object.
"""

from __future__ import annotations

from sortedcontainers import SortedDict, SortedList

from uvmlab.errors import InvariantError

BFC_ROUND_BYTES = 256
"""Allocation granularity (TensorFlow core/common_runtime/bfc_allocator.h, kMinAllocationSize)."""


def round_bfc(size_bytes: int) -> int:
    """Round a request up to the BFC granularity (a zero-byte request still takes one unit)."""
    return max(BFC_ROUND_BYTES, -(-int(size_bytes) // BFC_ROUND_BYTES) * BFC_ROUND_BYTES)


class BfcArena:
    """Best-fit-with-coalescing over one growing arena; ``peak_bytes`` is the arena's high-water mark."""

    def __init__(self) -> None:
        self._chunks: SortedDict = SortedDict()  # address -> [size, is_free]
        self._free: SortedList = SortedList()  # (size, address) of free chunks
        self.top_bytes = 0
        self.peak_bytes = 0
        self.allocated_bytes = 0

    def malloc(self, size_bytes: int) -> int:
        """Allocate; return the chunk address."""
        size = round_bfc(size_bytes)
        i = self._free.bisect_left((size, -1))
        if i < len(self._free):
            csize, addr = self._free.pop(i)
            self._chunks[addr] = [size, False]
            if csize > size:
                self._chunks[addr + size] = [csize - size, True]
                self._free.add((csize - size, addr + size))
        else:
            # grow; reuse a free chunk that ends at the top
            addr = self.top_bytes
            if self._chunks:
                last_addr = self._chunks.peekitem(-1)[0]
                last = self._chunks[last_addr]
                if last[1]:
                    self._free.remove((last[0], last_addr))
                    del self._chunks[last_addr]
                    addr = last_addr
            self._chunks[addr] = [size, False]
            self.top_bytes = addr + size
            self.peak_bytes = max(self.peak_bytes, self.top_bytes)
        self.allocated_bytes += size
        return addr

    def free(self, address: int) -> None:
        """Free the chunk at ``address`` and coalesce with free neighbours."""
        chunk = self._chunks.get(address)
        if chunk is None or chunk[1]:
            raise InvariantError(f"BFC: free of unknown or free chunk at {address}")
        size = chunk[0]
        self.allocated_bytes -= size
        start, end = address, address + size
        idx = self._chunks.index(address)
        if idx + 1 < len(self._chunks):
            naddr = self._chunks.peekitem(idx + 1)[0]
            nxt = self._chunks[naddr]
            if nxt[1]:
                self._free.remove((nxt[0], naddr))
                del self._chunks[naddr]
                end = naddr + nxt[0]
        if idx > 0:
            paddr = self._chunks.peekitem(idx - 1)[0]
            prv = self._chunks[paddr]
            if prv[1]:
                self._free.remove((prv[0], paddr))
                del self._chunks[address]
                start = paddr
        self._chunks[start] = [end - start, True]
        if end == self.top_bytes:  # the top chunk returns to the arena
            del self._chunks[start]
            self.top_bytes = start
        else:
            self._free.add((end - start, start))

    def check_invariants(self) -> None:
        """Chunks tile [0, top) without gaps; no two adjacent free chunks; the free index matches."""
        pos = 0
        prev_free = False
        free = []
        for addr, (size, is_free) in self._chunks.items():
            if addr != pos:
                raise InvariantError(f"BFC: gap or overlap at {addr} (expected {pos})")
            if is_free and prev_free:
                raise InvariantError(f"BFC: adjacent free chunks at {addr}")
            if is_free:
                free.append((size, addr))
            prev_free = is_free
            pos = addr + size
        if pos != self.top_bytes:
            raise InvariantError(f"BFC: chunks end at {pos}, top is {self.top_bytes}")
        if sorted(free) != list(self._free):
            raise InvariantError("BFC: free index out of date")
