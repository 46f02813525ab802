"""Size rules of the caching allocator: round_size and get_allocation_size (allocator.md 2.4, 2.5; PCA-2.5)."""

from __future__ import annotations

from uvmlab.sim.allocator.constants import (
    K_MIN_BLOCK_SIZE_BYTES,
    K_MIN_LARGE_ALLOC_BYTES,
    K_ROUND_LARGE_BYTES,
    K_SMALL_BUFFER_BYTES,
    K_SMALL_SIZE_BYTES,
    ROUNDUP_POWER2_INTERVALS,
    ROUNDUP_POWER2_START_BYTES,
)

_START_LOG2 = ROUNDUP_POWER2_START_BYTES.bit_length() - 1


def divisions_for(size: int, divisions: tuple[int, ...]) -> int:
    """The ``roundup_power2_divisions`` entry that applies to ``size`` (CFG-2.8cpp ``roundup_power2_divisions``)."""
    log_size = size.bit_length() - 1
    index = log_size - _START_LOG2 if log_size > _START_LOG2 else 0
    return divisions[min(index, ROUNDUP_POWER2_INTERVALS - 1)]


def roundup_power2_next_division(size: int, divisions: int) -> int:
    """PCA-2.5 ``roundup_power2_next_division``: round up to the next of ``divisions`` steps of a power of two."""
    if size & (size - 1) == 0:
        return size
    power2_floor = 1 << (size.bit_length() - 1)
    step = power2_floor >> (divisions.bit_length() - 1)
    if step == 0:
        return power2_floor << 1
    floor = size & ~(step - 1)
    return size if floor == size else floor + step


def round_size(size: int, divisions: tuple[int, ...] | None = None, bypass_bytes: int | None = None) -> int:
    """PCA-2.5 ``round_size``: at least 512 B, a multiple of 512 B, or the power-of-two division rounding.

    ``bypass_bytes`` is PyTorch 1.13/2.0's ``roundup_bypass_threshold_mb`` (PR #85940): larger requests skip the
    power-of-two rounding.
    """
    if size < K_MIN_BLOCK_SIZE_BYTES:
        return K_MIN_BLOCK_SIZE_BYTES
    if divisions is not None and (bypass_bytes is None or size <= bypass_bytes):
        d = divisions_for(size, divisions)
        if d > 1 and size > K_MIN_BLOCK_SIZE_BYTES * d:
            return roundup_power2_next_division(size, d)
    return (size + K_MIN_BLOCK_SIZE_BYTES - 1) // K_MIN_BLOCK_SIZE_BYTES * K_MIN_BLOCK_SIZE_BYTES


def allocation_size(size: int, large_segment_bytes: int = 20 * 1024 * 1024) -> int:
    """PCA-2.5 ``get_allocation_size``: the cudaMalloc size for a rounded request ``size``."""
    if size <= K_SMALL_SIZE_BYTES:
        return K_SMALL_BUFFER_BYTES
    if size < K_MIN_LARGE_ALLOC_BYTES:
        return large_segment_bytes
    return (size + K_ROUND_LARGE_BYTES - 1) // K_ROUND_LARGE_BYTES * K_ROUND_LARGE_BYTES
