"""Per-tensor UVM hints (uvmlab.sim.uvm.hints, issue 16): each mechanism on tiny scenarios, then through the replay."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.uvm_synth import live_range, make_trace, nocache_placement, pool_placement
from uvmlab.errors import InputError, InvariantError
from uvmlab.gpus import GPUS, get_gpu
from uvmlab.sim.uvm.driver import UvmSim
from uvmlab.sim.uvm.hints import plan_hints, prefetch_rows
from uvmlab.sim.uvm.knobs import PAGE_BYTES, UvmKnobs
from uvmlab.sim.uvm.replay import replay

MiB = 1 << 20
BLOCK = 2 * MiB
PAGES = BLOCK // PAGE_BYTES


def _sim(capacity: int = 8 * MiB, **knobs: object) -> UvmSim:
    return UvmSim(capacity, UvmKnobs(**knobs))  # type: ignore[arg-type]


# -- preferred location CPU + accessed-by GPU --------------------------------------------------------------------
def test_remote_access_first_touch_faults_populate_the_cpu_and_take_no_gpu_memory() -> None:
    sim = _sim()
    sim.map_range(0, 2 * BLOCK)
    c, link_ns = sim.remote_access([(0, 0, 2 * BLOCK, True)])
    assert c.fault_count == 2 * PAGES and c.write_fault_count == 2 * PAGES  # first touch: populated on the CPU
    assert c.fault_batch_count == -(-2 * PAGES // sim.knobs.pages_per_batch)
    assert c.htod_bytes == 0 and c.zero_fill_bytes == 0  # no migration, no GPU zero-fill
    assert sim.used_bytes == 0  # no GPU chunk
    assert c.remote_bytes == 2 * BLOCK
    assert link_ns == pytest.approx(2 * BLOCK / sim.costs.link_bytes_per_s * 1e9)
    again, _ = sim.remote_access([(0, 0, 2 * BLOCK, False)])
    assert again.fault_count == 0 and again.stall_ns == 0.0  # no fault, no migration: read over the link
    assert again.remote_bytes == 2 * BLOCK
    sim.check_invariants()


def test_remote_reads_and_writes_use_both_link_directions() -> None:
    sim = _sim()
    sim.map_range(0, 2 * BLOCK)
    sim.host_write(0, 0, 2 * BLOCK)
    _, both = sim.remote_access([(0, 0, BLOCK, False), (0, BLOCK, BLOCK, True)])
    _, one = sim.remote_access([(0, 0, BLOCK, False)])
    assert both == pytest.approx(one)  # full duplex: a read and a write of equal size take the time of one


def test_remote_access_of_gpu_resident_pages_is_local() -> None:
    sim = _sim()
    sim.map_range(0, BLOCK)
    sim.access([(0, 0, BLOCK // 2, True)])  # half the block on the GPU (e.g. faulted before the advice)
    c, _ = sim.remote_access([(0, 0, BLOCK, False)])
    assert c.remote_bytes == BLOCK // 2


# -- read-mostly (the knob issues cudaMemAdvise; uvmlab.sim.uvm.advice models it) ---------------------------------
def _read_dup(sim: UvmSim) -> None:
    sim.map_range(0, BLOCK)
    sim.host_write(0, 0, BLOCK)  # the page lives on the CPU
    sim.advise(0, 0, BLOCK, "set_read_mostly")
    sim.access([(0, 0, BLOCK, False)])


def test_a_read_duplicate_is_evicted_without_write_back() -> None:
    sim = _sim(BLOCK, advise_read_mostly="parameter")
    _read_dup(sim)
    assert sim._dup[sim._ranges[0][0]].sum() == PAGES
    sim.map_range(1, BLOCK)
    c = sim.access([(1, 0, BLOCK, True)])  # needs the only chunk: evicts the duplicate
    assert c.eviction_count == 1 and c.dtoh_bytes == 0 and c.writeback_saved_bytes == BLOCK
    assert sim._cpu[sim._ranges[0][0]].all()  # the CPU copy is the page now
    sim.check_invariants()


def test_without_read_mostly_the_same_eviction_copies_the_block_back() -> None:
    sim = _sim(BLOCK)
    sim.map_range(0, BLOCK)
    sim.host_write(0, 0, BLOCK)
    sim.access([(0, 0, BLOCK, False)])
    sim.map_range(1, BLOCK)
    c = sim.access([(1, 0, BLOCK, True)])
    assert c.dtoh_bytes == BLOCK and c.writeback_saved_bytes == 0


def test_a_write_collapses_read_duplicates_with_write_faults() -> None:
    sim = _sim(BLOCK, advise_read_mostly="parameter")
    _read_dup(sim)
    c = sim.access([(0, 0, BLOCK, True)])  # the optimizer step writes the parameter
    assert c.write_fault_count == PAGES and c.fault_batch_count >= 1 and c.stall_ns > 0
    assert c.htod_bytes == 0 and c.dtoh_bytes == 0  # an invalidation, no transfer
    assert not sim._dup.any()
    sim.map_range(1, BLOCK)
    assert sim.access([(1, 0, BLOCK, True)]).dtoh_bytes == BLOCK  # dirty again: written back


def test_zero_filled_pages_are_not_duplicates_but_are_mapped_read_only() -> None:
    """A read of a read-mostly page resident nowhere populates it on the GPU as a read duplicate with no other copy:
    no CPU copy to keep (not ``_dup``), but mapped read-only, so the next write faults."""
    sim = _sim(advise_read_mostly="parameter")
    sim.map_range(0, BLOCK)
    sim.advise(0, 0, BLOCK, "set_read_mostly")
    sim.access([(0, 0, BLOCK, False)])
    assert not sim._dup.any() and sim._gro[sim._ranges[0][0]].all()
    assert sim.access([(0, 0, BLOCK, True)]).write_fault_count == PAGES


# -- discard ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("knob", [MiB, 0], ids=["knob", "direct call without the knob"])
def test_discarded_gpu_pages_are_evicted_without_dtoh_and_come_back_zero_filled(knob: int) -> None:
    """Also from a direct ``discard`` on a simulator built without ``discard_min_bytes``: it turns the discard-aware
    eviction on, and a slot reused after its range is freed holds no stale discard bit (the random programs of
    tests/test_uvm_block_runs.py found that case: map, map, discard on a plain simulator)."""
    sim = _sim(BLOCK, discard_min_bytes=knob)
    sim.map_range(0, BLOCK)
    sim.access([(0, 0, BLOCK, True)])
    assert sim.discard(0, 0, BLOCK) == PAGES
    sim.map_range(1, BLOCK)
    c = sim.access([(1, 0, BLOCK, True)])
    assert c.eviction_count == 1 and c.dtoh_bytes == 0 and c.writeback_saved_bytes == BLOCK
    s0 = sim._ranges[0][0]
    assert not sim._cpu[s0].any() and not sim._disc[s0].any()  # resident nowhere; the mark cleared by eviction
    sim.undiscard(0, 0, BLOCK)
    back = sim.access([(0, 0, BLOCK, False)])
    assert back.htod_bytes == 0 and back.zero_fill_bytes == BLOCK  # dead data is not migrated back
    sim.discard(1, 0, BLOCK // 2)
    sim.unmap_range(1)
    sim.map_range(2, BLOCK)  # reuses range 1's slot
    assert not sim._disc[sim._ranges[2][0]].any()
    sim.check_invariants()


def test_discard_covers_whole_pages_only() -> None:
    sim = _sim(discard_min_bytes=MiB)
    sim.map_range(0, BLOCK)
    assert sim.discard(0, 100, 3 * PAGE_BYTES) == 2  # [100, 100 + 12 KiB) holds two whole pages
    assert np.flatnonzero(sim._disc[sim._ranges[0][0]]).tolist() == [1, 2]
    assert sim.discard(0, 10, PAGE_BYTES) == 0


def test_discarded_cpu_pages_are_dropped() -> None:
    sim = _sim(discard_min_bytes=MiB)
    sim.map_range(0, BLOCK)
    sim.host_write(0, 0, BLOCK)
    sim.discard(0, 0, BLOCK)
    c = sim.access([(0, 0, BLOCK, True)])
    assert c.htod_bytes == 0 and c.zero_fill_bytes == BLOCK
    sim.check_invariants()


def test_a_fully_discarded_block_is_evicted_before_older_live_ones() -> None:
    sim = _sim(2 * BLOCK, discard_min_bytes=MiB)
    for r in (0, 1, 2):
        sim.map_range(r, BLOCK)
    sim.access([(0, 0, BLOCK, True)])  # oldest, live
    sim.access([(1, 0, BLOCK, True)])  # newer, then freed and discarded
    sim.discard(1, 0, BLOCK)
    c = sim.access([(2, 0, BLOCK, True)])
    assert c.eviction_count == 1 and c.dtoh_bytes == 0  # the discarded block went, not the older live one
    assert sim._gpu[sim._ranges[0][0]].all()


def test_a_partly_discarded_block_keeps_its_place_and_writes_back_only_live_pages() -> None:
    sim = _sim(BLOCK, discard_min_bytes=MiB)
    sim.map_range(0, BLOCK)
    sim.access([(0, 0, BLOCK, True)])
    sim.discard(0, 0, BLOCK // 2)
    sim.map_range(1, BLOCK)
    c = sim.access([(1, 0, BLOCK, True)])
    assert c.dtoh_bytes == BLOCK // 2 and c.writeback_saved_bytes == BLOCK // 2


# -- knobs and plan --------------------------------------------------------------------------------------------
def test_hint_knobs_validate_categories() -> None:
    with pytest.raises(InputError, match="unknown categories"):
        UvmKnobs(advise_remote="optimizer")
    with pytest.raises(InputError):
        UvmKnobs(prefetch_next_kernels=-1)
    assert not UvmKnobs().any_hint and UvmKnobs(discard_min_bytes=1).any_hint


def test_plan_hints_selects_allocations_by_category_and_discards_only_large_freed_blocks() -> None:
    trace = make_trace(n_iter=2, param_mb=4, act_mb=1)
    pl = pool_placement(trace)
    knobs = UvmKnobs(advise_remote="optimizer_state", prefetch_next_kernels=1, discard_min_bytes=2 * MiB)
    plan = plan_hints(trace, pl.blocks, pl.ranges, knobs)
    cat = trace.allocations.set_index("alloc_id")["category"]
    assert {cat[a] for a in plan.remote_ids} == {"optimizer_state"}
    assert {cat[a] for a in plan.prefetch_ids} == {"parameter", "optimizer_state"}
    freed = [e for e in plan.events if e[1] == 1]
    assert freed and all(e[4] >= 2 * MiB for e in plan.events)  # 1 MiB activations are not discarded
    assert [e[0] for e in plan.events] == sorted(e[0] for e in plan.events)
    # a remote-advised tensor is never prefetched (a prefetch would migrate it)
    a = next(iter(plan.remote_ids))
    assert prefetch_rows(plan, [(0, 0, MiB, False)], [a], 10**9, {0}) == []


# -- through the replay (toy training loop, PCA on, 60 % of the peak) ------------------------------------------
@pytest.fixture(scope="module")
def runs() -> dict[str, object]:
    trace = make_trace(n_iter=4, param_mb=30, act_mb=30)
    gpu = get_gpu("A100-80GB")
    out: dict[str, object] = {}
    for name, pl in (("pool", pool_placement(trace)), ("nocache", nocache_placement(trace))):
        peak = int(pl.ranges["size_bytes"].sum()) if name == "pool" else 0
        cap = int((peak or 400 * MiB) * 0.6)
        for pol, kn in (
            ("plain", UvmKnobs()),
            ("remote", UvmKnobs(advise_remote="optimizer_state")),
            ("rm", UvmKnobs(advise_read_mostly="parameter")),
            ("next", UvmKnobs(prefetch_next_kernels=1)),
            ("discard", UvmKnobs(discard_min_bytes=MiB)),
        ):
            out[f"{name}/{pol}"] = replay(trace, pl, cap, gpu, kn, check_every=1)
    return out


def _it(r: object) -> float:
    return float(r.iterations["duration_ns"].iloc[1:].mean())  # type: ignore[attr-defined]


def test_remote_optimizer_state_moves_no_state_and_reads_it_over_the_link(runs: dict[str, object]) -> None:
    plain, remote = runs["pool/plain"], runs["pool/remote"]
    # the Adam kernels read and write 3 x 30 MiB of state per iteration, over the link, after the first touch
    assert remote.totals.remote_bytes >= 4 * 2 * 3 * 30 * MiB  # type: ignore[attr-defined]
    assert remote.totals.htod_bytes < plain.totals.htod_bytes  # type: ignore[attr-defined]
    assert remote.totals.dtoh_bytes < plain.totals.dtoh_bytes  # type: ignore[attr-defined]
    assert remote.totals.fault_count < plain.totals.fault_count  # type: ignore[attr-defined]


def test_read_mostly_parameters_save_write_backs_but_pay_write_faults_in_training(runs: dict[str, object]) -> None:
    plain, rm = runs["pool/plain"], runs["pool/rm"]
    assert rm.totals.writeback_saved_bytes > 0  # type: ignore[attr-defined]
    assert rm.totals.dtoh_bytes < plain.totals.dtoh_bytes  # type: ignore[attr-defined]
    assert rm.totals.write_fault_count > plain.totals.write_fault_count  # type: ignore[attr-defined]
    assert _it(rm) > _it(plain)  # the optimizer step's collapses cost more than the saved copies here


def test_prefetching_the_next_kernels_parameters_replaces_their_faults(runs: dict[str, object]) -> None:
    plain, nxt = runs["pool/plain"], runs["pool/next"]
    assert nxt.api_calls.get("cudaMemPrefetchAsync", 0) > 0  # type: ignore[attr-defined]
    assert nxt.totals.fault_count < plain.totals.fault_count  # type: ignore[attr-defined]
    assert nxt.totals.prefetch_htod_bytes > plain.totals.prefetch_htod_bytes  # type: ignore[attr-defined]
    assert _it(nxt) < _it(plain)


def test_discarding_freed_blocks_saves_write_backs_with_pca_and_does_nothing_without(runs: dict[str, object]) -> None:
    plain, disc = runs["pool/plain"], runs["pool/discard"]
    assert disc.api_calls.get("cudaMemDiscardBatchAsync", 0) > 0  # type: ignore[attr-defined]
    assert disc.totals.writeback_saved_bytes > 0  # type: ignore[attr-defined]
    assert disc.totals.dtoh_bytes < plain.totals.dtoh_bytes  # type: ignore[attr-defined]
    assert disc.totals.htod_bytes < plain.totals.htod_bytes  # type: ignore[attr-defined]
    # PCA off: cudaFree destroys each tensor's range, there is nothing left to discard
    a, b = runs["nocache/plain"], runs["nocache/discard"]
    assert b.totals.as_dict() == a.totals.as_dict()  # type: ignore[attr-defined]


def test_hints_off_leave_the_replay_unchanged(runs: dict[str, object]) -> None:
    trace = make_trace(n_iter=4, param_mb=30, act_mb=30)
    pl = pool_placement(trace)
    cap = int(pl.ranges["size_bytes"].sum() * 0.6)
    other = replay(trace, pl, cap, get_gpu("A100-80GB"), UvmKnobs(prefetch_next_categories="activation"))
    assert other.totals.as_dict() == runs["pool/plain"].totals.as_dict()  # type: ignore[attr-defined]


def test_discarded_blocks_leave_first_discarded_first() -> None:
    """The PMM's DISCARDED list is a FIFO (root_chunk_update_eviction_list moves a chunk to its tail)."""
    sim = _sim(3 * BLOCK, discard_min_bytes=MiB)
    for r in range(4):
        sim.map_range(r, BLOCK)
    for r in range(3):
        sim.access([(r, 0, BLOCK, True)])
    sim.discard(2, 0, BLOCK)
    sim.discard(1, 0, BLOCK)
    sim.access([(3, 0, BLOCK, True)])
    assert not sim._gpu[sim._ranges[2][0]].any()  # discarded first, evicted first
    assert sim._gpu[sim._ranges[1][0]].all() and sim._gpu[sim._ranges[0][0]].all()


