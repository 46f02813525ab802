"""GPU specifications the simulators and the estimator use, each number with its source.

A :class:`GpuSpec` is one GPU model in one host: compute and memory figures from the vendor's datasheet (dense, no
sparsity), the host link from :data:`LINKS`, the host's base page size, and the NVIDIA driver the run describes.

Host links (:data:`LINKS`): ``link_peak_bytes_per_s`` is the hardware's own limit per direction (the link's
signalling rate times its encoding efficiency); ``link_bytes_per_s`` is the sustained rate of 2 MiB UVM migrations
(the rate the simulator's transfer curve reaches at 2 MiB, reference/uvm.md 2.3/2.4). Every derived link rate the
simulator uses is capped at the peak (tests/test_gpus_profiles.py checks it over every GPU and profile).

``context_bytes`` is the CUDA context plus the memory the driver keeps back, which a job cannot use:
reference/uvm.md section 3.3 (287 MB lazy loading vs 667 MB eager, pytorch/pytorch PR #86509); we take
512 MiB as the default [I], overridable per run.

``driver``: the NVIDIA driver version the run describes (``--gpu NAME@VERSION``, e.g. ``V100-PCIe@418.67``); the
fault-path costs depend on its generation (uvmlab.sim.uvm.generations). Default :data:`DEFAULT_DRIVER`.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from uvmlab.errors import InputError
from uvmlab.units import GiB, KiB, MiB, TiB, parse_bytes

DEFAULT_CONTEXT_BYTES = 512 * MiB
MAX_MEMORY_BYTES = 64 * TiB
"""Largest ``--gpu-memory``: the simulators place device memory in a made-up 64 TiB address range
(``uvmlab.sim.allocator.constants.DEFAULT_VA_SIZE_BYTES``); the largest GPU listed has 141 GiB."""
DEFAULT_DRIVER = "575.57.08"
"""The driver a run describes unless ``--gpu NAME@VERSION`` says otherwise: the newest driver whose fault path
uvmlab has fitted (the RTX 5090 profile, uvmlab/sim/uvm/profiles/rtx5090.json). Every GPU listed here runs it
(Pascal and Volta are supported up to the R580 branch: NVIDIA's CUDA 12.8/13.0 release notes)."""
MIN_DRIVER_MAJOR = 375
"""Demand paging of managed memory (Pascal and later) needs CUDA 8, whose driver branch is R375 (CUDA 8.0 release
notes, "Unified Memory ... GPU page faulting"); an older version is refused."""
X86_PAGE_BYTES = 4096
"""x86-64 Linux ``PAGE_SIZE``."""
PAGE_64K = 65536
"""``PAGE_SIZE`` of ppc64le Linux (RHEL 7/8 for POWER9 ship 64 KiB pages: IBM Power AC922 Redbook, SG24-8422) and
of the 64 KiB-page ARM64 kernels NVIDIA recommends for Grace (NVIDIA Grace Performance Tuning Guide, "Linux kernel
page size")."""


@dataclass(frozen=True)
class LinkSpec:
    """A host link: its peak and sustained rates per direction, whether the CPU can map GPU memory, and sources."""

    name: str
    peak_bytes_per_s: float
    sustained_bytes_per_s: float
    coherent: bool
    """True when the CPU can access GPU memory (the driver sets ``accessible_from[gpu]`` for the CPU only for a
    coherent GPU with NUMA memory: [OGKM] uvm_va_space.c ``uvm_parent_gpu_is_coherent`` / ``mem_info.numa.enabled``);
    AccessedBy(CPU) and PreferredLocation(GPU) then keep GPU pages in place on CPU access (uvmlab.sim.uvm.hints)."""
    source: str


_PCIE_SUSTAINED = 0.73
"""Sustained 2 MiB rate / peak of PCIe x16: 11.5 / 15.75 (gen 3) and 23 / 31.5 (gen 4) (reference/uvm.md 2.3/2.4:
UVMSmart's fitted curve; the GTX 1080 nvprof traces of UVMSmart ``micro-benchmarks/transferBandwidth.cu`` reach
11.2 GB/s at 1 MiB and its ``getHWPrefetcherP1.cu`` moves a 0.996 MiB UM migration in 86.4 us, 12.1 GB/s)."""

LINKS: dict[str, LinkSpec] = {
    lk.name: lk
    for lk in (
        LinkSpec(
            "PCIe 3.0 x16",
            15.75e9,
            11.5e9,
            False,
            "peak: 8 GT/s x 16 lanes x 128/130; sustained: UVMSmart PCIe 3 curve (reference/uvm.md 2.3), matched by "
            "the GTX 1080 UM migrations of UVMSmart micro-benchmarks/getHWPrefetcherP1.cu (12.1 GB/s at 1 MiB)",
        ),
        LinkSpec(
            "PCIe 4.0 x16",
            31.5e9,
            23.0e9,
            False,
            "peak: 16 GT/s x 16 x 128/130; sustained: the PCIe 3 ratio 0.73 (reference/uvm.md 2.4: 24-26 achievable; "
            "the A100 nsys export fits 25.0, uvmlab/sim/uvm/profiles/a100.json)",
        ),
        LinkSpec(
            "PCIe 4.0 x8",
            15.75e9,
            11.5e9,
            False,
            "peak: 16 GT/s x 8 x 128/130; sustained: the PCIe ratio 0.73 [I]",
        ),
        LinkSpec(
            "PCIe 5.0 x16",
            63.0e9,
            46.0e9,
            False,
            "peak: 32 GT/s x 16 x 128/130; sustained: the PCIe ratio 0.73 [I]",
        ),
        LinkSpec(
            "NVLink 2.0 to POWER9 (3 bricks)",
            75.0e9,
            55.0e9,
            True,
            "peak: 3 NVLink 2.0 bricks x 25 GB/s per direction between each V100 and its POWER9 socket (IBM Power "
            "AC922 Redbook SG24-8422, 4-GPU model: 150 GB/s bidirectional); sustained: the PCIe ratio 0.73 [I, "
            "unverified for NVLink]; coherent: the CPU maps GPU memory (ATS / NUMA mode)",
        ),
        LinkSpec(
            "NVLink-C2C",
            450.0e9,
            300.0e9,
            True,
            "peak: NVLink-C2C 900 GB/s bidirectional (NVIDIA GH200 Grace Hopper Superchip datasheet); sustained: "
            "300 GB/s of 450 [U]; coherent: Grace maps Hopper memory as a NUMA node",
        ),
    )
}


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model in one host: capacity, compute, memory, host link, host page size, driver."""

    name: str
    memory_bytes: int
    fp32_flops: float
    """Peak dense FP32 (non-tensor-core) FLOP/s."""
    tensor_flops: float
    """Peak dense BF16/FP16 tensor-core FLOP/s (also used for TF32-eligible matmuls at fp32 when enabled); Pascal has
    no tensor cores: its peak FP16 rate."""
    hbm_bytes_per_s: float
    link_bytes_per_s: float
    """Sustained 2 MiB UVM migration rate per direction (:data:`LINKS`)."""
    link: str
    context_bytes: int = DEFAULT_CONTEXT_BYTES
    arch: str = ""
    """GPU architecture (Pascal, Volta, Turing, Ampere, Ada, Hopper, Blackwell)."""
    link_peak_bytes_per_s: float = 0.0
    """The link's own limit per direction; 0 = the sustained rate (a spec built by hand)."""
    coherent: bool = False
    """The CPU can map GPU memory (:attr:`LinkSpec.coherent`)."""
    host_page_bytes: int = X86_PAGE_BYTES
    """The host kernel's ``PAGE_SIZE``: the unit of UVM faults, residency and CPU mappings (uvmlab.sim.uvm.driver)."""
    driver: str = DEFAULT_DRIVER
    sources: tuple[tuple[str, str], ...] = ()
    """(what, source) for every number of this spec."""
    sm_count: int = 0
    """Streaming multiprocessors; 0 = unknown (the simulators then take :data:`DEFAULT_SM_COUNT`)."""
    fp64_flops: float = 0.0
    """Peak dense FP64 FLOP/s as cuBLAS DGEMM reaches it (FP64 tensor cores where the GPU has them); 0 = unknown:
    FP32 / 64 (the consumer-GPU ratio, CUDA C++ Programming Guide, arithmetic instructions)."""
    max_threads_per_sm: int = 2048
    """Resident threads per SM (CUDA C++ Programming Guide, "Technical Specifications per Compute Capability")."""
    memory_kind: str = "HBM"
    """Device memory technology, ``HBM`` or ``GDDR``: the share of peak bandwidth a stream reaches differs
    (uvmlab.sim.uvm.timing ``STREAM_EFFICIENCY``)."""
    l2_bytes: int = 0
    """L2 cache capacity (:data:`L2_KIB`); 0 = unknown: no kernel is served from the L2
    (uvmlab.sim.uvm.l2_reuse)."""

    @property
    def sms(self) -> int:
        """SMs: :attr:`sm_count`, or :data:`DEFAULT_SM_COUNT` when unknown."""
        return self.sm_count or DEFAULT_SM_COUNT

    @property
    def fp64_peak(self) -> float:
        """FP64 FLOP/s: :attr:`fp64_flops`, else FP32 / 64."""
        return self.fp64_flops or self.fp32_flops / 64

    @property
    def tf32_flops(self) -> float:
        """Dense TF32 tensor-core FLOP/s: half the BF16 rate on Ampere and later (NVIDIA A100 datasheet: 156 vs 312
        TFLOPS; H100 SXM 494.7 vs 989), none (0) before Ampere."""
        return self.tensor_flops / 2 if self.arch in TF32_ARCHS else 0.0

    @property
    def usable_bytes(self) -> int:
        """Memory a job can allocate: capacity minus the CUDA context reservation."""
        return self.memory_bytes - self.context_bytes

    @property
    def link_limit_bytes_per_s(self) -> float:
        """The most any derived host-link rate may be for this GPU (its link's peak)."""
        return self.link_peak_bytes_per_s or self.link_bytes_per_s

    @property
    def catalog_name(self) -> str:
        """The name in :data:`GPUS` (``--gpu``), without the capacity :meth:`with_memory` appends."""
        return self.name.split(" (")[0]

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

    def with_driver(self, driver: str) -> GpuSpec:
        """The same GPU under another driver version (``--gpu NAME@VERSION``)."""
        return replace(self, driver=check_driver(driver))


MEMORY_KINDS = ("HBM", "GDDR")
DEFAULT_SM_COUNT = 108
"""SMs of a GPU whose count is unknown: the seed study's A100."""
TF32_ARCHS = frozenset({"Ampere", "Ada", "Hopper", "Blackwell"})
"""Architectures with TF32 tensor cores (NVIDIA Ampere architecture whitepaper; Ada, Hopper, Blackwell keep them)."""


def check_driver(version: str) -> str:
    """``version`` if it is a driver version uvmlab can describe (``MAJOR[.MINOR[.PATCH]]``, major >= 375)."""
    m = re.fullmatch(r"(\d{3})(\.\d{1,3}){0,2}", version.strip())
    if m is None:
        raise InputError(f"driver version {version!r} is not of the form 535 or 535.104.05")
    if int(m.group(1)) < MIN_DRIVER_MAJOR:
        raise InputError(
            f"driver {version} predates demand-paged managed memory (driver {MIN_DRIVER_MAJOR}, CUDA 8); "
            "uvmlab cannot describe it"
        )
    return version.strip()


def driver_major(version: str) -> int:
    """The branch number of a driver version (``'460.27.04'`` -> 460)."""
    return int(check_driver(version).split(".")[0])


def _gpu(
    name: str,
    arch: str,
    memory_gb: int,
    fp32: float,
    tensor: float,
    hbm: float,
    link: str,
    datasheet: str,
    host: str = "x86-64 Linux",
) -> GpuSpec:
    lk = LINKS[link]
    sms, threads, fp64 = SM_FP64[name]
    kind = "GDDR" if name in GDDR_GPUS else "HBM"
    page = PAGE_64K if host != "x86-64 Linux" else X86_PAGE_BYTES
    return GpuSpec(
        name=name,
        memory_bytes=memory_gb * GiB,
        fp32_flops=fp32,
        tensor_flops=tensor,
        hbm_bytes_per_s=hbm,
        link_bytes_per_s=lk.sustained_bytes_per_s,
        link=link,
        arch=arch,
        link_peak_bytes_per_s=lk.peak_bytes_per_s,
        coherent=lk.coherent,
        host_page_bytes=page,
        sm_count=sms,
        max_threads_per_sm=threads,
        fp64_flops=fp64,
        memory_kind=kind,
        l2_bytes=L2_KIB.get(name, 0) * KiB,
        sources=(
            ("memory, FP32, tensor, memory bandwidth", datasheet),
            ("host link", lk.source),
            (f"host page size ({host})", "x86-64 PAGE_SIZE" if page == X86_PAGE_BYTES else PAGE_64K_SOURCE),
            ("CUDA context", "reference/uvm.md 3.3 (512 MiB default [I])"),
            ("SMs, threads per SM, FP64", SM_FP64_SOURCE),
            ("L2 cache", L2_SOURCE),
        ),
    )


GDDR_GPUS = frozenset({"A6000", "L40S", "RTX4090", "RTX4060", "RTX5090", "T4", "RTX2080Ti", "GTX1080Ti", "GTX1080"})
"""Listed GPUs with GDDR memory (GDDR5X/6/6X/7, their datasheets); the others have HBM2/2e/3/3e."""
SM_FP64: dict[str, tuple[int, int, float]] = {
    "A100-80GB": (108, 2048, 19.5e12),
    "A100-40GB": (108, 2048, 19.5e12),
    "A6000": (84, 1536, 0.0),
    "H100-80GB": (132, 2048, 67e12),
    "H100-PCIe": (114, 2048, 51e12),
    "H200": (132, 2048, 67e12),
    "GH200": (132, 2048, 67e12),
    "L40S": (142, 1536, 0.0),
    "RTX4090": (128, 1536, 0.0),
    "RTX4060": (24, 1536, 0.0),
    "RTX5090": (170, 1536, 0.0),
    "V100-32GB": (80, 2048, 7.8e12),
    "V100-16GB": (80, 2048, 7.8e12),
    "V100-PCIe": (80, 2048, 7.0e12),
    "V100-PCIe-32GB": (80, 2048, 7.0e12),
    "V100-SXM2-P9": (80, 2048, 7.8e12),
    "TitanV": (80, 2048, 7.45e12),
    "T4": (40, 1024, 0.0),
    "RTX2080Ti": (68, 1024, 0.0),
    "P100-PCIe": (56, 2048, 4.7e12),
    "P100-SXM2": (56, 2048, 5.3e12),
    "GTX1080Ti": (28, 2048, 0.0),
    "GTX1080": (20, 2048, 0.0),
}
"""(SMs, max resident threads per SM, FP64 FLOP/s; 0 = FP32 / 64) per catalogue GPU."""
SM_FP64_SOURCE = (
    "SMs: the vendor datasheets / architecture whitepapers (A100 108, H100 SXM 132, H100 PCIe 114, GA102 A6000 84, "
    "AD102 L40S 142 and RTX 4090 128, AD107 RTX 4060 24, GB202 RTX 5090 170, GV100 80, TU104 T4 40, TU102 2080 Ti 68, "
    "GP100 56, GP104 GTX 1080 20, GP102 1080 Ti 28); threads per SM: CUDA C++ Programming Guide, technical "
    "specifications per compute capability (2048 on 6.0-7.0, 8.0, 9.0; 1536 on 8.6, 8.9, 12.0; 1024 on 7.5); FP64: "
    "the datasheets (A100 FP64 tensor core 19.5 TFLOPS, H100 SXM 67, H100 PCIe 51, V100 SXM2 7.8, PCIe 7.0, Titan V "
    "7.45, P100 4.7/5.3); consumer GPUs 1/64 of FP32 (compute capability 8.6/8.9/12.0 and 7.5 technical "
    "specifications: 2 FP64 results per clock per SM against 128)"
)

L2_KIB: dict[str, int] = {
    "A100-80GB": 40_960,
    "A100-40GB": 40_960,
    "A6000": 6_144,
    "H100-80GB": 51_200,
    "H100-PCIe": 51_200,
    "H200": 51_200,
    "GH200": 51_200,
    "L40S": 98_304,
    "RTX4090": 73_728,
    "RTX4060": 24_576,
    "RTX5090": 98_304,
    "V100-32GB": 6_144,
    "V100-16GB": 6_144,
    "V100-PCIe": 6_144,
    "V100-PCIe-32GB": 6_144,
    "V100-SXM2-P9": 6_144,
    "TitanV": 4_608,
    "T4": 4_096,
    "RTX2080Ti": 5_632,
    "P100-PCIe": 4_096,
    "P100-SXM2": 4_096,
    "GTX1080Ti": 2_816,
    "GTX1080": 2_048,
}
"""L2 cache KiB per catalogue GPU (:data:`L2_SOURCE`)."""
L2_SOURCE = (
    "the architecture whitepapers and datasheets: GA100 A100 40 MB (deviceQuery on an A100: 41,943,040 bytes), GA102 "
    "A6000 6 MB, GH100 H100 / H200 / GH200 50 MB (NVIDIA H100 Tensor Core GPU Architecture; the GH200's H100 taken "
    "alike [I]), AD102 L40S 96 MB and RTX 4090 72 MB, AD107 RTX 4060 24 MB (NVIDIA Ada GPU Architecture), GB202 "
    "RTX 5090 96 MB (GeForce RTX 5090 specifications), GV100 6 MB (Volta whitepaper; TITAN V 4.5 MB with its 3,072-bit "
    "bus), TU104 T4 4 MB and TU102 2080 Ti 5.5 MB (Turing whitepaper), GP100 4 MB, GP102 1080 Ti 2.75 MB, GP104 GTX "
    "1080 2 MB (Pascal whitepapers); MB = 1,024 KiB"
)


H200_MEMORY_BYTES = 143_771 * MiB
"""What a real H200 reports: nvidia-smi shows 143,771 MiB on the H200 this project can be lent (KINDS.md, seen
2026-10-27), not the datasheet's 141 GB (the spec's memory is the capacity CUDA reports, as for the other GPUs)."""


def _with_reported_memory(spec: GpuSpec, memory_bytes: int, source: str) -> GpuSpec:
    """``spec`` with the capacity a real card reports instead of the datasheet's rounded figure."""
    return replace(spec, memory_bytes=memory_bytes, sources=(*spec.sources, ("memory as CUDA reports it", source)))


PAGE_64K_SOURCE = "64 KiB PAGE_SIZE (gpus.PAGE_64K: POWER9 RHEL kernels; NVIDIA Grace tuning guide)"
_P3, _P4, _P5 = "PCIe 3.0 x16", "PCIe 4.0 x16", "PCIe 5.0 x16"

GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        # Ampere
        _gpu(
            "A100-80GB",
            "Ampere",
            80,
            19.5e12,
            312e12,
            1935e9,
            _P4,
            "NVIDIA A100 80GB PCIe datasheet (seeds/003 table 1: the seed study's GPU)",
        ),
        _gpu("A100-40GB", "Ampere", 40, 19.5e12, 312e12, 1555e9, _P4, "NVIDIA A100 40GB PCIe datasheet"),
        _gpu("A6000", "Ampere", 48, 38.7e12, 155e12, 768e9, _P4, "NVIDIA RTX A6000 datasheet"),
        # Hopper
        _gpu("H100-80GB", "Hopper", 80, 67e12, 989e12, 3350e9, _P5, "NVIDIA H100 SXM5 datasheet"),
        _gpu("H100-PCIe", "Hopper", 80, 51e12, 756e12, 2000e9, _P5, "NVIDIA H100 PCIe datasheet"),
        _with_reported_memory(
            _gpu("H200", "Hopper", 141, 67e12, 989e12, 4800e9, _P5, "NVIDIA H200 SXM datasheet"),
            H200_MEMORY_BYTES,
            "nvidia-smi on an H200: 143,771 MiB (the lent machine, 2026-10-27)",
        ),
        _gpu(
            "GH200",
            "Hopper",
            96,
            67e12,
            989e12,
            4000e9,
            "NVLink-C2C",
            "NVIDIA GH200 Grace Hopper datasheet",
            host="Grace (ARM64, 64 KiB pages)",
        ),
        # Ada
        _gpu("L40S", "Ada", 48, 91.6e12, 362e12, 864e9, _P4, "NVIDIA L40S datasheet"),
        _gpu("RTX4090", "Ada", 24, 82.6e12, 165e12, 1008e9, _P4, "NVIDIA Ada GPU architecture whitepaper, RTX 4090"),
        _gpu("RTX4060", "Ada", 8, 15.1e12, 60e12, 272e9, "PCIe 4.0 x8", "NVIDIA GeForce RTX 4060 specifications"),
        # Blackwell
        _gpu("RTX5090", "Blackwell", 32, 104.8e12, 209e12, 1792e9, _P5, "NVIDIA GeForce RTX 5090 specifications"),
        # Volta
        _gpu(
            "V100-32GB",
            "Volta",
            32,
            15.7e12,
            125e12,
            900e9,
            _P3,
            "NVIDIA Tesla V100 datasheet (SXM2 figures; an x86 host over PCIe 3.0)",
        ),
        _gpu(
            "V100-16GB",
            "Volta",
            16,
            15.7e12,
            125e12,
            900e9,
            _P3,
            "NVIDIA Tesla V100 datasheet (SXM2 figures; an x86 host over PCIe 3.0)",
        ),
        _gpu("V100-PCIe", "Volta", 16, 14.0e12, 112e12, 900e9, _P3, "NVIDIA Tesla V100 PCIe datasheet (16 GB)"),
        _gpu("V100-PCIe-32GB", "Volta", 32, 14.0e12, 112e12, 900e9, _P3, "NVIDIA Tesla V100 PCIe datasheet (32 GB)"),
        _gpu(
            "V100-SXM2-P9",
            "Volta",
            16,
            15.7e12,
            125e12,
            900e9,
            "NVLink 2.0 to POWER9 (3 bricks)",
            "NVIDIA Tesla V100 SXM2 datasheet; IBM Power AC922 Redbook SG24-8422 (the host)",
            host="POWER9 (ppc64le, 64 KiB pages)",
        ),
        _gpu(
            "TitanV",
            "Volta",
            12,
            14.9e12,
            110e12,
            652e9,
            _P3,
            "NVIDIA TITAN V specifications (the uvm-eval GPU, reference/uvm.md 2.2)",
        ),
        # Turing
        _gpu("T4", "Turing", 16, 8.1e12, 65e12, 320e9, _P3, "NVIDIA T4 datasheet"),
        _gpu(
            "RTX2080Ti",
            "Turing",
            11,
            13.4e12,
            53.8e12,
            616e9,
            _P3,
            "NVIDIA Turing GPU architecture whitepaper, RTX 2080 Ti (FP16 tensor with FP32 accumulate)",
        ),
        # Pascal (no tensor cores: tensor_flops is the FP16 rate)
        _gpu("P100-PCIe", "Pascal", 16, 9.3e12, 18.7e12, 732e9, _P3, "NVIDIA Tesla P100 PCIe datasheet (16 GB)"),
        _gpu(
            "P100-SXM2",
            "Pascal",
            16,
            10.6e12,
            21.2e12,
            732e9,
            _P3,
            "NVIDIA Tesla P100 SXM2 datasheet (NVLink between GPUs; an x86 host over PCIe 3.0)",
        ),
        _gpu(
            "GTX1080Ti",
            "Pascal",
            11,
            11.3e12,
            0.177e12,
            484e9,
            _P3,
            "NVIDIA GeForce GTX 1080 Ti specifications; "
            "FP16 at 1/64 of FP32 (CUDA C++ Programming Guide, arithmetic instructions, compute capability 6.1)",
        ),
        _gpu(
            "GTX1080",
            "Pascal",
            8,
            8.9e12,
            0.139e12,
            320e9,
            _P3,
            "NVIDIA GeForce GTX 1080 specifications; FP16 at "
            "1/64 of FP32 (CUDA C++ Programming Guide, compute capability 6.1)",
        ),
    )
}
DEFAULT_GPU = "A100-80GB"


