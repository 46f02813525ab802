"""Native (all-resident) kernel time by kernel class (issue 41 section 2). Torch-free.

One roofline with one efficiency put large cuBLAS GEMMs 1.5-1.9x too slow and small or latency-bound kernels far
too fast; every slowdown inherits that error through its denominator. Each kernel is now put in a class, and each
class has its own rule and constants (``uvmlab.sim.uvm.timing.CostParams``, every one with its source):

``gemm``
    A GEMM-like library kernel (:data:`GEMM_NATIVE_OPS`: cuBLAS / cuBLASLt matmuls, cuDNN convolutions, the SDPA
    kernels, their in-place and ``out=`` forms) with FLOPs: ``flops / (peak x gemm_efficiency x occupancy)``, or its
    bytes at the DRAM rate when that is slower. ``peak`` is the math unit the library picks for the kernel's dtype
    (:func:`math_peak`): BF16/FP16 tensor cores; FP32 convolutions on TF32 tensor cores from Ampere on
    (``torch.backends.cudnn.allow_tf32`` defaults to True); FP32 matmuls on the FP32 units
    (``torch.backends.cuda.matmul.allow_tf32`` defaults to False since PyTorch 1.12: "TensorFloat-32 (TF32) on
    Ampere (and later) devices", PyTorch CUDA semantics notes); FP64 at the FP64 peak (tensor cores on A100/H100).
    ``occupancy`` is the one-wave share of the SMs a small GEMM fills (``uvmlab.sim.uvm.reread.occupancy``).
``memory``
    Every other kernel: its bytes at ``hbm x memory_efficiency``, or its FLOPs at ``fp32 x compute_efficiency``.
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
    the bandwidth. The time is the kernel's bytes over ``min(that bound, the class's DRAM rate)``.
``launch``
    Every kernel lasts at least ``kernel_min_ns`` (launch and drain); a declared launch of ``threads`` also pays
    ``cta_dispatch_ns`` per CTA of :data:`DEFAULT_BLOCK_THREADS` threads per SM (block scheduling, which bounds a
    grid of mostly idle threads).
``declared``
    A program kernel that says its time (``uvm.kernel(..., native_ms=...)``): that time. A program kernel that says
    its efficiency (``efficiency=...``) takes it in place of its class's efficiency.

The class of every kernel is in the kernels table (``kernel_class``) so that ``uvmlab calibrate --kernels`` and a
reader of a run can see which rule timed it. Approximations (docs/uvm-sim.md "Native kernel time by class"): GEMM
efficiency does not fall with K or with tile quantization inside a wave; L2 hits are not modelled (every byte is a
DRAM byte); a traced torch op's launch shape is not known, so ``serial`` and the CTA term apply to declared kernels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from uvmlab.gpus import GpuSpec
from uvmlab.sim.uvm.timing import CostParams
from uvmlab.trace.orchestrate import op_base

CLASSES = ("gemm", "memory", "sector", "index", "serial", "launch", "declared", "api")
"""Kernel classes (module docstring); ``api``: a CUDA API call or host access between kernels (no native time)."""
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
"""cuDNN convolutions: FP32 ones run on TF32 tensor cores from Ampere on (``torch.backends.cudnn.allow_tf32``)."""
DTYPES = ("fp32", "bf16", "fp16", "fp64", "tf32")
"""Kernel dtypes the class rules know (the trace's optional ``dtype`` column; "" = the run's)."""
WARP_LANES = 32
"""Threads per warp (CUDA C++ Programming Guide, "SIMT Architecture")."""
LANE_BYTES = 4
"""Bytes one lane moves per access in the serial rule (a 32-bit element, as the declared kernels' loops do)."""
SECTOR_BYTES = 32
"""DRAM / L2 transfer unit (CUDA C++ Best Practices Guide, "Coalesced Access to Global Memory")."""
DEFAULT_BLOCK_THREADS = 256
"""Threads per CTA assumed for a declared kernel's CTA dispatch term (the common launch of CUDA samples) [U]."""


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
    return KernelWork(
        names=kern["name"].astype(str).tolist(),
        flops=np.asarray(flops, dtype=float),
        nbytes=np.asarray(nbytes, dtype=float),
        dtypes=[str(x) for x in col("dtype", "", object)],
        occupancy=np.asarray(occupancy, dtype=float),
        sector=np.asarray(sector, dtype=bool) & ~index,
        index=index,
        threads=col("threads", 0, np.int64),
        native_ns=col("native_ns", np.nan, float),
        efficiency=col("efficiency", np.nan, float),
        api=[str(x) for x in col("api", "", object)],
    )


def math_peak(gpu: GpuSpec, dtype: str, op: str) -> float:
    """FLOP/s of the math unit a library GEMM of ``dtype`` runs on (module docstring, class ``gemm``)."""
    if dtype in ("bf16", "fp16"):
        return gpu.tensor_flops
    if dtype == "fp64":
        return gpu.fp64_peak
    if dtype == "tf32" or (dtype == "fp32" and op in CONV_OPS and gpu.tf32_flops > 0):
        return gpu.tf32_flops or gpu.fp32_flops
    return gpu.fp32_flops


def classify(work: KernelWork) -> list[str]:
    """The class of every kernel by what it is (module docstring); :func:`native_times` may refine ``memory``,
    ``sector`` and ``index`` to ``serial`` or ``launch`` by which bound sets the time."""
    out = []
    for i, name in enumerate(work.names):
        if work.api[i]:
            out.append("api")
        elif np.isfinite(work.native_ns[i]):
            out.append("declared")
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
    keep the DRAM busy is ``serial``."""
    costs = costs.for_gpu(gpu)
    classes = classify(work)
    t = np.zeros(len(classes))
    hbm = gpu.hbm_bytes_per_s
    for i, cls in enumerate(classes):
        if cls == "api":
            continue
        if cls == "declared":
            t[i] = float(work.native_ns[i])
            continue
        given = float(work.efficiency[i])
        has_eff = bool(np.isfinite(given) and given > 0)
        flops, nbytes = float(work.flops[i]), float(work.nbytes[i])
        threads = int(work.threads[i])
        if cls == "gemm":
            eff = given if has_eff else costs.gemm_efficiency
            occ = max(float(work.occupancy[i]), 1e-9)
            peak = math_peak(gpu, work.dtypes[i] or run_dtype, op_base(work.names[i]))
            compute = flops / (peak * eff * occ) if flops > 0 else 0.0
            ns = max(compute, nbytes / (hbm * costs.memory_efficiency)) * 1e9
        else:
            mem_eff = {
                "sector": costs.sector_memory_efficiency or costs.memory_efficiency,
                "index": costs.index_memory_efficiency or costs.memory_efficiency,
            }.get(cls, costs.memory_efficiency)
            comp_eff = costs.compute_efficiency
            if has_eff:  # a declared efficiency: the share of peak of whichever bound the kernel has
                mem_eff = comp_eff = given
            rate = hbm * mem_eff
            if threads > 0 and costs.warp_trip_ns > 0:
                cap = serial_rate(threads, gpu, costs, scattered=cls in ("sector", "index"))
                if cap < rate:
                    rate, cls = cap, "serial"
            compute = flops / (gpu.fp32_flops * comp_eff) if flops > 0 else 0.0
            ns = max(compute, nbytes / rate) * 1e9
        floor = costs.kernel_min_ns
        if threads > 0 and costs.cta_dispatch_ns > 0:
            ctas = -(-threads // DEFAULT_BLOCK_THREADS)
            floor = max(floor, -(-ctas // gpu.sms) * costs.cta_dispatch_ns)
        if floor > ns:
            ns, cls = floor, "launch"
        t[i], classes[i] = ns, cls
    return t, classes


def serial_rate(threads: int, gpu: GpuSpec, costs: CostParams, scattered: bool = False) -> float:
    """Bytes/s a launch of ``threads`` threads can keep in flight (class ``serial``): resident warps x their request
    bytes per ``warp_trip_ns``. A warp's request is its lanes' 4 B elements coalesced (at least one 32 B sector), or,
    for ``scattered`` accesses (a strided stream, a gather), one 32 B sector per lane."""
    resident = min(threads, gpu.sms * gpu.max_threads_per_sm)
    warps = -(-resident // WARP_LANES)
    lanes = min(resident, WARP_LANES)
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
