"""Microbenchmarks of UVM on the GPU (CuPy kernels over managed memory) and the fit to simulator cost parameters.

``run_microbench()`` (needs a GPU and CuPy) measures, on this process's GPU:

``prefetch_htod`` / ``prefetch_dtoh``  cudaMemPrefetchAsync of 2 MiB ... 1 GiB between host and GPU: link bandwidth
                                        by transfer size;
``touch_fresh``     one byte written per 4 KiB page, in order, of never-touched managed memory that fits: first-touch
                    cost (chunk allocation, page tables, zero fill; no copy);
``touch_host``      the same over memory the CPU wrote first: fault service + HtoD migration;
``touch_random``    the same pages in random order (host-resident): more, smaller fault batches;
``touch_oversub``   in-order touch of ``factor x C`` bytes where a balloon (real cudaMalloc) leaves C for UVM,
                    timed on the second pass (steady state: every block is evicted and fetched again). The
                    balloon leaves exactly C free, because UVM fills all free memory before it evicts its own
                    pages (uvmlab.measure.gpu.balloon, "What UVM can use"); the row's ``factor`` is the size over the
                    free memory measured after the balloon (the capacity UVM really had), not the one asked.

Each row of the timings table: ``kind, size_bytes, factor, time_ns`` (plus ``host_ns``, the host's time to enqueue
the timed work). Times are device times only: every timed region is CUDA events around work enqueued while a
one-thread gate kernel (:data:`GATE_CYCLES` of ``clock64`` spinning) still holds the stream, so Python, ctypes and
argument building between the two events do not add idle device time; the first call of each path (the kernel's
module load, the host-bound prefetch's runtime loaded by path and initialised) is made once, untimed, before the
first timed region. A row whose host enqueue took longer than the gate measured on the device (``gate_ns``, timed
once) may still include host time: it is kept and listed in the result's ``notes``. ``fit_params(timings)`` turns
them into a ``uvmlab.sim.uvm.timing.CostParams`` (pure arithmetic, tested on the CPU with recorded numbers). The
model is the simulator's per-VA-block decomposition (reference/uvm.md 2.5) with the prefetcher migrating whole 2 MiB
blocks on sequential touch [approximation]:

* link bandwidth L: least squares of ``time = bytes / BW(bytes)`` with UVMSmart's atan curve scaled to L at 2 MiB
  (the curve ``uvmlab.sim.uvm.timing.transfer_bandwidth`` uses), over the prefetch rows;
* per-block costs c_kind: least squares through the origin of time against the number of 2 MiB blocks;
* ``block_service_ns = c_host - t2`` with t2 = 2 MiB / L (one block migrated HtoD);
* ``block_first_gpu_ns = c_fresh - block_service_ns`` (zero fill neglected: 2 MiB at HBM speed is ~1 µs);
* ``evict_fixed_ns = c_oversub - block_service_ns - 2 * t2`` (one DtoH eviction and one HtoD fetch per block);
* ``batch_turnaround_ns``: (c_random - c_host) per block, taken as extra batches of one block each (random order
  defeats the batching of neighbouring faults) [approximation].

A quantity the data cannot give stays at its CostParams default, and a fitted value below 0 is set to 0; both are
listed in the result's ``notes`` (and in the parameter file's ``source``).
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from uvmlab.errors import InputError, UnavailableError
from uvmlab.units import MiB

BLOCK_BYTES = 2 * MiB
"""UVM VA block (uvm.md 1.2)."""
PAGE_BYTES = 4096
TIMING_COLUMNS = ("kind", "size_bytes", "factor", "time_ns")
KINDS = ("prefetch_htod", "prefetch_dtoh", "touch_fresh", "touch_host", "touch_random", "touch_oversub")


@dataclass(frozen=True)
class Fit:
    """The fitted parameters, the intermediate per-block costs (ns) and what could not be fitted."""

    params: Any  # uvmlab.sim.uvm.timing.CostParams
    per_block_ns: dict[str, float]
    link_bytes_per_s: float | None
    notes: tuple[str, ...]


def check_timings(timings: pd.DataFrame) -> pd.DataFrame:
    """Validate a timings table (columns TIMING_COLUMNS, known kinds, positive sizes and times)."""
    missing = [c for c in TIMING_COLUMNS if c not in timings.columns]
    if missing:
        raise InputError(f"microbenchmark timings lack columns {missing}; expected {list(TIMING_COLUMNS)}")
    unknown = sorted(set(timings["kind"]) - set(KINDS))
    if unknown:
        raise InputError(f"unknown microbenchmark kinds {unknown}; known: {', '.join(KINDS)}")
    t = timings.copy()
    t["size_bytes"] = pd.to_numeric(t["size_bytes"], errors="coerce")
    t["time_ns"] = pd.to_numeric(t["time_ns"], errors="coerce")
    bad = t[~((t["size_bytes"] > 0) & (t["time_ns"] > 0))]
    if len(bad):
        raise InputError(f"microbenchmark timings need size_bytes > 0 and time_ns > 0; row {bad.index[0]} has not")
    return t


def _curve_factor(nbytes: np.ndarray) -> np.ndarray:
    """BW(bytes) / BW(2 MiB) of the simulator's atan curve (uvmlab.sim.uvm.timing.transfer_bandwidth, uvm.md 2.3)."""
    from uvmlab.sim.uvm.timing import transfer_bandwidth

    return transfer_bandwidth(nbytes, 1.0)


