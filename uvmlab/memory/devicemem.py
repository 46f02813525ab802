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

5. **cuDNN's kernel images under eager loading** (``eager_cudnn_bytes``, eager loading only, runs that launch cuDNN
   convolutions). cuDNN 8/9 is split into sub-libraries that ``libcudnn`` opens on first use (cuDNN API reference,
   "Backend API Overview"), so an eager run loads the convolution engines only when it convolves: the sm_XX kernel
   images of ``libcudnn_engines_precompiled``, ``libcudnn_engines_runtime_compiled``, ``libcudnn_cnn`` and
   ``libcudnn_ops`` (``CUDNN_CONV_LIBRARIES``), measured from the binaries of the installed wheels with
   ``tools/module_images.py`` (``MODULE_IMAGES_MIB``). The same measurement of libtorch_cuda + cuBLAS + cuBLASLt
   (998 MiB for sm_80) corroborates part 3's calibrated 1,000 MiB; for GPUs other than an A100 part 3 now comes from
   that table too.

Every part is reported by library in ``ContextModel.by_library()`` (docs/estimate.md "Fixed costs by library").

cuBLAS/cuBLASLt workspaces and cuDNN convolution workspaces are NOT here: PyTorch allocates them through the
caching allocator (``uvmlab.trace.orchestrate``), so they are part of the reserved peak.

This module never imports torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from uvmlab.errors import InputError
from uvmlab.gpus import sm_info, sm_version
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

MODULE_IMAGES_MIB: dict[str, dict[int, float]] = {
    "libtorch_cuda": {75: 624.7, 80: 702.9, 86: 702.6, 89: 10.6, 90: 785.1, 100: 1157.8, 120: 1094.1},
    "libtorch_cuda_linalg": {80: 53.7, 86: 53.6, 90: 54.4, 100: 70.9, 120: 95.2},
    "libcublas": {75: 47.4, 80: 50.0, 86: 32.7, 90: 55.1, 100: 69.0, 120: 85.9},
    "libcublasLt": {75: 147.5, 80: 191.4, 86: 53.1, 89: 26.1, 90: 360.4, 100: 148.3, 120: 211.1},
    "libcudnn_engines_precompiled": {75: 207.2, 80: 215.4, 86: 54.7, 90: 233.1, 100: 376.8, 120: 410.5},
    "libcudnn_engines_runtime_compiled": {75: 3.7, 80: 6.5, 86: 4.3, 90: 8.2, 100: 7.9, 120: 7.8},
    "libcudnn_cnn": {75: 3.9, 80: 0.3, 86: 0.3, 90: 0.3, 100: 0.5, 120: 0.5},
    "libcudnn_ops": {75: 43.8, 80: 42.9, 90: 47.3, 100: 70.3, 120: 74.1},
    "libcudnn_adv": {75: 98.4, 80: 108.4, 86: 108.2, 90: 111.6, 100: 150.1, 120: 152.7},
    "libnccl": {75: 49.3, 80: 49.0, 90: 103.6, 100: 140.1, 120: 124.5},
}
"""Uncompressed cubin MiB per SM version in each library's ``.nv_fatbin`` (``python tools/module_images.py``, run on
torch 2.14.1+cu130 with nvidia-cudnn-cu13 9.24.0.43, nvidia-cublas 13.1.1.3, nvidia-nccl-cu13 2.30.7, 2026-11-25).
What eager loading makes resident for a library is its images for the GPU's SM version (an upper estimate: a cubin
also holds symbol and relocation tables)."""
TORCH_LIBRARIES = ("libtorch_cuda", "libtorch_cuda_linalg")
CUBLAS_LIBRARIES = ("libcublas", "libcublasLt")
CUDNN_CONV_LIBRARIES = (
    "libcudnn_engines_precompiled",
    "libcudnn_engines_runtime_compiled",
    "libcudnn_cnn",
    "libcudnn_ops",
)
"""What a convolution opens: the engines, the cnn front end, and ops (the handle, tensor transforms)."""


