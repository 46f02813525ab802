"""cudaMemAdvise, prefetch and host accesses as the driver implements them (issue 24 step 5; uvmlab.sim.uvm.advice,
uvmlab.sim.uvm.host), each advice on and off, through the replay's ``api`` rows (IFACE24.md). Torch-free."""

from __future__ import annotations

import pytest

from tests.uvm_program import Program
from uvmlab.errors import InputError
from uvmlab.gpus import GPUS
from uvmlab.sim.uvm.driver import UvmSim
from uvmlab.sim.uvm.knobs import PAGE_BYTES, UvmKnobs, rounded_range_bytes
from uvmlab.sim.uvm.replay import managed_chunk_bytes
from uvmlab.sim.uvm.timing import CostParams

MiB = 1 << 20
BLOCK = 2 * MiB
PAGES = BLOCK // PAGE_BYTES


def _host_written(*advice: str, size: int = BLOCK, extra: dict[str, int] | None = None) -> Program:
    """Tensor ``t`` written by the host, then advised."""
    p = Program({"t": size, **(extra or {})})
    p.api("host_write", "t")
    for a in advice:
        p.api("advise", "t", a)
    return p


# -- AccessedBy(GPU) alone ---------------------------------------------------------------------------------------
def test_accessed_by_gpu_reads_host_data_remotely_without_faults() -> None:
    on = _host_written("set_accessed_by:gpu")
    k = on.kernel(reads=("t",))
    _, kt = on.run(8 * MiB)
    assert kt.loc[k, "fault_count"] == 0 and kt.loc[k, "htod_bytes"] == 0
    assert kt.loc[k, "remote_read_bytes"] == BLOCK
    assert kt.loc[k, "duration_ns"] >= BLOCK / GPUS["A100-80GB"].link_bytes_per_s * 1e9 * 0.99  # the link's time
    off = _host_written()
    k = off.kernel(reads=("t",))
    _, kt = off.run(8 * MiB)
    assert kt.loc[k, "fault_count"] > 0 and kt.loc[k, "htod_bytes"] == BLOCK and kt.loc[k, "remote_read_bytes"] == 0


def test_accessed_by_gpu_leaves_first_touch_on_the_gpu() -> None:
    """A page resident nowhere goes to the faulting GPU: accessed-by alone keeps nothing remote that was not on the
    CPU (block_select_processor_residency: no preferred location -> the faulting processor)."""
    p = Program({"t": BLOCK})
    p.api("advise", "t", "set_accessed_by:gpu")
    k = p.kernel(writes=("t",))
    _, kt = p.run(8 * MiB)
    assert kt.loc[k, "zero_fill_bytes"] == BLOCK and kt.loc[k, "remote_write_bytes"] == 0


def test_accessed_by_gpu_maps_evicted_pages_and_unset_keeps_only_existing_mappings() -> None:
    """After an eviction the accessed-by GPU reads the evicted pages remotely (block_add_eviction_mappings); with the
    advice unset the same pages fault back (uvm_va_range_unset_accessed_by clears only the policy bit)."""

    def prog(*advice: str) -> tuple[Program, int]:
        p = Program({"t": BLOCK, "u": BLOCK})
        for a in advice:
            p.api("advise", "t", a)
        p.kernel(writes=("t",))
        p.kernel(writes=("u",))  # one chunk of GPU memory: evicts t
        return p, p.kernel(reads=("t",))

    on, k = prog("set_accessed_by:gpu")
    _, kt = on.run(BLOCK)
    assert kt.loc[k, "fault_count"] == 0 and kt.loc[k, "remote_read_bytes"] == BLOCK
    off, k = prog("set_accessed_by:gpu", "unset_accessed_by:gpu")
    _, kt = off.run(BLOCK)
    assert kt.loc[k, "fault_count"] > 0 and kt.loc[k, "htod_bytes"] == BLOCK


