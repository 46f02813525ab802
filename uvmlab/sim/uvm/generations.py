"""Driver generations: which fault-path costs describe a given NVIDIA driver (issue 24, step 4). Torch-free.

The fault path (batch turnaround, per-entry fetch, per-block service, fresh-block cost, per-page migration work,
eviction, CPU faults, read-duplicate collapse, API prefetch of a fresh block) is software: the UVM driver's bottom
half running on the host CPU (reference/uvm.md 1.4-1.6). Its costs change with the driver, not with the GPU's
architecture, so a run's fault-path constants come from its driver's *generation*, each represented by one
calibrated profile (uvmlab/sim/uvm/profiles/):

* **closed**: drivers R375-R514 (the closed-source ``nvidia-uvm`` up to R470, incl. 384-460); profile
  ``gtx1080_closed.json``, fitted on the GTX 1080 nvprof traces of UVMSmart's micro-benchmarks
  (uvmlab.measure.generation_fit);
* **open**: R515 and later (the open kernel modules, published from 515.43.04); profile ``rtx5090.json``, fitted on
  the RTX 5090 with 575.57.08 (uvmlab.measure.profile_fit).

Why these two and this boundary: they are the two drivers for which public fault timings exist that do not print
every fault (the Titan V 460.27.04 logs do: uvm.md 2.2). R515 is where NVIDIA began publishing the module's source
(open-gpu-kernel-modules 515.43.04, the first tag of that repository); the cost change is documented only by its
two ends (~17 us per single 64 KiB fault on the GTX 1080 trace, ~9 us on the RTX 5090 fit, plus 0.21 us per page
migrated on the former), not by a release note naming it [U: a timing of a 495-510 driver would place the
boundary]. No architecture term: the Pascal GTX 1080 under driver 535 (parallelArchitect/pascal-um-benchmark,
docs/uvm-sim.md) is predicted with the open generation's constants, which validates using them for Pascal.

:func:`uvmlab.sim.uvm.profile.pick_profile` applies the rule.
"""

from __future__ import annotations

from dataclasses import dataclass

from uvmlab.gpus import driver_major

FAULT_PATH_FIELDS = (
    "batch_turnaround_ns",
    "fault_entry_ns",
    "raw_entries_per_fault",
    "block_service_ns",
    "block_first_gpu_ns",
    "prefetch_first_block_ns",
    "evict_fixed_ns",
    "migrate_page_ns",
    "cpu_unmap_chunk_ns",
    "cpu_chunk_map_ns",
    "cpu_fault_ns",
    "collapse_page_ns",
)
"""The CostParams fields a driver generation sets (its software path); the rest (link, kernel efficiencies,
allocator calls) belong to the GPU and its host."""


@dataclass(frozen=True)
class DriverGeneration:
    """A range of driver branches sharing one fault-path calibration."""

    name: str
    first_major: int
    last_major: int
    profile_gpu: str
    """The GPU whose shipped profile holds this generation's fault path (profiles/*.json ``gpu``)."""
    evidence: str


GENERATIONS = (
    DriverGeneration(
        "closed (R375-R514)",
        375,
        514,
        "GTX1080",
        "UVMSmart micro-benchmarks' GTX 1080 nvprof traces (R384-R418 era), uvmlab.measure.generation_fit",
    ),
    DriverGeneration(
        "open (R515+)",
        515,
        9999,
        "RTX5090",
        "RTX 5090 with 575.57.08: workload timings, uvmlab.measure.profile_fit",
    ),
)


def generation(driver: str) -> DriverGeneration:
    """The generation of a driver version (``'460.27.04'`` -> the closed one)."""
    major = driver_major(driver)
    for g in GENERATIONS:
        if g.first_major <= major <= g.last_major:
            return g
    raise AssertionError(f"no driver generation covers {driver}")  # GENERATIONS covers 375.. (check_driver)


__all__ = ["FAULT_PATH_FIELDS", "GENERATIONS", "DriverGeneration", "generation"]
