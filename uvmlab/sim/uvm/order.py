"""Access order of a replayed kernel (issue 24 section 2; IFACE.md section C) and the scaled replay. Torch-free.

The fault model of :meth:`UvmSim.access` takes a kernel's pages in address order. That is right for a kernel
whose concurrently running threads touch a few MB of contiguous memory, but not for one whose threads each walk
their own part of a large range (their faults arrive interleaved, uvmlab.sim.uvm.streams) or one that gathers
rows through an index. This module decides, per kernel, which path it takes (:func:`plan_orders`) and builds the
:class:`~uvmlab.sim.uvm.streams.StreamKernel` of the stream path (:func:`stream_kernel`).

**Given orders** (trace kernel column ``order``, written by a workload program's ``uvm.kernel``): ``address``
(``UvmSim.access``, the old model), ``sequential`` / ``strided`` (each of ``threads`` threads walks its own
contiguous chunk of every range, one access every ``stride_bytes``), ``random`` (each thread its chunk's pages in a
seeded random order), ``lcg`` (gpu_ext microbench's ``rand_chunk_kernel`` generator, ``seed`` its base seed),
``gather`` / ``scatter`` (the indexed operand - the kernel's first read for a gather, its first write for a scatter -
in the index's order; the index is data, unknown on the meta device, so its pages are taken in one seeded uniform random
permutation dealt to the threads, StreamKernel per-access order ``shuffled``; the other operands in sequence) and
``tiled`` (the GEMM passes of uvmlab.sim.uvm.reread when the kernel's bytes exceed the GPU, else address order).
Defaults: ``threads`` 0 -> derived (below), ``warp_size`` 0 -> 32 (CUDA's warp), ``stride_bytes`` 0 -> 4096 (one
access per page).

**Derived orders** (column ``order`` "", traced torch ops; ``UvmKnobs.derived_orders``):

* GEMM / convolution (``reread.GEMM_OPS``): tile by tile, i.e. ``tiled`` (reread.py's passes when the kernel
  exceeds the GPU and is swept more than once; any other 2-D GEMM, in the first-request order of its tiles,
  uvmlab.sim.uvm.tile_order; both run from the replay, not planned here).
* index ops (:data:`GATHER_OPS`, :data:`SCATTER_OPS`): ``gather`` / ``scatter`` plans whose pages fault in
  *address* order (:attr:`OrderPlan.streams` is False): the index is data that a meta-device trace does not have,
  so the order its rows arrive in is unknown, and the seeded uniform permutation of a declared ``gather`` would be
  an invention here (real indices are often sorted or clustered: a CSR graph's edges, a sorted vocabulary batch);
  over a table whose pages nearly all hold an indexed row (2M random rows of a 5M-row table miss ~4 % of its
  pages) address order faults the same pages. A program that knows its index is random declares
  ``pattern="gather"``. [approximation: fault batching of a random index is not modelled for traced ops; the
  stream model of a random gather costs ~100x the CPU time on multi-GB tables]. Their DRAM traffic is
  the rows moved, not the whole indexed tensor (:func:`index_touched_bytes`): a gather moves its output and its
  index (every byte of the other operands); a scatter(-add) reads its source and read-modify-writes the rows it
  lands on: twice the largest other read (the source) plus the other operands [approximation: rows are read once,
  32 B sectors of partly used rows are not charged]. ``embedding_dense_backward`` stays in address order (it
  zero-fills its output, then walks sorted indices: :data:`SCATTER_OPS`).
* elementwise, reduction and copy kernels (the rest): PyTorch's ``gpu_kernel`` (aten/src/ATen/native/cuda/
  Loops.cuh, CUDALoops.cuh) launches blocks of ``num_threads()`` = 128 threads that each handle
  ``thread_work_size()`` = 4 elements (``block_work_size()`` = 512 elements per block); the blocks resident at once
  (SMs x resident threads per SM / 128, uvmlab.sim.uvm.occupancy: 2048 threads per SM on compute capability 7.0,
  8.0, 9.0, 1536 on 8.6, 8.9, 12.0, 1024 on 7.5) form a front of ``resident threads x 4`` elements moving through
  the tensor. With contiguous operands the front spans a few MB (RTX 5090: 170 x 1536 x 4 x 4 B = 4.2 MB): its pages
  fault as a dense sweep and address order is the right model (and the cheap path). When the trace gives the
  kernel a ``stride_bytes`` of at least a page (the recorder's innermost stride of a strided view, e.g.
  ``x[::1024]`` of fp32: 4096 B), every element is its own page and the front spans GBs (4.3 GB on the RTX 5090):
  the front's threads fault one page each, interleaved, as a page-strided microbenchmark's threads do; the kernel is
  replayed as a ``sequential`` stream kernel of ``min(elements / 4, front threads)`` threads, each a contiguous chunk
  [approximation: the real blocks retire and are replaced in blockIdx order, so the front is a moving window rather
  than fixed chunks; both keep the front's concurrency, which is what decides the fault arrival].

Fast path: a kernel whose pages are all GPU-resident cannot fault, so it is replayed through ``UvmSim.access``
whatever its order (no stream machinery: GPT-2's speed stays).

**Native time of a strided kernel** (``kernel_statics``): a stream kernel (given or derived order sequential,
strided, random, lcg) whose ``stride_bytes`` is at least two 32 B sectors and whose ``touched_bytes`` the trace
does not give moves one lone 32 B L2 sector per access, ``ceil(size / stride_bytes)`` accesses per range, at
``CostParams.sector_memory_efficiency`` (the lone-sector rate: RTX 5090 profile fit on seq_stream,
timing.py). A trace ``touched_bytes`` of such a kernel is costed at the same efficiency.

**Scaled replay** (``UvmKnobs.sim_scale`` S; :func:`auto_scale`, :func:`scale_rows`): GPU capacity, every
managed range's size and every access's offset and size are divided by S (offsets rounded down and ends up to
whole pages); stream kernels run ``threads / S`` sampled threads with ``tid_stride`` S, so a fault batch takes
``fault_batch_count / S`` of their entries (the same share of the threads as in the real launch,
uvmlab.sim.uvm.streams); every count, byte and time of the result is multiplied by S, except a stream kernel's
fault batch count (already the real one). Native (all-resident) times are computed from the unscaled trace.
Approximations: partial 2 MiB blocks and page rounding at range ends are not scale-invariant (a range is at least
``64 x 2 MiB`` scaled, so they are < 2 % of its blocks); an address-order kernel's batches hold
``pages_per_batch`` scaled pages, so its batch count is 1/S of the real one before the multiplication (right on
average, not per kernel); the prefetcher's tree sees 1/S of the blocks. tests/test_uvm_order.py checks the
invariance of a stream program (fault counts, bytes and time within 15 % of S = 1 at S = 2 and 4).
Auto (S = 0): 1 for a trace without stream kernels (sequential, random or lcg plans: the only kernels whose
replay cost grows with their thread count; gathers, scatters and address-order kernels replay exactly), else the
largest power of two <= :data:`SCALE_MAX` such that the scaled capacity and the largest scaled managed range are
at least ``SCALE_MIN_BLOCKS`` blocks each (a program of small arrays, e.g. three 2 MiB arrays, replays at 1: its
fault counts are exact) and the most managed ranges shorter than ``S x SCALE_MIN_BLOCKS x 2 MiB`` live at one
time, each of which may round up by one scaled block (S x 2 MiB), could take at most
:data:`SCALE_ROUNDING_SHARE` of the capacity; with per-tensor hint policies (uvmlab.sim.uvm.hints) S = 1. A
training trace keeps hundreds of small tensors live (parameters, gradients, optimizer state), so it replays at
S = 1; a program of a few multi-GB arrays and a few small temporaries (a page-strided microbenchmark written in
torch) scales.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from uvmlab.errors import InputError
from uvmlab.gpus import GpuSpec
from uvmlab.sim.uvm.index_order import draw_rows, parse_spec, thread_page_visits
from uvmlab.sim.uvm.knobs import PAGE_BYTES, VA_BLOCK_BYTES, UvmKnobs
from uvmlab.sim.uvm.occupancy import DEFAULT_BLOCK_THREADS, resident_threads, sm_count
from uvmlab.sim.uvm.reread import GEMM_OPS
from uvmlab.sim.uvm.streams import StreamKernel
from uvmlab.trace.orchestrate import op_base
from uvmlab.trace.schema import NEVER_FREED

Row = tuple[int, int, int, bool]

ACCESS_ORDERS = ("address", "sequential", "strided", "random", "lcg", "gather", "scatter", "tiled")
"""Values of the trace kernel column ``order`` besides "" (IFACE.md table A; "strided" = sequential with a
stride)."""
STREAM_ORDERS = {"sequential": "sequential", "strided": "sequential", "random": "random", "lcg": "lcg"}
"""Given orders replayed as a StreamKernel of that order."""
GATHER_OPS = frozenset({"index_select", "gather", "embedding", "index", "take"})
"""aten ops that read rows of their first operand through an index (the indexed operand: the first read)."""
SCATTER_OPS = frozenset(
    {
        "index_add",
        "index_add_",
        "index_copy",
        "index_copy_",
        "index_put",
        "index_put_",
        "_index_put_impl_",
        "index_reduce",
        "index_reduce_",
        "scatter",
        "scatter_",
        "scatter_add",
        "scatter_add_",
        "scatter_reduce",
        "scatter_reduce_",
    }
)
"""aten ops that write rows of their output through an index (the indexed operand: the first write).
``embedding_dense_backward`` is not one: on CUDA it zero-fills the whole gradient and then adds the rows in
*sorted* index order (aten/src/ATen/native/cuda/Embedding.cu ``embedding_dense_backward_cuda`` radix-sorts the
indices, EmbeddingBackwardKernel.cu ``embedding_backward_cuda_kernel`` takes ``sorted_indices`` and allocates
``grad_weight`` with ``at::zeros``): both passes ascend through memory, so address order models it."""
WARP_SIZE = 32
"""Threads per warp (CUDA C++ Programming Guide, "SIMT Architecture"): ``warp_size`` 0 means this."""
BLOCK_THREADS = 128
"""``num_threads()`` of PyTorch's elementwise launch (aten/src/ATen/native/cuda/thread_constants.h: 4 warps)."""
ELEMS_PER_THREAD = 4
"""``thread_work_size()`` (thread_constants.h); ``block_work_size()`` = 128 x 4 = 512 elements per block."""
SECTOR_BYTES = 32
"""DRAM / L2 access granularity of a lone strided element (one 32 B sector, CUDA C++ Best Practices Guide,
"Coalesced Access to Global Memory")."""
SCALE_MAX = 16
"""Largest automatic ``sim_scale`` (the page-strided microbenchmark of the scorecard runs at 16)."""
SCALE_MIN_BLOCKS = 64
"""A range this many 2 MiB blocks long or longer (scaled) loses < 2 % to page rounding; the GPU keeps at least this
many blocks after auto scaling."""
STREAM_PLAN_ORDERS = ("sequential", "random", "lcg")
"""Plan orders replayed as interleaved streams of sampled threads: a trace with one of them may auto-scale."""
SCALE_ROUNDING_SHARE = 0.01
"""Auto scaling accepts S while the smaller ranges live at one time, each of which may round up by one scaled 2 MiB
block (S x 2 MiB real), could misplace at most this share of the GPU capacity [U: a cost/fidelity choice]."""