def get_gpu(name: str, memory: str | int | None = None, spec: Mapping[str, Any] | None = None) -> GpuSpec:
    """Look up a GPU by name (case-insensitive), optionally ``NAME@DRIVER``; ``memory`` (e.g. ``"80GiB"``) overrides
    its capacity; ``spec`` (a GPU file's fields and/or ``--gpu-set KEY=VALUE``, :data:`SPEC_KEYS`) describes a GPU
    that is not in the list, starting from ``spec["base"]`` or else ``name`` (:func:`custom_gpu`)."""
    if spec:
        base_name = str(spec.get("base", name))
        gpu = custom_gpu(_catalog(base_name), spec)
    else:
        gpu = _catalog(name)
    if memory is not None:
        gpu = gpu.with_memory(parse_bytes(memory))
    return gpu


def _catalog(name: str) -> GpuSpec:
    base, _, driver = name.partition("@")
    by_lower = {k.lower(): v for k, v in GPUS.items()}
    spec = by_lower.get(base.strip().lower())
    if spec is None:
        raise InputError(
            f"unknown GPU {base!r}; known GPUs: {', '.join(GPUS)} (optionally NAME@DRIVER), or describe it in a GPU "
            "file (--gpu FILE.json) or with --gpu-set KEY=VALUE (docs/uvm-sim.md, 'GPUs not in the list')"
        )
    if driver:
        spec = spec.with_driver(driver)
    return spec


