"""The closed-driver (R375-R470) fault path, fitted on public GTX 1080 nvprof traces (issue 24, step 4).

Source: the nvprof ``--print-gpu-trace`` outputs pasted at the end of four UVMSmart micro-benchmarks
(DebashisGanguly/gpgpu-sim_UVMSmart @bafab5d, ``micro-benchmarks/*.cu``, MIT; added 2019-04-19, compiled for sm_35
and sm_61 with nvprof, so CUDA 9-10.1 and a closed driver of the R384-R418 branches [I: the driver is not
recorded]). Each runs one GPU thread that touches one byte per 64 KiB step with a sleep between steps, so every
fault is its own batch of one fault, on a GeForce GTX 1080 (Pascal, PCIe 3.0 x16), over a managed array the CPU
initialised (pages CPU-resident), prefetcher on. nvprof gives each fault group's duration and each UM migration's
size and duration. The numbers quoted below are those traces' (file and line).

Protocol (declared): **fit** on ``getHWPrefetcherP1.cu`` (faults 2-6: the per-fault cost and its growth with the
pages migrated; its HtoD records: the link rate) and on ``largePageBoundary.cu``'s first faults of its 2nd and 3rd
2 MiB blocks (the fresh-block cost); **validate** on ``getHWPrefetcherP2.cu``, ``getHWPrefetcherP3.cu``,
``managedAllocRoundUp.cu`` (tests/test_generations.py) and on the Titan V 460 logs.

What is fitted (``fit_closed``):

* ``link_bytes_per_s``: least squares of the simulator's transfer curve (uvmlab.sim.uvm.timing) on P1's six HtoD
  records (4 KiB-1020 KiB);
* per fault, nvprof's duration minus its HtoD records' durations is linear in the pages migrated (4 KiB pages):
  ``base + slope x pages`` (P1 faults 2-6: 17.5, 18.9, 25.8, 39.4, 68.9 us for 16-256 pages). ``slope`` is
  ``migrate_page_ns`` (the array is CPU-initialised, so it holds the unmapping of the CPU's pages too:
  ``cpu_unmap_chunk_ns`` is 0 in this profile); ``base`` is the sum of a one-fault batch's constants
  (``batch_turnaround_ns + raw_entries_per_fault x fault_entry_ns + block_service_ns``), split in the Titan V logs'
  ratios (the CostParams defaults, reference/uvm.md 2.2) by one scale ``s``;
* ``cpu_chunk_map_ns``: the first fault of a block minus ``base + slope x 16`` (largePageBoundary blocks 2 and 3:
  57.7 and 55.4 us), over the block's 512 CPU chunks: its pages are all CPU-resident, so the driver zeroes nothing
  and the excess is the DMA mapping of the CPU pages as the block's GPU state is created (the closed drivers, like
  R515-R529, keep CPU memory page by page: uvmlab.sim.uvm.cpu_chunks). ``block_first_gpu_ns`` (a block whose
  first chunk is zeroed) takes the same excess [I: no zero-filled block in the traces]. The very first fault of a
  process (P1: 183.7 us) also builds the page directories: the model does not have that one-off cost (validation
  shows it);
* ``cpu_fault_ns``: the CPU faults that read the pages back after the kernel, one per 64 KiB step, are 45 us apart
  (P1 lines 127-145, timestamps at 10 us resolution: 50, 40, 50, 40 us), each with a 64 KiB DtoH (6.3 us): 45 us
  minus the DtoH minus ``slope x 16``;
* ``evict_fixed_ns`` (no eviction in the traces): the Titan V default times ``s`` [I];
  ``prefetch_first_block_ns`` and ``collapse_page_ns`` (no API prefetch or read duplication in the traces): the
  RTX 5090 profile's value times this profile's over that profile's ``block_first_gpu_ns`` and one-fault base [I].
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from uvmlab.files.atomic import atomic_write_json
from uvmlab.gpus import GPUS
from uvmlab.sim.uvm.knobs import PAGES_PER_BLOCK
from uvmlab.sim.uvm.timing import PARAMS_SCHEMA_VERSION, CostParams, transfer_time_ns

KiB = 1024
UVMSMART = "DebashisGanguly/gpgpu-sim_UVMSmart@bafab5d micro-benchmarks/"
P1_FAULTS_US = (183.74, 25.216, 31.84, 49.28, 84.384, 157.02)
"""getHWPrefetcherP1.cu lines 108-124: "[Unified Memory GPU page faults]" durations of the faults at 0, 1, 2, 4,
8, 16 x 64 KiB of a CPU-initialised 2 MiB array."""
P1_HTOD = (
    ((4, 1.728), (60, 5.76)),
    ((4, 1.76), (60, 5.984)),
    ((4, 1.728), (124, 11.232)),
    ((4, 1.792), (252, 21.696)),
    ((4, 1.76), (508, 43.264)),
    ((4, 1.76), (1020, 86.4)),
)
"""getHWPrefetcherP1.cu lines 110-126: each fault's "[Unified Memory Memcpy HtoD]" records, (KiB, us)."""
LPB_FRESH_US = ((57.664, ((4, 1.952), (60, 5.792))), (55.36, ((4, 1.76), (60, 5.888))))
"""largePageBoundary.cu lines 148-150 and 166-168: the first faults of its 2nd and 3rd 2 MiB blocks (us) and their
HtoD records (KiB, us)."""
P1_CPU_FAULT_GAP_US = 45.0
"""getHWPrefetcherP1.cu lines 131-142: the CPU page faults after the kernel at 689.66, 689.71, 689.75, 689.80,
689.84 ms (mean gap 45 us)."""
P1_CPU_FAULT_DTOH_US = 1.056 + 5.28
"""The 4 KiB + 60 KiB DtoH records of each of those CPU faults (lines 130-132), us."""
ONE_FAULT_TERMS = ("batch_turnaround_ns", "fault_entry_ns", "block_service_ns")
"""The constants one single-fault batch pays besides migration (``fault_entry_ns`` once per raw entry)."""


