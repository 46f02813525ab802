"""Rule-level tests of the UVM driver model: tiny scenarios with exact event sequences (reference/uvm.md)."""

from __future__ import annotations

import numpy as np
import pytest

from uvmlab.errors import InputError, InvariantError
from uvmlab.sim.uvm.advice import HINT_ARRAYS
from uvmlab.sim.uvm.driver import UvmSim
from uvmlab.sim.uvm.knobs import PAGE_BYTES, UvmKnobs
from uvmlab.sim.uvm.prefetch import prefetch_pages

MiB = 1 << 20
BLOCK = 2 * MiB


def services(sim: UvmSim) -> list[tuple]:
    return [e for e in sim.events if e[0] == "service"]


def test_prefetcher_worked_example_sequential_sweep_costs_six_faults() -> None:
    """uvm.md 1.5: one fault at a time over a CPU-resident 2 MiB block: 64K, 64K, 128K, 256K, 512K, 1M."""
    sim = UvmSim(8 * MiB, UvmKnobs(batch_unique_pages=1), record_events=True)
    sim.map_range(0, BLOCK)
    sim.host_write(0, 0, BLOCK)
    for p in range(512):
        sim.access([(0, p * PAGE_BYTES, PAGE_BYTES, False)])
    migrated_kib = [e[4] * 4 for e in services(sim)]
    assert migrated_kib == [64, 64, 128, 256, 512, 1024]
    assert sim.totals.fault_count == 6
    assert sim.totals.fault_batch_count == 6
    assert sim.totals.htod_count == 6
    assert sim.totals.htod_bytes == BLOCK
    assert sim.totals.fault_htod_bytes == 6 * PAGE_BYTES
    assert sim.totals.prefetch_htod_bytes == BLOCK - 6 * PAGE_BYTES
    assert sim.totals.zero_fill_bytes == 0
    sim.check_invariants()


def test_prefetch_off_migrates_only_faulted_pages() -> None:
    sim = UvmSim(8 * MiB, UvmKnobs(prefetch_enable=False, batch_unique_pages=1), record_events=True)
    sim.map_range(0, BLOCK)
    sim.host_write(0, 0, BLOCK)
    for p in range(512):
        sim.access([(0, p * PAGE_BYTES, PAGE_BYTES, False)])
    assert sim.totals.fault_count == 512
    assert {e[4] for e in services(sim)} == {1}


def test_threshold_is_strict_half_full_subtree_does_not_trigger() -> None:
    """A subtree exactly 50 % marked does not qualify (strict '>' against 51)."""
    res = np.zeros(512, dtype=bool)
    res[:16] = True  # big page 0 resident
    f = np.zeros(512, dtype=bool)
    f[16] = True  # marks big page 1: 32/32 of the 128 KiB subtree, 32/64 = 50 % of the 256 KiB one
    extra = prefetch_pages(res, f, 512, 51)
    assert np.flatnonzero(extra).tolist() == list(range(17, 32))
    assert not prefetch_pages(res, f, 512, 100)[32:].any()


def test_many_faults_in_one_batch_migrate_the_whole_block() -> None:
    """uvm.md 1.5: when > 261 of 512 pages are marked in one batch, the root qualifies: one 2 MiB migration."""
    sim = UvmSim(8 * MiB, UvmKnobs(batch_unique_pages=300, fault_batch_count=300), record_events=True)
    sim.map_range(0, BLOCK)
    sim.host_write(0, 0, BLOCK)
    sim.access([(0, 0, BLOCK, False)])
    assert [e[3:5] for e in services(sim)] == [(300, 512)]
    assert sim.totals.htod_count == 1 and sim.totals.htod_bytes == BLOCK


def test_batch_limit_unique_pages_and_fault_batch_count() -> None:
    """Batches hold at most min(batch_unique_pages, fault_batch_count) unique pages."""
    knobs = UvmKnobs(prefetch_enable=False, batch_unique_pages=43)
    sim = UvmSim(16 * MiB, knobs, record_events=True)
    sim.map_range(0, 4 * MiB)
    sim.access([(0, 0, 1000 * PAGE_BYTES, True)])
    batches = [e for e in sim.events if e[0] == "batch"]
    assert [b[2] for b in batches] == [43] * 23 + [1000 - 43 * 23]
    assert sim.totals.fault_batch_count == 24
    sim2 = UvmSim(16 * MiB, UvmKnobs(prefetch_enable=False, batch_unique_pages=1000, fault_batch_count=256))
    sim2.map_range(0, 4 * MiB)
    c = sim2.access([(0, 0, 1000 * PAGE_BYTES, True)])
    assert c.fault_batch_count == 4  # 256 + 256 + 256 + 232
    assert c.raw_fault_entries <= 4 * 256