SPEC_KEYS: dict[str, str] = {
    "name": "the GPU's name (text)",
    "base": "the listed GPU to start from (default: --gpu)",
    "arch": "architecture (Pascal, Volta, Turing, Ampere, Ada, Hopper, Blackwell): TF32 from Ampere on",
    "memory": "device memory (bytes or 80GiB)",
    "fp32_flops": "peak dense FP32 FLOP/s (67e12 or 67TFLOPS)",
    "tensor_flops": "peak dense BF16/FP16 tensor-core FLOP/s",
    "fp64_flops": "peak FP64 FLOP/s cuBLAS DGEMM reaches (tensor cores where present)",
    "hbm_bytes_per_s": "peak DRAM bandwidth (3.35e12 or 3.35TB/s)",
    "sm_count": "streaming multiprocessors",
    "max_threads_per_sm": "resident threads per SM (2048, 1536 or 1024)",
    "memory_kind": "HBM or GDDR (the share of peak bandwidth a stream reaches)",
    "l2_bytes": "L2 cache capacity (bytes or 50MiB; 0 = unknown: no kernel is served from the L2)",
    "link": f"host link, one of {', '.join(LINKS)}",
    "link_bytes_per_s": "sustained 2 MiB UVM migration rate per direction",
    "link_peak_bytes_per_s": "the link's peak per direction",
    "coherent": "true when the CPU can map GPU memory (NVLink-C2C, POWER9 NVLink)",
    "host_page_bytes": "the host's PAGE_SIZE (4096 or 65536)",
    "context_bytes": "CUDA context and driver reservation (bytes or 512MiB)",
    "driver": "NVIDIA driver version (e.g. 550.54.15)",
}
"""Keys of a GPU description (a GPU file or ``--gpu-set``): every number a run of the simulator uses."""
_RATE_UNITS = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15}
_RATE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMgGtTpP]?)\s*(b/s|flops|flop/s)?\s*$", re.I)
MAX_RATE = 1e18
"""Largest rate accepted (1 EFLOP/s or 1 EB/s): a guard against unit slips, far above any GPU."""