def fit_link(rows: pd.DataFrame) -> float:
    """L (bytes/s at 2 MiB) minimizing sum (time - bytes / (L * curve(bytes)))^2 over the rows."""
    b = rows["size_bytes"].to_numpy(float)
    t = rows["time_ns"].to_numpy(float) / 1e9
    g = b / _curve_factor(b)  # time = g / L
    inv_l = float((g * t).sum() / (g * g).sum())
    return 1.0 / inv_l


def per_block_cost_ns(rows: pd.DataFrame) -> float:
    """Least-squares cost per 2 MiB block, through the origin."""
    blocks = np.ceil(rows["size_bytes"].to_numpy(float) / BLOCK_BYTES)
    t = rows["time_ns"].to_numpy(float)
    return float((blocks * t).sum() / (blocks * blocks).sum())


def fit(timings: pd.DataFrame, link_bytes_per_s: float | None = None) -> Fit:
    """Fit cost parameters to microbenchmark timings (see the module docstring for the model).

    ``link_bytes_per_s`` fixes the link bandwidth when the timings have no prefetch rows (else it is fitted).
    """
    from uvmlab.sim.uvm.timing import CostParams

    t = check_timings(timings)
    defaults = CostParams()
    notes: list[str] = []
    prefetch = t[t["kind"].isin(("prefetch_htod", "prefetch_dtoh"))]
    link = fit_link(prefetch) if len(prefetch) else link_bytes_per_s
    if link is None:
        notes.append("link bandwidth: no prefetch rows and none given; kept the GPU's default")
    per_block = {k: per_block_cost_ns(t[t["kind"] == k]) for k in KINDS[2:] if (t["kind"] == k).any()}
    t2 = BLOCK_BYTES / link * 1e9 if link else None
    values: dict[str, float] = {}

    def put(name: str, value: float | None, why_missing: str) -> None:
        if value is None:
            notes.append(f"{name}: {why_missing}; kept the default {getattr(defaults, name):g}")
            return
        if value < 0:
            notes.append(
                f"{name}: fitted {value:.0f} ns < 0, set to 0 (the data's per-block cost is below the model's"
                " transfer time: a lower link rate, or not every block migrating, would explain it)"
            )
            value = 0.0
        values[name] = value

    service = per_block["touch_host"] - t2 if "touch_host" in per_block and t2 else None
    put("block_service_ns", service, "needs touch_host rows and the link bandwidth")
    svc = values.get("block_service_ns", defaults.block_service_ns)
    first = per_block["touch_fresh"] - svc if "touch_fresh" in per_block else None
    put("block_first_gpu_ns", first, "needs touch_fresh rows")
    evict = per_block["touch_oversub"] - svc - 2 * t2 if "touch_oversub" in per_block and t2 else None
    put("evict_fixed_ns", evict, "needs touch_oversub rows and the link bandwidth")
    turn = (
        per_block["touch_random"] - per_block["touch_host"]
        if {"touch_random", "touch_host"} <= set(per_block)
        else None
    )
    put("batch_turnaround_ns", turn, "needs touch_random and touch_host rows")
    params = replace(defaults, **values, link_bytes_per_s=link)
    return Fit(params=params, per_block_ns=per_block, link_bytes_per_s=link, notes=tuple(notes))


def fit_params(timings: pd.DataFrame, link_bytes_per_s: float | None = None) -> Any:
    """``CostParams`` fitted to microbenchmark timings (pure; see :func:`fit` for the notes)."""
    return fit(timings, link_bytes_per_s).params


