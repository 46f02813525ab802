"""Native (all-resident) kernel time by kernel class (issue 41 section 2). Torch-free.

One roofline with one efficiency put large cuBLAS GEMMs 1.5-1.9x too slow and small or latency-bound kernels far
too fast; every slowdown inherits that error through its denominator. Each kernel is now put in a class, and each
class has its own rule and constants (``uvmlab.sim.uvm.timing.CostParams``, every one with its source):

``gemm``
    A GEMM-like library kernel (:data:`GEMM_NATIVE_OPS` but the convolutions: cuBLAS / cuBLASLt matmuls, the SDPA
    kernels, their in-place and ``out=`` forms) with FLOPs: ``flops / (peak x gemm_efficiency x occupancy)``, or its
    bytes at the DRAM rate when that is slower. ``peak`` is the math unit the library picks for the kernel's dtype
    (:func:`math_peak`): BF16/FP16 tensor cores; FP32 on the FP32 units (``torch.backends.cuda.matmul.allow_tf32``
    defaults to False since PyTorch 1.12: "TensorFloat-32 (TF32) on Ampere (and later) devices", PyTorch CUDA
    semantics notes); FP64 at the FP64 peak (tensor cores on A100/H100).
    ``occupancy`` is the one-wave share of the SMs a small GEMM fills (``uvmlab.sim.uvm.reread.occupancy``).
``conv``
    A cuDNN convolution (:data:`CONV_OPS`) with FLOPs: the same rule at the same unit (:func:`math_peak`), at
    ``compute_efficiency`` (the roofline efficiency every kernel had before these classes) [A]. Real cuDNN forward
    convolutions (rai-project/dlperf, cuDNN 7.6.3, FP32 without tensor ops, V100 and T4 at batch 8/16/32:
    ``benchmarks/cudnn_layer_native_table.py``) reach 0.28-0.56 of the FP32 peak for 1x1 filters and 0.73-1.70 for 3x3
    filters (Winograd and FFT algorithms do fewer multiplications than the nominal FLOPs); no one efficiency fits
    both, and no TF32 convolution (``torch.backends.cudnn.allow_tf32``, on by default from Ampere on) has been timed
    here, so FP32 convolutions stay on the FP32 units at ``compute_efficiency`` (docs/uvm-sim.md).
``memory`` / ``compute``
    Every other kernel: its bytes at ``hbm x memory_efficiency``, or its FLOPs at ``fp32 x compute_efficiency``
    when that is longer (then class ``compute``).
``sector``
    A strided stream whose every access is a lone 32 B sector in its own page: bytes at ``sector_memory_efficiency``
    (the RTX 5090 profile's fit, uvmlab.sim.uvm.order).
``index``
    A gather or scatter (declared, or the derived index ops of uvmlab.sim.uvm.order): the rows it moves at
    ``index_memory_efficiency`` (default: ``memory_efficiency``).
``serial``
    A declared kernel launched with few threads (``uvm.kernel(..., threads=N)``): Little's law. Each warp keeps one
    request in flight per ``warp_trip_ns`` (its active lanes x 4 B coalesced, at least one 32 B sector; one 32 B
    sector per lane for a strided or indexed kernel); the resident warps (at most SMs x threads per SM / 32) bound
    the bandwidth. The time is the kernel's bytes over ``min(that bound, the class's DRAM rate)``. A launch whose
    threads each walk their own chunk of at least a sector (order ``sequential``, e.g. a row per thread) is scattered:
    its lanes' addresses are a chunk apart, and each lane's next elements come from the sector it already fetched.
``l2``
    A kernel launched again over data the L2 still holds (:mod:`uvmlab.sim.uvm.l2_reuse`: the same launch as the row
    before, its lines within the L2, every page still where the GPU maps it): its bytes at the L2 rate,
    ``L2_OVER_DRAM`` x the DRAM peak. A kernel that declares an efficiency keeps it.
``launch``
    Every kernel lasts at least ``kernel_min_ns`` (launch and drain); a declared launch of ``threads`` also pays
    ``cta_dispatch_ns`` per CTA of :data:`DEFAULT_BLOCK_THREADS` threads per SM (block scheduling, which bounds a
    grid of mostly idle threads).
``declared``
    A program kernel that says its time (``uvm.kernel(..., native_ms=...)``): that time. A program kernel that says
    its efficiency (``efficiency=...``) takes it in place of its class's: of the FP32 peak (of the math unit's,
    classes ``gemm`` and ``conv``) when it has FLOPs, else of the DRAM bandwidth.

The class of every kernel is in the kernels table (``kernel_class``) so that ``uvmlab calibrate --kernels`` and a
reader of a run can see which rule timed it. Approximations (docs/uvm-sim.md "Native kernel time by class"): GEMM
efficiency does not fall with K or with tile quantization inside a wave, and skinny GEMMs (M of 8-32 rows, real
cuBLAS fully connected layers) are predicted 1.5-4.4x too fast; L2 hits are modelled only for a kernel launched
again over the same data (class ``l2``; reuse between different kernels, producer then consumer, is not); a traced
torch op's launch shape is not known, so ``serial`` and the CTA term apply to declared kernels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from uvmlab.gpus import GpuSpec
from uvmlab.sim.uvm.l2_reuse import L2_OVER_DRAM
from uvmlab.sim.uvm.occupancy import DEFAULT_BLOCK_THREADS
from uvmlab.sim.uvm.order import SECTOR_BYTES, WARP_SIZE
from uvmlab.sim.uvm.timing import CostParams
from uvmlab.trace.orchestrate import op_base

CLASSES = ("gemm", "conv", "memory", "compute", "sector", "index", "l2", "serial", "launch", "declared", "copy", "host",
           "api")  # fmt: skip
"""Kernel classes (module docstring); ``copy``: an explicit ``cudaMemcpy`` (its link time, set by the replay);
``host``: the host's own work; ``api``: a CUDA API call or host access between kernels (no native time)."""
API_CLASSES = {"memcpy_htod": "copy", "memcpy_dtoh": "copy", "host": "host", "host_async": "host"}
"""The class of an ``api`` row whose native time the replay sets (uvmlab.sim.uvm.replay)."""
GEMM_NATIVE_OPS = frozenset(
    {
        "mm",
        "addmm",
        "addmm_",
        "bmm",
        "baddbmm",
        "baddbmm_",
        "addbmm",
        "addbmm_",
        "addmv",
        "addmv_",
        "mv",
        "matmul",
        "_scaled_mm",
        "convolution",
        "_convolution",
        "convolution_overrideable",
        "cudnn_convolution",
        "convolution_backward",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_flash_attention_backward",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_efficient_attention_backward",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_cudnn_attention_backward",
        "_flash_attention_forward",
        "_flash_attention_backward",
        "_efficient_attention_forward",
        "_efficient_attention_backward",
    }
)
"""aten ops run by cuBLAS / cuBLASLt / cuDNN / the fused attention kernels: timed as GEMMs when they have FLOPs
(``mm.out`` and ``addmm_`` are the ``mm`` / ``addmm_`` names; uvmlab.trace.flops counts their FLOPs)."""
CONV_OPS = frozenset({"convolution", "_convolution", "convolution_overrideable", "cudnn_convolution",
                      "convolution_backward"})  # fmt: skip