# -- AccessedBy(CPU) ---------------------------------------------------------------------------------------------
def test_accessed_by_cpu_maps_evicted_pages_so_host_reads_do_not_fault() -> None:
    def prog(*advice: str) -> tuple[Program, int]:
        p = Program({"t": BLOCK, "u": BLOCK})
        for a in advice:
            p.api("advise", "t", a)
        p.kernel(writes=("t",))
        p.kernel(writes=("u",))  # evicts t to the CPU
        return p, p.api("host_read", "t")

    on, k = prog("set_accessed_by:cpu")
    _, kt = on.run(BLOCK)
    assert kt.loc[k, "cpu_fault_count"] == 0 and kt.loc[k, "dtoh_bytes"] == 0
    off, k = prog("set_accessed_by:cpu", "unset_accessed_by:cpu")
    _, kt = off.run(BLOCK)
    assert kt.loc[k, "cpu_fault_count"] > 0 and kt.loc[k, "dtoh_bytes"] == 0  # minor faults: map, no copy


def test_accessed_by_cpu_keeps_gpu_pages_in_place_only_over_a_coherent_link() -> None:
    """The CPU can map GPU memory only on a coherent link (uvm_va_space.c: accessible_from[gpu] gets the CPU only
    for a coherent GPU with NUMA memory): GH200 reads remotely, a PCIe A100 migrates the pages back."""
    results = {}
    for gpu in ("GH200", "A100-80GB"):
        p = Program({"t": BLOCK})
        p.api("advise", "t", "set_accessed_by:cpu")
        p.kernel(writes=("t",))
        k = p.api("host_read", "t")
        _, kt = p.run(8 * MiB, GPUS[gpu])
        results[gpu] = kt.loc[k, "dtoh_bytes"]
    assert results == {"GH200": 0, "A100-80GB": BLOCK}


# -- PreferredLocation alone -------------------------------------------------------------------------------------
def test_preferred_location_cpu_maps_host_pages_on_the_first_fault_then_reads_remotely() -> None:
    on = _host_written("set_preferred_location:cpu")
    k1, k2 = on.kernel(reads=("t",)), on.kernel(reads=("t",))
    _, kt = on.run(8 * MiB)
    assert kt.loc[k1, "fault_count"] == PAGES and kt.loc[k1, "htod_bytes"] == 0  # first touch: a mapping fault
    assert kt.loc[k2, "fault_count"] == 0 and kt.loc[k2, "remote_read_bytes"] == BLOCK
    assert kt.loc[k2, "resident_bytes"] == 0
    off = _host_written("set_preferred_location:cpu", "unset_preferred_location")
    k1 = off.kernel(reads=("t",))
    _, kt = off.run(8 * MiB)
    assert kt.loc[k1, "htod_bytes"] == BLOCK and kt.loc[k1, "remote_read_bytes"] == 0


def test_preferred_location_cpu_first_touch_populates_the_host_and_costs_time() -> None:
    p = Program({"t": BLOCK})
    p.api("advise", "t", "set_preferred_location:cpu")
    k1, k2 = p.kernel(writes=("t",)), p.kernel(writes=("t",))
    _, kt = p.run(8 * MiB)
    assert kt.loc[k1, "zero_fill_bytes"] == 0 and kt.loc[k1, "resident_bytes"] == 0
    assert kt.loc[k1, "stall_ns"] > 0 and kt.loc[k2, "stall_ns"] == 0  # first-touch mapping, then remote writes
    assert kt.loc[k2, "remote_write_bytes"] == BLOCK


def test_preferred_location_gpu_first_touch_populates_the_whole_block() -> None:
    """uvm_perf_prefetch.c: a first touch whose destination is the preferred location fills the whole block."""
    for advice, zero in (("set_preferred_location:gpu", BLOCK), ("unset_preferred_location", 64 * 1024)):
        p = Program({"t": BLOCK})
        p.api("advise", "t", advice)
        k = p.kernel(writes=("t",), size=PAGE_BYTES)
        _, kt = p.run(8 * MiB)
        assert kt.loc[k, "zero_fill_bytes"] == zero, advice