def test_run_with_a_hint_policy_reports_its_calls_and_bytes(tmp_path: object) -> None:
    import json
    import subprocess
    import sys

    args = ["-b", "16", "--option", "image_size=64", "--option", "num_classes=10", "-n", "2", "--oversub", "1.5"]
    out = {}
    for pol in ("remote-optimizer-state", "discard-freed-blocks"):
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "uvmlab",
                "run",
                "alexnet",
                *args,
                "--policy",
                pol,
                "-o",
                f"{tmp_path}/{pol}",
                "--format",
                "json",
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr
        out[pol] = json.loads(proc.stdout)
    assert out["remote-optimizer-state"]["policy"] == "remote-optimizer-state"
    assert out["remote-optimizer-state"]["remote_bytes"] > 0
    assert out["remote-optimizer-state"]["knobs"]["advise_remote"] == "optimizer_state"
    assert out["discard-freed-blocks"]["hint_api_calls"]["cudaMemDiscardBatchAsync"] > 0


def test_read_mostly_parameters_help_when_nothing_writes_them() -> None:
    """Inference-like: the same loop without the optimizer step. Parameters are only read, so their evicted
    duplicates are dropped instead of copied back, and no write collapses them: fewer bytes, less time."""
    from uvmlab.trace.schema import Trace

    full = make_trace(n_iter=4, param_mb=30, act_mb=30)
    k = full.kernels[full.kernels["phase"] != "optimizer"]
    trace = Trace(
        allocations=full.allocations,
        kernels=k.reset_index(drop=True),
        accesses=full.accesses[full.accesses["kernel_id"].isin(k["kernel_id"])].reset_index(drop=True),
        header=full.header,
    )
    pl = pool_placement(trace)
    cap = int(pl.ranges["size_bytes"].sum() * 0.6)
    gpu = get_gpu("A100-80GB")
    plain = replay(trace, pl, cap, gpu, UvmKnobs(), check_every=1)
    rm = replay(trace, pl, cap, gpu, UvmKnobs(advise_read_mostly="parameter"), check_every=1)
    assert rm.totals.writeback_saved_bytes > 0
    assert rm.totals.dtoh_bytes < plain.totals.dtoh_bytes
    assert rm.totals.write_fault_count == plain.totals.write_fault_count  # nothing collapses
    assert _it(rm) < _it(plain)


