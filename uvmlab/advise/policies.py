"""The memory policies ``uvmlab advise`` ranks, each modelled by the mechanism that really acts on a GPU.

A :class:`Policy` says what it changes in the simulated run (PCA on/off, ``PYTORCH_CUDA_ALLOC_CONF``, cached
blocks released between iterations, UVM driver module parameters, the job's batch shape) and how a user applies it
on a real GPU (an environment variable, a uvmlab shim option, a driver module parameter, or a few lines of
PyTorch). Policies whose GPU form is an environment variable carry it in ``gpu_env`` so that
``uvmlab run --policy NAME --mode gpu`` applies exactly what was simulated.

Names compose with ``+`` (``pca-off+driver-prefetch-off``) when their settings do not contradict each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from uvmlab.advise.shape import SHAPE_POLICIES
from uvmlab.config import AppliedPolicy, RunConfig
from uvmlab.errors import InputError
from uvmlab.trace.schema import CATEGORIES

FAMILIES = ("allocator", "driver", "uvm-hint", "job-shape")


@dataclass(frozen=True)
class Policy:
    """One candidate memory policy (see the module docstring)."""

    name: str
    family: str
    summary: str
    apply_how: str
    """What a user does on a real GPU to apply it."""
    source: str
    """Where the mechanism is documented (file and repository, or the CUDA/PyTorch documentation)."""
    pca: bool | None = None
    """Force the caching allocator on or off (None: keep the job's setting)."""
    alloc_conf: str = ""
    """``PYTORCH_CUDA_ALLOC_CONF`` entries (comma-separated ``key:value``)."""
    release_each_iteration: bool = False
    """``torch.cuda.empty_cache()`` after each optimizer step."""
    sim_options: dict[str, Any] = field(default_factory=dict)
    """UVM driver knobs (uvmlab.sim.uvm.knobs.UvmKnobs field names)."""
    gpu_env: dict[str, str] = field(default_factory=dict)
    """Environment of a real GPU run that applies the policy (shim options, PyTorch variables)."""
    fit_batch: bool = False
    """Job shape: the largest micro-batch that fits without UVM, with gradient accumulation to keep the batch."""
    needs_code_change: str = ""
    """When not empty: the few lines of PyTorch a user adds (the policy cannot be applied by a setting alone)."""
    checkpoint: str = ""
    """Job shape: activation checkpointing of the job's segments (``WorkloadConfig.checkpoint``; advise/shape.py)."""
    offload_optimizer: bool = False
    """Job shape: optimizer state and step on the host (``uvmlab.trace.offload``; advise/shape.py)."""
    overlap_step: bool = False
    """With ``offload_optimizer``: the CPU step overlaps the next forward and backward (delayed parameter update)."""
    dtype: str = ""
    """Job shape: train under autocast to this dtype (``WorkloadConfig.dtype``; "" keeps the job's)."""
    offload_activations: bool = False
    """Job shape: tensors saved for backward on the host (``uvmlab.trace.offload_activations``)."""
    optimizer_8bit: bool = False
    """Job shape: 8-bit Adam state with one fused step (``uvmlab.trace.optim8bit``)."""

    def changes_nothing_for(self, cfg: RunConfig) -> bool:
        """True when applying the policy to ``cfg`` simulates the same run (e.g. ``pca-on`` on a PCA-on job): the
        knobs it sets already have its values (given, or by default)."""
        from uvmlab.sim.uvm.knobs import UvmKnobs

        knobs = UvmKnobs.from_options(cfg.sim_options, cfg.prefetch)
        return (
            self.pca in (None, cfg.pca)
            and not self.alloc_conf
            and not self.release_each_iteration
            and not self.fit_batch
            and (not self.checkpoint or bool(cfg.workload.checkpoint))
            and not self.offload_optimizer
            and self.dtype in ("", cfg.workload.dtype)
            and not self.offload_activations
            and not self.optimizer_8bit
            and all(getattr(knobs, k) == v for k, v in self.sim_options.items())
        )

    def apply(self, cfg: RunConfig) -> RunConfig:
        """``cfg`` with this policy's settings (the job-shape search is done by the advisor, not here)."""
        options = dict(cfg.sim_options)
        for key, value in self.sim_options.items():
            if key in options and options[key] != value:
                raise InputError(
                    f"policy {self.name} sets simulator knob {key}={value!r} but the run already sets {options[key]!r}"
                )
            options[key] = value
        ck = cfg.workload.checkpoint or self.checkpoint  # a job that already names its segments keeps them
        workload = replace(cfg.workload, checkpoint=ck) if ck != cfg.workload.checkpoint else cfg.workload
        if self.dtype and self.dtype != workload.dtype:
            workload = replace(workload, dtype=self.dtype)
        pca = cfg.pca if self.pca is None else self.pca
        return replace(cfg, workload=workload, pca=pca, sim_options=options, policy=self.name, applied=self.resolved())

    def resolved(self, available_bytes: int | None = None) -> AppliedPolicy:
        """What the layers below act on (``RunConfig.applied``); ``available_bytes``: the given job's GPU memory."""
        return AppliedPolicy(
            name=self.name,
            alloc_conf=self.alloc_conf,
            release_each_iteration=self.release_each_iteration,
            offload_optimizer=self.offload_optimizer,
            overlap_step=self.overlap_step,
            offload_activations=self.offload_activations,
            optimizer_8bit=self.optimizer_8bit,
            gpu_env=tuple(sorted(self.gpu_env.items())),
            gpu_notes=tuple(self.gpu_notes()),
            gpu_refusal=self.gpu_refusal(),
            available_bytes=available_bytes,
        )

    def gpu_refusal(self) -> str:
        """Why uvmlab's GPU worker cannot run the policy ('' when it can): a code change it does not make."""
        missing = [
            what
            for on, what in (
                (self.offload_optimizer, "the optimizer on the CPU"),
                (self.offload_activations, "save_on_cpu around the forward"),
                (self.optimizer_8bit, "bitsandbytes' Adam8bit"),
                (bool(self.sim_options.get("prefetch_protect_next")), "a prefetch and eviction plan the shim replays"),
            )
            if on
        ]
        if not missing:
            return ""
        return (
            f"policy {self.name} needs a code change uvmlab's GPU worker does not make ({', '.join(missing)}; "
            "uvmlab advise shows the lines): run it with --mode sim"
        )

    def gpu_notes(self) -> list[str]:
        """What the policy needs on the GPU host that a plan cannot set for one process (driver module
        parameters, a C++ allocator hook)."""
        notes = []
        if "driver" in self.family.split("+"):
            notes.append(
                f"policy {self.name} needs the driver set up first, as root: {self.apply_how}; uvmlab cannot check it"
            )
        if self.sim_options.get("discard_min_bytes"):
            notes.append(
                "discard-freed-blocks is not applied on a GPU: it needs a C++ allocator hook (docs/advise.md); "
                "the run measures the job without it"
            )
        return notes


def _p(**kw: Any) -> Policy:
    """A policy; its ``alloc_conf`` also goes into ``gpu_env`` (``PYTORCH_CUDA_ALLOC_CONF``) for a real GPU run."""
    if kw.get("alloc_conf"):
        kw["gpu_env"] = {"PYTORCH_CUDA_ALLOC_CONF": kw["alloc_conf"], **kw.get("gpu_env", {})}
    return Policy(**kw)


_ALLOC_CONF_SRC = "PyTorch docs, 'CUDA memory management' (PYTORCH_CUDA_ALLOC_CONF); c10/cuda/CUDAAllocatorConfig.cpp"

POLICIES: dict[str, Policy] = {
    p.name: p
    for p in (
        _p(
            name="pca-on",
            family="allocator",
            summary="PyTorch's caching allocator (the default): segments are cached and reused, never cudaFree'd",
            apply_how="nothing (PyTorch's default)",
            source="c10/cuda/CUDACachingAllocator.cpp (pytorch/pytorch)",
            pca=True,
        ),
        _p(
            name="pca-off",
            family="allocator",
            summary="no caching: one managed range per tensor, destroyed (not written back) at cudaFree",
            apply_how="PYTORCH_NO_CUDA_MEMORY_CACHING=1",
            source="c10/cuda/CUDACachingAllocator.cpp uncached_allocate (pytorch/pytorch); seeds/003 observation 3",
            pca=False,
            gpu_env={"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"},
        ),
        _p(
            name="release-each-iteration",
            family="allocator",
            summary="torch.cuda.empty_cache() after each step: cached segments are cudaFree'd, so their pages are "
            "dropped instead of written back on eviction, and re-created segments are zero-filled on first touch",
            apply_how="call torch.cuda.empty_cache() after optimizer.step() (uvmlab's GPU worker: this policy)",
            source="c10/cuda/CUDACachingAllocator.cpp release_cached_blocks; reference/uvm.md (range destruction)",
            pca=True,
            release_each_iteration=True,
            gpu_env={"UVMLAB_EMPTY_CACHE_EACH_ITERATION": "1"},
            needs_code_change="optimizer.step()\ntorch.cuda.empty_cache()  # after every step",
        ),
        _p(
            name="max-split-128",
            family="allocator",
            summary="blocks over 128 MiB are never split: large tensors reuse only large cached blocks",
            apply_how="PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128",
            source=_ALLOC_CONF_SRC,
            pca=True,
            alloc_conf="max_split_size_mb:128",
        ),
        _p(
            name="roundup-pow2-4",
            family="allocator",
            summary="sizes rounded up to 4 divisions per power of two: more reuse of cached blocks, more slack",
            apply_how="PYTORCH_CUDA_ALLOC_CONF=roundup_power2_divisions:4",
            source=_ALLOC_CONF_SRC,
            pca=True,
            alloc_conf="roundup_power2_divisions:4",
        ),
        _p(
            name="gc-threshold-0.8",
            family="allocator",
            summary="garbage_collection_threshold:0.8 with a per-process memory fraction equal to the GPU memory "
            "UVM has: the allocator frees cached blocks when reserved passes 80 % of the fraction, but it also "
            "refuses to allocate beyond the fraction, so an oversubscribed job stops with an OOM",
            apply_how="PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:0.8 and "
            "torch.cuda.set_per_process_memory_fraction(F)",
            source=_ALLOC_CONF_SRC + "; CUDACachingAllocator.cpp garbage_collect_cached_blocks (needs set_fraction)",
            pca=True,
            alloc_conf="garbage_collection_threshold:0.8",
            needs_code_change="torch.cuda.set_per_process_memory_fraction(F)  # F = memory for UVM / GPU memory",
        ),
        _p(
            name="driver-prefetch-off",
            family="driver",
            summary="the driver's tree prefetcher off: only faulted pages migrate",
            apply_how="modprobe nvidia-uvm uvm_perf_prefetch_enable=0 (root; reload the module)",
            source="kernel-open/nvidia-uvm/uvm_perf_prefetch.c (NVIDIA/open-gpu-kernel-modules)",
            sim_options={"prefetch_enable": False},
        ),
        _p(
            name="driver-prefetch-aggressive",
            family="driver",
            summary="prefetch threshold 1 %: a faulted 64 KiB page pulls its whole subtree, up to the 2 MiB block",
            apply_how="modprobe nvidia-uvm uvm_perf_prefetch_threshold=1 (root; reload the module)",
            source="kernel-open/nvidia-uvm/uvm_perf_prefetch.c uvm_perf_prefetch_threshold (1-100, default 51)",
            sim_options={"prefetch_threshold": 1},
        ),
        _p(
            name="prefetch-on-alloc",
            family="uvm-hint",
            summary="cudaMemPrefetchAsync of every new managed range to the GPU right after it is allocated (PCA "
            "on: each new segment; off: each tensor): pages arrive in bulk transfers or are zero-filled without "
            "fault batches; a prefetch beyond free memory evicts other data",
            apply_how="uvmlab shim: UVMLAB_PREFETCH=on_alloc",
            source="CUDA runtime API cudaMemPrefetchAsync; kernel-open/nvidia-uvm/uvm_migrate.c (API_MIGRATE); "
            "validated on the RTX 5090 GCN with user prefetch (real-data/uvm, docs/fidelity.md)",
            sim_options={"prefetch_on_alloc": True},
            gpu_env={"UVMLAB_PREFETCH": "on_alloc"},
        ),
        _p(
            name="fit-batch-accumulate",
            family="job-shape",
            summary="the largest micro-batch whose footprint fits the GPU memory without UVM, with gradient "
            "accumulation over k micro-batches so the effective batch is at least the original",
            apply_how="batch size b/k, loss / k, optimizer.step() every k micro-batches",
            source="gradient accumulation (PyTorch autograd accumulates into .grad); uvmlab estimate for the fit",
            fit_batch=True,
            needs_code_change=(
                "for i, x in enumerate(micro_batches):  # k micro-batches of b/k\n"
                "    (loss_fn(model(x)) / k).backward()\n"
                "optimizer.step(); optimizer.zero_grad()"
            ),
        ),
    )
}
"""The single policies, by name."""
POLICIES.update({kw["name"]: Policy(**kw) for kw in SHAPE_POLICIES})  # job shape: checkpointing, CPU offload

# -- per-tensor UVM hints (issue 16; modelled by uvmlab.sim.uvm.hints) -----------------------------------------------
# The shim sees only the caching allocator's segments (cudaMalloc/cudaFree), not tensors, so these need a few lines
# of PyTorch: ``_CUDA_HINT_PRELUDE`` (ctypes on libcudart, CUDA 13 signatures from cuda_runtime_api.h:
# cudaMemAdvise(ptr, n, advice, cudaMemLocation), cudaMemPrefetchAsync(ptr, n, cudaMemLocation, flags, stream);
# enum values from driver_types.h) plus the policy's own lines.

_CUDA_HINT_PRELUDE = (
    "import ctypes, torch\n"
    "rt = ctypes.CDLL('libcudart.so.13')  # the process's CUDA 13 runtime; memory is managed (uvmlab shim)\n"
    "class Loc(ctypes.Structure): _fields_ = [('type', ctypes.c_int), ('id', ctypes.c_int)]  # cudaMemLocation\n"
    "GPU, CPU = Loc(1, torch.cuda.current_device()), Loc(2, 0)  # cudaMemLocationTypeDevice / Host\n"
    "def span(t): return ctypes.c_void_p(t.data_ptr()), ctypes.c_size_t(t.untyped_storage().nbytes())\n"
)
_HINT_SRC = "kernel-open/nvidia-uvm (NVIDIA/open-gpu-kernel-modules 595.45.04); CUDA 13.0 cuda_runtime_api.h"
PREFETCH_AHEAD_KERNELS = 2
"""How far ahead ``prefetch-ahead-evict`` prefetches (kernels): our choice [U], not tuned; DeepUM itself predicts
the next kernels from a correlation table. ``--sim-option prefetch_next_kernels=K`` tries another K."""

HINT_POLICIES: tuple[Policy, ...] = (
    _p(
        name="remote-optimizer-state",
        family="uvm-hint",
        summary="optimizer state advised preferred location CPU + accessed-by GPU: the GPU reads and writes it "
        "over the link at every step, it never faults, migrates or takes GPU memory",
        apply_how="needs a code change: cudaMemAdvise SetPreferredLocation(CPU) + SetAccessedBy(GPU) on each "
        "optimizer state tensor (uvmlab's GPU worker: this policy; the shim's UVMLAB_ADVISE would advise every "
        "segment, not only the state)",
        source=_HINT_SRC + " (uvm_va_policy.h preferred_location/accessed_by; uvm_va_block.c "
        "block_service_finish_map_accessed_by); remote access at GpuSpec.link_bytes_per_s",
        sim_options={"advise_remote": "optimizer_state"},
        gpu_env={"UVMLAB_HINTS": "remote-optimizer-state"},
        needs_code_change=_CUDA_HINT_PRELUDE + "optimizer.step()  # the first step creates the state; advise it once\n"
        "for st in optimizer.state.values():\n"
        "    for t in (v for v in st.values() if torch.is_tensor(v) and v.is_cuda):\n"
        "        rt.cudaMemAdvise(*span(t), 3, CPU)  # cudaMemAdviseSetPreferredLocation\n"
        "        rt.cudaMemAdvise(*span(t), 5, GPU)  # cudaMemAdviseSetAccessedBy",
    ),
    _p(
        name="read-mostly-parameters",
        family="uvm-hint",
        summary="parameters advised read-mostly: a read fault duplicates the page (evicting the copy needs no "
        "write-back), but the optimizer step writes every parameter, and each write to a page the GPU maps "
        "read-only faults (on an RTX 5090 a kernel writing read-mostly memory ran 10,800x slower than without the "
        "hint: uvmbench rq4, docs/advise.md)",
        apply_how="needs a code change: cudaMemAdvise SetReadMostly on each parameter (uvmlab's GPU worker: this "
        "policy)",
        source=_HINT_SRC + " (uvm_va_block.c uvm_va_block_make_resident_read_duplicate, "
        "break_read_duplication_in_region)",
        sim_options={"advise_read_mostly": "parameter"},
        gpu_env={"UVMLAB_HINTS": "read-mostly-parameters"},
        needs_code_change=_CUDA_HINT_PRELUDE
        + "for p in model.parameters():\n    rt.cudaMemAdvise(*span(p), 1, GPU)  # cudaMemAdviseSetReadMostly",
    ),
    _p(
        name="prefetch-next-kernel",
        family="uvm-hint",
        summary="cudaMemPrefetchAsync of the next kernel's parameters and optimizer state while the current "
        "kernel runs: they arrive in bulk, ahead of use, instead of by fault batches",
        apply_how="needs a code change: forward/backward pre-hooks prefetching the next module's parameters "
        "and an optimizer step pre-hook prefetching the state (uvmlab's GPU worker: this policy)",
        source=_HINT_SRC + " (uvm_migrate.c, cudaMemPrefetchAsync); PyTorch nn.Module.register_forward_pre_hook",
        sim_options={"prefetch_next_kernels": 1},
        gpu_env={"UVMLAB_HINTS": "prefetch-next-kernel"},
        needs_code_change=_CUDA_HINT_PRELUDE
        + "mods = [m for m in model.modules() if any(True for _ in m.parameters(recurse=False))]\n"
        "def ahead(m):  # prefetch m's parameters on the current stream\n"
        "    s = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)\n"
        "    for p in m.parameters(recurse=False): rt.cudaMemPrefetchAsync(*span(p), GPU, 0, s)\n"
        "for a, b in zip(mods, mods[1:]):\n"
        "    a.register_forward_pre_hook(lambda m, x, b=b: ahead(b))\n"
        "    b.register_full_backward_pre_hook(lambda m, g, a=a: ahead(a))\n"
        "def state_ahead(opt, *_):  # the step touches the optimizer state next\n"
        "    s = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)\n"
        "    for st in opt.state.values():\n"
        "        for t in (v for v in st.values() if torch.is_tensor(v) and v.is_cuda and v.numel() > 1):\n"
        "            rt.cudaMemPrefetchAsync(*span(t), GPU, 0, s)\n"
        "optimizer.register_step_pre_hook(state_ahead)",
    ),
    _p(
        name="prefetch-ahead-evict",
        family="uvm-hint",
        summary=f"DeepUM-style, planned from the trace: while kernel i runs, every tensor kernel i+"
        f"{PREFETCH_AHEAD_KERNELS} touches is prefetched to the GPU, and what eviction takes to make room is what "
        f"kernels i+1..i+{PREFETCH_AHEAD_KERNELS} do not touch",
        apply_how="needs a code change: a plan replayed before each kernel (uvmlab's shim does not replay one yet); "
        "module pre-hooks prefetching the next modules' tensors to the GPU and the finished ones to the CPU",
        source=_HINT_SRC + " (uvm_migrate.c, cudaMemPrefetchAsync); Jung et al., DeepUM, ASPLOS'23 (correlation "
        "prefetching and pre-eviction for UM-based DNN training)",
        sim_options={
            "prefetch_next_kernels": PREFETCH_AHEAD_KERNELS,
            "prefetch_next_categories": ",".join(CATEGORIES),
            "prefetch_protect_next": True,
        },
        needs_code_change=_CUDA_HINT_PRELUDE
        + "mods = [m for m in model.modules() if not list(m.children())]  # leaf modules in call order\n"
        "def move(m, where, s):  # m's parameters and the tensors it saved (hooks of your own recording them)\n"
        "    for p in m.parameters(recurse=False): rt.cudaMemPrefetchAsync(*span(p), where, 0, s)\n"
        f"K = {PREFETCH_AHEAD_KERNELS}\n"
        "for i, m in enumerate(mods):\n"
        "    def pre(m, x, i=i):\n"
        "        s = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)\n"
        "        if i + K < len(mods): move(mods[i + K], GPU, s)\n"
        "        if i >= 1: move(mods[i - 1], CPU, s)  # done for this forward: let it go first\n"
        "    m.register_forward_pre_hook(pre)",
    ),
    _p(
        name="discard-freed-blocks",
        family="uvm-hint",
        summary="each block of >= 1 MiB the caching allocator frees to its pool is discarded "
        "(cudaMemDiscardBatchAsync): evicting its pages costs no DtoH, a fully dead 2 MiB block is evicted first",
        apply_how="needs a code change: a C++ extension attaching an allocator trace tracker that discards each "
        "freed block (PyTorch frees to its pool: the shim never sees these frees)",
        source="CUDA 13.0 cuda_runtime_api.h cudaMemDiscardBatchAsync; kernel-open/nvidia-uvm uvm_policy.c "
        "uvm_api_discard, uvm_va_block.h discarded_pages, uvm_pmm_gpu.c DISCARDED list; "
        "c10/cuda/CUDACachingAllocator.h attachAllocatorTraceTracker (pytorch/pytorch); 1 MiB = kSmallSize "
        "(CUDACachingAllocator.cpp, the large pool)",
        pca=True,
        sim_options={"discard_min_bytes": 1 << 20},
        needs_code_change=(
            "// C++ extension (torch.utils.cpp_extension.load_inline), called once before training\n"
            "using namespace c10::cuda::CUDACachingAllocator;\n"
            "attachAllocatorTraceTracker([] (const TraceEntry& e) {\n"
            "  if (e.action_ != TraceEntry::FREE_COMPLETED || e.size_ < (1 << 20)) return;\n"
            "  uintptr_t lo = (e.addr_ + 4095) & ~4095ull, hi = (e.addr_ + e.size_) & ~4095ull;\n"
            "  void* p = (void*)lo; size_t n = hi - lo;\n"
            "  cudaMemDiscardBatchAsync(&p, &n, 1, 0, (cudaStream_t)e.stream_);  // whole pages only\n"
            "});"
        ),
    ),
)
"""Per-tensor UVM hints (issue 16): each needs a few lines of PyTorch (``needs_code_change``)."""
POLICIES.update({p.name: p for p in HINT_POLICIES})


def get_policy(name: str) -> Policy:
    """The policy ``name``, or the composition of ``a+b+...`` (settings must not contradict)."""
    parts = [p.strip() for p in name.split("+")] if "+" in name and name not in POLICIES else [name.strip()]
    unknown = [p for p in parts if p not in POLICIES]
    if unknown:
        raise InputError(f"unknown policy {unknown[0]!r}; policies: {', '.join(POLICIES)} (combine with +)")
    if len(parts) == 1:
        return POLICIES[parts[0]]
    return compose([POLICIES[p] for p in parts])


def compose(policies: list[Policy]) -> Policy:
    """One policy applying all of ``policies``; an InputError when two set the same thing differently."""
    pca: bool | None = None
    conf: list[str] = []
    options: dict[str, Any] = {}
    env: dict[str, str] = {}
    for p in policies:
        if p.pca is not None:
            if pca is not None and pca != p.pca:
                raise InputError(f"policies {' and '.join(q.name for q in policies)} disagree on PCA on/off")
            pca = p.pca
        if p.alloc_conf:
            conf.append(p.alloc_conf)
        for key, value in p.sim_options.items():
            if options.get(key, value) != value:
                raise InputError(f"policies {' and '.join(q.name for q in policies)} set {key} differently")
            options[key] = value
        for key, value in p.gpu_env.items():
            joined = key in ("PYTORCH_CUDA_ALLOC_CONF", "UVMLAB_HINTS") and key in env
            env[key] = f"{env[key]},{value}" if joined else value
    if pca is False and (conf or any(p.release_each_iteration for p in policies)):
        raise InputError("allocator settings and empty_cache need the caching allocator (PCA on)")
    if sum(p.fit_batch for p in policies) > 1:
        raise InputError("at most one job-shape policy")
    if any(p.offload_optimizer for p in policies) and "optimizer_state" in str(options.get("advise_remote", "")):
        raise InputError("offload-optimizer moves the optimizer state off the device: nothing is left to advise remote")
    if any(p.offload_optimizer for p in policies) and any(p.optimizer_8bit for p in policies):
        raise InputError(
            "offload-optimizer moves the optimizer state to the host: there is no device state to quantise"
        )
    dtypes = {p.dtype for p in policies if p.dtype}
    if len(dtypes) > 1:
        raise InputError(f"policies {' and '.join(q.name for q in policies)} set different dtypes")
    return Policy(
        name="+".join(p.name for p in policies),
        family="+".join(dict.fromkeys(p.family for p in policies)),
        summary="; ".join(p.summary for p in policies),
        apply_how="; ".join(p.apply_how for p in policies),
        source="; ".join(dict.fromkeys(p.source for p in policies)),
        pca=pca,
        alloc_conf=",".join(conf),
        release_each_iteration=any(p.release_each_iteration for p in policies),
        sim_options=options,
        gpu_env=env,
        fit_batch=any(p.fit_batch for p in policies),
        needs_code_change="\n".join(p.needs_code_change for p in policies if p.needs_code_change),
        checkpoint=next((p.checkpoint for p in policies if p.checkpoint), ""),
        offload_optimizer=any(p.offload_optimizer for p in policies),
        overlap_step=any(p.overlap_step for p in policies),
        dtype=next(iter(dtypes), ""),
        offload_activations=any(p.offload_activations for p in policies),
        optimizer_8bit=any(p.optimizer_8bit for p in policies),
    )