def test_eviction_picks_least_recently_migrated_not_least_recently_used() -> None:
    """uvm.md 1.6: GPU accesses to resident data never update the order; migration into a block does."""
    sim = UvmSim(2 * BLOCK, UvmKnobs(batch_unique_pages=512, fault_batch_count=512), record_events=True)
    for r in (0, 1, 2):
        sim.map_range(r, BLOCK)
    sim.access([(0, 0, BLOCK, True)])  # A migrated first
    sim.access([(1, 0, BLOCK, True)])  # then B
    c = sim.access([(0, 0, BLOCK, False)])  # A used again: resident, no fault, no LRM update
    assert c.fault_count == 0
    sim.access([(2, 0, BLOCK, True)])  # C needs a chunk: evicts A (least recently *migrated*)
    evicts = [e for e in sim.events if e[0] == "evict"]
    assert evicts == [("evict", 0, 0, 512)]
    sim.check_invariants()


def test_migration_into_a_block_moves_it_to_the_tail() -> None:
    sim = UvmSim(2 * BLOCK, UvmKnobs(batch_unique_pages=1, prefetch_enable=False), record_events=True)
    for r in (0, 1, 2):
        sim.map_range(r, BLOCK)
    sim.access([(0, 0, PAGE_BYTES, True)])
    sim.access([(1, 0, PAGE_BYTES, True)])
    sim.access([(0, PAGE_BYTES, PAGE_BYTES, True)])  # a new page migrated into A: A becomes most recent
    sim.access([(2, 0, PAGE_BYTES, True)])
    assert [e for e in sim.events if e[0] == "evict"] == [("evict", 1, 0, 1)]


def test_eviction_copies_every_resident_page_and_refault_migrates_back() -> None:
    """No dirty tracking: clean pages go DtoH too; a page that was evicted comes back by HtoD, not zero-fill."""
    sim = UvmSim(BLOCK, UvmKnobs(batch_unique_pages=512, fault_batch_count=512))
    sim.map_range(0, BLOCK)
    sim.map_range(1, BLOCK)
    first = sim.access([(0, 0, BLOCK, True)])  # fresh: zero-fill, no transfer
    assert first.zero_fill_bytes == BLOCK and first.htod_bytes == 0 and first.write_fault_count > 0
    c = sim.access([(1, 0, BLOCK, False)])  # read of never-populated memory: zero-fill; evicts block 0
    assert c.eviction_count == 1 and c.dtoh_bytes == BLOCK and c.dtoh_count == 1
    assert c.htod_bytes == 0 and c.zero_fill_bytes == BLOCK
    back = sim.access([(0, 0, BLOCK, False)])
    assert back.htod_bytes == BLOCK and back.zero_fill_bytes == 0 and back.read_fault_count > 0
    assert back.dtoh_bytes == BLOCK  # block 1 evicted in turn
    sim.check_invariants()


def test_unmap_destroys_range_without_dtoh() -> None:
    sim = UvmSim(BLOCK, record_events=True)
    sim.map_range(0, BLOCK)
    sim.access([(0, 0, BLOCK, True)])
    assert sim.used_bytes == BLOCK
    sim.unmap_range(0)
    assert sim.used_bytes == 0
    assert sim.totals.dtoh_bytes == 0
    assert sim.mapped_bytes == 0
    sim.map_range(1, BLOCK)
    sim.map_range(2, 3 * PAGE_BYTES)
    assert sim.mapped_bytes == BLOCK + 3 * PAGE_BYTES  # live ranges' bytes (the memory table's reserved_bytes)
    c = sim.access([(1, 0, BLOCK, True)])  # the freed chunk is reused: no eviction
    assert c.eviction_count == 0
    sim.check_invariants()
    sim.unmap_range(1)
    assert sim.mapped_bytes == 3 * PAGE_BYTES


def test_read_then_write_same_page_faults_once_as_read() -> None:
    """Read faults map read-write (uvm.md 1.4), so the kernel's later write does not fault again."""
    sim = UvmSim(8 * MiB, UvmKnobs(prefetch_enable=False))
    sim.map_range(0, BLOCK)
    c = sim.access([(0, 0, 10 * PAGE_BYTES, False), (0, 0, 10 * PAGE_BYTES, True)])
    assert (c.read_fault_count, c.write_fault_count) == (10, 0)