def test_reusing_a_still_resident_discarded_block_costs_remap_faults_not_transfers() -> None:
    """The discard unmaps the pages; the new tensor's first write faults them back in place (no data moves)."""
    sim = _sim(4 * BLOCK, discard_min_bytes=MiB)
    sim.map_range(0, BLOCK)
    sim.access([(0, 0, BLOCK, True)])
    sim.discard(0, 0, BLOCK // 2)
    c = sim.undiscard(0, 0, BLOCK)
    assert c.write_fault_count == PAGES // 2 // 16 and c.fault_batch_count >= 1 and c.stall_ns > 0  # per big page
    assert c.htod_bytes == 0 and c.dtoh_bytes == 0 and c.zero_fill_bytes == 0
    assert not sim._disc.any() and sim._gpu[sim._ranges[0][0]].all()
    assert sim.undiscard(0, 0, BLOCK).fault_count == 0  # nothing discarded any more


# -- properties ------------------------------------------------------------------------------------------------
_hint_op = st.one_of(
    st.tuples(st.just("map"), st.integers(1, 6 * MiB)),
    st.tuples(st.just("unmap"), st.integers(0, 20)),
    st.tuples(st.just("access"), st.integers(0, 20), st.integers(0, 6 * MiB), st.integers(1, 3 * MiB), st.booleans()),
    st.tuples(st.just("remote"), st.integers(0, 20), st.integers(0, 6 * MiB), st.integers(1, 3 * MiB), st.booleans()),
    st.tuples(st.just("rm"), st.integers(0, 20), st.integers(0, 6 * MiB), st.integers(1, 3 * MiB), st.booleans()),
    st.tuples(st.just("discard"), st.integers(0, 20), st.integers(0, 6 * MiB), st.integers(1, 3 * MiB)),
    st.tuples(st.just("undiscard"), st.integers(0, 20), st.integers(0, 6 * MiB), st.integers(1, 3 * MiB)),
    st.tuples(st.just("host"), st.integers(0, 20), st.integers(0, 6 * MiB), st.integers(1, MiB)),
    st.tuples(st.just("prefetch"), st.integers(0, 20), st.integers(0, 6 * MiB), st.integers(1, 3 * MiB)),
)


@pytest.mark.parametrize("driver", ["575.57.08", "525.105.17"], ids=["block-cpu-chunks", "page-cpu-chunks"])
@pytest.mark.parametrize("read_mostly", ["parameter", ""], ids=["read-mostly+discard", "discard-only"])
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(capacity_mib=st.integers(2, 10), ops=st.lists(_hint_op, min_size=1, max_size=40))
def test_random_hint_operations_keep_invariants(read_mostly: str, driver: str, capacity_mib: int, ops: list) -> None:
    """Capacity, residency and the byte ledger hold under any mix of hints: remote access never takes GPU memory,
    bytes leave the GPU only once (copied back or saved), duplicates are GPU-resident (and, with discards alone, exist
    only once host accesses create advice state), every block with a discarded page is in ``_disc_slots``, every
    CPU-resident page holds a CPU chunk (one per block from R530, per page before), and no kernel refetches more
    chunks than were evicted."""
    knobs = UvmKnobs(advise_read_mostly=read_mostly, discard_min_bytes=MiB)
    sim = UvmSim(capacity_mib * MiB, knobs, gpu=GPUS["A100-80GB"].with_driver(driver))
    sizes: dict[int, int] = {}
    nxt = 0
    for o in ops:
        live = sorted(sizes)
        if o[0] == "map":
            sim.map_range(nxt, o[1])
            sizes[nxt] = o[1]
            nxt += 1
            continue
        if not live:
            continue
        if o[0] == "unmap":
            rid = live[o[1] % len(live)]
            sim.unmap_range(rid)
            del sizes[rid]
            continue
        rid, off, size = live_range(sizes, o[1], o[2], o[3])
        row = [(rid, off, size, o[4])] if len(o) > 4 else [(rid, off, size, False)]
        used = sim.used_bytes
        if o[0] == "access":
            sim.access(row)
        elif o[0] == "remote":
            c, link_ns = sim.remote_access(row)
            assert sim.used_bytes == used  # no GPU memory, no eviction
            assert c.htod_bytes == 0 and c.dtoh_bytes == 0 and link_ns >= 0
            assert c.remote_bytes <= size
        elif o[0] == "rm":
            with sim.one_kernel():  # one kernel of several driver calls, as the replay runs a hinted row
                if read_mostly:
                    sim.advise(rid, off, size, "set_read_mostly")
                sim.access(row)
        elif o[0] == "discard":
            sim.discard(rid, off, size)
        elif o[0] == "undiscard":
            c = sim.undiscard(rid, off, size)
            assert c.htod_bytes == 0 and c.dtoh_bytes == 0
        elif o[0] == "host":
            sim.host_write(rid, off, size)
        else:
            sim.prefetch(rid, off, size)
        assert sim.used_bytes <= sim.capacity_bytes
        sim.check_invariants()
    t = sim.totals
    assert t.dtoh_bytes + t.writeback_saved_bytes <= sim.populated_gpu_bytes
    assert t.refetched_chunks <= t.eviction_count  # a refetch takes back a chunk its own kernel evicted


def _undiscard_by_block(disc: np.ndarray, gpu: np.ndarray, segs: list[tuple[int, int, int]]) -> tuple[int, int]:
    """The remap faults of an undiscard, block by block (the rule as written before the rows were taken at once):
    (faults: big pages holding a discarded GPU-resident page, blocks with such a fault); clears the windows."""
    n = blocks = 0
    for s, lo, hi in segs:
        live = np.zeros(PAGES, dtype=bool)
        live[lo:hi] = disc[s, lo:hi] & gpu[s, lo:hi]
        m = int(np.count_nonzero(live.reshape(-1, 16).any(axis=1)))
        n += m
        blocks += m > 0
        disc[s, lo:hi] = False
    return n, blocks


@settings(max_examples=60, deadline=None)
@given(
    blocks=st.integers(1, 4),
    seed=st.integers(0, 2**32 - 1),
    window=st.tuples(st.integers(0, 8 * MiB), st.integers(1, 8 * MiB)),
)
def test_undiscard_of_many_blocks_at_once_equals_block_by_block(blocks: int, seed: int, window: tuple) -> None:
    """Random discarded and resident pages over a range of 1-4 blocks: one undiscard of any window gives the faults,
    the batches and the discarded pages left that the block-by-block rule gives; ``_disc_slots`` stays a superset."""
    rng = np.random.default_rng(seed)
    sim = _sim(8 * BLOCK, discard_min_bytes=MiB)
    sim.map_range(0, blocks * BLOCK)
    slots = sim._ranges[0].tolist()
    for s in slots:  # a consistent random state: resident pages with a chunk, discarded pages among them or not
        gpu = rng.random(PAGES) < 0.5
        sim._gpu[s] = gpu
        sim._res_count[s] = int(gpu.sum())
        if gpu.any():
            sim._has_chunk[s] = True
            sim._lrm[s] = None
            sim.used_bytes += sim._chunk_bytes[s]
        sim._disc[s] = rng.random(PAGES) < 0.3
        if sim._disc[s].any():
            sim._disc_slots.add(s)
    off, size = window[0] % (blocks * BLOCK), window[1]
    expect_disc = sim._disc.copy()
    segs = sim._segments(0, off, size)
    n, nblocks = _undiscard_by_block(expect_disc, sim._gpu, segs)
    ref = _sim(8 * BLOCK, discard_min_bytes=MiB)
    if n:
        ref._charge_write_faults(n, nblocks)
    want = ref._flush_kernel_counters()
    got = sim.undiscard(0, off, size)
    assert got.as_dict() == want.as_dict()
    assert np.array_equal(sim._disc, expect_disc)
    assert set(np.flatnonzero(sim._disc.any(axis=1)).tolist()) <= sim._disc_slots
    sim.check_invariants()


def _corrupt_free_gpu_row(sim: UvmSim) -> None:
    sim._gpu[sim._n_slots, 3] = True  # a row never handed out (a freed one's count check fires first)


def _corrupt_dup_without_hints(sim: UvmSim) -> None:
    sim._dup[sim._ranges[0][0], 0] = True


def _corrupt_disc_outside_the_set(sim: UvmSim) -> None:
    sim._hinted = True
    sim._disc[sim._ranges[0][0], 0] = True


def _corrupt_both(sim: UvmSim) -> None:
    s = sim._ranges[0][0]
    sim._cpu[s, 0] = True
    sim._cpu_count[s] += 1


def _corrupt_past_the_end(sim: UvmSim) -> None:
    s = sim._ranges[0][-1]
    sim._cpu[s, PAGES - 1] = True
    sim._cpu_count[s] += 1


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (_corrupt_free_gpu_row, "free slot's gpu bitmap"),
        (_corrupt_dup_without_hints, "dup bitmap holds pages but no hint"),
        (_corrupt_disc_outside_the_set, "missing from _disc_slots"),
        (_corrupt_both, "both the GPU and the CPU"),
        (_corrupt_past_the_end, "past the end of its block"),
    ],
)
def test_check_invariants_catches_each_corruption(corrupt: object, message: str) -> None:
    """The checks that count bitmap rows instead of scanning them still see each kind of broken state."""
    sim = _sim(8 * BLOCK)
    sim.map_range(0, BLOCK + 64 * 1024)  # a full block and a short last one
    sim.map_range(1, BLOCK)
    sim.access([(0, 0, BLOCK + 64 * 1024, True), (1, 0, BLOCK, True)])
    sim.unmap_range(1)  # a free slot
    sim.check_invariants()
    corrupt(sim)  # type: ignore[operator]
    with pytest.raises(InvariantError, match=message):
        sim.check_invariants()


def test_read_mostly_advice_reaches_a_neighbour_on_the_same_page() -> None:
    """Issue 43 defect 9, in the simulator: CUDA rounds an advised range out to CPU pages, so a neighbour that
    shares the advised tensor's last page reads a duplicate there too. Range 0 holds a 6 KiB read-mostly tensor at
    0 and a neighbour at 6 KiB: the neighbour's first 2 KiB lie on the advised tensor's second page, its rest on
    pages of its own, which it migrates (they are not advised: no duplicate)."""
    sim = _sim(advise_read_mostly="parameter")
    sim.map_range(0, BLOCK)
    sim.host_write(0, 0, 16 * 1024)  # four pages on the CPU
    sim.advise(0, 0, 6 * 1024, "set_read_mostly")  # the advised tensor: pages 0 and 1
    s = sim._ranges[0][0]
    assert sim._rm[s, :4].tolist() == [True, True, False, False]
    sim.access([(0, 6 * 1024, 10 * 1024, False)])  # the neighbour: pages 1..3
    assert sim._dup[s, 1] and not sim._dup[s, 2:4].any() and not sim._cpu[s, 2:4].any()