"""cuDNN convolutions: class ``conv``, at ``compute_efficiency`` (module docstring)."""
DTYPES = ("fp32", "bf16", "fp16", "fp64", "tf32")
"""Kernel dtypes the class rules know (the trace's optional ``dtype`` column; "" = the run's)."""
LANE_BYTES = 4
"""Bytes one lane moves per access in the serial rule (a 32-bit element, as the declared kernels' loops do)."""


@dataclass(frozen=True)
class KernelWork:
    """What the class rules need of one kernel (arrays, one entry per kernel)."""

    names: Sequence[str]
    flops: np.ndarray
    nbytes: np.ndarray
    dtypes: Sequence[str]
    """Per kernel, its dtype ("" = the run's)."""
    occupancy: np.ndarray
    sector: np.ndarray
    """Strided streams costed at the lone-sector efficiency (uvmlab.sim.uvm.order)."""
    index: np.ndarray
    """Gathers and scatters (their bytes are the rows moved)."""
    threads: np.ndarray
    """Declared launch threads (0: not declared)."""
    native_ns: np.ndarray
    """Declared native times (NaN: none)."""
    efficiency: np.ndarray
    """Declared efficiencies (NaN: none)."""
    api: Sequence[str]
    chunked: np.ndarray | None = None
    """Declared launches whose threads each walk their own contiguous chunk (order ``sequential``: the lanes of a
    warp are a chunk apart, one 32 B sector each); None: none."""
    l2: np.ndarray | None = None
    """Relaunches whose bytes are L2 hits (uvmlab.sim.uvm.l2_reuse); None: none."""


