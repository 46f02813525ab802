"""Thrashing detection, throttling and pinning (uvmlab.sim.uvm.thrashing, uvm_perf_thrashing.c): where they act
(CPU-GPU ping-pong within the lapse) and where they do not (GPU faults and evictions alone)."""

from __future__ import annotations

import pytest

from uvmlab.gpus import GPUS, GpuSpec
from uvmlab.sim.uvm.driver import UvmSim
from uvmlab.sim.uvm.knobs import UvmKnobs
from uvmlab.sim.uvm.streams import StreamKernel
from uvmlab.sim.uvm.timing import CostParams
from uvmlab.units import MiB

SIZE = 64 * 1024  # one 64 KiB buffer the host writes and a kernel reads, over and over


def _ping_pong(gap_ns: float, knobs: UvmKnobs | None = None, gpu: GpuSpec | None = None, rounds: int = 40):
    """Host write, kernel read, ``gap_ns`` of other work after each; the clock moves by every call's time."""
    sim = UvmSim(64 * MiB, knobs or UvmKnobs(), CostParams(), gpu or GPUS["A100-80GB"])
    sim.map_range(0, SIZE)
    t = 0.0
    htod = remote = 0
    for _ in range(rounds):
        sim.now_ns = t
        t += sim.host_write(0, 0, SIZE).stall_ns + gap_ns
        sim.now_ns = t
        c = sim.access([(0, 0, SIZE, False)])
        t += c.stall_ns + gap_ns
        htod += c.htod_bytes
        remote += c.remote_bytes
    sim.check_invariants()
    return sim, t, htod, remote


def test_ping_pong_within_the_lapse_is_detected_and_throttled() -> None:
    """Migrations of a page to alternating processors within 500 us: per-page tracking, detection at the third
    event, then the processor that is not the period's first is throttled for the nap (the run takes longer)."""
    sim, t, _, _ = _ping_pong(20_000)
    assert sim.thrashing_pages_detected > 0 and sim.throttled_faults > 0
    off, t_off, _, _ = _ping_pong(20_000, UvmKnobs(thrashing_enable=False))
    assert off.thrashing_pages_detected == off.throttled_faults == 0
    assert t > t_off


def test_ping_pong_slower_than_the_lapse_is_not() -> None:
    sim, _, _, _ = _ping_pong(600_000)
    assert sim.thrashing_pages_detected == sim.throttled_faults == sim.pinned_pages == 0


def test_gpu_faults_and_evictions_alone_never_trigger_it() -> None:
    """A cascading stream kernel (round-robin batches at 2x) with no host access: thrashing_event_cb ignores the
    evictions and no block ever sees a second processor, so nothing is tracked."""
    sim = UvmSim(16 * MiB, UvmKnobs(stream_priority="rotate"), CostParams(), GPUS["A100-80GB"])
    sim.map_range(0, 16 * MiB)
    sim.map_range(1, 16 * MiB)
    k = StreamKernel(((0, 0, 16 * MiB, False), (1, 0, 16 * MiB, True)), 512, warp_size=32)
    for _ in range(3):
        c = sim.access_streams(k)
    assert c.eviction_count > 0
    assert not sim._thr and sim.thrashing_pages_detected == 0


def test_pinned_pages_are_read_remotely_on_a_pcie_host() -> None:
    """After ``thrashing_pin_threshold`` throttles the not-throttled processor's fault pins the page: on PCIe it
    stays on the CPU and the GPU maps it remotely (no more HtoD for it while pinned)."""
    sim, _, htod, remote = _ping_pong(20_000, rounds=60)
    assert sim.pinned_pages > 0 and remote > 0
    _, _, htod_off, remote_off = _ping_pong(20_000, UvmKnobs(thrashing_enable=False), rounds=60)
    assert htod < htod_off and remote_off == 0
    sooner, _, _, _ = _ping_pong(20_000, UvmKnobs(thrashing_pin_threshold=1), rounds=60)
    assert sooner.throttled_faults < sim.throttled_faults  # pinned after one throttle instead of ten


def test_a_coherent_host_pins_at_once_without_throttling() -> None:
    """NVLink to POWER9 (``GpuSpec.coherent``): every thrashing processor has fast access to the residency, so the
    hint is PIN where the page is, with no throttling period."""
    sim, _, _, _ = _ping_pong(20_000, gpu=GPUS["V100-SXM2-P9"])
    assert sim.pinned_pages > 0 and sim.throttled_faults == 0


def test_a_user_prefetch_resets_the_tracking() -> None:
    sim, _, _, _ = _ping_pong(20_000, rounds=6)
    (s,) = sim._thr
    assert sim._thr[s].events.max() > 0
    sim.prefetch(0, 0, SIZE)
    assert sim._thr[s].events.max() == 0


def test_freed_ranges_drop_their_tracking() -> None:
    sim, _, _, _ = _ping_pong(20_000, rounds=6)
    assert sim._thr and sim._thr_last
    sim.unmap_range(0)
    assert not sim._thr and not sim._thr_last


def test_the_documented_ping_pong_figures() -> None:
    """docs/uvm-sim.md's thrashing paragraph, reproduced (60 rounds, 20 us between accesses, default costs): A100 160
    pages detected, 160 faults throttled, 16 pinned, 10.79 ms against 9.60 ms unthrottled, HtoD halved to 1.875 MiB
    with as much read remotely; V100 with NVLink to POWER9: 16 pinned at once, none throttled, 2.67 ms (0.3 ms
    less than before CPU chunks: the host-written buffer's first GPU touch zeroes no chunk)."""
    sim, t, htod, remote = _ping_pong(20_000, rounds=60)
    assert (sim.thrashing_pages_detected, sim.throttled_faults, sim.pinned_pages) == (160, 160, 16)
    _, t_off, htod_off, _ = _ping_pong(20_000, UvmKnobs(thrashing_enable=False), rounds=60)
    assert t / 1e6 == pytest.approx(10.79, abs=0.005) and t_off / 1e6 == pytest.approx(9.60, abs=0.005)
    assert htod == remote == 1.875 * MiB and htod_off == 3.75 * MiB
    v, t_v, _, _ = _ping_pong(20_000, gpu=GPUS["V100-SXM2-P9"], rounds=60)
    assert (v.pinned_pages, v.throttled_faults) == (16, 0) and t_v / 1e6 == pytest.approx(2.67, abs=0.005)