@dataclass(frozen=True)
class OrderPlan:
    """How one kernel is replayed when some of its pages are not resident."""

    order: str
    """A StreamKernel order ("sequential", "random", "lcg") or "gather" / "scatter" (sequential with the indexed
    operand shuffled); kernels in address order or tiled have no plan."""
    threads: int
    warp_size: int
    stride_bytes: int
    seed: int
    derived: bool = False
    index_rows: np.ndarray | None = field(default=None, compare=False)
    """A gather / scatter with a declared index (trace column ``index``, uvmlab.sim.uvm.index_order): the row each
    lookup visits, in lookup order; None: the seeded uniform permutation."""
    table_rows: int = 0
    """The indexed operand's rows (with ``index_rows``)."""

    @property
    def streams(self) -> bool:
        """Replayed through the stream model when some pages are missing; a derived gather / scatter is not (its
        index order is unknown: module docstring) and faults in address order, keeping its rows-moved bytes."""
        return not (self.derived and self.order in ("gather", "scatter"))


def _col(kern: pd.DataFrame, name: str, default: object) -> np.ndarray:
    """Optional kernels column ``name`` (IFACE.md table A) or ``default`` for every kernel (older traces)."""
    if name in kern.columns:
        s = kern[name]
        return (s.fillna(default) if default is not None else s).to_numpy()
    return np.full(len(kern), default, dtype=object if isinstance(default, str) else None)