def test_preferred_location_gpu_turns_off_cpu_prefetch_from_driver_590() -> None:
    """A CPU fault on data preferred on the GPU migrates only the faulted page from R590 on
    (should_apply_prefetch_logic, new in 590.44.01); 575 and 580 still prefetch."""
    counts = {}
    for driver in ("595.45.04", "580.142", "575.57.08"):
        for advice in ("set_preferred_location:gpu", "unset_preferred_location"):
            p = Program({"t": BLOCK})
            p.api("advise", "t", advice)
            p.kernel(writes=("t",))
            k = p.api("host_read", "t")
            _, kt = p.run(8 * MiB, GPUS["A100-80GB"].with_driver(driver))
            counts[driver, advice] = kt.loc[k, "cpu_fault_count"]
            assert kt.loc[k, "dtoh_bytes"] == BLOCK
    assert counts == {
        ("595.45.04", "set_preferred_location:gpu"): PAGES,
        ("595.45.04", "unset_preferred_location"): 6,
        ("580.142", "set_preferred_location:gpu"): 6,
        ("580.142", "unset_preferred_location"): 6,
        ("575.57.08", "set_preferred_location:gpu"): 6,
        ("575.57.08", "unset_preferred_location"): 6,
    }


def test_preferred_location_gpu_removes_the_gpus_remote_mappings() -> None:
    p = _host_written("set_accessed_by:gpu", "set_preferred_location:gpu")
    k = p.kernel(reads=("t",))
    _, kt = p.run(8 * MiB)
    assert kt.loc[k, "remote_read_bytes"] == 0 and kt.loc[k, "htod_bytes"] == BLOCK


# -- remote accesses in each direction ---------------------------------------------------------------------------
def test_remote_reads_and_writes_use_their_own_link_direction() -> None:
    gpu = GPUS["A100-80GB"]
    one = BLOCK / gpu.link_bytes_per_s * 1e9
    p = Program({"a": BLOCK, "b": BLOCK})
    for t in ("a", "b"):
        p.api("host_write", t)
        p.api("advise", t, "set_preferred_location:cpu")
        p.api("advise", t, "set_accessed_by:gpu")
    both = p.kernel(reads=("a",), writes=("b",))
    reads = p.kernel(reads=("a", "b"))
    _, kt = p.run(8 * MiB, gpu)
    assert kt.loc[both, "duration_ns"] == pytest.approx(max(one, kt.loc[both, "native_ns"]), rel=1e-6)
    assert kt.loc[reads, "duration_ns"] == pytest.approx(2 * one, rel=1e-6)  # one direction, twice the bytes
    slow = CostParams(remote_write_bytes_per_s=gpu.link_bytes_per_s / 4)
    _, kt = p.run(8 * MiB, gpu, costs=slow)
    assert kt.loc[both, "duration_ns"] == pytest.approx(4 * one, rel=1e-6)


def test_a_strided_kernel_moves_only_its_touched_bytes_over_the_link() -> None:
    """One 32 B sector per 4 KiB page (the trace's touched_bytes): the link carries the sectors, not the range."""
    gpu = GPUS["A100-80GB"]
    p = _host_written("set_accessed_by:gpu")
    sectors = PAGES * 32
    k = p.kernel(reads=("t",), touched=sectors)
    _, kt = p.run(8 * MiB, gpu)
    assert kt.loc[k, "remote_read_bytes"] == BLOCK  # the pages it reaches through the mapping
    link = sectors / gpu.link_bytes_per_s * 1e9
    assert kt.loc[k, "duration_ns"] == pytest.approx(max(link, kt.loc[k, "native_ns"]), rel=1e-6)
    assert kt.loc[k, "duration_ns"] < BLOCK / gpu.link_bytes_per_s * 1e9 / 10


# -- read duplication and its collapse ---------------------------------------------------------------------------
def test_read_mostly_duplicates_then_a_gpu_write_collapses_once_per_cpu_write() -> None:
    """The collapse is paid once after each CPU write, not on every launch (issue 24)."""
    costs = CostParams(collapse_page_ns=30_000.0)
    p = _host_written("set_read_mostly")
    rd = p.kernel(reads=("t",))
    w1, w2 = p.kernel(reads=("t",), writes=("t",)), p.kernel(reads=("t",), writes=("t",))
    p.api("host_write", "t")
    w3 = p.kernel(reads=("t",), writes=("t",))
    _, kt = p.run(8 * MiB, costs=costs)
    assert kt.loc[rd, "htod_bytes"] == BLOCK and kt.loc[rd, "collapse_count"] == 0
    assert kt.loc[w1, "collapse_count"] == PAGES and kt.loc[w1, "htod_bytes"] == 0
    assert kt.loc[w1, "stall_ns"] >= PAGES * 30_000.0
    assert kt.loc[w2, "collapse_count"] == 0 and kt.loc[w2, "fault_count"] == 0  # not on every launch
    assert kt.loc[w3, "collapse_count"] == PAGES and kt.loc[w3, "htod_bytes"] == BLOCK  # again after a CPU write
    off = _host_written("set_read_mostly", "unset_read_mostly")
    w = off.kernel(reads=("t",), writes=("t",))
    _, kt = off.run(8 * MiB, costs=costs)
    assert kt.loc[w, "collapse_count"] == 0 and kt.loc[w, "fault_count"] == kt.loc[w, "read_fault_count"]