def work_of(
    kern: pd.DataFrame,
    flops: np.ndarray,
    nbytes: np.ndarray,
    occupancy: np.ndarray,
    sector: np.ndarray,
    plans: Sequence[Any],
) -> KernelWork:
    """The :class:`KernelWork` of a trace's kernels table (rows in replay order): optional columns ``dtype``,
    ``threads``, ``native_ns``, ``efficiency`` and ``api`` (uvmlab.trace.schema.KERNEL_OPTIONAL; absent in older
    traces), ``plans`` the access-order plans (uvmlab.sim.uvm.order; gathers and scatters are class ``index``)."""
    n = len(kern)

    def col(name: str, default: Any, dtype: Any) -> np.ndarray:
        if name not in kern.columns:
            return np.full(n, default, dtype=dtype)
        return kern[name].fillna(default).to_numpy(dtype=dtype)

    index = np.array([p is not None and p.order in ("gather", "scatter") for p in plans], dtype=bool)
    threads = col("threads", 0, np.int64)
    chunk = np.where(threads > 0, np.asarray(nbytes, dtype=float) / np.maximum(threads, 1), 0.0)
    walks = np.array([p is not None and p.order == "sequential" and not p.derived for p in plans], dtype=bool)
    return KernelWork(
        names=kern["name"].astype(str).tolist(),
        flops=np.asarray(flops, dtype=float),
        nbytes=np.asarray(nbytes, dtype=float),
        dtypes=[str(x) for x in col("dtype", "", object)],
        occupancy=np.asarray(occupancy, dtype=float),
        sector=np.asarray(sector, dtype=bool) & ~index,
        index=index,
        threads=threads,
        native_ns=col("native_ns", np.nan, float),
        efficiency=col("efficiency", np.nan, float),
        api=[str(x) for x in col("api", "", object)],
        chunked=walks & (threads > 1) & (chunk >= SECTOR_BYTES),
    )


def math_peak(gpu: GpuSpec, dtype: str) -> float:
    """FLOP/s of the math unit a library GEMM or convolution of ``dtype`` runs on (module docstring, classes
    ``gemm`` and ``conv``): FP32 on the FP32 units, TF32 only when the kernel says so (dtype ``tf32``)."""
    if dtype in ("bf16", "fp16"):
        return gpu.tensor_flops
    if dtype == "fp64":
        return gpu.fp64_peak
    if dtype == "tf32":
        return gpu.tf32_flops or gpu.fp32_flops
    return gpu.fp32_flops


def classify(work: KernelWork) -> list[str]:
    """The class of every kernel by what it is (module docstring); :func:`native_times` may refine ``memory``,
    ``sector`` and ``index`` to ``serial`` or ``launch`` by which bound sets the time."""
    out = []
    for i, name in enumerate(work.names):
        if work.api[i]:
            out.append(API_CLASSES.get(work.api[i], "api"))
        elif np.isfinite(work.native_ns[i]):
            out.append("declared")
        elif op_base(name) in CONV_OPS and work.flops[i] > 0:
            out.append("conv")
        elif op_base(name) in GEMM_NATIVE_OPS and work.flops[i] > 0:
            out.append("gemm")
        elif work.index[i]:
            out.append("index")
        elif work.sector[i]:
            out.append("sector")
        else:
            out.append("memory")
    return out


