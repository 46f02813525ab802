"""Event-log unit tests of CachingAllocatorSim / NoCacheAllocatorSim on tiny scenarios (allocator.md 2.6-2.13)."""

from __future__ import annotations

import pytest

from uvmlab.errors import InputError, OutOfMemoryError
from uvmlab.sim.allocator.allocconf import AllocatorSettings
from uvmlab.sim.allocator.caching import CachingAllocatorSim
from uvmlab.sim.allocator.device import DeviceSim
from uvmlab.sim.allocator.nocache import NoCacheAllocatorSim

MiB = 1 << 20


def sim(conf: str = "", capacity: int | None = None, **kw) -> CachingAllocatorSim:
    s = AllocatorSettings.parse(conf, **kw)
    return CachingAllocatorSim(s, DeviceSim(capacity), record_events=True)


def actions(a: CachingAllocatorSim) -> list[str]:
    return [e[0] for e in a.events]


def test_small_pool_packs_into_one_2mib_segment() -> None:
    a = sim()
    b1, b2 = a.malloc(100), a.malloc(1000)
    assert b2.ptr == b1.ptr + 512 and b2.size == 1024
    assert actions(a) == ["segment_alloc", "alloc", "alloc"]
    assert a.events[0][2] == 2 * MiB and a.reserved_bytes == 2 * MiB
    assert a.allocated_bytes == 512 + 1024 and a.requested_bytes == 1100
    a.check_invariants()


def test_large_request_no_split_when_remainder_at_most_1mib() -> None:
    a = sim()
    b = a.malloc(19 * MiB + 1)  # 1-10 MiB rule does not apply: >= 10 MiB -> 20 MiB segment, 1 MiB - 512 left
    assert a.events[0][2] == 20 * MiB
    assert b.size == 20 * MiB  # the slack stays with the block
    assert a.allocated_bytes == 20 * MiB
    a.check_invariants()


def test_split_remainder_over_1mib_and_best_fit_by_address() -> None:
    a = sim()
    x = a.malloc(3 * MiB)  # 20 MiB segment, 17 MiB remainder
    y = a.malloc(5 * MiB)  # from the remainder, right after x
    assert y.ptr == x.ptr + 3 * MiB and len(a.segment_events) == 1
    a.free(x)
    z = a.malloc(2 * MiB)  # best fit: the freed 3 MiB hole (smaller than the 12 MiB tail)
    assert z.ptr == x.ptr
    a.check_invariants()


def test_coalescing_restores_an_unsplit_segment_that_empty_cache_releases() -> None:
    a = sim()
    blocks = [a.malloc(2 * MiB) for _ in range(4)]
    for b in (blocks[1], blocks[3], blocks[0], blocks[2]):
        a.free(b)
    a.check_invariants()
    assert len(a.large_pool) == 1  # everything merged back into one 20 MiB free block
    a.empty_cache()
    assert actions(a)[-1] == "segment_free" and a.reserved_bytes == 0 and a.num_device_free == 1
    a.check_invariants()


def test_empty_cache_keeps_split_segments() -> None:
    a = sim()
    b1 = a.malloc(2 * MiB)
    a.malloc(2 * MiB)
    a.free(b1)
    a.empty_cache()
    assert a.reserved_bytes == 20 * MiB and a.num_device_free == 0


def test_exactly_10mib_gets_10mib_segment() -> None:
    a = sim()
    a.malloc(10 * MiB)
    assert a.segment_events[0][3] == 10 * MiB


def test_streams_do_not_share_free_blocks() -> None:
    a = sim()
    b = a.malloc(4 * MiB, stream=1)
    a.free(b)
    c = a.malloc(4 * MiB, stream=2)
    assert c.segment is not b.segment and a.segment == 2
    a.check_invariants()


def test_oversize_rules() -> None:
    a = sim("max_split_size_mb:64")
    big = a.malloc(100 * MiB)
    assert big.size == 100 * MiB
    a.free(big)
    small = a.malloc(30 * MiB)  # < max_split may not take an over-size block
    assert small.segment is not big.segment
    within = a.malloc(90 * MiB)  # >= max_split, block 100 MiB < 90 + 20 MiB slack: reused, not split
    assert within.ptr == big.ptr and within.size == 100 * MiB
    a.free(within)
    too_far = a.malloc(70 * MiB)  # 100 >= 70 + 20: not reused
    assert too_far.ptr != big.ptr
    assert a.oversize_allocations == 1 and a.oversize_segments == 2
    a.check_invariants()


def test_oom_path_release_and_retry_counters() -> None:
    a = sim(capacity=100 * MiB)
    b = a.malloc(60 * MiB)
    a.free(b)  # 60 MiB cached
    c = a.malloc(70 * MiB)  # cudaMalloc fails, release_cached_blocks frees the 60 MiB, retry succeeds
    assert a.num_alloc_retries == 1 and a.num_ooms == 0
    assert actions(a)[-3:] == ["segment_free", "segment_alloc", "alloc"]
    with pytest.raises(OutOfMemoryError):
        a.malloc(40 * MiB)
    assert a.num_ooms == 1 and a.events[-1][0] == "oom" and a.events[-1][2] == 40 * MiB
    assert c.allocated
    a.check_invariants()


