"""Every call of issue 24 step 1, on and off, through the path ``uvmlab run FILE`` takes.

Each test writes a small workload program (``program(uvm, cfg, options)``, workloads.program), simulates it with
``uvmlab.uvm.simulate.prepare`` + ``simulate_prepared`` (what ``uvmlab run`` runs before writing its tables), once
with the call and once without, and asserts the effect the driver model documents for it
(uvmlab/sim/uvm/advice.py, host.py, driver.py ``prefetch``) with the numbers its rule implies. A tensor of 16 MiB
is 8 VA blocks of 2 MiB, 4096 pages of 4 KiB; on main none of these files loads (a user file cannot define
``program``), so every test here fails there.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pandas as pd
import pytest

from uvmlab.config import RunConfig, WorkloadConfig
from uvmlab.uvm.simulate import prepare, simulate_prepared

MIB = 1 << 20
SIZE = 16 * MIB
"""Bytes of each tensor: ``torch.empty(4 << 20)`` float32, one PCA segment of its own (>= 10 MiB is rounded to
2 MiB, CUDACachingAllocator.cpp ``get_allocation_size``)."""
BLOCKS = SIZE // (2 * MIB)
PAGES = SIZE // 4096
HOST_FAULTS_PER_BLOCK = 6
"""A sequential host access of a fresh 2 MiB block faults 6 times on the CPU (64K, 64K, 128K, 256K, 512K, 1M:
the tree prefetcher for the CPU destination, uvmlab/sim/uvm/host.py docstring)."""
TENSOR = "a = torch.empty(4 << 20, device=uvm.device)\n"
TWO = TENSOR + "b = torch.empty(4 << 20, device=uvm.device)\n"


def simulate(tmp_path: Path, body: str, name: str, **run: object) -> tuple[pd.DataFrame, dict]:
    """Simulate the program whose body (after ``import torch``) is ``body``; return (kernels table, result.json)."""
    f = tmp_path / f"{name}.py"
    f.write_text("def program(uvm, cfg, options):\n    import torch\n\n" + textwrap.indent(body, "    "))
    iterations = int(run.pop("iterations", 1))
    cfg = RunConfig(workload=WorkloadConfig(str(f), iterations=iterations), mode="sim", **run)
    res, result = simulate_prepared(cfg, prepare(cfg))
    return res.kernels.reset_index(drop=True), result


def row(kernels: pd.DataFrame, name: str, iteration: int | None = None) -> pd.Series:
    """The one row of kernel (or API call) ``name`` (in ``iteration`` when given)."""
    sel = kernels[kernels["name"] == name]
    if iteration is not None:
        sel = sel[sel["iteration"] == iteration]
    assert len(sel) == 1, f"{len(sel)} rows named {name!r}"
    return sel.iloc[0]


def pair(tmp_path: Path, on: str, off: str, **run: object) -> tuple[pd.DataFrame, pd.DataFrame, dict, dict]:
    k_on, r_on = simulate(tmp_path, on, "on", **run)
    k_off, r_off = simulate(tmp_path, off, "off", **run)
    return k_on, k_off, r_on, r_off


# ---- host accesses --------------------------------------------------------------------------------------------
def test_host_write_puts_the_data_on_the_cpu_and_the_kernel_migrates_it(tmp_path: Path) -> None:
    loop = 'for it in uvm.iterations():\n    uvm.kernel("r", reads=[a])\n'
    on, off, r_on, r_off = pair(tmp_path, TENSOR + "uvm.host_write(a)\n" + loop, TENSOR + loop)
    hw = row(on, "host_write")
    assert hw["cpu_fault_count"] == BLOCKS * HOST_FAULTS_PER_BLOCK and hw["phase"] == "setup"
    assert hw["htod_bytes"] == 0 and hw["dtoh_bytes"] == 0  # first touch on the CPU: populated there, no transfer
    assert row(on, "r")["htod_bytes"] == SIZE and row(on, "r")["zero_fill_bytes"] == 0
    # without it the pages are resident nowhere: the GPU zero-fills them, nothing crosses the link
    assert row(off, "r")["htod_bytes"] == 0 and row(off, "r")["zero_fill_bytes"] == SIZE
    assert r_on["hint_api_calls"] == {"host_write": 1} and r_off["hint_api_calls"] == {}


def test_host_read_brings_gpu_data_back_and_the_next_kernel_faults_again(tmp_path: Path) -> None:
    body = 'for it in uvm.iterations():\n    uvm.kernel("w", writes=[a])\n{}    uvm.kernel("r", reads=[a])\n'
    on, off, r_on, _ = pair(tmp_path, TENSOR + body.format("    uvm.host_read(a)\n"), TENSOR + body.format(""))
    hr = row(on, "host_read")
    assert hr["dtoh_bytes"] == SIZE and hr["cpu_fault_count"] == BLOCKS * HOST_FAULTS_PER_BLOCK
    assert hr["phase"] == "compute" and hr["iteration"] == 0
    assert row(on, "r")["htod_bytes"] == SIZE and row(on, "r")["fault_count"] > 0
    assert row(off, "r")["fault_count"] == 0 and row(off, "r")["htod_bytes"] == 0
    assert r_on["dtoh_bytes"] == SIZE and r_on["hint_api_calls"] == {"host_read": 1}


# ---- cudaMemPrefetchAsync -------------------------------------------------------------------------------------
def test_prefetch_to_gpu_removes_every_fault_of_the_kernel(tmp_path: Path) -> None:
    loop = 'for it in uvm.iterations():\n    uvm.kernel("r", reads=[a])\n'
    setup = TENSOR + "uvm.host_write(a)\n"
    on, off, r_on, _ = pair(tmp_path, setup + 'uvm.prefetch(a, "gpu")\n' + loop, setup + loop)
    pf = row(on, "cudaMemPrefetchAsync")
    assert pf["htod_bytes"] == SIZE and pf["prefetch_htod_bytes"] == SIZE and pf["fault_count"] == 0
    r = row(on, "r")
    assert r["fault_count"] == 0 and r["htod_bytes"] == 0
    assert row(off, "r")["fault_count"] > 0 and row(off, "r")["htod_bytes"] == SIZE
    assert r_on["hint_api_calls"]["cudaMemPrefetchAsync"] == 1


def test_prefetch_to_cpu_moves_the_data_back_without_cpu_faults(tmp_path: Path) -> None:
    body = 'for it in uvm.iterations():\n    uvm.kernel("w", writes=[a])\n{}    uvm.host_read(a)\n'
    on, off, _, _ = pair(tmp_path, TENSOR + body.format('    uvm.prefetch(a, "cpu")\n'), TENSOR + body.format(""))
    pf = row(on, "cudaMemPrefetchAsync")
    assert pf["dtoh_bytes"] == SIZE and pf["cpu_fault_count"] == 0 and pf["iteration"] == 0
    assert row(on, "host_read")["cpu_fault_count"] == 0 and row(on, "host_read")["dtoh_bytes"] == 0
    assert row(off, "host_read")["cpu_fault_count"] == BLOCKS * HOST_FAULTS_PER_BLOCK
    assert row(off, "host_read")["dtoh_bytes"] == SIZE


# ---- cudaMemAdvise: read-mostly -------------------------------------------------------------------------------
READ_MOSTLY = (
    "uvm.host_write(a)\n{}"
    'for it in uvm.iterations():\n    uvm.kernel("r", reads=[a])\n'
    '    uvm.host_read(a)\n    uvm.kernel("w", writes=[a])\n'
)


def test_set_read_mostly_duplicates_on_read_and_collapses_on_write(tmp_path: Path) -> None:
    on, off, r_on, _ = pair(
        tmp_path, TENSOR + READ_MOSTLY.format('uvm.advise(a, "set_read_mostly")\n'), TENSOR + READ_MOSTLY.format("")
    )
    # the read makes GPU duplicates: the CPU keeps its copy and its mapping, the host read costs nothing
    assert row(on, "r")["htod_bytes"] == SIZE
    assert row(on, "host_read")["dtoh_bytes"] == 0 and row(on, "host_read")["cpu_fault_count"] == 0
    # a GPU write to a duplicate faults and collapses it: one collapse per 4 KiB host page
    w = row(on, "w")
    assert w["write_fault_count"] == PAGES and w["collapse_count"] == PAGES and w["htod_bytes"] == 0
    # without read duplication the read migrates, the host read brings every page back, nothing collapses
    assert row(off, "host_read")["dtoh_bytes"] == SIZE
    assert row(off, "w")["collapse_count"] == 0 and row(off, "w")["htod_bytes"] == SIZE
    assert r_on["hint_api_calls"]["cudaMemAdvise"] == 1


def test_unset_read_mostly_mid_run_drops_the_gpu_duplicates(tmp_path: Path) -> None:
    body = (
        'uvm.host_write(a)\nuvm.advise(a, "set_read_mostly")\n'
        'for it in uvm.iterations():\n    uvm.kernel("r", reads=[a])\n{}    uvm.kernel("r2", reads=[a])\n'
    )
    on, off, r_on, _ = pair(
        tmp_path, TENSOR + body.format('    uvm.advise(a, "unset_read_mostly")\n'), TENSOR + body.format("")
    )
    un = row(on, "cudaMemAdvise", iteration=0)
    assert un["phase"] == "compute" and un["dtoh_bytes"] == 0  # the CPU copy stays, the GPU copy is dropped
    assert row(on, "r2")["htod_bytes"] == SIZE and row(on, "r2")["fault_count"] > 0  # so the GPU faults again
    assert row(off, "r2")["fault_count"] == 0 and row(off, "r2")["htod_bytes"] == 0
    assert r_on["hint_api_calls"]["cudaMemAdvise"] == 2


# ---- cudaMemAdvise: preferred location ------------------------------------------------------------------------
def test_set_preferred_location_gpu_populates_the_whole_block_on_first_touch(tmp_path: Path) -> None:
    loop = 'for it in uvm.iterations():\n    uvm.kernel("r", reads=[a])\n'
    on, off, r_on, _ = pair(tmp_path, TENSOR + 'uvm.advise(a, "set_preferred_location", "gpu")\n' + loop, TENSOR + loop)
    knobs = r_on["knobs"]
    r_on_k, r_off_k = row(on, "r"), row(off, "r")
    assert r_on_k["zero_fill_bytes"] == SIZE == r_off_k["zero_fill_bytes"]
    # a block's first fault populates all of it: only the faults of each block's first batch are taken
    assert 0 < r_on_k["fault_count"] <= BLOCKS * knobs["batch_unique_pages"] < r_off_k["fault_count"]


def test_unset_preferred_location_gpu_restores_the_fault_path(tmp_path: Path) -> None:
    loop = 'for it in uvm.iterations():\n    uvm.kernel("r", reads=[a])\n'
    setting = 'uvm.advise(a, "set_preferred_location", "gpu")\n'
    on, off, _, _ = pair(
        tmp_path,
        TENSOR + setting + 'uvm.advise(a, "unset_preferred_location")\n' + loop,
        TENSOR + setting + loop,
    )
    assert row(on, "r")["fault_count"] > row(off, "r")["fault_count"] > 0


def test_set_preferred_location_gpu_breaks_remote_mappings_of_accessed_by(tmp_path: Path) -> None:
    """AccessedBy(GPU) maps the CPU copy remotely; PreferredLocation(GPU) removes the GPU's remote mappings
    (``preferred_location_unmap_remote_pages``, uvm_policy.c), so the kernel faults the pages over instead."""
    setup = TENSOR + 'uvm.host_write(a)\nuvm.advise(a, "set_accessed_by", "gpu")\n'
    loop = 'for it in uvm.iterations():\n    uvm.kernel("r", reads=[a])\n'
    on, off, _, _ = pair(tmp_path, setup + 'uvm.advise(a, "set_preferred_location", "gpu")\n' + loop, setup + loop)
    assert row(on, "r")["htod_bytes"] == SIZE and row(on, "r")["remote_read_bytes"] == 0
    assert row(off, "r")["fault_count"] == 0 and row(off, "r")["remote_read_bytes"] == SIZE


def test_set_preferred_location_cpu_keeps_the_data_on_the_cpu_mapped_remotely(tmp_path: Path) -> None:
    setup = TENSOR + "uvm.host_write(a)\n"
    loop = 'for it in uvm.iterations():\n    uvm.kernel("r", reads=[a])\n'
    on, off, r_on, _ = pair(
        tmp_path, setup + 'uvm.advise(a, "set_preferred_location", "cpu")\n' + loop, setup + loop, iterations=2
    )
    first, second = row(on, "r", 0), row(on, "r", 1)
    # every page faults once on its own (a page that stays is not prefetched), nothing migrates, reads go remote
    assert first["fault_count"] == PAGES and first["htod_bytes"] == 0 and first["remote_read_bytes"] == SIZE
    assert second["fault_count"] == 0 and second["remote_read_bytes"] == SIZE  # mapped: never faults again
    assert row(off, "r", 0)["htod_bytes"] == SIZE and row(off, "r", 1)["remote_read_bytes"] == 0
    assert r_on["remote_bytes"] == 2 * SIZE


def test_unset_preferred_location_cpu_lets_the_kernel_migrate(tmp_path: Path) -> None:
    setup = TENSOR + 'uvm.host_write(a)\nuvm.advise(a, "set_preferred_location", "cpu")\n'
    loop = 'for it in uvm.iterations():\n    uvm.kernel("r", reads=[a])\n'
    on, off, _, _ = pair(tmp_path, setup + 'uvm.advise(a, "unset_preferred_location")\n' + loop, setup + loop)
    assert row(on, "r")["htod_bytes"] == SIZE and row(on, "r")["remote_read_bytes"] == 0
    assert row(off, "r")["htod_bytes"] == 0 and row(off, "r")["remote_read_bytes"] == SIZE


# ---- cudaMemAdvise: accessed-by -------------------------------------------------------------------------------
def test_set_accessed_by_gpu_reads_cpu_data_remotely_without_faults(tmp_path: Path) -> None:
    setup = TENSOR + "uvm.host_write(a)\n"
    loop = 'for it in uvm.iterations():\n    uvm.kernel("r", reads=[a])\n'
    on, off, _, _ = pair(
        tmp_path, setup + 'uvm.advise(a, "set_accessed_by", "gpu")\n' + loop, setup + loop, iterations=2
    )
    for it in (0, 1):
        r = row(on, "r", it)
        assert r["fault_count"] == 0 and r["htod_bytes"] == 0 and r["remote_read_bytes"] == SIZE
    assert row(off, "r", 0)["fault_count"] > 0 and row(off, "r", 0)["htod_bytes"] == SIZE


def test_unset_accessed_by_gpu_stops_mapping_new_cpu_pages(tmp_path: Path) -> None:
    """Accessed-by GPU maps pages the host populates (``block_service_finish_map_accessed_by``); unset before the
    host write, the GPU has no mapping and faults them over."""
    tail = 'uvm.host_write(a)\nfor it in uvm.iterations():\n    uvm.kernel("r", reads=[a])\n'
    setting = TENSOR + 'uvm.advise(a, "set_accessed_by", "gpu")\n'
    on, off, _, _ = pair(tmp_path, setting + 'uvm.advise(a, "unset_accessed_by", "gpu")\n' + tail, setting + tail)
    assert row(on, "r")["htod_bytes"] == SIZE and row(on, "r")["remote_read_bytes"] == 0
    assert row(off, "r")["fault_count"] == 0 and row(off, "r")["remote_read_bytes"] == SIZE


EVICTED = (
    '{}for it in uvm.iterations():\n    uvm.kernel("wa", writes=[a])\n    uvm.kernel("wb", writes=[b])\n'
    "    uvm.host_read(a)\n"
)


def test_set_accessed_by_cpu_maps_evicted_pages_for_the_cpu(tmp_path: Path) -> None:
    """At factor 2, writing b evicts a; the CPU, accessed-by, gets a mapping of the evicted pages
    (``block_add_eviction_mappings``) and reads them without a fault; without it one mapping fault per block."""
    on, off, _, _ = pair(
        tmp_path,
        TWO + EVICTED.format('uvm.advise(a, "set_accessed_by", "cpu")\n'),
        TWO + EVICTED.format(""),
        oversub=2.0,
    )
    assert row(on, "wb")["eviction_count"] == BLOCKS == row(off, "wb")["eviction_count"]
    assert row(on, "host_read")["cpu_fault_count"] == 0
    assert row(off, "host_read")["cpu_fault_count"] == BLOCKS and row(off, "host_read")["dtoh_bytes"] == 0


def test_unset_accessed_by_cpu_leaves_evicted_pages_unmapped(tmp_path: Path) -> None:
    setting = 'uvm.advise(a, "set_accessed_by", "cpu")\n'
    on, off, _, _ = pair(
        tmp_path,
        TWO + EVICTED.format(setting + 'uvm.advise(a, "unset_accessed_by", "cpu")\n'),
        TWO + EVICTED.format(setting),
        oversub=2.0,
    )
    assert row(on, "host_read")["cpu_fault_count"] == BLOCKS
    assert row(off, "host_read")["cpu_fault_count"] == 0


COHERENT = '{}for it in uvm.iterations():\n    uvm.kernel("w", writes=[a])\n    uvm.host_read(a)\n'


def test_set_accessed_by_cpu_on_a_coherent_link_reads_gpu_memory_in_place(tmp_path: Path) -> None:
    """GH200 (NVLink-C2C, coherent, 64 KiB host pages): the CPU, accessed-by, maps the GPU's pages instead of
    migrating them: one mapping fault per 64 KiB host page, no DtoH transfer."""
    on, off, _, _ = pair(
        tmp_path,
        TENSOR + COHERENT.format('uvm.advise(a, "set_accessed_by", "cpu")\n'),
        TENSOR + COHERENT.format(""),
        gpu="GH200",
    )
    assert row(on, "host_read")["dtoh_bytes"] == 0 and row(on, "host_read")["cpu_fault_count"] == SIZE // (64 << 10)
    assert row(off, "host_read")["dtoh_bytes"] == SIZE


def test_unset_accessed_by_cpu_on_a_coherent_link_migrates_again(tmp_path: Path) -> None:
    setting = 'uvm.advise(a, "set_accessed_by", "cpu")\n'
    on, off, _, _ = pair(
        tmp_path,
        TENSOR + COHERENT.format(setting + 'uvm.advise(a, "unset_accessed_by", "cpu")\n'),
        TENSOR + COHERENT.format(setting),
        gpu="GH200",
    )
    assert row(on, "host_read")["dtoh_bytes"] == SIZE
    assert row(off, "host_read")["dtoh_bytes"] == 0


# ---- the prefetching allocator --------------------------------------------------------------------------------
def test_prefetch_new_allocations_prefetches_each_new_tensor_until_turned_off(tmp_path: Path) -> None:
    loop = 'for it in uvm.iterations():\n    uvm.kernel("r", reads=[a])\n    uvm.kernel("rb", reads=[b])\n'
    on, off, r_on, r_off = pair(
        tmp_path,
        "uvm.prefetch_new_allocations(True)\n"
        + TENSOR
        + "uvm.prefetch_new_allocations(False)\n"
        + "b = torch.empty(4 << 20, device=uvm.device)\n"
        + loop,
        TWO + loop,
    )
    pf = row(on, "cudaMemPrefetchAsync")  # one row: a's allocation only; b came after the allocator was turned off
    assert pf["zero_fill_bytes"] == SIZE and pf["fault_count"] == 0
    assert row(on, "r")["fault_count"] == 0 and row(on, "r")["zero_fill_bytes"] == 0
    assert row(on, "rb")["fault_count"] == row(off, "rb")["fault_count"] > 0
    assert row(off, "r")["fault_count"] > 0 and row(off, "r")["zero_fill_bytes"] == SIZE
    assert r_on["hint_api_calls"] == {"cudaMemPrefetchAsync": 1} and r_off["hint_api_calls"] == {}


@pytest.mark.parametrize("iterations", [2])
def test_prefetch_new_allocations_covers_tensors_made_inside_the_loop(tmp_path: Path, iterations: int) -> None:
    body = (
        "{}for it in uvm.iterations():\n    t = torch.empty(4 << 20, device=uvm.device)\n"
        '    uvm.kernel("w", writes=[t])\n    del t\n'
    )
    on, off, r_on, _ = pair(
        tmp_path, body.format("uvm.prefetch_new_allocations(True)\n"), body.format(""), iterations=iterations
    )
    assert (on[on["name"] == "w"]["fault_count"] == 0).all()
    assert (off[off["name"] == "w"]["fault_count"].iloc[:1] > 0).all()
    assert r_on["hint_api_calls"]["cudaMemPrefetchAsync"] == iterations


def test_unset_accessed_by_gpu_mid_run_keeps_the_existing_remote_mapping(tmp_path: Path) -> None:
    """Unset AccessedBy clears the policy bit only (``uvm_va_range_unset_accessed_by``): the GPU keeps its remote
    mapping of the CPU pages until they move, so the next iteration still reads them over the link, no fault.
    (Regression: the slot left the policy fault path with its mappings in place, and the plain path faulted the
    mapped pages over: InvariantError "the GPU maps a page remotely that is resident on the GPU".)"""
    body = (
        'uvm.advise(a, "set_preferred_location", "cpu")\nuvm.advise(a, "set_accessed_by", "gpu")\n'
        'for it in uvm.iterations():\n    uvm.host_write(a)\n    uvm.kernel("r", reads=[a])\n'
        '    if it == 0:\n        uvm.advise(a, "unset_accessed_by", "gpu")\n'
        '        uvm.advise(a, "unset_preferred_location")\n'
    )
    kernels, result = simulate(tmp_path, TENSOR + body, "unset_mid_run", iterations=2)
    for it in (0, 1):
        r = row(kernels, "r", it)
        assert r["fault_count"] == 0 and r["htod_bytes"] == 0 and r["remote_read_bytes"] == SIZE
    assert result["hint_api_calls"]["cudaMemAdvise"] == 4
