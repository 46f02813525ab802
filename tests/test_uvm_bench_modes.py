"""uvmbench's modes (uvmlab.sim.uvm.bench: device, prefetch, cudaMemAdvise hints) and the lone-sector efficiency."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from uvmlab.errors import InputError
from uvmlab.gpus import GPUS
from uvmlab.measure.profile_fit import SECTOR_FIT, bench_measured
from uvmlab.sim.uvm.bench import MODES, RTX5090_TOTAL_BYTES, SECTOR_BYTES, THREADS, simulate_uvmbench
from uvmlab.sim.uvm.hints import remote_link_ns
from uvmlab.sim.uvm.knobs import PAGE_BYTES
from uvmlab.sim.uvm.profile import load_profile
from uvmlab.sim.uvm.timing import CostParams

GPU = GPUS["RTX5090"]
COSTS = replace(CostParams(sector_memory_efficiency=0.125), link_bytes_per_s=10e9)
SCALE = 64


def _sector_bytes_per_array(factor: float) -> float:
    """Lone-sector bytes one launch touches in one seq/rand array at full scale (one 4 B element per page)."""
    array = int(RTX5090_TOTAL_BYTES * factor) // 2 // SCALE
    return -(-array // PAGE_BYTES) * SECTOR_BYTES * SCALE


def _native_ms(nbytes: float, costs: CostParams = COSTS) -> float:
    return nbytes / (GPU.hbm_bytes_per_s * (costs.sector_memory_efficiency or costs.memory_efficiency)) * 1e3


def test_device_mode_is_the_lone_sector_roofline() -> None:
    r = simulate_uvmbench("seq_stream", 0.5, mode="device", costs=COSTS, scale=SCALE)
    assert r.median_ms == pytest.approx(_native_ms(2 * _sector_bytes_per_array(0.5)), rel=1e-9)
    assert r.fault_count == r.htod_bytes == r.remote_bytes == 0


def test_sector_efficiency_defaults_to_the_memory_efficiency() -> None:
    plain = CostParams()
    assert plain.sector_memory_efficiency is None
    assert plain.for_scattered_sectors().memory_efficiency == plain.memory_efficiency
    assert COSTS.for_scattered_sectors().memory_efficiency == 0.125
    r = simulate_uvmbench("seq_stream", 0.5, mode="device", costs=plain, scale=SCALE)
    assert r.median_ms == pytest.approx(_native_ms(2 * _sector_bytes_per_array(0.5), plain), rel=1e-9)
    with pytest.raises(InputError, match="sector_memory_efficiency"):
        CostParams(sector_memory_efficiency=0.0)


@pytest.mark.parametrize("kernel", ["seq_stream", "rand_stream"])
@pytest.mark.parametrize("mode", ["uvm", "uvm_prefetch", "uvm_advise_pref_gpu", "uvm_advise_read"])
def test_undersubscribed_local_modes_run_native_after_the_warmups(kernel: str, mode: str) -> None:
    r = simulate_uvmbench(kernel, 0.25, mode=mode, costs=COSTS, scale=SCALE)
    assert r.fault_count == r.htod_bytes == r.dtoh_bytes == r.eviction_count == 0
    assert r.median_ms == pytest.approx(_native_ms(2 * _sector_bytes_per_array(0.25)), rel=1e-9)


def test_prefetch_moves_the_data_before_the_first_launch() -> None:
    plain = simulate_uvmbench("seq_stream", 0.25, mode="uvm", costs=COSTS, scale=SCALE)
    pre = simulate_uvmbench("seq_stream", 0.25, mode="uvm_prefetch", costs=COSTS, scale=SCALE)
    assert plain.times_ns[0] > 10 * plain.times_ns[-1]  # the first warm-up faults everything in
    assert pre.times_ns[0] == pytest.approx(pre.times_ns[-1])  # nothing left to fault


def test_preferred_location_cpu_reads_and_writes_every_sector_remotely() -> None:
    r = simulate_uvmbench("seq_stream", 0.25, mode="uvm_advise_pref_cpu", costs=COSTS, scale=SCALE, iterations=3)
    per = _sector_bytes_per_array(0.25)
    assert r.remote_bytes == int(2 * per * 3)
    assert r.median_ms == pytest.approx(remote_link_ns(per, per, 10e9) / 1e6, rel=1e-9)
    assert r.fault_count == 0


def test_accessed_by_reads_the_host_written_array_remotely_and_keeps_the_rest_local() -> None:
    per = _sector_bytes_per_array(0.25)
    r = simulate_uvmbench("rand_stream", 0.25, mode="uvm_advise_access", costs=COSTS, scale=SCALE, iterations=1)
    assert r.remote_bytes == int(per)  # input only: the output is populated on the faulting GPU
    assert r.median_ms == pytest.approx(max(_native_ms(per), remote_link_ns(per, 0, 10e9) / 1e6), rel=1e-9)
    chase = simulate_uvmbench("pointer_chase", 0.25, mode="uvm_advise_access", costs=COSTS, scale=SCALE)
    assert chase.remote_bytes == 0  # its nodes are written by a GPU kernel, so they live on the GPU
    remote = simulate_uvmbench("pointer_chase", 0.25, mode="uvm_advise_pref_cpu", costs=COSTS, scale=SCALE)
    assert remote.remote_bytes == THREADS * 9 * SECTOR_BYTES * 3  # 8 chased nodes and 1 output float per thread


def test_hint_modes_are_refused_under_oversubscription_and_unknown_modes_always() -> None:
    for mode in ("uvm_advise_read", "uvm_advise_pref_gpu", "uvm_advise_pref_cpu", "uvm_advise_access"):
        with pytest.raises(InputError, match="fits the GPU"):
            simulate_uvmbench("seq_stream", 1.25, mode=mode, scale=SCALE)
    assert simulate_uvmbench("seq_stream", 1.25, mode="uvm_prefetch", scale=SCALE).median_ms > 0
    with pytest.raises(InputError, match=r"device mode above size_factor 0\.8"):
        simulate_uvmbench("seq_stream", 0.9, mode="device", scale=SCALE)
    with pytest.raises(InputError, match="unknown uvmbench mode"):
        simulate_uvmbench("seq_stream", 0.25, mode="uvm_advise_magic", scale=SCALE)
    assert len(MODES) == 7


def test_the_shipped_profile_reproduces_its_sector_fit_point(real_data: Path) -> None:
    """The RTX 5090 profile's sector efficiency is fitted on t0rq3 seq_stream device 0.5x: it must give it back."""
    uvm = real_data / "uvm"
    if not (uvm / "gpu_ext_rtx5090_microbench").is_dir():
        pytest.skip(f"{uvm / 'gpu_ext_rtx5090_microbench'} absent")
    mode, factor = SECTOR_FIT
    measured = bench_measured(uvm, "seq_stream", factor, mode=mode)
    costs = load_profile("RTX5090")
    assert costs.sector_memory_efficiency is not None
    assert simulate_uvmbench("seq_stream", factor, mode=mode, costs=costs).median_ms == pytest.approx(
        measured, rel=1e-9
    )
