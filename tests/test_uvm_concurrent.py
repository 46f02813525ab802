"""The occupancy-bounded concurrent engine (uvmlab.sim.uvm.concurrent) and the launch geometry of traced ops
(uvmlab.sim.uvm.occupancy): waves, native progress during batches, per-SM uTLB merging, the ``sm`` arrival order,
foreach launches, the steady-state extrapolation and its error."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tests.uvm_program import Program
from uvmlab.gpus import GPUS
from uvmlab.sim.uvm import concurrent
from uvmlab.sim.uvm.driver import UvmSim
from uvmlab.sim.uvm.knobs import PAGE_BYTES, VA_BLOCK_BYTES, UvmKnobs
from uvmlab.sim.uvm.occupancy import (
    foreach_launches,
    foreach_lists,
    resident_blocks,
    resident_threads,
    sm_count,
    window_blocks,
)
from uvmlab.sim.uvm.streams import StreamKernel
from uvmlab.sim.uvm.timing import CostParams
from uvmlab.units import MiB

GPU = GPUS["A100-80GB"]


def _sim(capacity: int, arrays: int, size: int, knobs: UvmKnobs | None = None, host: bool = True) -> UvmSim:
    sim = UvmSim(capacity, knobs or UvmKnobs(), CostParams(), GPU)
    for r in range(arrays):
        sim.map_range(r, size)
    if host:
        sim.host_write(0, 0, size)
    return sim


# -- occupancy ---------------------------------------------------------------------------------------------------
def test_occupancy_follows_the_compute_capability_tables() -> None:
    """Resident blocks = SMs x min(blocks per SM, threads per SM // block): A100 (8.0) 2048 threads and 32 blocks
    per SM, RTX 5090 (12.0) 1536 and 24, T4 (7.5) 1024 and 16; a renamed spec keeps its GPU's SMs."""
    assert resident_blocks("A100-80GB", 512) == 108 * 4
    assert resident_blocks("A100-80GB", 32) == 108 * 32  # the block limit binds
    assert resident_threads("RTX5090", 128) == 170 * 1536
    assert resident_threads("T4", 256) == 40 * 1024
    assert sm_count("V100-PCIe") == 80  # the old table lacked it and gave the A100's 108
    assert sm_count("A100-80GB (40.0 GiB)") == 108


# -- the engine ----------------------------------------------------------------------------------------------------
def test_walkers_beyond_the_resident_ones_wait_for_a_free_slot() -> None:
    """Two warps of 32 threads, one page each: with both resident their 64 faults fill one batch; with room for one
    warp the second starts when the first retires, so its faults come in a second batch."""
    k = StreamKernel(((0, 0, 64 * PAGE_BYTES, False),), 64, warp_size=32)
    both = _sim(64 * MiB, 1, 64 * PAGE_BYTES, UvmKnobs(prefetch_enable=False), False).access_streams(k)
    one = _sim(64 * MiB, 1, 64 * PAGE_BYTES, UvmKnobs(prefetch_enable=False), False).access_streams(
        replace(k, resident=32)
    )
    assert both.fault_count == one.fault_count == 64
    assert (both.fault_batch_count, one.fault_batch_count) == (1, 2)


def test_running_warps_overlap_the_batches_of_stalled_ones() -> None:
    """Warp 0's pages are missing, warp 1's resident: with time (``native_ns``) warp 1 works during warp 0's batches,
    so the kernel lasts less than its native time plus every batch; without time it is exactly that sum."""
    size = 128 * PAGE_BYTES
    costs = CostParams()
    out = {}
    for native in (0.0, 2e6):
        sim = UvmSim(64 * MiB, UvmKnobs(prefetch_enable=False), costs, GPU)
        sim.map_range(0, size)
        sim.prefetch(0, size // 2, size // 2)  # warp 1's half is resident
        out[native] = sim.access_streams(StreamKernel(((0, 0, size, False),), 64, warp_size=32, native_ns=native))
    untimed, timed = out[0.0], out[2e6]
    assert untimed.fault_count == timed.fault_count == 64
    batches = untimed.stall_ns
    assert timed.stall_ns < batches  # time beyond the native 2 ms: the batches minus the overlapped work
    assert timed.stall_ns > batches - 2e6


def test_one_sms_misses_on_a_page_are_one_entry() -> None:
    """Two warps visiting the same pages: on one SM their uTLB merges the misses (one entry per page), on two SMs
    each raises its own (a duplicate, serviced once)."""
    visits = np.zeros((64, 1), dtype=np.int64)  # every thread touches page 0
    k = StreamKernel(((0, 0, PAGE_BYTES, False),), 64, "visits", warp_size=32, visits=visits)
    one = _sim(64 * MiB, 1, PAGE_BYTES, host=False).access_streams(replace(k, sms=1))
    two = _sim(64 * MiB, 1, PAGE_BYTES, host=False).access_streams(replace(k, sms=2))
    assert one.fault_count == two.fault_count == 1
    assert (one.raw_fault_entries, two.raw_fault_entries) == (1, 2)


def test_sm_order_interleaves_the_sms() -> None:
    """Batches of two entries, four warps on two SMs: ``lowest`` takes two lanes of warp 0, ``sm`` one lane of warp
    0 (SM 0) and one of warp 1 (SM 1)."""
    size = 128 * PAGE_BYTES
    svc = {}
    for prio in ("lowest", "sm"):
        knobs = UvmKnobs(prefetch_enable=False, fault_batch_count=2, stream_priority=prio)
        sim = UvmSim(64 * MiB, knobs, CostParams(), GPU)
        sim.map_range(0, size)
        seen: list[np.ndarray] = []
        orig = sim._service_block

        def spy(s: int, faulted: np.ndarray, orig=orig, seen=seen) -> None:
            seen.append(np.flatnonzero(faulted))
            orig(s, faulted)

        sim._service_block = spy  # type: ignore[method-assign]
        sim.access_streams(StreamKernel(((0, 0, size, False),), 128, warp_size=32, sms=2))
        svc[prio] = seen[0].tolist()
    assert svc["lowest"] == [0, 1]
    assert svc["sm"] == [0, 32]


# -- foreach launches ---------------------------------------------------------------------------------------------
def _foreach_rows(sizes: list[int], depth: int) -> list[tuple[int, int, int, bool]]:
    """An in-place foreach op over ``depth`` lists (list 0 written), the trace's row order: list 0's tensors (write
    and read rows), then the other lists' (reads); tensor t of list j in range j * 100 + t."""
    rows = []
    for t, size in enumerate(sizes):
        rows += [(t, 0, size, True), (t, 0, size, False)]
    for j in range(1, depth):
        rows += [(j * 100 + t, 0, size, False) for t, size in enumerate(sizes)]
    return rows


def test_foreach_lists_are_recovered_from_the_rows() -> None:
    lists = foreach_lists(_foreach_rows([4096, 256, 8192], 3))
    assert lists is not None and len(lists) == 3
    assert [r.size for r in lists[0]] == [4096, 256, 8192]
    assert [r.write for r in lists[0]] == [True] * 3 and not any(r.write for r in lists[2])
    assert foreach_lists([(0, 0, 10, False), (1, 0, 20, False), (2, 0, 30, False)]) is not None  # depth 1
    six = foreach_lists(_foreach_rows([4096], 6))  # more lists than multi_tensor_apply takes: not six
    assert six is not None and len(six) <= 5


def test_foreach_launches_follow_multi_tensor_apply() -> None:
    """Chunks of 65,536 elements, a launch per 320 (4 KB arguments) or 2,240 blocks (32 KB, driver >= 530)."""
    e = 4
    big = [1000 * 65536 * e]  # 1000 chunks
    lists = foreach_lists(_foreach_rows(big, 2))
    assert lists is not None
    assert [len(x.chunks) for x in foreach_launches(lists, e, 525)] == [320, 320, 320, 40]
    assert [len(x.chunks) for x in foreach_launches(lists, e, 575)] == [1000]
    many = foreach_lists(_foreach_rows([65536 * e] * 100, 3))  # depth 3: at most 48 tensors per 4 KB launch
    assert many is not None
    assert [len(x.chunks) for x in foreach_launches(many, e, 525)] == [48, 48, 4]


def _foreach_program(mb: int) -> Program:
    size = mb * MiB
    p = Program({"p": size, "m": size, "v": size})
    p.api("host_write", "p")
    for _ in range(3):
        k = p._row("aten::_foreach_addcdiv_")
        p._touch(k, "p", True)
        p._touch(k, "p", False)
        p._touch(k, "m", False)
        p._touch(k, "v", False)
    return p


def test_a_foreach_whose_window_fits_keeps_address_order() -> None:
    """``_foreach_addcdiv_`` over three 64 MiB lists: one launch of 256 chunks, all resident on an A100 (432 blocks
    of 512 threads), so its window is the three lists, 96 blocks. A 512 MiB GPU holds them: the replay is the
    address-order one; a 64 MiB GPU does not: with the option ``concurrent_ops=1`` the launch goes through the
    engine, by default (issue 41: the option moves the seed grid away from the study) it keeps address order."""
    p = _foreach_program(64)
    on, off = UvmKnobs(concurrent_ops=True), UvmKnobs(concurrent_ops=False)
    _, k_fits = p.run(512 * MiB, knobs=on)
    _, k_off = p.run(512 * MiB, knobs=off)
    assert np.array_equal(k_fits["fault_count"], k_off["fault_count"])  # every window fits: address order
    _, k_tight = p.run(64 * MiB, knobs=on)
    _, k_tight_off = p.run(64 * MiB, knobs=off)
    assert not np.array_equal(k_tight["fault_count"], k_tight_off["fault_count"])  # the engine ran
    _, k_default = p.run(64 * MiB)
    assert not UvmKnobs().concurrent_ops
    assert np.array_equal(k_default["fault_count"], k_tight_off["fault_count"])  # the default: address order


def test_window_of_a_foreach_launch() -> None:
    sim = UvmSim(1024 * MiB, UvmKnobs(), CostParams(), GPU)
    rows = _foreach_rows([64 * MiB], 3)
    for rid in sorted({r[0] for r in rows}):
        sim.map_range(rid, 64 * MiB)
    lists = foreach_lists(rows)
    assert lists is not None
    (launch,) = foreach_launches(lists, 4, 575)
    from uvmlab.sim.uvm.occupancy import foreach_pages

    src = foreach_pages(lists, launch, 4, {rid: sim.range_gids(rid) for rid in sorted({r[0] for r in rows})})
    assert src.n == 256 and src.steps == 32
    assert window_blocks(src, 432) == 3 * 32  # every chunk in flight: the three 64 MiB lists
    assert window_blocks(src, 8) == 3 * 1  # 8 chunks of 256 KiB: one 2 MiB block per list


# -- steady state --------------------------------------------------------------------------------------------------
def _cascade(steady: bool) -> tuple[list[tuple[float, ...]], int]:
    """A round-robin cascade (``rotate``): 128 MiB arrays on 24 MiB, 1,024 sampled threads (batches of 16)."""
    knobs = UvmKnobs(stream_priority="rotate", cascade_steady=steady)
    sim = _sim(24 * MiB, 2, 128 * MiB, knobs)
    k = StreamKernel(((0, 0, 128 * MiB, False), (1, 0, 128 * MiB, True)), 1024, warp_size=32, tid_stride=16)
    rounds = 0
    orig = concurrent._Engine._batch

    def counting(self: concurrent._Engine, stalled: np.ndarray) -> int:
        nonlocal rounds
        rounds += 1
        return orig(self, stalled)

    concurrent._Engine._batch = counting  # type: ignore[method-assign]
    try:
        out = []
        for _ in range(2):
            c = sim.access_streams(k)
            out.append((c.fault_count, c.htod_bytes, c.dtoh_bytes, c.eviction_count, c.stall_ns))
    finally:
        concurrent._Engine._batch = orig  # type: ignore[method-assign]
    sim.check_invariants()
    return out, rounds


def test_a_steady_cascade_is_extrapolated_within_its_stated_error() -> None:
    """The extrapolated run simulates a fraction of the rounds and lands within 3 % of the full simulation on every
    counter and the time (measured: docs/uvm-sim.md "Concurrent kernels")."""
    full, n_full = _cascade(False)
    fast, n_fast = _cascade(True)
    assert n_fast < n_full / 3
    np.testing.assert_allclose(np.array(fast), np.array(full), rtol=0.03)


def test_a_launch_whose_rest_is_resident_is_not_extrapolated() -> None:
    """The second pass at 1.0x: its first rounds fault steadily, its rest is resident (the sample of pages ahead
    says so), so no rate is extrapolated over it (this happened before the check: 10x its time)."""
    size = 64 * MiB
    for steady in (False, True):
        sim = _sim(2 * size + 4 * VA_BLOCK_BYTES, 2, size, UvmKnobs(cascade_steady=steady))
        k = StreamKernel(((0, 0, size, False), (1, 0, size, True)), 2048, warp_size=32, tid_stride=16)
        got = [sim.access_streams(k).stall_ns for _ in range(2)]
        if not steady:
            want = got
    assert got == pytest.approx(want)


# -- the documented experiment, through uvmlab run ------------------------------------------------------------------
def test_row_per_thread_fits_once_and_streams_when_it_does_not(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """docs/examples/programs/row_per_thread.py (small: 2,048 rows of 64 KiB) through the CLI: at 0.9x the matrix
    migrates once and later launches run at native speed; at 1.5x every launch faults again (the warps of the whole
    matrix are in flight at once: LRM evicts rows other warps still walk) and is tens of times slower, and its
    regime says so."""
    from pathlib import Path

    from uvmlab.cli import main
    from uvmlab.files.rundir import RunDir

    monkeypatch.setenv("UVMLAB_CACHE", str(tmp_path / "cache"))
    prog = str(Path(__file__).resolve().parents[1] / "docs" / "examples" / "programs" / "row_per_thread.py")
    args = [prog, "--option", "rows=2048", "--option", "row_kib=64", "-n", "3", "--mode", "sim"]
    out = {}
    for f in ("0.9", "1.5"):
        assert main(["run", *args, "--oversub", f, "-o", str(tmp_path / f)]) == 0
        out[f] = RunDir(tmp_path / f).read_result()
    fits, over = out["0.9"], out["1.5"]
    assert fits["slowdown_vs_native"] == pytest.approx(1.0, abs=0.01)
    assert fits["fault_count"] == 2048 * 64 * 1024 // PAGE_BYTES // 16  # the first launch: one fault per 64 KiB
    assert over["slowdown_vs_native"] > 10
    assert over["fault_count"] > 1.5 * fits["fault_count"] and over["dtoh_bytes"] > 0
    assert over["thrashing"]["thrashing_pages"] == 0  # one GPU, no host access between launches
    # the regime (uvmlab.uvm.regime): nothing evicted after the first launch at 0.9x; at 1.5x the launch refetches
    assert fits["regime"]["verdict"] == "fits"
    reg = over["regime"]
    assert reg["verdict"] == "thrashing" and reg["worst_kernel"]["name"] == "row_sum"
    assert 0 < reg["refetched_chunks_per_iteration"] <= reg["evicted_chunks_per_iteration"]
