"""DeviceSim: the CUDA driver as the allocator sees it: capacity, context, device addresses, OOM.

What is modelled:
- **Capacity.** ``cudaMalloc``/``cuMemCreate`` fail (return None) when ``used + size > capacity - context``, the
  way the real stack decides OOM (the caching allocator then runs its release-and-retry path).
  ``capacity_bytes=None`` means unlimited.
- **CUDA context.** ``context_bytes`` is taken from the capacity up front (the CUDA context, cuBLAS/cuDNN
  handles, NCCL buffers: memory PyTorch does not see; allocator.md 2.20). Its size per GPU is not known
  (unverified); callers pass it.
- **Addresses.** The driver's placement cannot be derived from the public data: of 6,605 real ``segment_alloc``
  events, 4,478 lie below the previous new segment (442 directly below), 1,478 above it (holes in VA reserved
  earlier) and 626 reuse a freed address, with alignments from 2 MiB to 1 GiB (docs/allocator.md). The model is a
  downward bump allocator: each allocation goes just below the previous one, aligned to 2 MiB
  (``DRIVER_VA_ALIGNMENT_BYTES``) or, for allocations under 2 MiB, to 512 B; freed VA is not reused (addresses
  are made up: only non-overlap matters; allocator.md 4.3 found made-up segment addresses leave peaks unchanged).
  For exact replays, :mod:`uvmlab.memory.replay` installs an ``oracle`` that returns the real address of the next
  segment from the snapshot's trace.
- **Accounting granularity.** Allocations count their size rounded up to 512 B; the driver's own granularity
  for small cudaMallocs is unverified (allocator.md 2.17), so ``PYTORCH_NO_CUDA_MEMORY_CACHING`` runs with many
  tiny tensors may under-count device memory.
"""

from __future__ import annotations

from collections.abc import Callable

from uvmlab.errors import InputError, InvariantError
from uvmlab.sim.allocator.constants import (
    CUDA_MALLOC_ALIGNMENT_BYTES,
    DEFAULT_VA_SIZE_BYTES,
    DEFAULT_VA_TOP,
    DRIVER_VA_ALIGNMENT_BYTES,
)
from uvmlab.units import GiB

DEFAULT_TOTAL_BYTES = 80 * GiB
"""``totalGlobalMem`` assumed when no capacity is given (used only to size expandable-segment VA reservations
and a memory fraction's limit)."""

Oracle = Callable[[str, int], "int | None"]
"""``oracle(kind, size) -> address or None``; kind is "malloc" (cudaMalloc) or "reserve" (cuMemAddressReserve)."""


def _round_up(n: int, m: int) -> int:
    return (n + m - 1) // m * m