def front_threads(gpu_name: str | GpuSpec) -> int:
    """Threads resident at once in blocks of ``BLOCK_THREADS`` (the front of an elementwise kernel;
    uvmlab.sim.uvm.occupancy)."""
    return resident_threads(gpu_name, BLOCK_THREADS)


def plan_orders(
    kern: pd.DataFrame, gpu_name: str | GpuSpec, knobs: UvmKnobs, indices: dict[str, Any] | None = None
) -> list[OrderPlan | None]:
    """Per kernel (rows of ``kern`` in replay order): its OrderPlan, or None for address order / tiled / API rows.
    ``indices``: the trace header's ``kernel_indices`` (explicit index rows of declared gathers and scatters).

    Raises InputError for an unknown ``order`` value."""
    names = kern["name"].astype(str).tolist()
    orders = [str(o) for o in _col(kern, "order", "")]
    api = [str(a) for a in _col(kern, "api", "")]
    threads = _col(kern, "threads", 0).astype(np.int64)
    warp = _col(kern, "warp_size", 0).astype(np.int64)
    stride = _col(kern, "stride_bytes", 0).astype(np.int64)
    seed = _col(kern, "seed", 0).astype(np.int64)
    index = [str(x) for x in _col(kern, "index", "")]
    kid = kern["kernel_id"].to_numpy(dtype=np.int64)
    front = front_threads(gpu_name)
    out: list[OrderPlan | None] = []
    for i, name in enumerate(names):
        o = orders[i]
        if o and o not in ACCESS_ORDERS:
            raise InputError(f"trace kernel {name!r} has access order {o!r}; known: {', '.join(ACCESS_ORDERS)}")
        if api[i]:
            out.append(None)
            continue
        w = int(warp[i]) or WARP_SIZE
        st = int(stride[i]) or PAGE_BYTES
        if o in STREAM_ORDERS or o in ("gather", "scatter"):
            plan_order = STREAM_ORDERS.get(o, o)
            rows, table = None, 0
            if index[i] and o in ("gather", "scatter"):
                spec = parse_spec(index[i])
                rows, table = draw_rows(spec, int(seed[i]), indices), spec.rows
            out.append(OrderPlan(plan_order, int(threads[i]), w, st, int(seed[i]), index_rows=rows, table_rows=table))
            continue
        if o or not knobs.derived_orders:  # address, tiled, or derivation off
            out.append(None)
            continue
        base = op_base(name)
        if base in GEMM_OPS:
            out.append(None)  # tiled: reread's passes in _Replayer._access
        elif base in GATHER_OPS or base in SCATTER_OPS:
            kind = "gather" if base in GATHER_OPS else "scatter"
            out.append(OrderPlan(kind, int(threads[i]) or front, w, st, int(seed[i]) * 1_000_003 + int(kid[i]), True))
        elif int(stride[i]) >= PAGE_BYTES:  # a page-strided view: the front spans GBs
            out.append(OrderPlan("sequential", int(threads[i]), w, int(stride[i]), int(seed[i]), True))
        else:
            out.append(None)
    return out