def native_times(
    work: KernelWork, gpu: GpuSpec, costs: CostParams, run_dtype: str = "fp32"
) -> tuple[np.ndarray, list[str]]:
    """(native ns, class) of every kernel (module docstring); API rows get 0. The class is the rule that set the
    time: a kernel whose launch floor or CTA dispatch bound is the longest is ``launch``, one whose warps cannot
    keep the DRAM busy is ``serial``, a non-GEMM kernel whose FLOPs bound it is ``compute``. Vectorised: a training
    trace has tens of thousands of kernels."""
    costs = costs.for_gpu(gpu)
    cls = np.array(classify(work), dtype=object)
    n = len(cls)
    flops = np.asarray(work.flops, dtype=float)
    nbytes = np.asarray(work.nbytes, dtype=float)
    threads = np.asarray(work.threads, dtype=np.int64)
    given = np.asarray(work.efficiency, dtype=float)
    has_eff = np.isfinite(given) & (given > 0)
    hbm = gpu.hbm_bytes_per_s
    mem = float(costs.memory_efficiency or 1.0)
    t = np.zeros(n)
    timed = ~np.isin(cls, ("api", "copy", "host", "declared"))
    l2 = np.zeros(n, dtype=bool) if work.l2 is None else np.asarray(work.l2, dtype=bool) & timed & ~has_eff
    # GEMMs and convolutions: FLOPs at the math unit's peak x efficiency x occupancy, or their bytes
    gemm = np.isin(cls, ("gemm", "conv"))
    if gemm.any():
        peak = np.array([math_peak(gpu, work.dtypes[i] or run_dtype) for i in np.flatnonzero(gemm)])
        class_eff = np.where(cls[gemm] == "conv", costs.compute_efficiency, costs.gemm_efficiency)
        eff = np.where(has_eff[gemm], given[gemm], class_eff)
        occ = np.maximum(np.asarray(work.occupancy, dtype=float)[gemm], 1e-9)
        compute = np.where(flops[gemm] > 0, flops[gemm] / (peak * eff * occ), 0.0)
        bytes_rate = np.where(l2[gemm], hbm * L2_OVER_DRAM, hbm * mem)
        t[gemm] = np.maximum(compute, nbytes[gemm] / bytes_rate) * 1e9
    # the rest: bytes at the class's share of the DRAM, or FLOPs at the FP32 peak; declared launches: serial cap
    rest = timed & ~gemm
    if rest.any():
        mem_eff = np.full(n, mem)
        mem_eff[cls == "sector"] = costs.sector_memory_efficiency or mem
        mem_eff[cls == "index"] = costs.index_memory_efficiency or mem
        comp_eff = np.full(n, costs.compute_efficiency)
        comp_eff = np.where(has_eff & (flops > 0), given, comp_eff)
        mem_eff = np.where(has_eff & ~(flops > 0), given, mem_eff)
        rate = np.where(l2, hbm * L2_OVER_DRAM, hbm * mem_eff)
        if costs.warp_trip_ns > 0:  # DRAM round trips: not for L2 hits (their latency is not modelled)
            chunked = np.zeros(n, dtype=bool) if work.chunked is None else np.asarray(work.chunked, dtype=bool)
            for i in np.flatnonzero(rest & (threads > 0) & ~l2):
                scattered = bool(chunked[i]) or cls[i] in ("sector", "index")
                cap = serial_rate(int(threads[i]), gpu, costs, scattered=scattered)
                if cap < rate[i]:
                    rate[i], cls[i] = cap, "serial"
        with np.errstate(divide="ignore", invalid="ignore"):
            compute = np.where(flops > 0, flops / (gpu.fp32_flops * comp_eff), 0.0)
            memory = nbytes / rate
        cls[rest & l2 & (compute <= memory)] = "l2"
        cls[rest & (compute > memory)] = "compute"
        t[rest] = np.maximum(compute, memory)[rest] * 1e9
    # the launch floor and, for a declared launch, the CTA dispatch bound
    floor = np.where(timed, costs.kernel_min_ns, 0.0)
    if costs.cta_dispatch_ns > 0:
        ctas = -(-threads // DEFAULT_BLOCK_THREADS)
        cta = np.where(timed & (threads > 0), -(-ctas // gpu.sms) * costs.cta_dispatch_ns, 0.0)
        floor = np.maximum(floor, cta)
    low = timed & (floor > t)
    t[low] = floor[low]
    cls[low] = "launch"
    declared = cls == "declared"
    t[declared] = np.asarray(work.native_ns, dtype=float)[declared]
    return t, [str(c) for c in cls]


def serial_rate(threads: int, gpu: GpuSpec, costs: CostParams, scattered: bool = False) -> float:
    """Bytes/s a launch of ``threads`` threads can keep in flight (class ``serial``): resident warps x their request
    bytes per ``warp_trip_ns``. A warp's request is its lanes' 4 B elements coalesced (at least one 32 B sector), or,
    for ``scattered`` accesses (a strided stream, a gather), one 32 B sector per lane."""
    resident = min(threads, gpu.sms * gpu.max_threads_per_sm)
    warps = -(-resident // WARP_SIZE)
    lanes = min(resident, WARP_SIZE)
    request = lanes * SECTOR_BYTES if scattered else max(SECTOR_BYTES, lanes * LANE_BYTES)
    return warps * request / (costs.warp_trip_ns * 1e-9)


__all__ = [
    "CLASSES",
    "CONV_OPS",
    "DTYPES",
    "GEMM_NATIVE_OPS",
    "KernelWork",
    "classify",
    "math_peak",
    "native_times",
    "serial_rate",
    "work_of",
]