def synthetic_timings(params: Any, sizes: tuple[int, ...], factor: float = 2.0) -> pd.DataFrame:
    """The timings the fit's model predicts for ``params`` (a CostParams with link_bytes_per_s set): the inverse
    of :func:`fit`, for tests and for reading what a parameter set means."""
    link = params.link_bytes_per_s
    if not link:
        raise InputError("synthetic timings need params.link_bytes_per_s")
    t2 = BLOCK_BYTES / link * 1e9
    rows = []
    for s in sizes:
        blocks = math.ceil(s / BLOCK_BYTES)
        bw = link * float(_curve_factor(np.array([float(s)]))[0])
        rows += [
            ("prefetch_htod", s, 1.0, s / bw * 1e9),
            ("prefetch_dtoh", s, 1.0, s / bw * 1e9),
            ("touch_host", s, 1.0, blocks * (params.block_service_ns + t2)),
            ("touch_fresh", s, 1.0, blocks * (params.block_service_ns + params.block_first_gpu_ns)),
            ("touch_random", s, 1.0, blocks * (params.block_service_ns + t2 + params.batch_turnaround_ns)),
            ("touch_oversub", s, factor, blocks * (params.block_service_ns + 2 * t2 + params.evict_fixed_ns)),
        ]
    return pd.DataFrame(rows, columns=list(TIMING_COLUMNS))


def param_names() -> list[str]:
    """The CostParams fields this fit can set."""
    from uvmlab.sim.uvm.timing import CostParams

    wanted = {"block_service_ns", "block_first_gpu_ns", "evict_fixed_ns", "batch_turnaround_ns", "link_bytes_per_s"}
    return [f.name for f in fields(CostParams) if f.name in wanted]


# ---- on the GPU ------------------------------------------------------------------------------------------------
_TOUCH_SRC = r"""
extern "C" __global__ void touch(unsigned char* p, const long long* order, long long npages, long long stride) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < npages) { long long page = order ? order[i] : i; p[page * stride] += 1; }
}
extern "C" __global__ void gate(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) { }
}
"""
GATE_CYCLES = 20_000_000
"""Cycles the gate kernel spins before a timed region (about 10 ms at the H200's 1.98 GHz boost clock, KINDS.md
[I]): long enough for the host to enqueue the start event, the work and the end event behind it."""
CUDA_CPU_DEVICE_ID = -1
"""cudaCpuDeviceId (driver_types.h)."""
CUDA_MEM_LOCATION_TYPE_HOST = 2
"""cudaMemLocationTypeHost (CUDA 13.0 driver_types.h enum cudaMemLocationType)."""
CUDA13 = 13000


class _MemLocation(ctypes.Structure):
    """struct cudaMemLocation {cudaMemLocationType type; int id;} (CUDA >= 12.2 driver_types.h)."""

    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


def prefetch(cp: Any, mem: Any, size: int, device: int, stream: Any) -> None:
    """cudaMemPrefetchAsync of ``size`` bytes at ``mem`` (a CuPy MemoryPointer) to ``device`` (-1: the host).

    Through ``cupy.cuda.runtime.memPrefetchAsync(devPtr, count, dstDevice, stream)``, whose signature is the same
    in every CuPy release, not ``ManagedMemory.prefetch``: that one is ``prefetch(self, stream, *, device_id=...)``
    in CuPy 13+ and ``prefetch(self, stream)`` (own device only) before (cupy/cuda/memory.pyx). On a CUDA 13
    build CuPy passes ``{cudaMemLocationTypeDevice, dstDevice}`` (cupy_backends/cuda/api/runtime.pyx), which
    cannot name the host, so the host destination calls ``cudaMemPrefetchAsync`` with
    ``{cudaMemLocationTypeHost, 0}`` (CUDA 13.0 cuda_runtime_api.h) through a runtime loaded by path
    (:func:`uvmlab.measure.gpu.cudart.load_cudart`): CuPy links the runtime statically, so this process has none loaded
    unless torch was imported.
    """
    rt = cp.cuda.runtime
    if device != CUDA_CPU_DEVICE_ID or rt.runtimeGetVersion() < CUDA13:
        rt.memPrefetchAsync(mem.ptr, size, device, stream.ptr)
        return
    from uvmlab.measure.gpu.cudart import load_cudart

    fn = load_cudart(rt.runtimeGetVersion() // 1000).cudaMemPrefetchAsync
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, _MemLocation, ctypes.c_uint, ctypes.c_void_p]
    host = _MemLocation(CUDA_MEM_LOCATION_TYPE_HOST, 0)
    rc = fn(ctypes.c_void_p(mem.ptr), size, host, 0, ctypes.c_void_p(stream.ptr))
    if rc != 0:
        raise UnavailableError(f"cudaMemPrefetchAsync to the host failed with CUDA error {rc}")