def test_release_available_cached_blocks_with_max_split() -> None:
    a = sim("max_split_size_mb:32", capacity=120 * MiB)
    b1, b2 = a.malloc(40 * MiB), a.malloc(40 * MiB)
    a.free(b1)
    a.free(b2)
    a.malloc(60 * MiB)  # misses (over-size slack), cudaMalloc fails, one 40 MiB over-size block is not enough:
    # release from the largest down until 60 MiB are freed -> both 40 MiB blocks go, no full release needed
    assert a.num_alloc_retries == 0
    assert [e[1] for e in a.segment_events][-3:] == ["segment_free", "segment_free", "segment_alloc"]
    a.check_invariants()


def test_memory_fraction_limits_reserved_and_gc_releases_old_blocks() -> None:
    s = AllocatorSettings.parse("garbage_collection_threshold:0.5", memory_fraction=0.5)
    a = CachingAllocatorSim(s, DeviceSim(200 * MiB), record_events=True)  # allowed 100 MiB, GC above 50 MiB
    old = a.malloc(30 * MiB)
    a.free(old)
    for _ in range(3):  # age the cached 30 MiB block with searches that miss
        a.free(a.malloc(2 * MiB))
    a.malloc(40 * MiB)  # reserved 30 + 20 = 50, not above the threshold yet: no GC; now 90 MiB
    a.malloc(35 * MiB)  # miss; 90 > 50: GC releases unsplit cached blocks, the oldest (the 30 MiB) first
    freed = [e for e in a.segment_events if e[1] == "segment_free"]
    assert freed and freed[0][2] == old.segment.address
    with pytest.raises(OutOfMemoryError):
        a.malloc(90 * MiB)  # fraction: reserved + 90 MiB > 100 MiB allowed, even though the device has room
    a.check_invariants()


def test_expandable_segments_map_grow_and_unmap() -> None:
    a = sim("expandable_segments:True")
    b1 = a.malloc(16 * MiB)
    b2 = a.malloc(16 * MiB)  # 4 MiB left in the first page + a new 20 MiB page, contiguous
    assert b2.ptr == b1.ptr + 16 * MiB
    assert [e[1] for e in a.segment_events] == ["segment_map", "segment_map"]
    assert a.reserved_bytes == 40 * MiB and a.segment == 0
    a.check_invariants()
    a.free(b2)
    a.empty_cache()  # the fully free second page is unmapped; the first stays (b1 holds part of it)
    assert a.segment_events[-1][1:] == ("segment_unmap", b1.ptr + 20 * MiB, 20 * MiB, 0)
    assert a.reserved_bytes == 20 * MiB
    a.check_invariants()
    a.free(b1)
    a.empty_cache()
    assert a.reserved_bytes == 0 and not a.expandable_segments
    a.check_invariants()


def test_block_counter_tie_break_differs_from_address() -> None:
    def run(tie: str) -> int:
        a = sim(tie_break=tie)
        x = a.malloc(2 * MiB)
        a.malloc(2 * MiB)
        y = a.malloc(2 * MiB)
        a.malloc(2 * MiB)
        a.free(y)  # higher address, created later
        a.free(x)  # lower address, created earlier... but split blocks get NEW counters at each split
        return a.malloc(2 * MiB).ptr - x.ptr

    assert run("address") == 0
    assert run("segment_counter") == 0  # same segment: falls back to the address
    assert run("block_counter") in (0, 4 * MiB)


def test_to_snapshot_dicts_round_trip(tmp_path) -> None:
    from uvmlab.trace.snapshot import read_snapshot, write_snapshot

    a = sim()
    keep = a.malloc(3 * MiB)
    a.free(a.malloc(100))
    segments, traces = a.to_snapshot_dicts()
    assert {s["total_size"] for s in segments} == {2 * MiB, 20 * MiB}
    assert [e["action"] for e in traces[0]][:2] == ["segment_alloc", "alloc"]
    path = tmp_path / "sim.pickle"
    write_snapshot(path, segments, traces)
    snap = read_snapshot(path)
    assert int(snap.allocated_bytes(0)) == keep.size
    assert len(snap.events) == len(a.events)


def test_nocache_exact_sizes_and_oom() -> None:
    n = NoCacheAllocatorSim(DeviceSim(10 * MiB), record_events=True)
    b1 = n.malloc(1000)
    b2 = n.malloc(3 * MiB)
    assert b1.size == 1000 and n.reserved_bytes == 3 * MiB + 1000
    n.free(b1)
    assert n.reserved_bytes == 3 * MiB and n.num_device_free == 1
    with pytest.raises(OutOfMemoryError):
        n.malloc(8 * MiB)
    n.check_invariants()
    segments, traces = n.to_snapshot_dicts()
    assert [s["address"] for s in segments] == [b2.ptr]
    assert "oom" in [e["action"] for e in traces[0]]


def test_bad_inputs() -> None:
    with pytest.raises(InputError):
        DeviceSim(capacity_bytes=10, context_bytes=20)
    with pytest.raises(InputError):
        CachingAllocatorSim("backend:cudaMallocAsync")
    a = sim()
    b = a.malloc(10)
    a.free(b)
    with pytest.raises(ValueError):
        a.free(b)
    with pytest.raises(ValueError):
        a.malloc(0)