class DeviceSim:
    """Device memory: capacity, a context reservation, made-up (or oracle) addresses."""

    __slots__ = (
        "_allocs",
        "_next_top",
        "_vas",
        "capacity_bytes",
        "context_bytes",
        "num_malloc",
        "num_malloc_failed",
        "oracle",
        "peak_used_bytes",
        "total_bytes",
        "used_bytes",
        "va_bottom",
    )

    def __init__(
        self,
        capacity_bytes: int | None = None,
        context_bytes: int = 0,
        *,
        va_top: int = DEFAULT_VA_TOP,
        oracle: Oracle | None = None,
    ):
        if capacity_bytes is not None and capacity_bytes <= 0:
            raise InputError(f"device capacity must be positive, got {capacity_bytes}")
        if context_bytes < 0:
            raise InputError(f"CUDA context size cannot be negative, got {context_bytes}")
        if capacity_bytes is not None and context_bytes >= capacity_bytes:
            raise InputError(f"CUDA context ({context_bytes} B) leaves nothing of the capacity ({capacity_bytes} B)")
        self.capacity_bytes = capacity_bytes
        self.total_bytes = capacity_bytes if capacity_bytes is not None else DEFAULT_TOTAL_BYTES
        self.context_bytes = context_bytes
        self.used_bytes = 0
        self.peak_used_bytes = 0
        self.num_malloc = 0
        self.num_malloc_failed = 0
        self._next_top = va_top
        self.va_bottom = va_top - DEFAULT_VA_SIZE_BYTES
        self._allocs: dict[int, int] = {}  # address -> accounted bytes (physical)
        self._vas: dict[int, int] = {}  # address -> size of VA-only reservations
        self.oracle = oracle

    @property
    def free_bytes(self) -> int | None:
        """What cudaMemGetInfo would report as free (None when unlimited)."""
        if self.capacity_bytes is None:
            return None
        return self.capacity_bytes - self.context_bytes - self.used_bytes

    def _fits(self, nbytes: int) -> bool:
        cap = self.capacity_bytes
        return cap is None or self.used_bytes + nbytes <= cap - self.context_bytes

    def _place(self, size: int, kind: str) -> int:
        if self.oracle is not None:
            addr = self.oracle(kind, size)
            if addr is not None:
                return addr
        align = DRIVER_VA_ALIGNMENT_BYTES if size >= DRIVER_VA_ALIGNMENT_BYTES else CUDA_MALLOC_ALIGNMENT_BYTES
        addr = (self._next_top - size) // align * align
        if addr < self.va_bottom:  # only absurd inputs get here (a batch of 10**12): the user's mistake, exit 2
            raise InputError(
                f"the simulated job asked for more than the {DEFAULT_VA_SIZE_BYTES // 2**40} TiB device address range "
                f"(request of {size:,} bytes); the batch size or workload options are far beyond any GPU"
            )
        self._next_top = addr
        return addr

    def malloc(self, size: int) -> int | None:
        """cudaMalloc: the address, or None for cudaErrorMemoryAllocation."""
        acct = _round_up(size, CUDA_MALLOC_ALIGNMENT_BYTES)
        if not self._fits(acct):
            self.num_malloc_failed += 1
            return None
        addr = self._place(size, "malloc")
        if addr in self._allocs:
            raise InvariantError(f"device address {addr:#x} handed out twice")
        self._allocs[addr] = acct
        self.used_bytes += acct
        self.num_malloc += 1
        if self.used_bytes > self.peak_used_bytes:
            self.peak_used_bytes = self.used_bytes
        return addr

    def adopt(self, address: int, size: int) -> None:
        """Register an allocation that already exists (a segment present when a replayed trace starts)."""
        if address in self._allocs:
            raise InvariantError(f"device address {address:#x} adopted twice")
        acct = _round_up(size, CUDA_MALLOC_ALIGNMENT_BYTES)
        self._allocs[address] = acct
        self.used_bytes += acct
        self.peak_used_bytes = max(self.peak_used_bytes, self.used_bytes)

    def in_use(self, address: int) -> bool:
        """True if ``address`` is the start of a live device allocation."""
        return address in self._allocs

    def free(self, address: int) -> None:
        """cudaFree."""
        acct = self._allocs.pop(address, None)
        if acct is None:
            raise InvariantError(f"cudaFree of unknown device address {address:#x}")
        self.used_bytes -= acct

    def reserve_va(self, size: int) -> int:
        """cuMemAddressReserve: VA only, no physical memory (never fails)."""
        addr = self._place(size, "reserve")
        self._vas[addr] = size
        return addr

    def free_va(self, address: int) -> None:
        """cuMemAddressFree."""
        if self._vas.pop(address, None) is None:
            raise InvariantError(f"cuMemAddressFree of unknown VA {address:#x}")

    def map_pages(self, nbytes: int) -> bool:
        """cuMemCreate + cuMemMap of ``nbytes`` of physical pages; False when they do not fit."""
        if not self._fits(nbytes):
            self.num_malloc_failed += 1
            return False
        self.used_bytes += nbytes
        if self.used_bytes > self.peak_used_bytes:
            self.peak_used_bytes = self.used_bytes
        return True

    def unmap_pages(self, nbytes: int) -> None:
        """cuMemUnmap + cuMemRelease."""
        if nbytes > self.used_bytes:
            raise InvariantError(f"unmapping {nbytes} B but only {self.used_bytes} B are in use")
        self.used_bytes -= nbytes
