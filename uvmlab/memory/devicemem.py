"""Device memory outside the caching allocator: the CUDA context, loaded modules, library handles.

``nvidia-smi`` (NVML ``memory.used``) shows, per process, the caching allocator's reserved segments PLUS memory
the allocator never sees. This module models the latter as a sum of parts, each with its source
(docs/estimate.md "Device peak"):

1. **Local memory (LMEM)** the driver reserves for the context: ``max resident threads per SM x SMs x stack
   bytes per thread`` (NVIDIA developer forum thread 289339, "Local memory management": "the local memory
   allocation is context wide and is calculated as MAX_THREADS_PER_SM x SMs x LOCAL_MEM_PER_THREAD"; the
   default per-thread stack is 1 KiB, CUDA Runtime API ``cudaLimitStackSize``). SM counts are vendor datasheet
   figures; threads per SM are the CUDA C Programming Guide's compute-capability table (2048 on sm70/80/90,
   1536 on sm86/89/120, 1024 on sm75). A100: 108 x 2048 x 1 KiB = 216 MiB.
2. **The rest of a lazily loaded context** (page tables, driver heaps, the few kernels PyTorch's start-up
   runs): 426 MiB measured with ``torch.cuda.mem_get_info`` and nothing allocated on an RTX 6000 Ada
   (PyTorch 2.10 / CUDA 13; unslothai/unsloth-zoo PR #1053, in ../shared/real-data/memory/
   context_and_workspace_evidence.md) minus that GPU's LMEM (142 SMs x 1536 x 1 KiB = 213 MiB) = 213 MiB.
3. **Eagerly loaded modules.** Without lazy loading (CUDA < 11.7, a driver older than R515, or
   ``CUDA_MODULE_LOADING=EAGER``) every kernel of libtorch_cuda, cuBLAS and cuDNN for the GPU's architecture
   is loaded when the context is created: 615 MiB more than lazy on the same machine in pytorch/pytorch
   PR #86509 (666,632,192 B eager vs 287,047,680 B lazy, a 20 MiB allocator segment in both). The module
   images grew with later releases and architectures (1.49-1.69 GiB whole-process on RTX 3090 with CUDA 11.0/11.1,
   pytorch/pytorch #49877 and #55277), so for a known stack the size is calibrated (``EAGER_MODULES_A100``).
   With lazy loading (PyTorch sets ``CUDA_MODULE_LOADING=LAZY`` since 1.13 when CUDA >= 11.7; CUDA's own
   default since 12.2) only the kernels a run launches load: counted in part 2 (APPROXIMATION: the
   per-library lazy increments of cuBLAS/cuDNN are not measured separately in any source we found).
4. Lazily loaded modules of a convolutional training run (``LAZY_CONV_MODULES_BYTES``, lazy loading only, runs
   that launch convolutions): the cuDNN/cuBLAS kernels and library handles a CNN run loads on first use. Calibrated
   on a declared subset of CARMA's A100-40GB runs (the 15 CIFAR-100 rows, whose allocator peaks are small: the
   gap is module memory, not workspaces) and validated on the 18 ImageNet rows (docs/estimate.md "Validation:
   CARMA A100-40GB CNN runs"). Runs without convolutions get nothing: no measurement separates cuBLAS's share.

cuBLAS/cuBLASLt workspaces and cuDNN convolution workspaces are NOT here: PyTorch allocates them through the
caching allocator (``uvmlab.trace.orchestrate``), so they are part of the reserved peak.

This module never imports torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from uvmlab.errors import InputError
from uvmlab.units import KiB, MiB

STACK_BYTES_PER_THREAD = 1 * KiB
"""Default ``cudaLimitStackSize`` (CUDA Runtime API documentation)."""
LAZY_CONTEXT_OTHER_BYTES = 426 * MiB - 142 * 1536 * STACK_BYTES_PER_THREAD
"""Lazy context minus LMEM: unsloth-zoo PR #1053 (RTX 6000 Ada, 426 MiB) minus 142 SMs x 1536 threads x 1 KiB."""
EAGER_MODULES_A100_BYTES = 1_000 * MiB
"""Eagerly loaded modules of the GPUMemNet A100-40GB stack: CALIBRATED on the declared subset of the MLP set
(the 600 rows whose index is a multiple of 5, ``uvmlab.evaluate.gpumemnet.CALIBRATION_STRIDE``): the median of
measured - (simulated reserved peak + LMEM + lazy rest) = 1000.0 MiB (5-95 %: 984-1032 MiB), measured
2026-11-23, docs/evaluation.md. Validated on the other 2,400 rows. Same order as PR #86509's 615 MiB on an
older, smaller stack."""
LAZY_CONV_MODULES_BYTES = 93 * MiB
"""The smallest gap, measured - this model's lazy prediction, over CARMA's 15 CIFAR-100 A100-40GB rows (itu-rad/CARMA
@e044017, workloads/ehsan-summary.csv; 93-159 MiB, 93 MiB on six rows of four distinct settings): the smallest,
as the larger gaps include allocator effects. Calibration subset only; the ImageNet rows validate it."""
MODULE_LOADING = ("lazy", "eager")

