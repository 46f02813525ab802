"""Constants of PyTorch's CUDACachingAllocator, each with its unit and source.

Source short names are those of ``../shared/reference/allocator.md`` section 1: PCA-2.5 is
``pytorch/pytorch c10/cuda/CUDACachingAllocator.cpp`` at 001074d2, PCA-main26 the 2026 main branch.
"""

from __future__ import annotations

from uvmlab.units import GiB, MiB

K_MIN_BLOCK_SIZE_BYTES = 512
"""``kMinBlockSize`` (PCA-2.5): every request is rounded up to a multiple of this, at least this."""
K_SMALL_SIZE_BYTES = 1 * MiB
"""``kSmallSize`` (PCA-2.5): a rounded size <= this goes to the small pool."""
K_SMALL_BUFFER_BYTES = 2 * MiB
"""``kSmallBuffer`` (PCA-2.5): segment size of the small pool; also the expandable small-pool page."""
K_MIN_LARGE_ALLOC_BYTES = 10 * MiB
"""``kMinLargeAlloc`` (PCA-2.5): rounded requests in (1 MiB, 10 MiB) get a kLargeBuffer segment."""
K_LARGE_BUFFER_BYTES = 20 * MiB
"""``kLargeBuffer`` (PCA-2.5; CFG-2.8 moved it to AllocatorConfig.h): 1-10 MiB segment size, expandable
large-pool page size, and the over-size reuse slack before PR #136174. ``large_segment_size_mb`` in main26."""
K_ROUND_LARGE_BYTES = 2 * MiB
"""``kRoundLarge`` (PCA-2.5): segments for requests >= 10 MiB are rounded up to a multiple of this."""
SIZE_MAX = 2**64 - 1
"""``std::numeric_limits<size_t>::max()``: the default ``max_split_size`` ("unlimited")."""
ROUNDUP_POWER2_INTERVALS = 16
"""Entries of the ``roundup_power2_divisions`` vector (CFG-2.8cpp ``kRoundUpPowerOfTwoIntervals``): one per power
of two from 1 MiB up."""
ROUNDUP_POWER2_START_BYTES = 1 * MiB
"""The first interval of ``roundup_power2_divisions`` starts at 1 MiB (CFG-2.8cpp ``roundup_power2_divisions``:
``log2(size) - log2(1 MiB)`` clamped to [0, 15])."""
EXPANDABLE_VA_FACTOR_NUM, EXPANDABLE_VA_FACTOR_DEN = 9, 8
"""ExpandableSegment reserves VA for ``totalGlobalMem + totalGlobalMem / 8`` (PCA-2.5 ``ExpandableSegment``)."""
MIN_MAX_SPLIT_SIZE_MB = 20
"""``max_split_size_mb`` below this is refused (CFG-2.8cpp: must be > kLargeBuffer / 1 MiB)."""
CUDA_MALLOC_ALIGNMENT_BYTES = 512
"""Alignment of ``cudaMalloc`` results used by :class:`~uvmlab.sim.allocator.device.DeviceSim` for small device
allocations (CUDA guarantees at least 256 B; 512 B is what the snapshots show). Approximation."""
DRIVER_VA_ALIGNMENT_BYTES = 2 * MiB
"""Made-up device addresses of segments are aligned to 2 MiB, the GPU large-page size (every ``segment_alloc``
address in the real snapshots is 2 MiB aligned)."""
DEFAULT_VA_TOP = 0x7F0000000000
"""Top of the made-up device VA range (real snapshots show addresses just below 0x7fxx_xxxx_xxxx); made-up
addresses grow downwards from here like the real ones do."""
DEFAULT_VA_SIZE_BYTES = 64 * 1024 * GiB
"""Size of the made-up VA range (64 TiB)."""