def fit_link(htod: tuple[tuple[tuple[int, float], ...], ...] = P1_HTOD) -> tuple[float, dict[str, Any]]:
    """The 2 MiB link rate whose transfer curve best fits the HtoD records (least squares on the durations)."""
    sizes = np.array([kb * KiB for f in htod for kb, _ in f], dtype=float)
    meas = np.array([us for f in htod for _, us in f])
    # time is inversely proportional to the link rate: t_model(L) = t_model(1) / L, closed form
    unit = np.array([transfer_time_ns(np.array([b]), 1.0) / 1e3 for b in sizes])  # us at 1 B/s
    link = float((unit * unit).sum() / (unit * meas).sum())
    model = unit / link
    return link, {"records": len(sizes), "max_abs_error_us": float(np.abs(model - meas).max())}


def _non_transfer(dur: float, recs: tuple[tuple[int, float], ...]) -> tuple[float, int]:
    """(us not spent in the fault's HtoD records, 4 KiB pages it migrated)."""
    return dur - sum(us for _, us in recs), sum(kb for kb, _ in recs) // 4


def fit_closed(base: CostParams | None = None, newer: CostParams | None = None) -> tuple[CostParams, dict[str, Any]]:
    """The closed-driver profile by the module's protocol; ``newer``: the RTX 5090 profile (for the [I] terms)."""
    base = base or CostParams()
    link, link_info = fit_link()
    pts = [_non_transfer(d, r) for d, r in zip(P1_FAULTS_US[1:], P1_HTOD[1:], strict=True)]
    pages = np.array([p for _, p in pts], dtype=float)
    us = np.array([u for u, _ in pts])
    slope, intercept = np.polyfit(pages, us, 1)
    one = base.batch_turnaround_ns + base.raw_entries_per_fault * base.fault_entry_ns + base.block_service_ns
    s = intercept * 1e3 / one
    fresh = [_non_transfer(d, r) for d, r in LPB_FRESH_US]
    first_us = float(np.mean([u - (intercept + slope * p) for u, p in fresh]))
    cpu_us = P1_CPU_FAULT_GAP_US - P1_CPU_FAULT_DTOH_US - slope * 16
    params = {f: getattr(base, f) * s for f in (*ONE_FAULT_TERMS, "evict_fixed_ns")}
    params.update(
        link_bytes_per_s=link,
        migrate_page_ns=float(slope) * 1e3,
        block_first_gpu_ns=first_us * 1e3,
        cpu_chunk_map_ns=first_us * 1e3 / PAGES_PER_BLOCK,
        cpu_fault_ns=float(cpu_us) * 1e3,
    )
    if newer is not None:
        new_one = newer.batch_turnaround_ns + newer.raw_entries_per_fault * newer.fault_entry_ns
        new_one += newer.block_service_ns
        params["prefetch_first_block_ns"] = (
            newer.prefetch_first_block_ns * params["block_first_gpu_ns"] / (newer.block_first_gpu_ns or 1.0)
        )
        params["collapse_page_ns"] = newer.collapse_page_ns * intercept * 1e3 / new_one
    costs = replace(base, **params)
    details = {
        "link": link_info,
        "per_fault": {
            "pages": pages.tolist(),
            "non_transfer_us": us.tolist(),
            "base_us": float(intercept),
            "migrate_page_us": float(slope),
            "scale_of_titanv_constants": float(s),
        },
        "fresh_block_us": first_us,
        "cpu_fault_us": float(cpu_us),
    }
    return costs, details


def write_closed_profile(path: Path, newer: CostParams) -> Path:
    """Write ``profiles/gtx1080_closed.json`` (the closed-driver generation's fault path)."""
    costs, details = fit_closed(newer=newer)
    doc = {
        "schema_version": PARAMS_SCHEMA_VERSION,
        "gpu": "GTX1080",
        "driver": "closed driver of the R384-R418 branches (not recorded; CUDA 9-10.1 era)",
        "driver_version": "410",
        "link": GPUS["GTX1080"].link,
        "source": "uvmlab.measure.generation_fit.fit_closed on UVMSmart's GTX 1080 nvprof traces",
        "fitted_on": [
            f"{UVMSMART}getHWPrefetcherP1.cu nvprof trace: faults 2-6 -> one-fault base and migrate_page_ns; "
            "its HtoD records -> link_bytes_per_s; its CPU faults -> cpu_fault_ns",
            f"{UVMSMART}largePageBoundary.cu nvprof trace: first faults of blocks 2 and 3 -> cpu_chunk_map_ns "
            "(and block_first_gpu_ns [I])",
        ],
        "validated_on": [
            f"{UVMSMART}getHWPrefetcherP2.cu, getHWPrefetcherP3.cu, managedAllocRoundUp.cu nvprof traces",
            "uvm-eval Titan V 460.27.04 abc logs",
        ],
        "fit": details,
        "params": costs.to_dict(),
    }
    atomic_write_json(path, doc)
    return path


__all__ = ["fit_closed", "fit_link", "write_closed_profile"]
