"""The simulator's cost model: native kernel time, fault-batch service time, transfers, allocator API costs.

It follows the proposal of reference/uvm.md section 2.5 (per kernel: native time plus the serial bottom half's
batches)::

    T_kernel_uvm = T_native + (1 - fault_overlap) * sum over batches of t_batch
    t_batch = batch_turnaround + fault_entry * raw_entries
            + sum over VA blocks (block_service + block_first_gpu [first GPU chunk of the block since its range was
              created, when zeroed] + cpu_chunk_map x the block's CPU chunks [same moment]
              + cpu_unmap_chunk x CPU chunks migrated + evictions (evict_fixed + DtoH bytes / BW(size))
              + HtoD bytes / BW(size) + zero-fill / HBM)

``T_native`` is a roofline: max(FLOPs / (peak * compute_efficiency), bytes / (HBM * memory_efficiency)), at least
``kernel_min``. Link bandwidth per transfer follows UVMSmart's fitted curve (uvm.md 2.3):
``BW(s) = (2a/pi) * atan(0.07292 * s_KiB)`` GiB/s, with ``a`` scaled so that BW(2 MiB) equals the GPU's sustained
link bandwidth (``GpuSpec.link_bytes_per_s``): small transfers are slower (4 KiB ~18 %, 64 KiB ~87 % of 2 MiB).

Every parameter below names its source; [U] marks unverified guesses that ``uvmlab calibrate`` should replace.
The parameter file is JSON ``{"schema_version": 1, "source": "...", "params": {field: value}}``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from uvmlab.errors import InputError
from uvmlab.files.atomic import atomic_write_json
from uvmlab.files.inputs import read_json_file
from uvmlab.gpus import LINKS, GpuSpec
from uvmlab.numbers import prefix

PARAMS_SCHEMA_VERSION = 1
MAX_PARAMS_BYTES = 16 * 1024 * 1024
"""Largest cost parameter file read (16 MiB; the shipped profiles are about 2 KB)."""
STREAM_EFFICIENCY = {"HBM": 0.896, "GDDR": 0.624}
"""Share of peak DRAM bandwidth a streaming kernel reaches, by memory technology (``GpuSpec.memory_kind``).
HBM: 4.3 of 4.8 TB/s for a device-to-device copy through PyTorch on an H200, counting bytes read and written (the lent
H200's reading, /work/.library/device/KINDS.md, 2026-10-28: 8.6 GB in 2.0 ms); the A100's cudaMemset in the
gemmspmm nsys export writes at 0.995 of its 1555 GB/s (write-only, a validation point: docs/fidelity.md). GDDR: the
RTX 5090 (GDDR7) runs gpu_ext's dense seq_stream (read half, write half of the working set once) in device mode at
0.25x in 7.527 ms, 8.42 GB: 1.118 of 1.792 TB/s (real-data/uvm gpu_ext_rtx5090_microbench rq1, the fitted point of
the ``rtx5090-stream-native`` check; rq2 at 0.5x validates it)."""
_ATAN_K_PER_KIB = 0.07292
"""UVMSmart ``gpu-sim.cc:636-651`` transfer curve constant (per KiB)."""


@dataclass(frozen=True)
class CostParams:
    """Cost parameters of the UVM simulator (all times in ns). Defaults are literature / real-log figures."""

    batch_turnaround_ns: float = 25_000.0
    """Replay + refault + interrupt + fetch + preprocess per batch: 20-30 µs between batches, Titan V abc log
    (uvm.md 2.2, 'b -> next s' 18-29 µs typical)."""
    fault_entry_ns: float = 300.0
    """Per raw fault-buffer entry fetched, sorted, deduplicated: 0.1-0.5 µs [U] (uvm.md 2.5 c_entry)."""
    raw_entries_per_fault: float = 5.9
    """Raw HW entries per unique faulted page: 256 / (256 - 212.7) from the cuBLAS log (uvm.md 1.4, 2.2)."""
    block_service_ns: float = 30_000.0
    """Servicing one VA block in a batch: 25-40 µs (uvm.md 2.2, abc batches 2 and 3, 'last f -> b')."""
    block_first_gpu_ns: float = 300_000.0
    """Extra when a block gets its first GPU chunk since its range was created and that chunk must be zeroed: some
    page of the block is resident nowhere (chunk from PMA, page-table creation, invalid-PDE faults, and the CE memset
    push of ``block_zero_new_gpu_chunk``, which the driver skips when every page of the chunk is resident somewhere,
    uvm_va_block.c): +0.25-0.45 ms per block (uvm.md 2.2, abc batch 1: 507-887 us for 2 blocks of which 32 pages
    were CPU-initialised). A block the CPU populated whole pays ``cpu_chunk_map_ns`` per CPU chunk instead."""
    prefetch_first_block_ns: float = 0.0
    """The same first-chunk cost on the API path: ``cudaMemPrefetchAsync`` of a never-populated block
    (``uvm_migrate.c`` ``uvm_va_block_migrate_locked`` -> ``uvm_va_block_make_resident``: chunk from PMM/PMA, CE
    memset push ``block_zero_new_gpu_chunk`` and tracker wait, then ``block_migrate_add_mappings``: PTE writes);
    no fault-buffer round trips; like ``block_first_gpu_ns``, only for a chunk that must be zeroed. Default 0 [U]
    (the API path pays only ``block_service_ns`` and the zero-fill); the RTX 5090 profile fits it on a
    with-user-prefetch training epoch (``uvmlab.measure.profile_fit``)."""
    evict_fixed_ns: float = 20_000.0
    """Fixed cost of evicting one root chunk besides its DtoH copy (unmap, PMM bookkeeping) [U]."""
    link_bytes_per_s: float | None = None
    """Sustained 2 MiB host<->device bandwidth; None: the GPU's ``link_bytes_per_s`` (gpus.py, uvm.md 2.3/2.4)."""
    zero_fill_bytes_per_s: float | None = None
    """Copy-engine memset of newly populated pages; None: the GPU's HBM bandwidth (uvm.md 1.2: a CE memset) [I]."""
    migrate_page_ns: float = 0.0
    """Per 4 KiB page a fault migrates, besides its transfer (unmapping the source, PTE writes). Default 0: the Titan
    V logs and the RTX 5090 fit cannot separate it from ``block_service_ns``; the closed-driver profile fits it on the
    GTX 1080 nvprof traces (0.21 us per page: uvmlab.measure.generation_fit)."""
    cpu_unmap_chunk_ns: float = 0.0
    """Per CPU chunk whose pages a migration makes GPU-resident while the CPU maps them, besides the fault and the
    transfer: the driver unmaps the CPU's mappings and copies the pages chunk by chunk (``block_unmap_cpu``, the
    copy loop of ``block_copy_resident_pages``, uvm_va_block.c); pages the CPU does not map (evicted ones, pages the
    host never touched) do not pay it (``AdviceService.unmap_cpu``). A chunk is a host page on drivers before R530
    and a whole block from R530 (uvmlab.sim.uvm.cpu_chunks). Default 0: the Titan V constants above were timed over
    CPU-initialised pages and hold it. The open-driver profiles take 693 ns, fitted on the A100 host of the csc746
    export (driver 525: one chunk per page), whose one-thread kernel faults back to back (13.9 us + 0.693 us per
    page migrated: ``uvmlab.measure.calibrate.fit_serial_refaults``; [I] on every other host); the closed-driver
    profile folds it into ``migrate_page_ns``."""
    cpu_chunk_map_ns: float = 0.0
    """Per CPU chunk a block holds when the GPU first touches it: the driver DMA-maps each for the GPU as it creates
    the block's GPU state (``uvm_va_block_gpu_state_get_alloc`` -> ``block_gpu_map_phys_all_cpu_pages`` ->
    ``uvm_cpu_chunk_map_gpu``: ``dma_map_page``, the IOMMU entry, the reverse map; uvm_va_block.c); chunks as for
    ``cpu_unmap_chunk_ns``. A chunk the block allocates later, while it has GPU state (its first eviction, a CPU
    fault or first touch), is mapped the same way (``block_populate_pages_cpu`` ->
    ``uvm_va_block_map_cpu_chunk_on_gpus``) and pays it too (``UvmSim._cpu_alloc_ns``). Default 0 (the Titan V
    constants hold it). The open-driver profiles take 480 ns, fitted
    on csc746 (driver 525): a block's first fault costs 245.6 us more than the same fault later in the block, over
    the block's 512 chunks (``fit_serial_refaults``); the closed-driver profile fits it on the GTX 1080 traces'
    first faults of CPU-initialised blocks (uvmlab.measure.generation_fit)."""
    cpu_fault_ns: float = 30_000.0
    """One CPU page fault serviced by UVM (``uvm_va_space_cpu_fault_managed`` -> ``uvm_va_block_cpu_fault``:
    residency choice, CPU-side prefetch, population or DtoH, CPU mapping), besides its transfer and zeroing: one
    block service on the CPU path [I: ``block_service_ns``' Titan V default]. Real exports bracket it: 24.5 us on an
    RTX 4060 laptop (easycuda) and 41.7 us on an A100 host (csc746), the fixed part of the gaps between CPU faults
    (uvmlab.measure.calibrate.fit_cpu_fault_ns); the A100 profile fits it on csc746, the closed-driver profile on
    the GTX 1080 traces (35 us, uvmlab.measure.generation_fit), the open-driver profile keeps this default (its
    RTX 5090 data has no CPU fault)."""
    collapse_page_ns: float = 0.0
    """Per GPU write fault on a page the GPU maps read-only in a read-mostly range, besides the fault itself: a read
    duplicate whose other copy the write revokes (``break_read_duplication_in_region``, uvm_va_block.c), or a sole
    copy whose write a prefetch region took (uvmlab.sim.uvm.advice, "Read-only sole copies"). Default 0 [U]; the
    RTX 5090 profile fits it on rq4's read-mostly seq_stream runs, which pay it on every written page of every
    launch (uvmlab.measure.profile_fit)."""
    host_zero_bytes_per_s: float = 10e9
    """Rate at which the kernel zeroes the CPU chunks the driver allocates zeroed (``__GFP_ZERO`` where a page of the
    chunk is resident nowhere: a CPU first touch's host page before R530, a block's whole 2 MiB chunk from R530;
    ``UvmSim._cpu_alloc_ns``) [U: one core's clear_page order]."""
    remote_read_bytes_per_s: float | None = None
    """GPU reads of host memory through a remote mapping; None: ``link_bytes_per_s`` (uvmlab.sim.uvm.hints)."""
    remote_write_bytes_per_s: float | None = None
    """GPU writes to host memory through a remote mapping; None: ``link_bytes_per_s`` (uvmlab.sim.uvm.hints)."""
    remote_partial_write_ns: float = 0.0
    """Per remote write of a lone sector (a kernel costed at the lone-sector efficiency: one small write per page):
    each is a partial-cache-line write to host memory, which the host completes one after another ("a partial write
    operation may delay subsequent requests", Intel 64 and IA-32 Architectures Optimization Reference Manual,
    "Maximizing PCIe Performance"); the kernel's remote writes take at least this many ns each. Default 0 [U: not
    modelled]; the RTX 5090 profile fits it on rq4's preferred-location-CPU seq_stream (uvmlab.measure.profile_fit)."""
    managed_alloc_ns: float = 10_000.0
    """One ``cudaMallocManaged`` call (range creation) [U]."""
    cudafree_sync_ns: float = 10_000.0
    """One ``cudaFree`` of a managed range: device synchronization (pytorch#106200 [S]) + range destroy [U]."""
    range_destroy_block_ns: float = 1_000.0
    """Per VA block of a destroyed range (freeing GPU chunks, no DtoH) [U]."""
    compute_efficiency: float = 0.5
    """Achieved share of the FP32 peak by the FLOPs of a kernel that is not a library GEMM (elementwise, reduction,
    a declared kernel's ``flops``) [U: such kernels are rarely compute-bound; typical 30-70 %]. Library GEMMs take
    ``gemm_efficiency`` (uvmlab.sim.uvm.kernel_class)."""
    gemm_efficiency: float = 0.80
    """Achieved share of the math unit's peak by a large cuBLAS / cuBLASLt / cuDNN GEMM (uvmlab.sim.uvm.kernel_class,
    class ``gemm``): 788 of 989 TFLOP/s (0.797) for an 8192^3 BF16 matmul through PyTorch on an H200 (the lent H200's
    reading, /work/.library/device/KINDS.md, 2026-10-28: mean of ten products on random data; 769-798 on
    2026-11-04); validated on the A100 cuBLAS DGEMMs of the gemmspmm nsys export (FP64 tensor cores, 16.1-16.4 of
    19.5 TFLOP/s: 0.83-0.84; docs/fidelity.md ``nsys-kernels``). The same share is taken for every architecture and
    for SIMT FP32 GEMMs [I]."""
    memory_efficiency: float | None = None
    """Achieved share of peak DRAM bandwidth by a streaming kernel (class ``memory``); None: by the GPU's memory
    (:data:`STREAM_EFFICIENCY`, filled by :meth:`for_gpu`)."""
    index_memory_efficiency: float | None = None
    """Share of peak DRAM bandwidth at which a gather / scatter moves its rows (class ``index``); None:
    ``memory_efficiency``. The RTX 5090 profile fits it on GCN's native epoch (its index ops dominate it)."""
    sector_memory_efficiency: float | None = None
    """Achieved share of peak DRAM bandwidth when every access is a lone 32 B sector in its own 4 KiB page (a
    page-strided stream: gpu_ext microbench ``--stride_bytes=4096``, one DRAM row and one TLB entry per access); None:
    ``memory_efficiency``. The RTX 5090 profile fits it on the microbenchmark's seq_stream in ``device`` mode at 0.5x
    (t0rq3: 0.568 ms for 4.11 M sectors: 13 % of peak, against ~49-70 % for dense streams) [F:
    uvmlab.measure.profile_fit]."""
    kernel_min_ns: float = 4_575.0
    """Floor of any kernel's time: launch and drain (class ``launch``). [F: the median of Mordred's ``build_GPU2``
    over 5 CTAs of 128 threads on a Quadro RTX 6000 (mordred nsys export, 3 launches, 4.48-4.61 us; work negligible);
    validated on its 40-CTA launches (4.74-5.02 us: 0.96); ``uvmlab calibrate --kernels``, docs/fidelity.md
    ``nsys-kernels``]. The only GPU generation measured is Turing; newer GPUs may launch faster [U]."""
    cta_dispatch_ns: float = 79.64
    """Time per CTA per SM to dispatch and retire the blocks of a declared launch (class ``launch``): a grid of
    mostly idle threads is bound by block scheduling. [F: 79.6 ns on the GH200 of the cudamicrobench nsys export,
    ``LowAccessDensityTest_cudakernel``: 524,288 CTAs of 256 threads of which 131,072 threads load, 316 us on 132 SMs;
    uvmlab calibrate --kernels, docs/fidelity.md ``nsys-kernels``]."""
    warp_trip_ns: float = 255.13
    """Time one warp's memory request takes to come back in a launch too small to fill the DRAM pipe (class
    ``serial``, Little's law: resident warps x bytes per request / this). [F: a single-thread ``y[i] = x[i] + y[i]``
    over 2^28 floats on an A100-SXM4 (csc746 nsys export, 25.8 s; 32 B per request, the UM migrations inside it
    0.15 s removed); uvmlab calibrate --kernels]."""
    fault_overlap: float = 0.0
    """Share of fault-batch time hidden behind non-faulting warps; 0 = the warps stall for every batch (uvm.md 2.5
    optional knob (a)) [U]."""

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
                raise InputError(f"cost parameter {f.name} must be a finite number >= 0, not {v!r}")
        if not 0 <= self.fault_overlap <= 1:
            raise InputError(f"cost parameter fault_overlap must be in [0, 1], not {self.fault_overlap}")
        if self.host_zero_bytes_per_s <= 0 or 0 in (self.remote_read_bytes_per_s, self.remote_write_bytes_per_s):
            raise InputError("cost parameters host_zero_bytes_per_s and remote_*_bytes_per_s must be > 0")
        if any(getattr(self, f) is not None and not 0 < getattr(self, f) <= 1 for f in EFFICIENCY_FIELDS):
            raise InputError(f"cost parameters {', '.join(EFFICIENCY_FIELDS)} must be in (0, 1]")

    def for_scattered_sectors(self) -> CostParams:
        """These costs with ``memory_efficiency`` set to the lone-sector one (for page-strided streams)."""
        return replace(self, memory_efficiency=self.sector_memory_efficiency or self.memory_efficiency)

    def for_gpu(self, gpu: GpuSpec) -> CostParams:
        """Fill the GPU-dependent parameters left as None from ``gpu``."""
        link = self.link_bytes_per_s or gpu.link_bytes_per_s
        return replace(
            self,
            memory_efficiency=self.memory_efficiency
            or STREAM_EFFICIENCY.get(gpu.memory_kind, STREAM_EFFICIENCY["HBM"]),
            link_bytes_per_s=link,
            zero_fill_bytes_per_s=self.zero_fill_bytes_per_s or gpu.hbm_bytes_per_s,
            remote_read_bytes_per_s=self.remote_read_bytes_per_s or link,
            remote_write_bytes_per_s=self.remote_write_bytes_per_s or link,
        )

    # -- parameter files ---------------------------------------------------------------------
    @classmethod
    def from_file(cls, path: str | Path) -> CostParams:
        """The costs a parameter file sets, over the built-in defaults (for files that set every cost, such as the
        shipped profiles; a run takes a user's file through :func:`read_params_file` and the GPU's profile)."""
        return cls(**read_params_file(path).values)

    def to_file(self, path: str | Path, source: str) -> Path:
        """Write the parameter file atomically, every cost set (``source`` says where the numbers come from)."""
        doc = {"schema_version": PARAMS_SCHEMA_VERSION, "source": source, "params": asdict(self)}
        check_cost_values(doc["params"], str(path))
        atomic_write_json(Path(path), doc)
        return Path(path)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


ZERO_MEANS: dict[str, str] = {
    "batch_turnaround_ns": "the other modelled terms take the whole batch (uvmlab calibrate floors its fit there)",
    "prefetch_first_block_ns": "the API path pays only block_service_ns and the zero-fill (the default)",
    "migrate_page_ns": "folded into block_service_ns (the default)",
    "cpu_unmap_chunk_ns": "held in the other fault-path constants (the default; the closed profile's migrate_page_ns)",
    "cpu_chunk_map_ns": "held in the other fault-path constants (the default)",
    "collapse_page_ns": "folded into the write fault (the default)",
    "remote_partial_write_ns": "lone remote writes cost their bytes at the remote write rate (the default)",
    "fault_overlap": "no fault time is hidden (the default)",
}
"""The costs for which 0 means something (what it means); every other cost of a parameter file must be > 0: a
driver operation, a kernel launch or a transfer is never free, and a zero rate has no finite time."""
MAX_COST_NS = 1e9
"""Largest time cost accepted (1 s per operation; the largest measured: 0.9 ms for a block's first chunk, uvm.md
2.2): 1e308 ns was accepted and overflowed a run's totals to infinity."""
MAX_RATE_BYTES_PER_S = 1e13
"""Largest rate accepted (10 TB/s: above every GPU's HBM in uvmlab.gpus, the H200's 4.8 TB/s the fastest)."""
MAX_LINK_BYTES_PER_S = max(lk.peak_bytes_per_s for lk in LINKS.values())
"""Largest host-link rate accepted: the fastest link peak uvmlab knows (uvmlab.gpus.LINKS: NVLink-C2C, 450 GB/s)."""
LINK_FIELDS = ("link_bytes_per_s", "remote_read_bytes_per_s", "remote_write_bytes_per_s")
EFFICIENCY_FIELDS = (
    "compute_efficiency",
    "gemm_efficiency",
    "memory_efficiency",
    "sector_memory_efficiency",
    "index_memory_efficiency",
)
"""Shares of a peak, each in (0, 1] (None: the class rule's default where the field allows it)."""
SHARE_FIELDS = (*EFFICIENCY_FIELDS, "fault_overlap")
"""Shares of a peak (0, 1]; fault_overlap [0, 1]."""
MAX_RAW_ENTRIES_PER_FAULT = 256.0
"""Raw fault-buffer entries per unique faulted page: at least 1, at most a whole batch (256 entries, uvm.md 1.4)."""


def cost_limits(name: str) -> tuple[float, float, str]:
    """(lowest, highest, unit) a parameter file may give cost ``name`` (docs/uvm-sim.md "Parameter files")."""
    low = 0.0 if name in ZERO_MEANS else math.ulp(0.0)
    if name in SHARE_FIELDS:
        return low, 1.0, ""
    if name == "raw_entries_per_fault":
        return 1.0, MAX_RAW_ENTRIES_PER_FAULT, " entries"
    if name in LINK_FIELDS:
        return low, MAX_LINK_BYTES_PER_S, " bytes/s"
    if name.endswith("_bytes_per_s"):
        return low, MAX_RATE_BYTES_PER_S, " bytes/s"
    return low, MAX_COST_NS, " ns"


def check_cost_values(values: dict[str, Any], where: str) -> None:
    """Refuse (one InputError naming ``where`` and the bad costs) values a run cannot use: not a finite number, 0
    where 0 means nothing (:data:`ZERO_MEANS`), or outside :func:`cost_limits`. ``None`` is allowed where the field
    defaults to None (the GPU's own value)."""
    nullable = {f.name for f in fields(CostParams) if f.default is None}
    zero: list[str] = []
    bad: list[str] = []
    for name, value in values.items():
        if value is None and name in nullable:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            bad.append(f"{name} {prefix(value)} is not a finite number")
            continue
        low, high, unit = cost_limits(name)
        if value == 0 and low > 0:
            zero.append(name)
        elif not low <= value <= high:
            bad.append(f"{name} {value:g} is outside {low:g}..{high:g}{unit}")
    if zero:
        bad.append(
            f"{_names(zero)} {'is' if len(zero) == 1 else 'are'} 0, a cost that is never free (0 is allowed only "
            f"where it means something: {len(ZERO_MEANS)} costs, docs/uvm-sim.md 'Parameter files')"
        )
    if bad:
        raise InputError(f"{where}: {'; '.join(bad[:3])}{f'; and {len(bad) - 3} more' if len(bad) > 3 else ''}")


def _names(names: list[str]) -> str:
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


@dataclass(frozen=True)
class ParamsFile:
    """A cost parameter file as read: the costs it sets, which of them were fitted, where they come from."""

    path: Path
    values: dict[str, Any]
    """The costs the file sets (its ``params``); a run takes every other cost from the GPU's profile."""
    fitted: tuple[str, ...] = ()
    """The costs fitted to measurements (``uvmlab calibrate``); empty when the file does not say."""
    source: str = ""
    ignored: tuple[str, ...] = ()
    """Costs an older ``uvmlab calibrate`` wrote with the built-in defaults (listed in its ``kept``): not taken."""

    def describe(self, rest: str) -> str:
        """Where a run's costs come from when it reads this file over ``rest`` (the profile's description)."""
        fitted = [n for n in self.fitted if n in self.values]
        given = [n for n in self.values if n not in fitted]
        parts = [f"fitted {', '.join(fitted)}" if fitted else "", f"set {', '.join(given)}" if given else ""]
        sets = "; ".join(p for p in parts if p) or "no cost"
        return f"{self.path} ({sets}); every other cost: {rest}"


RENAMED_COSTS = {"cpu_unmap_page_ns": "cpu_unmap_chunk_ns"}
"""Cost names of older parameter files and the field each now sets (the unmapping became per CPU chunk: on the
drivers it was fitted on, R515-R529, a chunk is a host page, so the value carries over)."""


def read_params_file(path: str | Path) -> ParamsFile:
    """Read a parameter file ``{"schema_version": 1, "source": ..., "params": {field: value}, "fitted": [...]}``:
    its numbers are checked while decoded (uvmlab.numbers) and against :func:`check_cost_values`; unknown fields or a
    wrong schema version are an InputError. A file of an older ``uvmlab calibrate`` (every cost written, the
    unfitted ones with the built-in defaults, listed in ``kept``) sets only the costs it did not keep."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"cost parameter file {p} not found; write one with: uvmlab calibrate")
    doc = read_json_file(p, MAX_PARAMS_BYTES, "a cost parameter file (JSON)")  # numbers checked (uvmlab.numbers)
    if not isinstance(doc, dict) or doc.get("schema_version") != PARAMS_SCHEMA_VERSION:
        got = doc.get("schema_version") if isinstance(doc, dict) else None
        raise InputError(
            f"cost parameter file {p} has schema_version {prefix(got)}; this uvmlab reads {PARAMS_SCHEMA_VERSION} "
            '(format: {"schema_version": 1, "source": "...", "params": {field: value}})'
        )
    params = doc.get("params")
    if not isinstance(params, dict):
        raise InputError(f"cost parameter file {p} needs a 'params' mapping of field to number")
    params = {RENAMED_COSTS.get(k, k): v for k, v in params.items()}
    known = {f.name for f in fields(CostParams)}
    unknown = sorted(set(params) - known)
    if unknown:
        raise InputError(f"cost parameter file {p} has unknown fields {prefix(unknown)}; known fields: {sorted(known)}")
    named: dict[str, list[str]] = {}
    for key in ("fitted", "kept"):
        names = doc.get(key, [])
        if isinstance(names, dict):  # uvmlab calibrate --uvm-timings wrote {name: true}
            names = list(names)
        if not isinstance(names, list) or not all(
            isinstance(n, str) and RENAMED_COSTS.get(n, n) in known for n in names
        ):
            raise InputError(f"cost parameter file {p}: '{key}' must list cost names, not {prefix(names)}")
        named[key] = [RENAMED_COSTS.get(n, n) for n in names]
    fitted, kept = named["fitted"], named["kept"]
    ignored = tuple(n for n in kept if n in params and n not in fitted)
    values = {k: v for k, v in params.items() if k not in ignored}
    check_cost_values(values, f"cost parameter file {p}")
    CostParams(**values)  # the dataclass's own checks (fault_overlap, efficiencies)
    return ParamsFile(p, values, tuple(fitted), str(doc.get("source", "")), ignored)


def transfer_bandwidth(nbytes: np.ndarray | float, link_bytes_per_s: float) -> np.ndarray:
    """Achieved link bandwidth (bytes/s) of transfers of ``nbytes`` each (UVMSmart atan curve, uvm.md 2.3)."""
    kib = np.asarray(nbytes, dtype=float) / 1024.0
    norm = math.atan(_ATAN_K_PER_KIB * 2048.0)  # the curve at 2 MiB maps to link_bytes_per_s
    return link_bytes_per_s * np.arctan(_ATAN_K_PER_KIB * kib) / norm


def transfer_time_ns(nbytes: np.ndarray, link_bytes_per_s: float) -> float:
    """Total time (ns) of serial transfers of the given sizes (bytes)."""
    nbytes = np.asarray(nbytes, dtype=float)
    nbytes = nbytes[nbytes > 0]
    if nbytes.size == 0:
        return 0.0
    return float((nbytes / transfer_bandwidth(nbytes, link_bytes_per_s)).sum() * 1e9)


def kernel_time_ns(
    flops: np.ndarray,
    nbytes: np.ndarray,
    gpu: GpuSpec,
    costs: CostParams,
    dtype: str = "fp32",
    occupancy: np.ndarray | float = 1.0,
) -> np.ndarray:
    """Native (all-resident) kernel time: roofline of FLOPs and touched bytes, floored at ``kernel_min_ns``.

    Approximation: fp32 runs at ``gpu.fp32_flops`` (PyTorch's default keeps TF32 matmul off), bf16 at
    ``gpu.tensor_flops``; touched bytes are the bytes the kernel reads and writes, each once. ``occupancy`` (0-1]
    scales the compute rate of a kernel too small to fill the GPU (``uvmlab.sim.uvm.reread.occupancy``).
    """
    costs = costs.for_gpu(gpu)
    peak = gpu.tensor_flops if dtype == "bf16" else gpu.fp32_flops
    t_compute = np.asarray(flops, dtype=float) / (peak * costs.compute_efficiency * np.asarray(occupancy, dtype=float))
    t_memory = np.asarray(nbytes, dtype=float) / (gpu.hbm_bytes_per_s * costs.memory_efficiency)
    return np.maximum(np.maximum(t_compute, t_memory) * 1e9, costs.kernel_min_ns)