# (SM count, max resident threads per SM) by GpuSpec name prefix: vendor datasheets; CUDA C Programming Guide.
SM_TABLE: dict[str, tuple[int, int]] = {
    "A100": (108, 2048),
    "H100-PCIe": (114, 2048),
    "H100": (132, 2048),
    "H200": (132, 2048),
    "GH200": (132, 2048),
    "L40S": (142, 1536),
    "A6000": (84, 1536),
    "V100": (80, 2048),
    "TitanV": (80, 2048),
    "RTX4090": (128, 1536),
    "RTX5090": (170, 1536),
    "RTX4060": (24, 1536),
    "RTX3060": (28, 1536),
    "T4": (40, 1024),
}
DEFAULT_SMS = (108, 2048)
"""GPUs missing from ``SM_TABLE`` are taken as an A100 (said in ``ContextModel.notes``)."""


def sm_info(gpu_name: str) -> tuple[int, int, bool]:
    """(SMs, threads per SM, known) for a GpuSpec name (longest matching prefix)."""
    for prefix in sorted(SM_TABLE, key=len, reverse=True):
        if gpu_name.startswith(prefix):
            return (*SM_TABLE[prefix], True)
    return (*DEFAULT_SMS, False)


def lmem_bytes(gpu_name: str, stack_bytes: int = STACK_BYTES_PER_THREAD) -> int:
    """The context's local-memory reservation: SMs x threads per SM x stack bytes per thread."""
    sms, threads, _known = sm_info(gpu_name)
    return sms * threads * stack_bytes


@dataclass(frozen=True)
class ContextModel:
    """The parts of device memory outside the caching allocator, in bytes (module docstring)."""

    gpu: str
    module_loading: str
    lmem_bytes: int
    lazy_rest_bytes: int
    eager_modules_bytes: int
    notes: tuple[str, ...] = ()
    lazy_conv_modules_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        """Whole-process device memory with nothing allocated by the caching allocator."""
        return self.lmem_bytes + self.lazy_rest_bytes + self.eager_modules_bytes + self.lazy_conv_modules_bytes

    def to_json(self) -> dict[str, Any]:
        """The ``context_model`` object of the estimate JSON (docs/estimate.md)."""
        out = asdict(self)
        out["notes"] = list(self.notes)
        out["total_bytes"] = self.total_bytes
        return out


def context_model(
    gpu_name: str, module_loading: str = "lazy", eager_modules_bytes: int | None = None, convolutions: bool = False
) -> ContextModel:
    """The context model of a run on ``gpu_name`` with ``module_loading`` ``lazy`` (default) or ``eager``.

    ``convolutions``: the run launches convolutions (lazy loading then adds ``LAZY_CONV_MODULES_BYTES``).

    ``eager_modules_bytes`` overrides the eager module size (default: ``EAGER_MODULES_A100_BYTES``, the only
    stack we have measurements for; the module images are per architecture, so other GPUs are noted).
    """
    if module_loading not in MODULE_LOADING:
        raise InputError(f"module loading must be one of {', '.join(MODULE_LOADING)}, not {module_loading!r}")
    notes: list[str] = []
    _sms, _threads, known = sm_info(gpu_name)
    if not known:
        notes.append(f"SM count of {gpu_name} unknown: taken as an A100's (108 SMs x 2048 threads)")
    eager = 0
    if module_loading == "eager":
        eager = EAGER_MODULES_A100_BYTES if eager_modules_bytes is None else int(eager_modules_bytes)
        if eager_modules_bytes is None and not gpu_name.startswith("A100"):
            notes.append("eager module size measured on an A100 stack; other architectures differ")
    return ContextModel(
        gpu=gpu_name,
        module_loading=module_loading,
        lmem_bytes=lmem_bytes(gpu_name),
        lazy_rest_bytes=LAZY_CONTEXT_OTHER_BYTES,
        eager_modules_bytes=eager,
        notes=tuple(notes),
        lazy_conv_modules_bytes=LAZY_CONV_MODULES_BYTES if module_loading == "lazy" and convolutions else 0,
    )
