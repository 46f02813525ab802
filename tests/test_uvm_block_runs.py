"""The run path of the fault service (``FaultService._apply_plan_run``) against block-by-block ``_apply_plan``.

A kernel's never-touched blocks are serviced as one run: chunk allocation and its evictions are found first, the
batch accounting is summed and the bitmaps are written once per plan. With the run path off, every counter (up to
the order of float additions), bitmap, the LRM order and the memory high-water mark must come out the same, over
random programs of maps, frees, kernels, host accesses, prefetches, hints and discards, with and without evictions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.uvm_synth import live_range
from uvmlab.gpus import GPUS
from uvmlab.sim.uvm.advice import ADVICE
from uvmlab.sim.uvm.driver import UvmSim
from uvmlab.sim.uvm.knobs import PAGE_BYTES, UvmKnobs

MiB = 1 << 20
BLOCK = 2 * MiB

map_op = st.tuples(st.just("map"), st.integers(1, 9 * MiB))
unmap_op = st.tuples(st.just("unmap"), st.integers(0, 30))
kernel_op = st.tuples(
    st.just("kernel"),
    st.lists(
        st.tuples(st.integers(0, 30), st.integers(0, 9 * MiB), st.integers(1, 9 * MiB), st.booleans()),
        min_size=1,
        max_size=4,
    ),
)
op = st.one_of(
    map_op,
    unmap_op,
    kernel_op,
    st.tuples(st.just("host"), st.integers(0, 30), st.integers(0, 9 * MiB), st.integers(1, 5 * MiB), st.booleans()),
    st.tuples(st.just("prefetch"), st.integers(0, 30), st.integers(0, 9 * MiB), st.integers(1, 9 * MiB)),
    st.tuples(
        st.just("advise"), st.integers(0, 30), st.integers(0, 9 * MiB), st.integers(1, 5 * MiB), st.sampled_from(ADVICE)
    ),
    st.tuples(st.just("discard"), st.integers(0, 30), st.integers(0, 9 * MiB), st.integers(1, 5 * MiB)),
)


def run_program(ops: list, capacity_blocks: int, knobs: UvmKnobs, gpu: str) -> tuple:
    """Replay ``ops`` on a fresh simulator; return its totals, bitmaps, LRM order, memory marks and per-slot lists."""
    sim = UvmSim(capacity_blocks * BLOCK, knobs, gpu=GPUS[gpu])
    sizes: dict[int, int] = {}
    next_id = 0
    per_call = []
    for o in ops:
        if o[0] == "map":
            sim.map_range(next_id, o[1])
            sizes[next_id] = o[1]
            next_id += 1
            continue
        if not sizes:
            continue

        def rng(index: int, offset: int, size: int) -> tuple[int, int, int]:
            return live_range(sizes, index, offset, size)

        if o[0] == "unmap":
            rid = live_range(sizes, o[1], 0, 1)[0]
            sim.unmap_range(rid)
            del sizes[rid]
        elif o[0] == "kernel":
            per_call.append(sim.access([(*rng(r, off, n), w) for r, off, n, w in o[1]]))
        elif o[0] == "host":
            per_call.append(sim.cpu_access(*rng(o[1], o[2], o[3]), o[4]))
        elif o[0] == "prefetch":
            per_call.append(sim.prefetch(*rng(o[1], o[2], o[3])))
        elif o[0] == "advise":
            per_call.append(sim.advise(*rng(o[1], o[2], o[3]), o[4]))
        else:
            sim.discard(*rng(o[1], o[2], o[3]))
    sim.check_invariants()
    maps = {n: getattr(sim, n)[: sim._n_slots].copy() for n in ("_gpu", "_cpu", "_dup", "_disc", *sim._hint_arrays)}
    counters = [dataclasses.asdict(c) for c in per_call] + [dataclasses.asdict(sim.totals)]
    per_slot = {name: getattr(sim, name)[: sim._n_slots] for name, _ in UvmSim._SLOT_DEFAULTS}
    return counters, maps, list(sim._lrm), sim.used_bytes, sim.peak_used_bytes, sim.populated_gpu_bytes, per_slot


def assert_same(fast: tuple, slow: tuple, rel: float = 1e-9) -> None:
    """Two ``run_program`` results agree: floats within ``rel`` (0: exactly), everything else exactly."""
    assert len(fast[0]) == len(slow[0])
    for a, b in zip(fast[0], slow[0], strict=True):
        for name, va in a.items():
            if isinstance(va, float):
                assert va == pytest.approx(b[name], rel=rel, abs=1e-6 if rel else 0), name
            else:
                assert va == b[name], name
    assert fast[1].keys() == slow[1].keys()
    for name in fast[1]:
        assert np.array_equal(fast[1][name], slow[1][name]), name
    assert fast[2:] == slow[2:]


def compare(ops: list, capacity_blocks: int, knobs: UvmKnobs, gpu: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as m:
        m.setattr(UvmSim, "bulk_block_runs", True)
        fast = run_program(ops, capacity_blocks, knobs, gpu)
        m.setattr(UvmSim, "bulk_block_runs", False)
        slow = run_program(ops, capacity_blocks, knobs, gpu)
    assert_same(fast, slow)


def random_programs(test: Callable[..., None]) -> Callable[..., None]:
    """Run ``test`` on random programs, capacities (in blocks), prefetch on/off, batch sizes and two GPUs."""
    return settings(
        max_examples=80,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )(
        given(
            ops=st.lists(op, min_size=1, max_size=30),
            capacity_blocks=st.integers(1, 12),
            prefetch=st.booleans(),
            per_batch=st.integers(1, 300),
            gpu=st.sampled_from(["A100-80GB", "GH200"]),
        )(test)
    )


@random_programs
def test_run_path_equals_block_by_block(
    ops: list, capacity_blocks: int, prefetch: bool, per_batch: int, gpu: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    knobs = UvmKnobs(prefetch_enable=prefetch, batch_unique_pages=per_batch)
    compare(ops, capacity_blocks, knobs, gpu, monkeypatch)


def test_long_runs_with_evictions_of_every_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hand-picked: runs that evict fully and partly resident chunks, CPU-resident blocks joining a run, a run
    larger than the GPU (it would evict its own blocks: the one-by-one fallback), and a discarded chunk waiting."""
    ops = [
        ("map", 6 * BLOCK),
        ("map", 5 * BLOCK + 3 * PAGE_BYTES),
        ("map", 20 * BLOCK),
        ("kernel", [(0, 0, 6 * BLOCK, False)]),
        ("kernel", [(1, 5 * PAGE_BYTES, 77 * PAGE_BYTES, True)]),  # a partly resident block
        ("kernel", [(2, 0, 20 * BLOCK, True)]),  # larger than the GPU
        ("kernel", [(0, 0, 6 * BLOCK, False), (1, 0, 5 * BLOCK, False)]),  # CPU-resident blocks, evictions
        ("discard", 0, 0, 2 * BLOCK),
        ("kernel", [(2, 0, 4 * BLOCK, False)]),  # the discarded chunks go first
        ("map", 16 * PAGE_BYTES),  # one 64 KiB chunk
        ("kernel", [(3, 0, 16 * PAGE_BYTES, True)]),
        ("discard", 3, 0, 16 * PAGE_BYTES),
        ("kernel", [(2, 12 * BLOCK, 2 * BLOCK, False)]),  # the small discarded chunk goes first
        ("host", 1, 0, 3 * BLOCK, True),
        ("kernel", [(1, 0, 5 * BLOCK, False), (2, 3 * BLOCK, 9 * BLOCK, True)]),
    ]
    for prefetch in (True, False):
        compare(ops, 8, UvmKnobs(prefetch_enable=prefetch), "A100-80GB", monkeypatch)


