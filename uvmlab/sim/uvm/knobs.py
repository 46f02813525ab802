"""Geometry constants of the NVIDIA UVM driver and the simulator's knobs (its module parameters).

Every constant names its unit and its source: [OGKM] = NVIDIA/open-gpu-kernel-modules 595.45.04,
``kernel-open/nvidia-uvm/``; section numbers refer to ``reference/uvm.md``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from uvmlab.errors import InputError
from uvmlab.files.inputs import short

PAGE_BYTES = 4096
"""x86 ``PAGE_SIZE``: the unit of faults and residency (uvm.md 1.2)."""
BIG_PAGE_BYTES = 64 * 1024
"""``UVM_BIG_PAGE_SIZE`` (uvm_va_block_types.h:52): the prefetcher's minimum growth unit."""
VA_BLOCK_BYTES = 2 * 1024 * 1024
"""``1 << UVM_VA_BLOCK_BITS`` (21, uvm_va_block_types.h:42): VA block and GPU root chunk size."""
PAGES_PER_BLOCK = VA_BLOCK_BYTES // PAGE_BYTES  # 512
PAGES_PER_BIG_PAGE = BIG_PAGE_BYTES // PAGE_BYTES  # 16
PMA_BATCH_CHUNKS = 1 << 6
"""Root chunks PMM takes from PMA at once: ``1 << uvm_perf_pma_batch_nonpinned_order`` (6), uvm_pmm_gpu.c:188-194."""