def test_read_mostly_duplicates_need_no_write_back_and_host_reads_do_not_fault() -> None:
    p = _host_written("set_read_mostly", extra={"u": BLOCK})
    p.kernel(reads=("t",))
    h = p.api("host_read", "t")
    ev = p.kernel(writes=("u",))  # one chunk: evicts the duplicate of t
    _, kt = p.run(BLOCK)
    assert kt.loc[h, "cpu_fault_count"] == 0 and kt.loc[h, "dtoh_bytes"] == 0
    assert kt.loc[ev, "eviction_count"] == 1 and kt.loc[ev, "dtoh_bytes"] == 0


def test_unset_read_mostly_keeps_the_cpu_copy_and_the_gpu_faults_again() -> None:
    """va_block_unset_read_duplication_locked: a duplicate keeps the CPU's copy (processor id 0) unless the GPU is
    the preferred location."""
    for advice, htod in (("unset_read_mostly", BLOCK), ("set_preferred_location:gpu", 0)):
        p = _host_written("set_read_mostly")
        p.kernel(reads=("t",))
        if advice != "unset_read_mostly":
            p.api("advise", "t", advice)
        p.api("advise", "t", "unset_read_mostly")
        k = p.kernel(reads=("t",))
        _, kt = p.run(8 * MiB)
        assert kt.loc[k, "htod_bytes"] == htod, advice


def test_read_mostly_prefetch_to_the_gpu_duplicates() -> None:
    p = _host_written("set_read_mostly")
    p.api("prefetch", "t", "gpu")
    h = p.api("host_read", "t")
    _, kt = p.run(8 * MiB)
    assert kt.loc[h, "cpu_fault_count"] == 0 and kt.loc[h, "dtoh_bytes"] == 0


# -- prefetch to the CPU, host reads and writes ------------------------------------------------------------------
def test_prefetch_to_cpu_moves_gpu_pages_home_without_faults() -> None:
    p = Program({"t": BLOCK})
    p.kernel(writes=("t",))
    pf = p.api("prefetch", "t", "cpu")
    h = p.api("host_read", "t")
    _, kt = p.run(8 * MiB)
    assert kt.loc[pf, "dtoh_bytes"] == BLOCK and kt.loc[pf, "fault_count"] == 0
    assert kt.loc[pf, "resident_bytes"] == 0 and kt.loc[pf, "duration_ns"] > 0
    assert kt.loc[h, "cpu_fault_count"] == 0


def test_host_accesses_fault_on_the_cpu_and_take_time() -> None:
    """A fresh block written by the host faults six times (64K, 64K, 128K, 256K, 512K, 1M: the CPU faults of
    UVMSmart getHWPrefetcherP1.cu's GTX 1080 trace); reading GPU data back migrates it with the same growth."""
    p = Program({"t": BLOCK})
    w = p.api("host_write", "t")
    p.kernel(writes=("t",))
    r = p.api("host_read", "t")
    _, kt = p.run(8 * MiB)
    assert kt.loc[w, "cpu_fault_count"] == 6 and kt.loc[w, "duration_ns"] > 0
    assert kt.loc[r, "cpu_fault_count"] == 6 and kt.loc[r, "dtoh_bytes"] == BLOCK
    costs = CostParams()
    assert kt.loc[r, "duration_ns"] >= 6 * costs.cpu_fault_ns