def test_the_run_path_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison above is not vacuous: a kernel over new blocks goes through the run path."""
    calls = []
    orig = UvmSim._apply_plan_run

    def spy(self: UvmSim, run: list, budget: int) -> int:
        calls.append(len(run))
        return orig(self, run, budget)

    monkeypatch.setattr(UvmSim, "_apply_plan_run", spy)
    sim = UvmSim(4 * BLOCK, UvmKnobs())
    sim.map_range(0, 10 * BLOCK)
    sim.access([(0, 0, 10 * BLOCK, False)])
    assert calls == [10]
    assert sim.totals.eviction_count == 6


def test_partly_resident_victims_keep_their_own_transfers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two partly resident blocks evicted by one run: the first ends and the second starts with resident pages,
    which are two transfers, not one (the rows are evicted together)."""
    ops = [
        ("map", 2 * BLOCK),
        ("kernel", [(0, BLOCK - 64 * PAGE_BYTES, 128 * PAGE_BYTES, False)]),  # pages 448-511 and 0-63
        ("map", 4 * BLOCK),
        ("kernel", [(1, 0, 4 * BLOCK, False)]),  # evicts both
    ]
    compare(ops, 4, UvmKnobs(prefetch_enable=False), "A100-80GB", monkeypatch)
    counters = run_program(ops, 4, UvmKnobs(prefetch_enable=False), "A100-80GB")[0]
    assert counters[-1]["eviction_count"] == 2 and counters[-1]["dtoh_count"] == 2


@pytest.mark.parametrize("run_path", [True, False])
def test_a_gpu_fault_unmaps_the_cpu_on_a_coherent_host(run_path: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pages the GPU faults in lose their CPU mapping (``_after_gpu_populate``; only accessed-by CPU keeps it on a
    coherent link), through the memoized plan and the run path too: the CPU's next read of them faults."""
    monkeypatch.setattr(UvmSim, "bulk_block_runs", run_path)
    sim = UvmSim(8 * BLOCK, UvmKnobs(), gpu=GPUS["GH200"])
    sim.map_range(0, 2 * BLOCK)
    sim.host_write(0, 0, 2 * BLOCK)  # the CPU populates and maps every page
    sim.access([(0, 0, 2 * BLOCK, False)])  # entirely on the CPU: the plan path migrates the blocks
    assert sim.host_read(0, 0, 2 * BLOCK).cpu_fault_count > 0
    sim.check_invariants()
