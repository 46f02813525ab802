"""NoCacheAllocatorSim: PyTorch with ``PYTORCH_NO_CUDA_MEMORY_CACHING=1`` (allocator.md 2.17).

Every tensor is its own ``cudaMalloc`` of exactly the requested size (no rounding, no pools, no streams) and
every free is a ``cudaFree``. Differences from PyTorch worth knowing:
- PyTorch's ``memory_stats`` and snapshot stay empty on this path; this simulator's ``stats`` report the
  device-level bytes instead (allocated == reserved == live requested bytes), and ``to_snapshot_dicts`` lists
  one segment per live tensor so a simulated run can still be viewed.
- ``raw_alloc`` users (cuBLAS workspaces) ignore the variable in PCA-2.5 and still use the cache; that mixed
  mode is not modelled (every request goes uncached).
- Device memory is counted as the size rounded up to 512 B (DeviceSim); the driver's real granularity for
  small allocations is unverified.
"""

from __future__ import annotations

from typing import Any

from uvmlab.errors import InvariantError, OutOfMemoryError
from uvmlab.sim.allocator.blocks import Block, Segment
from uvmlab.sim.allocator.device import DeviceSim
from uvmlab.sim.allocator.snapshot_dicts import device_traces, segment_dict


class NoCacheAllocatorSim:
    """One cudaMalloc per tensor; same interface as CachingAllocatorSim."""

    def __init__(self, device: DeviceSim | None = None, *, record_events: bool = False, device_index: int = 0):
        self.device = device if device is not None else DeviceSim()
        self.device_index = device_index
        self.active_blocks: dict[int, Block] = {}
        self.allocated_bytes = self.peak_allocated_bytes = 0
        self.requested_bytes = self.peak_requested_bytes = 0
        self.allocation = self.peak_allocation = 0
        self.num_ooms = self.num_device_alloc = self.num_device_free = 0
        self.num_malloc = self.num_free = 0
        self._counter = 0
        self.record_events = record_events
        self.events: list[tuple[str, int, int, int]] = []
        self.segment_events: list[tuple[int, str, int, int, int]] = []
        self.op_index = 0

    # reserved == allocated on this path
    @property
    def reserved_bytes(self) -> int:
        """Bytes held from the device (the sum of live tensor sizes)."""
        return self.allocated_bytes

    @property
    def peak_reserved_bytes(self) -> int:
        """Peak of reserved_bytes."""
        return self.peak_allocated_bytes

    def malloc(self, size: int, stream: int = 0) -> Block:
        """cudaMalloc(size); raise OutOfMemoryError when the device is full."""
        if size <= 0:
            raise ValueError(f"malloc size must be positive (cudaMalloc(0) allocates nothing), got {size}")
        self.num_malloc += 1
        ptr = self.device.malloc(size)
        if ptr is None:
            self.num_ooms += 1
            if self.record_events:
                free = self.device.free_bytes
                self.events.append(("oom", free if free is not None else -1, size, stream))
            self.op_index += 1
            raise OutOfMemoryError(
                f"simulated CUDA out of memory (no caching): cudaMalloc of {size} B failed with "
                f"{self.allocated_bytes} B in use, device free {self.device.free_bytes} B"
            )
        self._counter += 1
        seg = Segment(ptr, size, stream, False, self._counter)
        b = Block(ptr, size, stream, seg, self._counter)
        b.allocated = True
        b.requested_size = size
        self.active_blocks[ptr] = b
        self.num_device_alloc += 1
        self.allocation += 1
        self.peak_allocation = max(self.peak_allocation, self.allocation)
        self.allocated_bytes += size
        self.requested_bytes += size
        if self.allocated_bytes > self.peak_allocated_bytes:
            self.peak_allocated_bytes = self.allocated_bytes
            self.peak_requested_bytes = self.allocated_bytes
        self.segment_events.append((self.op_index, "segment_alloc", ptr, size, stream))
        if self.record_events:
            self.events.append(("segment_alloc", ptr, size, stream))
            self.events.append(("alloc", ptr, size, stream))
        self.op_index += 1
        return b

    def free(self, block: Block) -> None:
        """cudaFree."""
        if self.active_blocks.get(block.ptr) is not block:
            raise ValueError(f"free of a block that is not allocated: {block!r}")
        self.num_free += 1
        del self.active_blocks[block.ptr]
        block.allocated = False
        self.device.free(block.ptr)
        self.num_device_free += 1
        self.allocation -= 1
        self.allocated_bytes -= block.size
        self.requested_bytes -= block.size
        self.segment_events.append((self.op_index, "segment_free", block.ptr, block.size, block.stream))
        if self.record_events:
            for action in ("free_requested", "free_completed", "segment_free"):
                self.events.append((action, block.ptr, block.size, block.stream))
        self.op_index += 1

    def empty_cache(self) -> None:
        """Nothing is cached: no-op."""
        self.op_index += 1

    @property
    def stats(self) -> dict[str, int]:
        """Device-level counters under memory_stats names (PyTorch itself reports 0 on this path)."""
        return {
            "allocated_bytes.all.current": self.allocated_bytes,
            "allocated_bytes.all.peak": self.peak_allocated_bytes,
            "reserved_bytes.all.current": self.reserved_bytes,
            "reserved_bytes.all.peak": self.peak_reserved_bytes,
            "active_bytes.all.current": self.allocated_bytes,
            "active_bytes.all.peak": self.peak_allocated_bytes,
            "requested_bytes.all.current": self.requested_bytes,
            "requested_bytes.all.peak": self.peak_requested_bytes,
            "allocation.all.current": self.allocation,
            "allocation.all.peak": self.peak_allocation,
            "segment.all.current": self.allocation,
            "segment.all.peak": self.peak_allocation,
            "num_alloc_retries": 0,
            "num_ooms": self.num_ooms,
            "num_device_alloc": self.num_device_alloc,
            "num_device_free": self.num_device_free,
        }

    def check_invariants(self) -> None:
        """Live allocations never overlap; stats equal the sums over live blocks."""
        problems = []
        end = -1
        for ptr in sorted(self.active_blocks):
            b = self.active_blocks[ptr]
            if ptr < end:
                problems.append(f"{b!r} overlaps the previous allocation")
            if not b.allocated or b.ptr != ptr:
                problems.append(f"{b!r} is listed as live but is not")
            end = ptr + b.size
        total = sum(b.size for b in self.active_blocks.values())
        if total != self.allocated_bytes or len(self.active_blocks) != self.allocation:
            problems.append(f"stats {self.allocated_bytes} B/{self.allocation} != blocks {total} B")
        if self.device.used_bytes < self.allocated_bytes:
            problems.append("device holds fewer bytes than the live tensors")
        if problems:
            raise InvariantError("no-cache allocator invariant broken: " + "; ".join(problems[:5]))

    def to_snapshot_dicts(self) -> tuple[list[dict[str, Any]], list[list[dict[str, Any]]]]:
        """(segments, device_traces): one segment per live tensor (PyTorch would record none)."""
        segments = [segment_dict(self.device_index, [b], b.segment) for _, b in sorted(self.active_blocks.items())]
        return segments, device_traces(self)