def indexed_rows(plan: OrderPlan, rows: list[Row]) -> list[bool]:
    """Which of a gather/scatter kernel's rows are the indexed operand: every row on the byte range of its first
    read (gather) or first write (scatter); all False for other orders or when there is no such row."""
    if plan.order not in ("gather", "scatter"):
        return [False] * len(rows)
    want_write = plan.order == "scatter"
    key = next(((r[0], r[1], r[2]) for r in rows if r[3] == want_write), None)
    return [(r[0], r[1], r[2]) == key for r in rows]


def index_touched_bytes(plan: OrderPlan, rows: list[Row]) -> float | None:
    """DRAM bytes of a gather / scatter (module docstring: the rows moved, not the indexed tensor); None when the
    kernel has no indexed operand among its rows."""
    idx = indexed_rows(plan, rows)
    if not any(idx):
        return None
    other = [r for r, x in zip(rows, idx, strict=True) if not x]
    total = float(sum(r[2] for r in other))
    if plan.order == "scatter":
        total += float(max((r[2] for r in other if not r[3]), default=0))
    return total


def strided_sector_bytes(rows: list[Row], stride_bytes: int) -> float:
    """Lone 32 B sectors a strided stream kernel moves: ``ceil(size / stride)`` per range (module docstring)."""
    return float(sum(-(-r[2] // stride_bytes) for r in rows) * SECTOR_BYTES)


def stream_threads(plan: OrderPlan, rows: list[Row], gpu_name: str | GpuSpec, scale: int = 1) -> int:
    """Threads of the launch: the plan's, or (0) derived: ``min(elements / 4, front)`` for an elementwise kernel
    (elements: the largest range's accesses at ``stride_bytes``; ``rows`` at 1/``scale``), the front for others."""
    if plan.threads > 0:
        return plan.threads
    front = front_threads(gpu_name)
    elems = max((-(-r[2] * scale // plan.stride_bytes) for r in rows), default=1)
    return max(1, min(front, -(-elems // ELEMS_PER_THREAD)))


def stream_kernel(
    plan: OrderPlan, rows: list[Row], gpu_name: str | GpuSpec, scale: int = 1, native_ns: float = 0.0
) -> StreamKernel:
    """The StreamKernel of a planned kernel over its (possibly scaled) rows: ``threads / scale`` streams standing
    for ``scale`` threads each (``tid_stride``), at most the GPU's resident threads in flight
    (uvmlab.sim.uvm.occupancy: blocks of ``BLOCK_THREADS`` for a derived elementwise kernel, of
    ``occupancy.DEFAULT_BLOCK_THREADS`` for a declared one), ``native_ns`` (the kernel's native time) spread over
    their accesses; a sequential thread with ``stride_bytes`` below a page makes ``4096 / stride_bytes`` accesses to
    each page it visits (the kernel's unit step is a page)."""
    threads = stream_threads(plan, rows, gpu_name, scale)
    n = max(1, threads // scale)
    if plan.derived:  # threads past the largest range's pages would have nothing to touch: a cost cap only
        n = min(n, max(1, max((-(-r[2] // PAGE_BYTES) for r in rows), default=1)))
    order = plan.order
    acc_orders: tuple[str, ...] = ()
    visits: tuple[np.ndarray | None, ...] = ()
    if order in ("gather", "scatter"):
        indexed = indexed_rows(plan, rows)
        acc_orders = tuple("shuffled" if x else "sequential" for x in indexed)
        order = "sequential"
        if plan.index_rows is not None:  # the declared index: each thread's share of the lookups, in order
            visits = tuple(
                _index_visits(plan, r[2], n, scale) if x else None for r, x in zip(rows, indexed, strict=True)
            )
    stride = plan.stride_bytes if order == "sequential" else PAGE_BYTES
    block = BLOCK_THREADS if plan.derived else DEFAULT_BLOCK_THREADS
    sub = PAGE_BYTES // stride if order == "sequential" and not acc_orders and 0 < stride < PAGE_BYTES else 1
    return StreamKernel(
        tuple(rows),
        n,
        order,
        max(PAGE_BYTES, stride),
        seed=plan.seed & 0xFFFFFFFF,
        tid_stride=scale,
        warp_size=plan.warp_size,
        access_orders=acc_orders,
        access_visits=visits,
        resident=max(1, resident_threads(gpu_name, block) // scale),
        sms=sm_count(gpu_name),
        native_ns=native_ns / scale,
        sub=sub,
    )


def _index_visits(plan: OrderPlan, size: int, n: int, scale: int) -> np.ndarray:
    """(n, steps) pages of the indexed operand (its access of ``size`` bytes, at 1/``scale``) each of ``n`` sampled
    threads visits: the declared index's lookups dealt to ``n x scale`` threads, every ``scale``-th kept
    (uvmlab.sim.uvm.index_order.thread_page_visits)."""
    assert plan.index_rows is not None
    row_bytes = size / max(1, plan.table_rows)
    return thread_page_visits(plan.index_rows, row_bytes, n * scale, PAGE_BYTES)[::scale][:n]


# -- scaled replay ---------------------------------------------------------------------------------------------------
def auto_scale(ranges: Any, capacity_bytes: int, knobs: UvmKnobs, streams: bool = True) -> int:
    """``knobs.sim_scale``, or (0) the automatic scale of the module docstring.

    ``ranges``: the placement's managed ranges (columns size_bytes, alloc_seq, free_seq); ``streams``: the trace
    has stream kernels (plans of a STREAM_PLAN_ORDERS order), the only ones whose cost needs scaling."""
    if knobs.sim_scale:
        if knobs.any_hint and knobs.sim_scale > 1:
            raise InputError("sim_scale > 1 cannot be combined with the per-tensor hint policies (uvm_hints)")
        return int(knobs.sim_scale)
    if knobs.any_hint or len(ranges) == 0 or not streams:
        return 1
    s = 1
    largest = int(ranges["size_bytes"].max())
    while (
        s * 2 <= SCALE_MAX
        and capacity_bytes // (s * 2) >= SCALE_MIN_BLOCKS * VA_BLOCK_BYTES
        and largest // (s * 2) >= SCALE_MIN_BLOCKS * VA_BLOCK_BYTES
        and _max_live_small(ranges, s * 2) * s * 2 * VA_BLOCK_BYTES <= SCALE_ROUNDING_SHARE * capacity_bytes
    ):
        s *= 2
    return s


def _max_live_small(ranges: Any, scale: int) -> int:
    """Most ranges smaller than ``scale x SCALE_MIN_BLOCKS x 2 MiB`` live at one time."""
    small = ranges[ranges["size_bytes"].to_numpy() < scale * SCALE_MIN_BLOCKS * VA_BLOCK_BYTES]
    if small.empty:
        return 0
    seqs = np.concatenate([small["alloc_seq"].to_numpy(), small["free_seq"].to_numpy()])
    delta = np.concatenate([np.ones(len(small), dtype=np.int64), -np.ones(len(small), dtype=np.int64)])
    keep = seqs != NEVER_FREED
    keep[: len(small)] = True
    seqs, delta = seqs[keep], delta[keep]
    order = np.lexsort((delta, seqs))  # at one seq, frees first
    return int(np.cumsum(delta[order]).max(initial=0))


def scaled_bytes(size: int, scale: int) -> int:
    """A range's size at 1/``scale``, rounded up to whole pages."""
    if scale == 1:
        return int(size)
    return max(PAGE_BYTES, _pages_up(size, scale))


def _pages_up(nbytes: int, scale: int) -> int:
    """``ceil(nbytes / scale)`` rounded up to whole pages."""
    per = -(-int(nbytes) // scale)
    return -(-per // PAGE_BYTES) * PAGE_BYTES


def scale_rows(rows: list[Row], scale: int) -> list[Row]:
    """Accesses at 1/``scale``: offset rounded down to a page, end rounded up to a page."""
    if scale == 1:
        return rows
    out = []
    for rid, off, size, w in rows:
        lo = off // scale // PAGE_BYTES * PAGE_BYTES
        hi = _pages_up(off + size, scale) if size > 0 else lo
        out.append((rid, lo, max(0, hi - lo), w))
    return out