def rounded_tail_bytes(tail_bytes: int, page_bytes: int = PAGE_BYTES) -> int:
    """Bytes of a managed range's last VA block as the driver maps it: ``tail_bytes`` rounded up to 64 KiB x 2^i
    (at most 2 MiB), so that the prefetch tree over it is a full binary tree of 64 KiB leaves.

    Source: UVMSmart ``micro-benchmarks/managedAllocRoundUp.cu`` (DebashisGanguly/gpgpu-sim_UVMSmart @bafab5d): "the
    user provided size for a managed allocation is rounded up to the next 64*(2^i)KB"; its nvprof trace on a GTX
    1080 shows it: of a 2 MiB + 192 KiB allocation, the fault at +2 MiB + 128 KiB migrates 4 KiB + 124 KiB, up to
    +2 MiB + 256 KiB (the tree's 256 KiB root qualifies, 75 % marked), and the CPU later copies back the 64 KiB
    past the requested end (``64.000000KB 0x7f1e46230000 [Unified Memory Memcpy DtoH]``). The rounding happens in
    the CUDA user-mode driver (the range the kernel module sees already has the rounded size); whether drivers
    newer than that trace (2019) still round this way is not verified [U]. ``page_bytes``: the host page, the
    smallest unit (a 64 KiB host page rounds to at least 64 KiB anyway).
    """
    t = max(int(tail_bytes), 1)
    if t >= VA_BLOCK_BYTES:
        return VA_BLOCK_BYTES
    unit = max(BIG_PAGE_BYTES, int(page_bytes))
    n = -(-t // unit)
    return min(unit << (n - 1).bit_length(), VA_BLOCK_BYTES)


def rounded_range_bytes(size_bytes: np.ndarray | int, page_bytes: int = PAGE_BYTES) -> np.ndarray:
    """:func:`rounded_tail_bytes` over whole ranges (vectorized): full 2 MiB blocks plus the rounded tail."""
    size = np.asarray(size_bytes, dtype=np.int64)
    full = (size - 1) // VA_BLOCK_BYTES
    tail = size - full * VA_BLOCK_BYTES
    unit = max(BIG_PAGE_BYTES, int(page_bytes))
    n = -(-tail // unit)
    pow2 = np.left_shift(np.int64(1), np.ceil(np.log2(np.maximum(n, 1))).astype(np.int64))
    return full * VA_BLOCK_BYTES + np.minimum(unit * pow2, VA_BLOCK_BYTES)


REPLAY_POLICIES = {"block": 0, "batch": 1, "batch_flush": 2, "once": 3}
"""``uvm_perf_fault_replay_policy`` values (uvm_gpu_replayable_faults.h)."""


@dataclass(frozen=True)
class UvmKnobs:
    """The driver's module parameters the simulator honours (uvm.md 1.11), plus one model parameter.

    Defaults are the 595.45.04 defaults; names drop the ``uvm_perf_`` prefix.
    """

    prefetch_enable: bool = True
    """``uvm_perf_prefetch_enable`` (uvm_perf_prefetch.c:39), default 1."""
    prefetch_threshold: int = 51
    """``uvm_perf_prefetch_threshold`` in percent, 1-100 (uvm_perf_prefetch.c:40-48); a subtree qualifies when
    strictly more than this share of its pages is marked."""
    prefetch_min_faults: int = 1
    """``uvm_perf_prefetch_min_faults`` 1-20 (uvm_perf_prefetch.c:50-56)."""
    fault_batch_count: int = 256
    """``uvm_perf_fault_batch_count`` (uvm_gpu_replayable_faults.c:72-78): max fault entries fetched per batch."""
    fault_replay_policy: str = "batch_flush"
    """``uvm_perf_fault_replay_policy`` (default 2 = BATCH_FLUSH). Changes only raw-entry counts and turnaround;
    the simulator only records it: every policy is charged one turnaround (replay) per batch."""
    prefetch_on_alloc: bool = False
    """Not a driver parameter: the uvmlab shim's ``UVMLAB_PREFETCH=on_alloc``, a ``cudaMemPrefetchAsync`` of each new
    managed range to the GPU right after its ``cudaMallocManaged`` (PCA on: each segment; off: each tensor), modelled
    by ``UvmSim.prefetch`` (a prefetch beyond free memory evicts other data, as ``uvm_migrate.c`` does)."""
    fault_max_batches_per_service: int = 20
    """``uvm_perf_fault_max_batches_per_service`` (:103-109); reported, has no effect on which pages move."""
    fault_coalesce: bool = True
    """``uvm_perf_fault_coalesce`` (:115-116): same-page entries of a uTLB merge; the simulator counts unique
    pages, i.e. it always reports coalesced faults."""
    batch_unique_pages: int = 43
    """MODEL parameter, not a driver one: unique faulting pages that arrive in one batch (the fault concurrency
    of a busy kernel). Default 43 = 256 - 212.7 mean duplicates per 256-entry batch in the uvm-eval cuBLAS log
    (uvm.md 2.2, real-data/uvm cublas_wq256-3.dmesg). Capped by ``fault_batch_count``."""

    thrashing_enable: bool = True
    """``uvm_perf_thrashing_enable`` (uvm_perf_thrashing.c, uvm.md 1.7), default 1: detection, throttling and pinning
    (uvmlab.sim.uvm.thrashing). The detector (``thrashing_event_cb``) returns at once for eviction-caused migrations
    and only tracks a block that two different processors migrated within the lapse: with one GPU it acts on
    CPU-GPU ping-pong (host accesses between kernels), never on GPU faults and evictions alone."""
    thrashing_threshold: int = 3
    """``uvm_perf_thrashing_threshold`` (1-7): migrations within the lapse before a page counts as thrashing."""
    thrashing_pin_threshold: int = 10
    """``uvm_perf_thrashing_pin_threshold``: throttling rounds before the page is pinned instead."""
    thrashing_lapse_usec: int = 500
    """``uvm_perf_thrashing_lapse_usec``: window between events that counts as close."""
    thrashing_nap: int = 1
    """``uvm_perf_thrashing_nap`` (x lapse): how long a throttled processor stays off the page."""
    thrashing_epoch: int = 2000
    """``uvm_perf_thrashing_epoch`` (x lapse): after this, thrashing is considered over."""
    thrashing_pin: int = 300
    """``uvm_perf_thrashing_pin`` (x lapse): how long a page stays pinned (0: forever)."""
    thrashing_max_resets: int = 4
    """``uvm_perf_thrashing_max_resets``: epoch resets of a block's tracking before it is kept."""
    stream_priority: str = "lowest"
    """MODEL parameter: which stalled threads of a concurrent kernel fill a fault batch (uvmlab.sim.uvm.concurrent):
    ``lowest`` (lowest thread ids first: the oldest warps, whose entries are the oldest in the fault buffer) or
    ``sm`` (each SM's stalled warps oldest first, the SMs' entries interleaved one by one: every SM replays at once)
    or ``rotate`` (round-robin over the stalled threads) or ``random`` (a seeded random order each batch: an arrival
    order with no memory of age). The choice was made by looking at the gpu_ext microbench points (rotate makes
    seq_stream 1.5x cascade, 4.3x too slow; random cascades as well), so it is a structural choice informed by
    validation data: docs/uvm-sim.md reports all three."""
    walker_time: bool = True
    """MODEL parameter: the walkers of a concurrent kernel that are not stalled progress at their native speed
    during each fault batch (uvmlab.sim.uvm.concurrent: the kernel's time overlaps its faults with the work of the
    walkers that run); 0 = they progress without time between batches and every batch adds to the kernel's time
    (the stream model before issue 41)."""
    cascade_steady: bool = True
    """Cost, not physics: a concurrent kernel whose fault rounds reach a steady state (uvmlab.sim.uvm.concurrent:
    three windows of rounds with the same rates) is extrapolated to its end instead of simulated round by round
    (a cascade of 1e8 faults in seconds; its error is measured in tests/test_uvm_concurrent.py); 0 = every round."""
    concurrent_ops: bool = False
    """MODEL option, off by default: traced ops with a launch geometry (uvmlab.sim.uvm.occupancy: foreach launches)
    whose concurrent working set exceeds the GPU go through the occupancy-bounded concurrent engine
    (uvmlab.sim.uvm.concurrent), where in-flight blocks can lose pages they still need; 0 = address order. Off
    because the two routes disagree on the batch composition of the same op (the engine's batches hold up to
    ``fault_batch_count`` distinct pages, the address-order model ``batch_unique_pages``), no source or
    measurement we hold says which is right for an optimizer step, and the switch at the window makes the seed
    grid jump (AlexNet PCA on 639.9 ms per iteration at x5, 616.5 ms at x6) and moves its maxima away from the
    study (14.8x -> 14.5x PCA on, 4.47x -> 3.66x off; docs/uvm-sim.md "Grid results")."""
    gemm_rereads: bool = True
    """MODEL parameter: replay a GEMM-like kernel (mm, addmm, convolution and its backward) whose bytes exceed the
    GPU memory as the sweeps its tiled GEMM makes over its M operand (uvmlab.sim.uvm.reread), so pages evicted
    within the kernel fault again; 0 = every kernel touches each page once (the model before issue 11's re-reads)."""
    gemm_tile_order: bool = True
    """MODEL parameter: a GEMM (``mm``, ``addmm``, ``bmm``, ``baddbmm``) whose operands are not all GPU-resident
    faults its pages in the order its tiles first ask for them (uvmlab.sim.uvm.tile_order: CUTLASS's rasterization,
    the trace's operand layouts), which spreads a batch's faults over the rows of an operand read across its
    storage rows; 0 = address order (the model before issue 41 section 3). A kernel whose bytes exceed the GPU and
    whose tiles sweep it more than once keeps ``gemm_rereads``' passes; one swept once faults in tile order."""

    sim_scale: int = 0
    """MODEL parameter (cost, not physics): replay at 1/``sim_scale`` of the memory (uvmlab.sim.uvm.order,
    docs/uvm-sim.md "Scaled replay"): GPU capacity, managed ranges and accesses divided by it, stream kernels run
    ``threads / sim_scale`` sampled threads, every count, byte and time of the result multiplied back. 0 = auto
    (``order.auto_scale``: 1 unless every accessed allocation is at least ``scale x 64 x 2 MiB``); 1 = exact."""
    derived_orders: bool = True
    """MODEL parameter: give traced torch kernels (trace column ``order`` "") the access order of their op
    (uvmlab.sim.uvm.order: page-strided elementwise kernels as interleaved streams, index ops in a seeded random
    index order); 0 = every such kernel in address order (the model before issue 24)."""

    # -- uvmlab hint policies (issue 16): not driver parameters; modelled by uvmlab.sim.uvm.hints ------------------
    advise_remote: str = ""
    """Trace categories (comma-separated, e.g. ``optimizer_state``) whose tensors are advised
    ``cudaMemAdviseSetPreferredLocation(cpu)`` + ``cudaMemAdviseSetAccessedBy(gpu)``: the GPU reads and writes them
    over the link, never migrates them (uvmlab.sim.uvm.hints)."""
    advise_read_mostly: str = ""
    """Trace categories advised ``cudaMemAdviseSetReadMostly``: a read fault duplicates the page (the CPU copy stays
    valid, so its eviction needs no write-back); a GPU write collapses the copies (a write fault)."""
    prefetch_next_kernels: int = 0
    """0: off. N: while kernel i runs, ``cudaMemPrefetchAsync`` to the GPU the tensors of kernel i+N whose category
    is in ``prefetch_next_categories`` (overlapping kernel i's compute)."""
    prefetch_next_categories: str = "parameter,optimizer_state"
    """Categories the ``prefetch_next_kernels`` policy prefetches."""
    prefetch_protect_next: bool = False
    """With ``prefetch_next_kernels`` = k: before kernel i+k's prefetch, the VA blocks kernels i+1..i+k touch move to
    the end of the eviction order, so what eviction takes (while kernel i runs) is what the next k kernels do not
    touch: the proactive eviction of DeepUM (Jung et al., ASPLOS'23), planned from the trace."""
    discard_min_bytes: int = 0
    """0: off. Otherwise each freed allocator block of at least this size is discarded
    (``cudaMemDiscardBatchAsync``, CUDA 13): its whole pages are dead, evicting them costs no DtoH."""

    def hint_categories(self, name: str) -> frozenset[str]:
        """The categories of the comma-separated knob ``name`` (validated against the trace schema)."""
        value = getattr(self, name)
        return frozenset(c.strip() for c in value.split(",") if c.strip())

    @property
    def any_hint(self) -> bool:
        """True when a uvm_hints policy is on (the replay then tracks per-allocation advice)."""
        return bool(
            self.advise_remote or self.advise_read_mostly or self.prefetch_next_kernels or self.discard_min_bytes
        )

    def __post_init__(self) -> None:
        from uvmlab.trace.schema import CATEGORIES

        for name in ("advise_remote", "advise_read_mostly", "prefetch_next_categories"):
            bad = sorted(self.hint_categories(name) - set(CATEGORIES))
            if bad:
                raise InputError(f"{name}: unknown categories {bad}; known: {', '.join(CATEGORIES)}")
        if int(self.prefetch_next_kernels) < 0 or int(self.discard_min_bytes) < 0:
            raise InputError("prefetch_next_kernels and discard_min_bytes must be >= 0")
        if not 1 <= int(self.prefetch_threshold) <= 100:
            raise InputError(f"prefetch_threshold must be 1-100 (percent), not {self.prefetch_threshold!r}")
        if not 1 <= int(self.prefetch_min_faults) <= 20:
            raise InputError(f"prefetch_min_faults must be 1-20, not {self.prefetch_min_faults!r}")
        if int(self.fault_batch_count) < 1:
            raise InputError(f"fault_batch_count must be >= 1, not {self.fault_batch_count!r}")
        if int(self.batch_unique_pages) < 1:
            raise InputError(f"batch_unique_pages must be >= 1, not {self.batch_unique_pages!r}")
        if self.gemm_rereads not in (0, 1):  # True/False and 0/1 (--sim-option values are parsed as JSON)
            raise InputError(f"gemm_rereads must be 0 or 1, not {self.gemm_rereads!r}")
        if isinstance(self.sim_scale, bool) or not isinstance(self.sim_scale, int) or self.sim_scale < 0:
            raise InputError(f"sim_scale must be an integer >= 0 (0 = auto), not {self.sim_scale!r}")
        if self.derived_orders not in (0, 1):
            raise InputError(f"derived_orders must be 0 or 1, not {self.derived_orders!r}")
        if self.stream_priority not in ("lowest", "sm", "rotate", "random"):
            raise InputError(
                f"stream_priority must be 'lowest', 'sm', 'rotate' or 'random', not {self.stream_priority!r}"
            )
        for switch in ("concurrent_ops", "walker_time", "cascade_steady", "gemm_tile_order"):
            if getattr(self, switch) not in (0, 1):
                raise InputError(f"{switch} must be 0 or 1, not {getattr(self, switch)!r}")
        if self.fault_replay_policy not in REPLAY_POLICIES:
            raise InputError(
                f"fault_replay_policy must be one of {', '.join(REPLAY_POLICIES)}, not {self.fault_replay_policy!r}"
            )

    @property
    def pages_per_batch(self) -> int:
        """Unique pages serviced per batch: min(batch_unique_pages, fault_batch_count)."""
        return min(int(self.batch_unique_pages), int(self.fault_batch_count))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_options(cls, options: dict[str, Any] | None, prefetch: bool | None = None) -> UvmKnobs:
        """Knobs from ``RunConfig.sim_options`` (unknown keys are an InputError) and the ``--prefetch`` flag."""
        options = dict(options or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise InputError(f"unknown simulator options {unknown}; known: {sorted(known)}")
        if prefetch is not None:
            options.setdefault("prefetch_enable", bool(prefetch))
        try:
            return cls(**options)
        except (TypeError, ValueError, OverflowError) as exc:  # int("x"), int(inf): one sentence
            raise InputError(f"bad simulator option: {short(str(exc))}") from None