def test_bad_api_arguments_are_refused() -> None:
    p = Program({"t": BLOCK})
    p.api("advise", "t", "set_read_mostly_please")
    with pytest.raises(InputError, match="api_arg"):
        p.run(8 * MiB)
    p = Program({"t": BLOCK})
    p.api("prefetch", "t", "disk")
    with pytest.raises(InputError, match="api_arg"):
        p.run(8 * MiB)
    with pytest.raises(InputError, match="advice"):
        sim = UvmSim(8 * MiB)
        sim.map_range(0, BLOCK)
        sim.advise(0, 0, BLOCK, "bogus")


# -- allocation round-up, host page size -------------------------------------------------------------------------
def test_allocation_round_up_extends_the_prefetch_tree() -> None:
    """2 MiB + 192 KiB is mapped as 2 MiB + 256 KiB (UVMSmart managedAllocRoundUp.cu): the fault at +128 KiB of
    the tail migrates 128 KiB, as the GTX 1080 trace shows (4 KiB + 124 KiB up to +256 KiB)."""
    size = BLOCK + 192 * 1024
    assert managed_chunk_bytes(size) == BLOCK + 256 * 1024 == int(rounded_range_bytes(size))
    sim = UvmSim(8 * MiB)
    sim.map_range(0, size)
    sim.host_write(0, 0, size)
    got = [sim.access([(0, BLOCK + off * 1024, 1, True)]).htod_bytes // 1024 for off in (0, 64, 128)]
    assert got == [64, 64, 128]
    assert sim.used_bytes == 256 * 1024  # only the tail block holds a chunk: its rounded size
    sim.check_invariants()


def test_a_64k_host_page_is_the_fault_unit() -> None:
    """POWER9 and Grace kernels use 64 KiB pages: one fault per 64 KiB, however many 4 KiB pages a kernel touches."""
    knobs = UvmKnobs(prefetch_enable=False)
    faults = {}
    for gpu in ("V100-16GB", "V100-SXM2-P9"):
        sim = UvmSim(8 * MiB, knobs, gpu=GPUS[gpu])
        sim.map_range(0, BLOCK)
        sim.host_write(0, 0, BLOCK)
        c = sim.access([(0, p * PAGE_BYTES, 4, False) for p in range(PAGES)])
        faults[gpu] = (c.fault_count, c.htod_bytes)
        sim.check_invariants()
    assert faults == {"V100-16GB": (PAGES, BLOCK), "V100-SXM2-P9": (PAGES // 16, BLOCK)}
    sim = UvmSim(8 * MiB, knobs, gpu=GPUS["V100-SXM2-P9"])
    sim.map_range(0, BLOCK)
    sim.host_write(0, 0, BLOCK)
    c = sim.access([(0, 0, 1, False)])  # one byte: its whole 64 KiB page migrates
    assert c.fault_count == 1 and c.htod_bytes == 64 * 1024


def test_remote_mappings_never_point_at_gpu_pages() -> None:
    p = _host_written("set_accessed_by:gpu", "set_read_mostly", "unset_read_mostly")
    p.kernel(reads=("t",))
    p.api("prefetch", "t", "gpu")
    p.kernel(writes=("t",))
    p.api("prefetch", "t", "cpu")
    k = p.kernel(reads=("t",))
    _, kt = p.run(8 * MiB)  # check_every=1 runs check_advice_invariants after every step
    assert kt.loc[k, "remote_read_bytes"] == BLOCK and kt.loc[k, "fault_count"] == 0


@pytest.mark.parametrize(
    ("mode", "advice", "remote", "faults"),
    [
        ("uvm", (), (0, 0), 0),
        ("uvm_prefetch", ("prefetch",), (0, 0), 0),
        ("uvm_advise_pref_gpu", ("set_preferred_location:gpu",), (0, 0), 0),
        ("uvm_advise_read", ("set_read_mostly",), (0, 0), PAGES),
        ("uvm_advise_access", ("set_accessed_by:gpu",), (1, 0), 0),
        ("uvm_advise_pref_cpu", ("set_preferred_location:cpu",), (1, 1), 0),
    ],
)
def test_rq4_modes_reach_their_steady_state_through_the_general_path(
    mode: str, advice: tuple[str, ...], remote: tuple[int, int], faults: int
) -> None:
    """gpu_ext's rq4 (uvmbench at 0.25x: the host writes ``input``, both arrays get the hint, two warm-up launches,
    then timed ones) written as api rows: after the warm-ups nothing moves, only the modes that map host memory
    access it remotely (reads of the host-written input; with preferred location CPU also the writes), and only
    read-mostly faults: every written page, on every launch (the prefetch region of each write fault revokes the
    write permission of the block's pages written before it; ``AdviceService._service_policy``)."""
    p = Program({"input": BLOCK, "output": BLOCK})
    p.api("host_write", "input")
    for t in ("input", "output"):
        for a in advice:
            if a == "prefetch":
                p.api("prefetch", t, "gpu")
            else:
                p.api("advise", t, a)
    launches = [p.kernel(reads=("input",), writes=("output",), touched=2 * PAGES * 32) for _ in range(3)]
    _, kt = p.run(8 * MiB)
    timed = kt.loc[launches[-1]]
    assert timed["fault_count"] == faults and timed["htod_bytes"] == 0, mode
    assert (timed["remote_read_bytes"] > 0, timed["remote_write_bytes"] > 0) == (bool(remote[0]), bool(remote[1]))


def test_preferred_location_gpu_keeps_the_remote_mappings_of_read_duplicated_pages_only() -> None:
    """Read duplication takes precedence over PreferredLocation (preferred_location_unmap_remote_pages): the GPU's
    remote mappings of read-mostly pages survive a preferred-location GPU advice, the others are removed."""
    sim = UvmSim(8 * MiB)
    sim.map_range(0, BLOCK)
    sim.host_write(0, 0, BLOCK)
    sim.advise(0, 0, BLOCK, "set_accessed_by:gpu")
    s = int(sim._ranges[0][0])
    sim._rm[s, : PAGES // 2] = True  # half the block under read duplication, mapped remotely before it was set
    sim.advise(0, 0, BLOCK, "set_preferred_location:gpu")
    assert sim._gmap[s, : PAGES // 2].all() and not sim._gmap[s, PAGES // 2 :].any()


def _written_each_launch(*advice: str, launches: int = 3, blocks: int = 4) -> list[int]:
    """Fault counts of ``launches`` kernels that each write a ``blocks``-block tensor the host never touched."""
    p = Program({"out": blocks * BLOCK})
    for a in advice:
        p.api("advise", "out", a)
    ks = [p.kernel(writes=("out",)) for _ in range(launches)]
    _, kt = p.run(64 * MiB)
    assert (kt.loc[ks[1:], "htod_bytes"] == 0).all()  # the pages never leave the GPU
    return [int(kt.loc[k, "fault_count"]) for k in ks]


def test_gpu_writes_to_read_mostly_memory_fault_on_every_launch() -> None:
    """The prefetcher's region includes pages already resident on the destination (only the faulted pages are taken
    out: uvm_perf_prefetch_prenotify_fault_migrations, uvm_perf_prefetch.c); in a read-mostly range its pages go to
    ``uvm_va_block_make_resident_read_duplicate``, which revokes the write permission of every resident copy that is
    not yet a duplicate (``block_prep_read_duplicate_mapping``, uvm_va_block.c). So each write fault takes the write
    of the block's pages written before it, and every written page faults again at the next launch: rq4's 3 us per
    written page on every launch (docs/uvm-sim.md). Without the advice the pages stay mapped read-write."""
    assert _written_each_launch()[1:] == [0, 0]
    assert _written_each_launch("set_read_mostly")[1:] == [4 * PAGES, 4 * PAGES]


def test_set_read_mostly_revokes_the_write_of_gpu_resident_copies() -> None:
    """``va_block_set_read_duplication_locked`` (uvm_policy.c) makes every resident page a read duplicate where it
    is, revoking the holder's write: a tensor the GPU wrote and still holds faults at its next write, with no
    transfer."""
    p = Program({"out": BLOCK})
    p.kernel(writes=("out",))
    p.api("advise", "out", "set_read_mostly")
    k = p.kernel(writes=("out",))
    _, kt = p.run(64 * MiB)
    assert kt.loc[k, "fault_count"] == PAGES and kt.loc[k, "htod_bytes"] == 0


def test_a_write_to_a_read_only_sole_copy_costs_the_fitted_collapse_price() -> None:
    """The steady launch of the rq4 case costs, per written page, the model's write-fault time plus
    ``collapse_page_ns``: the price fitted on rq4's seq_stream (uvmlab.measure.profile_fit.fit_collapse)."""
    from uvmlab.measure.profile_fit import collapse_fault_ns
    from uvmlab.sim.uvm.profile import load_profile

    costs = load_profile("RTX5090")
    p = Program({"out": 4 * BLOCK})
    p.api("advise", "out", "set_read_mostly")
    ks = [p.kernel(writes=("out",)) for _ in range(3)]
    _, kt = p.run(64 * MiB, gpu=GPUS["RTX5090"], costs=costs)
    per_page = kt.loc[ks[-1], "fault_stall_ns"] / (4 * PAGES)
    expected = collapse_fault_ns(costs) + costs.collapse_page_ns
    assert costs.collapse_page_ns > 1_000
    assert per_page == pytest.approx(expected, rel=0.2)


def test_lone_remote_writes_pay_a_partial_line_write_each_and_dense_ones_their_bytes() -> None:
    """A kernel costed at the lone-sector efficiency writes one small piece per page: each remote write is a
    partial-cache-line write the host completes one after another (``CostParams.remote_partial_write_ns``); a dense
    kernel's remote writes keep the rate of their bytes. Reads are never per transaction."""
    from uvmlab.sim.uvm.advice import remote_ns
    from uvmlab.sim.uvm.faults import UvmCounters

    costs = CostParams(link_bytes_per_s=10e9, remote_read_bytes_per_s=20e9, remote_partial_write_ns=30.0)
    c = UvmCounters(
        remote_read_bytes=64 * PAGE_BYTES, remote_write_bytes=64 * PAGE_BYTES, remote_bytes=128 * PAGE_BYTES
    )
    dense = remote_ns(c, costs)
    assert dense == pytest.approx(64 * PAGE_BYTES / 10e9 * 1e9)  # the writes' bytes at the link rate
    sectors = 32 / PAGE_BYTES  # touched_bytes / accessed: one 32 B sector per 4 KiB page
    assert remote_ns(c, costs, sectors, lone_sectors=True) == pytest.approx(64 * 30.0)  # 64 partial writes
    assert remote_ns(c, costs, sectors) == pytest.approx(64 * 32 / 10e9 * 1e9)  # not lone: the sectors' bytes
    reads_only = UvmCounters(remote_read_bytes=64 * PAGE_BYTES, remote_bytes=64 * PAGE_BYTES)
    assert remote_ns(reads_only, costs, sectors, lone_sectors=True) == pytest.approx(64 * 32 / 20e9 * 1e9)


def test_a_prefetch_of_read_mostly_memory_revokes_the_write_of_the_gpus_own_copies() -> None:
    """``uvm_va_block_migrate_locked`` (uvm_migrate.c) makes a read-mostly range's pages read duplicates, which
    revokes the write permission of the GPU's own copies; ``uvm_va_block_migrate_map_mapped_pages`` maps only pages
    the GPU does not map yet, so they stay read-only and the next write faults. Never-populated pages are mapped
    read-write (``block_migrate_map_unmapped_pages``): writing them after the prefetch does not fault. (A 64 KiB
    tensor faults in one batch, so its own writes revoke nothing: each launch after the first is clean.)"""
    small = 16 * PAGE_BYTES
    p = Program({"out": small, "fresh": small})
    p.api("advise", "out", "set_read_mostly")
    p.api("advise", "fresh", "set_read_mostly")
    w = [p.kernel(writes=("out",)) for _ in range(2)]
    p.api("prefetch", "out", "gpu")
    p.api("prefetch", "fresh", "gpu")
    after = p.kernel(writes=("out", "fresh"))
    _, kt = p.run(64 * MiB)
    assert kt.loc[w[0], "fault_count"] == 16 and kt.loc[w[1], "fault_count"] == 0
    assert kt.loc[after, "fault_count"] == 16 and kt.loc[after, "htod_bytes"] == 0  # out's pages only