def image_bytes(libraries: tuple[str, ...], sm: int) -> int:
    """Bytes eager loading makes resident for ``libraries`` on an ``sm`` GPU.

    Per library, the images of ``sm`` itself, else of the highest lower version of the same major (cubins run on
    later minor versions of their major: CUDA C Programming Guide, "Binary Compatibility"); none when there are none
    (the driver would JIT the PTX instead: not modelled)."""
    total = 0.0
    for lib in libraries:
        sizes = MODULE_IMAGES_MIB.get(lib, {})
        usable = [v for v in sizes if v <= sm and v // 10 == sm // 10]
        if usable:
            total += sizes[max(usable)]
    return int(total * MiB)


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
    eager_cudnn_bytes: int = 0
    """cuDNN's convolution sub-libraries loaded eagerly at the first convolution (part 5; eager loading only)."""
    stack_bytes: int = 0
    """Fixed costs fitted to the user's stack (``uvmlab calibrate --memory``, ``uvmlab.memory.stack``); 0 without."""

    @property
    def total_bytes(self) -> int:
        """Whole-process device memory with nothing allocated by the caching allocator."""
        return (
            self.lmem_bytes
            + self.lazy_rest_bytes
            + self.eager_modules_bytes
            + self.lazy_conv_modules_bytes
            + self.eager_cudnn_bytes
            + self.stack_bytes
        )

    def by_library(self) -> dict[str, int]:
        """The same bytes by what owns them: the CUDA context, PyTorch's + cuBLAS's kernels, cuDNN, the stack fit."""
        return {
            "cuda_context": self.lmem_bytes + self.lazy_rest_bytes,
            "torch_and_cublas_kernels": self.eager_modules_bytes,
            "cudnn": self.lazy_conv_modules_bytes + self.eager_cudnn_bytes,
            "stack_calibration": self.stack_bytes,
        }

    def to_json(self) -> dict[str, Any]:
        """The ``context_model`` object of the estimate JSON (docs/estimate.md)."""
        out = asdict(self)
        out["notes"] = list(self.notes)
        out["by_library"] = self.by_library()
        out["total_bytes"] = self.total_bytes
        return out


def context_model(
    gpu_name: str,
    module_loading: str = "lazy",
    eager_modules_bytes: int | None = None,
    convolutions: bool = False,
    stack_bytes: int = 0,
) -> ContextModel:
    """The context model of a run on ``gpu_name`` with ``module_loading`` ``lazy`` (default) or ``eager``.

    ``convolutions``: the run launches cuDNN convolutions (lazy loading then adds ``LAZY_CONV_MODULES_BYTES``,
    eager loading cuDNN's convolution images, ``image_bytes(CUDNN_CONV_LIBRARIES, sm)``).

    ``eager_modules_bytes`` overrides the eager size of PyTorch's and cuBLAS's kernels (default: the A100 value
    calibrated on GPUMemNet's stack, ``EAGER_MODULES_A100_BYTES``; other GPUs: the images of
    ``TORCH_LIBRARIES + CUBLAS_LIBRARIES`` for their SM version). ``stack_bytes``: a stack calibration's fixed costs.
    """
    if module_loading not in MODULE_LOADING:
        raise InputError(f"module loading must be one of {', '.join(MODULE_LOADING)}, not {module_loading!r}")
    notes: list[str] = []
    _sms, _threads, known = sm_info(gpu_name)
    if not known:
        notes.append(f"SM count of {gpu_name} unknown: taken as an A100's (108 SMs x 2048 threads)")
    sm = sm_version(gpu_name)
    eager = cudnn = 0
    if module_loading == "eager":
        if eager_modules_bytes is not None:
            eager = int(eager_modules_bytes)
        elif gpu_name.startswith("A100"):
            eager = EAGER_MODULES_A100_BYTES
        else:
            eager = image_bytes(TORCH_LIBRARIES + CUBLAS_LIBRARIES, sm)
            notes.append(f"eager kernels of PyTorch and cuBLAS: their sm_{sm} images in the measured wheels")
        if convolutions:
            cudnn = image_bytes(CUDNN_CONV_LIBRARIES, sm)
    return ContextModel(
        gpu=gpu_name,
        module_loading=module_loading,
        lmem_bytes=lmem_bytes(gpu_name),
        lazy_rest_bytes=LAZY_CONTEXT_OTHER_BYTES,
        eager_modules_bytes=eager,
        notes=tuple(notes),
        lazy_conv_modules_bytes=LAZY_CONV_MODULES_BYTES if module_loading == "lazy" and convolutions else 0,
        eager_cudnn_bytes=cudnn,
        stack_bytes=int(stack_bytes),
    )