def parse_rate(key: str, value: Any) -> float:
    """A positive rate: a number, or text such as ``3.35TB/s`` / ``989TFLOPS`` / ``25e9`` (decimal prefixes)."""
    if isinstance(value, bool):
        raise InputError(f"GPU {key} must be a number, not {value!r}")
    if isinstance(value, int | float):
        rate = float(value)
    else:
        m = _RATE_RE.match(str(value))
        if m is None:
            raise InputError(f"GPU {key} {value!r} is not a rate (examples: 3.35e12, 3.35TB/s, 989TFLOPS)")
        rate = float(m.group(1)) * _RATE_UNITS[m.group(2).lower()]
    if not math.isfinite(rate) or rate <= 0 or rate > MAX_RATE:
        raise InputError(f"GPU {key} must be a rate > 0 and <= {MAX_RATE:g}, not {value!r}")
    return rate


def _whole(key: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise InputError(f"GPU {key} must be a whole number in [{lo}, {hi}], not {value!r}")
    return value


def custom_gpu(base: GpuSpec, fields: Mapping[str, Any]) -> GpuSpec:
    """``base`` with the GPU description ``fields`` (:data:`SPEC_KEYS`) applied; unknown keys and bad values are an
    InputError naming the key. The spec's ``sources`` say that these numbers are the user's."""
    unknown = sorted(set(fields) - set(SPEC_KEYS))
    if unknown:
        raise InputError(f"unknown GPU keys {unknown}; known keys: {', '.join(SPEC_KEYS)}")
    kw: dict[str, Any] = {}
    if "link" in fields:  # first: explicit link rates and coherence below override the named link's
        lk = LINKS.get(str(fields["link"]))
        if lk is None:
            raise InputError(f"unknown GPU link {fields['link']!r}; known links: {', '.join(LINKS)}")
        kw.update(
            link=lk.name,
            link_bytes_per_s=lk.sustained_bytes_per_s,
            link_peak_bytes_per_s=lk.peak_bytes_per_s,
            coherent=lk.coherent,
        )
    elif "link_bytes_per_s" in fields:
        kw["link"] = "user-given link"
    for key, value in fields.items():
        if key in ("base", "link"):
            continue
        if key in ("name", "arch"):
            if not isinstance(value, str) or not value.strip():
                raise InputError(f"GPU {key} must be non-empty text, not {value!r}")
            kw[key] = value.strip()
        elif key == "memory_kind":
            if value not in MEMORY_KINDS:
                raise InputError(f"GPU memory_kind must be one of {', '.join(MEMORY_KINDS)}, not {value!r}")
            kw[key] = value
        elif key in ("memory", "context_bytes", "l2_bytes"):
            kw["memory_bytes" if key == "memory" else key] = parse_bytes(value)
        elif key.endswith(("_flops", "_bytes_per_s")):
            kw[key] = parse_rate(key, value)
        elif key == "sm_count":
            kw[key] = _whole(key, value, 1, 10_000)
        elif key == "max_threads_per_sm":
            kw[key] = _whole(key, value, 32, 65_536)
        elif key == "host_page_bytes":
            kw[key] = _whole(key, value, X86_PAGE_BYTES, 1 << 30)
            if kw[key] & (kw[key] - 1):
                raise InputError(f"GPU host_page_bytes must be a power of two, not {value}")
        elif key == "coherent":
            if not isinstance(value, bool):
                raise InputError(f"GPU coherent must be true or false, not {value!r}")
            kw[key] = value
        elif key == "driver":
            kw[key] = check_driver(str(value))
    if "link_bytes_per_s" in fields and "link_peak_bytes_per_s" not in fields and "link" not in fields:
        kw["link_peak_bytes_per_s"] = kw["link_bytes_per_s"]
    if "name" not in kw:
        kw["name"] = f"{base.catalog_name}-custom"
    gpu = replace(base, **kw)
    if gpu.link_peak_bytes_per_s and gpu.link_bytes_per_s > gpu.link_peak_bytes_per_s:
        raise InputError(
            f"GPU link_bytes_per_s {gpu.link_bytes_per_s:g} exceeds link_peak_bytes_per_s {gpu.link_peak_bytes_per_s:g}"
        )
    if gpu.memory_bytes <= gpu.context_bytes:
        raise InputError(f"GPU memory {gpu.memory_bytes} B is not larger than its context_bytes {gpu.context_bytes} B")
    if gpu.memory_bytes > MAX_MEMORY_BYTES:
        raise InputError(f"GPU memory {gpu.memory_bytes:,} B is more than {MAX_MEMORY_BYTES // TiB} TiB")
    given = ", ".join(sorted(k for k in fields if k != "base"))
    return replace(gpu, sources=((f"user-given ({given}); the rest from {base.name}", "the user"), *base.sources))


def spec_dict(gpu: GpuSpec) -> dict[str, Any]:
    """The numbers of ``gpu`` a run uses, by :data:`SPEC_KEYS` name (result.json ``gpu_spec``)."""
    return {
        "name": gpu.name,
        "arch": gpu.arch,
        "memory": gpu.memory_bytes,
        "fp32_flops": gpu.fp32_flops,
        "tensor_flops": gpu.tensor_flops,
        "fp64_flops": gpu.fp64_peak,
        "hbm_bytes_per_s": gpu.hbm_bytes_per_s,
        "sm_count": gpu.sms,
        "max_threads_per_sm": gpu.max_threads_per_sm,
        "memory_kind": gpu.memory_kind,
        "l2_bytes": gpu.l2_bytes,
        "link": gpu.link,
        "link_bytes_per_s": gpu.link_bytes_per_s,
        "link_peak_bytes_per_s": gpu.link_limit_bytes_per_s,
        "coherent": gpu.coherent,
        "host_page_bytes": gpu.host_page_bytes,
        "context_bytes": gpu.context_bytes,
        "driver": gpu.driver,
    }


def known_gpu(detected: str | None) -> str | None:
    """The known GPU whose name's parts all appear in a detected name ('A100-80GB' in 'NVIDIA A100 80GB PCIe'); a
    heuristic: None when no known name fits (the longest fit wins)."""
    if not detected:
        return None
    words = detected.upper().replace("-", " ").split()
    pairs = {a + b for a, b in itertools.pairwise(words)}  # "RTX 4060" is the listed "RTX4060"
    fits = [k for k in GPUS if all(part in words or part in pairs for part in k.upper().split("-"))]
    return max(fits, key=len) if fits else None


SM_VERSION: dict[str, int] = {
    "A100": 80, "H100": 90, "H200": 90, "GH200": 90, "L40S": 89, "A6000": 86, "V100": 70, "TitanV": 70,
    "RTX4090": 89, "RTX5090": 120, "RTX4060": 89, "RTX3060": 86, "T4": 75, "RTX2080Ti": 75, "P100": 60,
    "GTX1080": 61,
}  # fmt: skip
"""Compute capability x 10 by GpuSpec name prefix (NVIDIA CUDA GPUs list)."""

SM_TABLE: dict[str, tuple[int, int]] = {
    **{name: (sms, threads) for name, (sms, threads, _fp64) in SM_FP64.items()},
    "RTX3060": (28, 1536),  # GA106: 28 SMs (RTX 3060 datasheet); compute capability 8.6: 1536 threads per SM
}
"""(SM count, max resident threads per SM) by GpuSpec name prefix: :data:`SM_FP64`'s counts (its sources), plus the
xMem sample's RTX 3060, a GPU the memory estimate meets by name but the catalogue does not list."""
DEFAULT_SMS = (108, 2048)
"""GPUs missing from ``SM_TABLE`` are taken as an A100 (``uvmlab.memory.devicemem.ContextModel.notes`` says so)."""


def prefix_lookup(table: dict[str, Any], gpu_name: str) -> Any:
    for prefix in sorted(table, key=len, reverse=True):
        if gpu_name.startswith(prefix):
            return table[prefix]
    return None


def sm_info(gpu_name: str) -> tuple[int, int, bool]:
    """(SMs, threads per SM, known) for a GpuSpec name (longest matching prefix)."""
    found = prefix_lookup(SM_TABLE, gpu_name)
    return (*found, True) if found is not None else (*DEFAULT_SMS, False)


def sm_version(gpu_name: str) -> int:
    """Compute capability x 10 of a GpuSpec name (80, an A100's, when unknown)."""
    found = prefix_lookup(SM_VERSION, gpu_name)
    return 80 if found is None else int(found)
