"""GPU specifications the simulators and the estimator use.

Numbers are vendor datasheet figures (dense, no sparsity). ``link_bytes_per_s`` is the sustained
host<->device bandwidth for large (2 MiB) UVM migrations, not the link's peak: PCIe 3 x16 ~11.5 GB/s and
PCIe 4 x16 ~23 GB/s are the UVMSmart curve fits quoted in reference/uvm.md section 2.3/2.4; PCIe 5 x16 is
taken as twice PCIe 4 [I]; NVLink-C2C (GH200) as 300 GB/s sustained of its 450 GB/s per direction [U].
``context_bytes`` is the CUDA context plus the memory the driver keeps back, which a job cannot use:
reference/uvm.md section 3.3 (287 MB lazy loading vs 667 MB eager, pytorch/pytorch PR #86509); we take
512 MiB as the default [I], overridable per run.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from uvmlab.errors import InputError
from uvmlab.units import GiB, MiB, TiB, parse_bytes

DEFAULT_CONTEXT_BYTES = 512 * MiB
MAX_MEMORY_BYTES = 64 * TiB
"""Largest ``--gpu-memory``: the simulators place device memory in a made-up 64 TiB address range
(``uvmlab.sim.allocator.constants.DEFAULT_VA_SIZE_BYTES``); the largest GPU listed has 141 GiB."""


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model: capacity, compute, memory and host-link bandwidth."""

    name: str
    memory_bytes: int
    fp32_flops: float
    """Peak dense FP32 (non-tensor-core) FLOP/s."""
    tensor_flops: float
    """Peak dense BF16/FP16 tensor-core FLOP/s (also used for TF32-eligible matmuls at fp32 when enabled)."""
    hbm_bytes_per_s: float
    link_bytes_per_s: float
    link: str
    context_bytes: int = DEFAULT_CONTEXT_BYTES

    @property
    def usable_bytes(self) -> int:
        """Memory a job can allocate: capacity minus the CUDA context reservation."""
        return self.memory_bytes - self.context_bytes

    def with_memory(self, memory_bytes: int) -> GpuSpec:
        """The same GPU with a different capacity (``--gpu-memory``)."""
        if memory_bytes > MAX_MEMORY_BYTES:
            raise InputError(
                f"GPU memory {memory_bytes:,} B is more than the {MAX_MEMORY_BYTES // TiB} TiB the simulators' device "
                "address range holds; give a smaller --gpu-memory"
            )
        if memory_bytes <= self.context_bytes:
            raise InputError(
                f"GPU memory {memory_bytes} B is not larger than the CUDA context reservation "
                f"({self.context_bytes} B); give a larger --gpu-memory"
            )
        return replace(self, name=f"{self.name} ({memory_bytes / GiB:.1f} GiB)", memory_bytes=memory_bytes)


_PCIE3 = 11.5e9
_PCIE4 = 23.0e9
_PCIE5 = 46.0e9

GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        # A100 80GB PCIe: the seed study's GPU (seeds/003 table 1). 1935 GB/s HBM2e, 19.5 TF fp32, 312 TF bf16.
        GpuSpec("A100-80GB", 80 * GiB, 19.5e12, 312e12, 1935e9, _PCIE4, "PCIe 4.0 x16"),
        GpuSpec("A100-40GB", 40 * GiB, 19.5e12, 312e12, 1555e9, _PCIE4, "PCIe 4.0 x16"),
        GpuSpec("H100-80GB", 80 * GiB, 67e12, 989e12, 3350e9, _PCIE5, "PCIe 5.0 x16"),
        GpuSpec("H100-PCIe", 80 * GiB, 51e12, 756e12, 2000e9, _PCIE5, "PCIe 5.0 x16"),
        GpuSpec("H200", 141 * GiB, 67e12, 989e12, 4800e9, _PCIE5, "PCIe 5.0 x16"),
        GpuSpec("GH200", 96 * GiB, 67e12, 989e12, 4000e9, 300e9, "NVLink-C2C"),
        GpuSpec("L40S", 48 * GiB, 91.6e12, 362e12, 864e9, _PCIE4, "PCIe 4.0 x16"),
        GpuSpec("A6000", 48 * GiB, 38.7e12, 155e12, 768e9, _PCIE4, "PCIe 4.0 x16"),
        GpuSpec("V100-32GB", 32 * GiB, 15.7e12, 125e12, 900e9, _PCIE3, "PCIe 3.0 x16"),
        GpuSpec("V100-16GB", 16 * GiB, 15.7e12, 125e12, 900e9, _PCIE3, "PCIe 3.0 x16"),
        GpuSpec("TitanV", 12 * GiB, 14.9e12, 110e12, 652e9, _PCIE3, "PCIe 3.0 x16"),
        GpuSpec("RTX4090", 24 * GiB, 82.6e12, 165e12, 1008e9, _PCIE4, "PCIe 4.0 x16"),
        GpuSpec("RTX5090", 32 * GiB, 104.8e12, 209e12, 1792e9, _PCIE5, "PCIe 5.0 x16"),
        GpuSpec("RTX4060", 8 * GiB, 15.1e12, 60e12, 272e9, _PCIE4, "PCIe 4.0 x8"),
        GpuSpec("T4", 16 * GiB, 8.1e12, 65e12, 320e9, _PCIE3, "PCIe 3.0 x16"),
    )
}
DEFAULT_GPU = "A100-80GB"


def get_gpu(name: str, memory: str | int | None = None) -> GpuSpec:
    """Look up a GPU by name (case-insensitive); ``memory`` (e.g. ``"80GiB"``) overrides its capacity."""
    by_lower = {k.lower(): v for k, v in GPUS.items()}
    spec = by_lower.get(name.lower())
    if spec is None:
        raise InputError(f"unknown GPU {name!r}; known GPUs: {', '.join(GPUS)}")
    if memory is not None:
        spec = spec.with_memory(parse_bytes(memory))
    return spec


def known_gpu(detected: str | None) -> str | None:
    """The known GPU whose name's parts all appear in a detected name ('A100-80GB' in 'NVIDIA A100 80GB PCIe'); a
    heuristic: None when no known name fits (the longest fit wins)."""
    if not detected:
        return None
    words = detected.upper().replace("-", " ").split()
    fits = [k for k in GPUS if all(part in words for part in k.upper().split("-"))]
    return max(fits, key=len) if fits else None
