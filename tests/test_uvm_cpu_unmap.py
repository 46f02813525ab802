"""The CPU's mappings unmapped when the GPU takes pages the CPU maps (``CostParams.cpu_unmap_chunk_ns``,
``AdviceService.unmap_cpu``; issue 41 section 3), and the fit of that cost on a one-thread kernel's back-to-back
faults (``uvmlab.measure.calibrate.fit_serial_refaults``)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tests.nsys_fault_groups import write_fault_group_export
from uvmlab.gpus import GPUS, GpuSpec
from uvmlab.measure.calibrate import fit_serial_refaults
from uvmlab.measure.nsys.read import open_export
from uvmlab.sim.uvm.driver import UvmSim
from uvmlab.sim.uvm.knobs import PAGE_BYTES, VA_BLOCK_BYTES, UvmKnobs
from uvmlab.sim.uvm.timing import CostParams

MiB = 1 << 20
GPU = GPUS["A100-80GB"]  # the default driver: one CPU chunk per block (uvmlab.sim.uvm.cpu_chunks)
GPU_525 = GPU.with_driver("525.105.17")  # csc746's driver: one CPU chunk per page


def _run(
    costs: CostParams, capacity: int, size: int, host_writes: bool, passes: int = 1, gpu: GpuSpec = GPU
) -> list[tuple[float, int]]:
    """(fault stall, pages migrated HtoD) of each GPU pass over a range of ``size`` bytes (written by the host
    first, or not)."""
    sim = UvmSim(capacity, UvmKnobs(), costs, gpu)
    sim.map_range(0, size)
    if host_writes:
        sim.host_write(0, 0, size)
    out = []
    for _ in range(passes):
        c = sim.access([(0, 0, size, False)])
        out.append((float(c.stall_ns), int(c.htod_bytes) // PAGE_BYTES))
    return out


def _stall(
    costs: CostParams, capacity: int, size: int, host_writes: bool, passes: int = 1, gpu: GpuSpec = GPU
) -> list[float]:
    return [t for t, _ in _run(costs, capacity, size, host_writes, passes, gpu)]


@pytest.mark.parametrize("gpu", [GPU_525, GPU], ids=["R525", "R575"])
@pytest.mark.parametrize("size", [4 * MiB, 4 * MiB + 3 * PAGE_BYTES])
def test_pages_the_cpu_maps_pay_their_unmapping_once(size: int, gpu: GpuSpec) -> None:
    """A GPU read of host-written pages pays ``cpu_unmap_chunk_ns`` per CPU chunk it migrates from, exactly once
    (the pages stay on the GPU and unmapped): per page on R525 (the prefetched ones beyond the range's end
    included), per 2 MiB block on R530+ (2 blocks, and a third for the 3 pages past 4 MiB)."""
    on = _run(CostParams(cpu_unmap_chunk_ns=1000.0), 64 * MiB, size, True, passes=2, gpu=gpu)
    off = _run(CostParams(cpu_unmap_chunk_ns=0.0), 64 * MiB, size, True, passes=2, gpu=gpu)
    migrated = on[0][1]
    assert migrated >= -(-size // PAGE_BYTES) and migrated == off[0][1]
    chunks = migrated if gpu is GPU_525 else -(-size // VA_BLOCK_BYTES)
    assert on[0][0] - off[0][0] == pytest.approx(chunks * 1000.0)
    assert on[1][0] == off[1][0] == 0.0


@pytest.mark.parametrize("gpu", [GPU_525, GPU], ids=["R525", "R575"])
def test_pages_the_cpu_never_mapped_or_no_longer_maps_do_not_pay_it(gpu: GpuSpec) -> None:
    """Zero-filled pages (never touched by the host) and pages the GPU evicted (the CPU does not map them,
    ``block_add_eviction_mappings`` maps only accessed-by processors) fault back with no unmapping."""
    costs = CostParams(cpu_unmap_chunk_ns=1000.0)
    assert _stall(costs, 64 * MiB, 4 * MiB, False, gpu=gpu) == _stall(
        replace(costs, cpu_unmap_chunk_ns=0.0), 64 * MiB, 4 * MiB, False, gpu=gpu
    )
    cap = 4 * VA_BLOCK_BYTES  # a 16 MiB range over 8 MiB: the second pass re-faults evicted pages only
    on = _stall(costs, cap, 16 * MiB, True, passes=2, gpu=gpu)
    off = _stall(replace(costs, cpu_unmap_chunk_ns=0.0), cap, 16 * MiB, True, passes=2, gpu=gpu)
    chunks = 16 * MiB // (PAGE_BYTES if gpu is GPU_525 else VA_BLOCK_BYTES)
    assert on[0] - off[0] == pytest.approx(chunks * 1000.0)  # every chunk once, on the first pass
    assert on[1] == pytest.approx(off[1])


@pytest.mark.parametrize("gpu", [GPU_525, GPU], ids=["R525", "R575"])
def test_an_api_prefetch_of_host_pages_pays_the_unmapping_too(gpu: GpuSpec) -> None:
    """``cudaMemPrefetchAsync`` to the GPU of host-written pages (``uvm_migrate.c`` unmaps the CPU as a fault does)."""
    out = []
    for unmap in (1000.0, 0.0):
        sim = UvmSim(64 * MiB, UvmKnobs(), CostParams(cpu_unmap_chunk_ns=unmap), gpu)
        sim.map_range(0, 4 * MiB)
        sim.host_write(0, 0, 4 * MiB)
        out.append(float(sim.prefetch(0, 0, 4 * MiB).stall_ns))
    assert out[0] - out[1] == pytest.approx((1024 if gpu is GPU_525 else 2) * 1000.0)


def _serial_export(path: Path, base_us: float, per_page_us: float, threads: int = 1) -> None:
    """A one-thread kernel over two CPU-initialised arrays: x's fault group, then y's right after it (``base_us`` +
    ``per_page_us`` per page before y's first copy; 270 us at a block's first page), then the kernel's own work
    (2 ms) before the next x fault."""

    def gap_us(arr: int, off: int, kib: int) -> float:
        return 2000.0 if arr == 0 else 270.0 if off == 0 else base_us + per_page_us * kib / 4

    write_fault_group_export(path, gap_us, blocks=6, threads=threads)


def test_the_per_page_latency_of_back_to_back_faults_is_recovered(tmp_path: Path) -> None:
    _serial_export(tmp_path / "s.sqlite", base_us=14.0, per_page_us=0.7)
    with open_export(tmp_path / "s.sqlite") as ex:
        ns, info = fit_serial_refaults(ex)
    assert ns == pytest.approx(700.0, rel=1e-3) and info["base_us"] == pytest.approx(14.0, abs=0.05)
    assert info["back_to_back"] == 36 and info["fitted_faults"] == 30 and info["block_first_median_us"] == 270.0


def test_a_kernel_of_many_threads_gives_no_fit(tmp_path: Path) -> None:
    """Faults of a parallel kernel come in batches: the gaps between its copies are no fault latency."""
    _serial_export(tmp_path / "p.sqlite", base_us=14.0, per_page_us=0.7, threads=256)
    with open_export(tmp_path / "p.sqlite") as ex:
        ns, info = fit_serial_refaults(ex)
    assert ns is None and "one thread" in info["reason"]


@pytest.mark.real_data
def test_the_a100_exports_serial_kernel_gives_0_69_us_per_page(real_data: Path) -> None:
    """csc746's ``add<<<1, 1>>>`` (driver 525: a CPU chunk per page): 13.9 us + 0.693 us per page before each
    back-to-back fault's copy; a block's first fault 270.6 us, 245.6 us over the line at its 16 pages: 480 ns for
    each of the block's 512 CPU chunks the driver DMA-maps for the GPU (``cpu_chunk_map_ns``)."""
    src = real_data / "nsys" / "csc746_a100_um_migrations_nsys2022.2.1.sqlite"
    if not src.is_file():
        pytest.skip("missing")
    with open_export(src) as ex:
        ns, info = fit_serial_refaults(ex)
    assert ns == pytest.approx(693, abs=2) and info["base_us"] == pytest.approx(13.9, abs=0.1)
    assert info["fitted_faults"] == 2560 and info["block_first_median_us"] == pytest.approx(270.6, abs=0.1)
    assert np.isclose(info["median_us_by_pages"]["256"], 198.75, atol=0.01)
    assert info["driver"] == "525" and info["cpu_chunk_map_ns"] == pytest.approx(479.7, abs=0.1)