DEFAULT_SIZES = (2 * MiB, 8 * MiB, 32 * MiB, 128 * MiB, 512 * MiB, 1024 * MiB)
DEFAULT_FACTORS = (1.5, 2.0, 4.0)


def run_microbench(
    sizes: tuple[int, ...] = DEFAULT_SIZES,
    factors: tuple[float, ...] = DEFAULT_FACTORS,
    oversub_capacity_bytes: int = 1024 * MiB,
    repeats: int = 3,
    seed: int = 0,
    out: Any = None,
) -> Any:
    """Measure the timings table on this machine's GPU (CuPy). Refuses with one sentence without a GPU or CuPy.

    Each row is the median of ``repeats`` runs. Run it on an otherwise idle GPU: the oversubscription rows put a
    balloon (real cudaMalloc) in front of UVM so that ``oversub_capacity_bytes`` remain for it.
    Returns the timings DataFrame; with ``out`` (what ``uvmlab calibrate --microbench`` passes) it also fits them,
    writes the CostParams file ``out`` and returns that file's content plus ``fitted``, ``notes`` and ``timings``.
    """
    from uvmlab.measure.gpu.detect import gpu_status

    status = gpu_status()
    if not status.available:
        raise UnavailableError(f"microbenchmarks need an NVIDIA GPU: {status.reason}")
    try:
        import cupy as cp
    except ImportError:
        raise UnavailableError("microbenchmarks need CuPy: pip install 'uvmlab[gpu]' (cupy-cuda13x)") from None
    import time

    rt = cp.cuda.runtime
    dev = cp.cuda.Device().id
    kernel = cp.RawKernel(_TOUCH_SRC, "touch")
    gate = cp.RawKernel(_TOUCH_SRC, "gate")
    stream = cp.cuda.Stream(non_blocking=True)
    rng = np.random.default_rng(seed)
    rows: list[tuple[str, int, float, float, float]] = []

    def timed_with_host(fn: Any) -> tuple[float, float]:
        """(device ns between the events, host ns to enqueue fn): the gate holds the stream meanwhile."""
        start, end = cp.cuda.Event(), cp.cuda.Event()
        with stream:
            gate((1,), (1,), (np.int64(GATE_CYCLES),))
        t0 = time.perf_counter_ns()
        start.record(stream)
        fn()
        end.record(stream)
        host = time.perf_counter_ns() - t0
        end.synchronize()
        return float(cp.cuda.get_elapsed_time(start, end)) * 1e6, float(host)  # ms -> ns

    host_ns: list[float] = []

    def timed(fn: Any) -> float:
        device, host = timed_with_host(fn)
        host_ns.append(host)
        return device

    # the first call of each path, untimed: the gate and touch kernels' module, the host-bound prefetch's runtime
    warm = cp.cuda.malloc_managed(BLOCK_BYTES)
    stream.synchronize()
    ctypes.memset(warm.ptr, 1, BLOCK_BYTES)
    with stream:
        warm_args = (np.uint64(warm.ptr), np.uint64(0), np.int64(BLOCK_BYTES // PAGE_BYTES), np.int64(PAGE_BYTES))
        kernel(((BLOCK_BYTES // PAGE_BYTES + 255) // 256,), (256,), warm_args)
    prefetch(cp, warm, BLOCK_BYTES, dev, stream)
    prefetch(cp, warm, BLOCK_BYTES, CUDA_CPU_DEVICE_ID, stream)
    stream.synchronize()
    del warm
    start_gate, end_gate = cp.cuda.Event(), cp.cuda.Event()
    start_gate.record(stream)
    with stream:
        gate((1,), (1,), (np.int64(GATE_CYCLES),))
    end_gate.record(stream)
    end_gate.synchronize()
    gate_ns = float(cp.cuda.get_elapsed_time(start_gate, end_gate)) * 1e6

    def touch(mem: Any, size: int, order: Any = None) -> None:
        npages = size // PAGE_BYTES
        threads = 256
        order_ptr = np.uint64(order.data.ptr if order is not None else 0)  # a null pointer: in-order touch
        args = (np.uint64(mem.ptr), order_ptr, np.int64(npages), np.int64(PAGE_BYTES))
        with stream:
            kernel(((npages + threads - 1) // threads,), (threads,), args)

    def host_fill(mem: Any, size: int) -> None:
        stream.synchronize()
        ctypes.memset(mem.ptr, 1, size)  # the CPU writes every page: they are host-resident

    def median(values: list[float]) -> float:
        return float(np.median(values))

    for size in sizes:
        for kind in ("prefetch_htod", "prefetch_dtoh", "touch_fresh", "touch_host", "touch_random"):
            times = []
            for _ in range(repeats):
                mem = cp.cuda.malloc_managed(size)
                order = None
                if kind == "touch_random":
                    order = cp.asarray(rng.permutation(size // PAGE_BYTES).astype(np.int64))
                if kind != "touch_fresh":
                    host_fill(mem, size)
                if kind == "prefetch_htod":
                    times.append(timed(lambda m=mem, s=size: prefetch(cp, m, s, dev, stream)))
                elif kind == "prefetch_dtoh":
                    prefetch(cp, mem, size, dev, stream)
                    stream.synchronize()
                    times.append(timed(lambda m=mem, s=size: prefetch(cp, m, s, CUDA_CPU_DEVICE_ID, stream)))
                else:
                    times.append(timed(lambda m=mem, s=size, o=order: touch(m, s, o)))
                del mem, order
            rows.append((kind, size, 1.0, median(times), max(host_ns[-repeats:])))
    free, _total = rt.memGetInfo()
    # UVM uses every free byte before it evicts (block_alloc_gpu_chunk), so the balloon leaves exactly C
    balloon_bytes = max(0, free - oversub_capacity_bytes) // BLOCK_BYTES * BLOCK_BYTES if factors else 0
    balloon = rt.malloc(balloon_bytes) if balloon_bytes else 0
    try:
        capacity = int(rt.memGetInfo()[0])  # what UVM really has: the free memory the balloon left
        for f in factors:
            size = int(f * oversub_capacity_bytes) // BLOCK_BYTES * BLOCK_BYTES
            times = []
            for _ in range(repeats):
                mem = cp.cuda.malloc_managed(size)
                host_fill(mem, size)
                touch(mem, size)  # first pass: fills the GPU and starts evicting
                stream.synchronize()
                times.append(timed(lambda m=mem, s=size: touch(m, s)))
                del mem
            factor = size / capacity if capacity > 0 else float(f)
            rows.append(("touch_oversub", size, factor, median(times), max(host_ns[-repeats:])))
    finally:
        if balloon:
            rt.free(balloon)
    timings = pd.DataFrame(rows, columns=[*TIMING_COLUMNS, "host_ns"])
    timings.attrs["gate_ns"] = gate_ns
    slow = timings[timings["host_ns"] > gate_ns]
    timings.attrs["notes"] = [
        f"{k} {s} B: the host took {h / 1e6:.2f} ms to enqueue, longer than the gate's {gate_ns / 1e6:.2f} ms: the "
        "row may include host time"
        for k, s, h in zip(slow["kind"], slow["size_bytes"], slow["host_ns"], strict=True)
    ]
    if out is None:
        return timings
    return write_fit(
        fit(timings), timings, out, f"uvmlab.measure.gpu.microbench on {status.name} (driver {status.driver})"
    )


def write_fit(result: Fit, timings: pd.DataFrame, out: Any, source: str) -> dict[str, Any]:
    """Write ``result.params`` as a CostParams file (notes appended to ``source``); return the file's content plus
    ``fitted`` (the parameter names the data set), ``notes`` and ``timings`` (records)."""

    from uvmlab.files.atomic import atomic_write_json
    from uvmlab.sim.uvm.timing import PARAMS_SCHEMA_VERSION, check_cost_values

    if result.notes:
        source += "; " + "; ".join(result.notes)
    not_fitted = {n.split(":")[0] for n in result.notes}
    if result.link_bytes_per_s is None:
        not_fitted.add("link_bytes_per_s")
    fitted = [n for n in param_names() if n not in not_fitted]
    values = {n: getattr(result.params, n) for n in fitted}  # a run takes every other cost from its GPU's profile
    check_cost_values(values, f"{out}: the microbenchmark fit")
    doc = {"schema_version": PARAMS_SCHEMA_VERSION, "source": source, "params": values, "fitted": fitted}
    atomic_write_json(Path(out), doc)
    doc["notes"] = list(result.notes)
    doc["timings"] = timings.to_dict(orient="records")
    return doc


def calibrate_microbench(out: Any, **kwargs: Any) -> dict[str, Any]:
    """Run the microbenchmarks, fit, write the CostParams file ``out``; return its content (see run_microbench)."""
    return dict(run_microbench(out=out, **kwargs))