def test_memcpy_populates_without_faults_or_um_migrations() -> None:
    sim = UvmSim(8 * MiB)
    sim.map_range(0, 3 * MiB)
    c = sim.memcpy_htod(0, 0, 3 * MiB)
    assert c.fault_count == 0 and c.htod_bytes == 0
    assert c.memcpy_htod_bytes == 3 * MiB and c.memcpy_htod_count == 1
    assert sim.access([(0, 0, 3 * MiB, False)]).fault_count == 0
    assert sim.used_bytes == BLOCK + MiB  # the 1 MiB tail block takes a 1 MiB (64 KiB-rounded) chunk


def test_partial_block_chunk_is_rounded_to_64k() -> None:
    sim = UvmSim(8 * MiB)
    sim.map_range(0, 5000)
    sim.access([(0, 0, 5000, True)])
    assert sim.used_bytes == 64 * 1024


def test_capacity_below_one_chunk_is_refused() -> None:
    with pytest.raises(InputError, match="2 MiB root chunk"):
        UvmSim(MiB)


def test_access_to_unmapped_range_is_an_invariant_error() -> None:
    sim = UvmSim(8 * MiB)
    with pytest.raises(InvariantError):
        sim.access([(7, 0, 10, False)])


def test_knob_validation() -> None:
    with pytest.raises(InputError, match="prefetch_threshold"):
        UvmKnobs(prefetch_threshold=0)
    with pytest.raises(InputError, match="unknown simulator options"):
        UvmKnobs.from_options({"prefetch_treshold": 60})
    assert UvmKnobs.from_options({}, prefetch=False).prefetch_enable is False
    assert UvmKnobs.from_options({"prefetch_enable": True}, prefetch=False).prefetch_enable is True


def test_memoized_plan_matches_general_path() -> None:
    """The fast path for empty blocks must give the same counters as servicing block by block."""

    def run(events: bool) -> dict:
        sim = UvmSim(6 * BLOCK, UvmKnobs(), record_events=events)
        for r in range(4):
            sim.map_range(r, 3 * BLOCK + 12345)
        sim.host_write(1, 0, 3 * BLOCK + 12345)
        for r in range(4):
            sim.access([(r, 777, 3 * BLOCK, r % 2 == 0)])
        for r in range(4):
            sim.access([(r, 0, 3 * BLOCK + 12345, False)])
        sim.check_invariants()
        return sim.totals.as_dict()

    # events turn the run path off (uvmlab.sim.uvm.faults): float sums may differ in their last bits
    assert run(events=True) == pytest.approx(run(events=False), rel=1e-12)


@pytest.mark.parametrize("capacity_blocks", [16, 5])
@pytest.mark.parametrize("host_written", [False, True])
def test_whole_block_prefetch_path_equals_the_general_loop(
    capacity_blocks: int, host_written: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cudaMemPrefetchAsync of whole never-populated or CPU-resident blocks takes a shortcut (consecutive ones as
    a run); with it off, every counter (floats up to the order of additions), bitmap and the LRM order come out
    the same (new ranges, host-written ranges, a partial last block, a partly resident block, and evictions when
    the capacity is short; a host write creates the mapping bitmaps)."""
    import dataclasses

    def run() -> tuple:
        sim = UvmSim(capacity_blocks * BLOCK, UvmKnobs(), record_events=False)
        sim.map_range(0, 3 * BLOCK + 5 * PAGE_BYTES)  # a partial last block
        sim.map_range(1, 4 * BLOCK)
        if host_written:
            sim.host_write(1, 0, 4 * BLOCK)
        sim.map_range(2, 2 * BLOCK)
        sim.access([(2, 0, 7 * PAGE_BYTES, False)])  # partly resident: the general loop
        sizes = ((0, 3 * BLOCK + 5 * PAGE_BYTES), (1, 4 * BLOCK), (2, 2 * BLOCK))
        out = [sim.prefetch(r, 0, size) for r, size in sizes]
        out.append(sim.prefetch(1, 0, 4 * BLOCK))  # all resident (or re-fetched after evictions)
        sim.check_invariants()
        maps = [getattr(sim, n).copy() for n in ("_gpu", "_cpu", *sim._hint_arrays)]
        return [dataclasses.asdict(c) for c in out], dataclasses.asdict(sim.totals), list(sim._lrm), maps

    fast = run()
    monkeypatch.setattr(UvmSim, "whole_block_fast_path", False)
    slow = run()
    assert fast[2] == slow[2]  # the LRM order
    for got, want in zip([*fast[0], fast[1]], [*slow[0], slow[1]], strict=True):  # the run path sums floats apart
        assert got == pytest.approx(want, rel=1e-12), got
    assert len(fast[3]) == len(slow[3]) == (2 + len(HINT_ARRAYS) if host_written else 2)
    assert all(np.array_equal(a, b) for a, b in zip(fast[3], slow[3], strict=True))
