"""How many threads and blocks of a kernel a GPU keeps in flight, and the launch geometry of traced ops (torch-free).

The concurrent model (uvmlab.sim.uvm.concurrent) runs every resident walker of a kernel at once; this module says
how many there are and what each touches:

* **Occupancy** (CUDA C++ Programming Guide, "Technical Specifications per Compute Capability", table "Technical
  Specifications per Compute Capability"; SM counts from NVIDIA datasheets and architecture whitepapers): resident
  blocks per SM = min(max blocks per SM, max threads per SM // block threads), times the SMs. Register and shared
  memory limits are not known for traced ops and are not applied [approximation], except for GEMM tiles (below).
* **Foreach ops** (``aten::_foreach_*``, PyTorch's multi-tensor apply, aten/src/ATen/native/cuda/MultiTensorApply.cuh):
  blocks of ``kBlockSize`` = 512 threads, one per chunk of ``kChunkSize`` = 65,536 elements of a tensor (all lists
  at once: ``depth`` tensor lists, e.g. 3 for ``_foreach_addcdiv_``), each thread ``kILP`` = 4 elements per
  iteration, so a block sweeps its chunk in 32 iterations of 2,048 elements per list (ForeachFunctors.cuh
  ``i_start += blockDim.x * kILP``). A launch holds at most ``depth_to_max_blocks`` chunks and
  ``depth_to_max_tensors`` tensors: 320 / {110, 64, 48, 36, 30} with 4 KB kernel arguments, 2,240 / {770, 448,
  336, 252, 210} with the 32 KB arguments CUDA 12.1+ and driver 530+ allow (``DepthToMaxConfig``); the launches of
  one op run one after the other on the stream. The trace lists a foreach op's tensors list by list (each list's
  tensors in order, an in-place list read and written); :func:`foreach_lists` recovers the lists from the sizes.

The *window* of a launch is the VA blocks its first wave of resident walkers touches (:func:`window_blocks`): when
it fits in the GPU memory available, no walker can lose a page it still needs to another walker's faults, and the
replay keeps the address-order model (uvmlab.sim.uvm.driver ``access``) for traced ops; when it does not, the
launch goes through the concurrent engine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from uvmlab.gpus import GpuSpec, sm_info, sm_version
from uvmlab.sim.uvm.concurrent import AffinePages
from uvmlab.sim.uvm.knobs import PAGE_BYTES, PAGES_PER_BLOCK, VA_BLOCK_BYTES

Row = tuple[int, int, int, bool]

SM_LIMITS = {
    60: (2048, 32),
    61: (2048, 32),
    70: (2048, 32),
    75: (1024, 16),
    80: (2048, 32),
    86: (1536, 16),
    89: (1536, 24),
    90: (2048, 32),
    120: (1536, 24),
}
"""(max resident threads, max resident blocks) per SM by compute capability x 10 (CUDA C++ Programming Guide,
"Technical Specifications per Compute Capability"); a GPU's capability is :func:`uvmlab.gpus.sm_version`'s."""

DEFAULT_BLOCK_THREADS = 256
"""[U] Threads per block of a declared program kernel (``uvm.kernel`` gives the total threads, not the block size):
a common choice (CUDA C++ Best Practices Guide, "Thread and Block Heuristics": 128-256 is a good start)."""

FOREACH_BLOCK_THREADS = 512
"""``kBlockSize`` (MultiTensorApply.cuh)."""
FOREACH_CHUNK_ELEMS = 65536
"""``kChunkSize`` (MultiTensorApply.cuh)."""
FOREACH_ILP = 4
"""``kILP`` (MultiTensorApply.cuh): elements per thread per iteration."""
FOREACH_MAX_BLOCKS = (320, 2240)
"""``depth_to_max_blocks`` with 4 KB / 32 KB kernel arguments (``DepthToMaxConfig<false / true>``)."""
FOREACH_MAX_TENSORS = ((110, 64, 48, 36, 30), (770, 448, 336, 252, 210))
"""``depth_to_max_tensors`` with 4 KB / 32 KB kernel arguments, by depth 1-5."""
LARGE_KERNEL_ARG_DRIVER = 530
"""``supports_large_kernel_arg`` (MultiTensorApply.cuh): CUDA runtime >= 12.1 (the wheels' cu12x builds) and driver
>= 530 (its runtime check ``driver_ver >= 12010``: a CUDA 12.1 driver is R530)."""


def base_name(gpu_name: str | GpuSpec) -> str:
    """The catalog name of a (possibly renamed) spec: ``"A100-80GB (40.0 GiB)"`` -> ``"A100-80GB"``."""
    return gpu_name.catalog_name if isinstance(gpu_name, GpuSpec) else gpu_name.split(" (")[0]


def sm_count(gpu_name: str | GpuSpec) -> int:
    """SMs of ``gpu_name``: a spec's own count (a GPU described in a file or by options), else the one SM table's
    (:func:`uvmlab.gpus.sm_info`: an A100's 108 for a GPU it does not list)."""
    if isinstance(gpu_name, GpuSpec):
        return gpu_name.sms
    return sm_info(base_name(gpu_name))[0]


def sm_limits(gpu_name: str | GpuSpec) -> tuple[int, int]:
    """(max resident threads, max resident blocks) per SM of ``gpu_name`` (a spec's own threads per SM)."""
    threads, blocks = SM_LIMITS.get(sm_version(base_name(gpu_name)), SM_LIMITS[80])
    if isinstance(gpu_name, GpuSpec):
        threads = gpu_name.max_threads_per_sm or threads
    return threads, blocks


def resident_blocks(gpu_name: str | GpuSpec, block_threads: int) -> int:
    """Blocks of ``block_threads`` threads resident on the whole GPU (threads and blocks per SM; registers and shared
    memory not applied)."""
    threads, blocks = sm_limits(gpu_name)
    per_sm = max(1, min(blocks, threads // max(1, int(block_threads))))
    return sm_count(gpu_name) * per_sm


def resident_threads(gpu_name: str | GpuSpec, block_threads: int = DEFAULT_BLOCK_THREADS) -> int:
    """Threads resident on the whole GPU in blocks of ``block_threads``."""
    return resident_blocks(gpu_name, block_threads) * int(block_threads)


# -- foreach (multi-tensor apply) ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorRef:
    """One tensor of a kernel: its byte range in a managed range and whether the kernel writes it."""

    range_id: int
    offset: int
    size: int
    write: bool


def foreach_lists(rows: list[Row]) -> list[list[TensorRef]] | None:
    """The tensor lists of a foreach kernel from its trace rows (module docstring): ``depth`` (at most 5) lists of
    ``n`` tensors, tensor i of every list of the same size, ``n`` the number of tensors written (one list is) or else
    the smallest that splits (one list of every tensor at worst); None for no rows."""
    seen: dict[tuple[int, int, int], int] = {}
    refs: list[TensorRef] = []
    for rid, off, size, w in rows:
        key = (rid, off, size)
        j = seen.get(key)
        if j is None:
            seen[key] = len(refs)
            refs.append(TensorRef(rid, off, size, w))
        elif w and not refs[j].write:
            refs[j] = TensorRef(rid, off, size, True)
    t = len(refs)
    written = sum(r.write for r in refs)  # one list is written (in place: the first; out of place: the output)
    for n in ([written] if written else []) + list(range(1, t + 1)):
        d = t // n if n else 0
        if not n or t % n or d > len(FOREACH_MAX_TENSORS[0]):
            continue
        sizes = [r.size for r in refs[:n]]
        if all(refs[j * n + i].size == sizes[i] for j in range(d) for i in range(n)):
            return [refs[j * n : (j + 1) * n] for j in range(d)]
    return None


@dataclass(frozen=True)
class ForeachLaunch:
    """One multi-tensor-apply launch: its chunks as (tensor index, chunk index) and the bytes it moves."""

    chunks: np.ndarray  # (blocks, 2): tensor index within the lists, chunk index within the tensor
    nbytes: int


def foreach_launches(lists: list[list[TensorRef]], elem_bytes: int, driver_major: int) -> list[ForeachLaunch]:
    """The launches ``multi_tensor_apply`` makes for these lists (module docstring)."""
    large = int(driver_major >= LARGE_KERNEL_ARG_DRIVER)
    depth = len(lists)
    max_blocks = FOREACH_MAX_BLOCKS[large]
    max_tensors = FOREACH_MAX_TENSORS[large][depth - 1]
    chunk_bytes = FOREACH_CHUNK_ELEMS * elem_bytes
    out: list[ForeachLaunch] = []
    cur: list[tuple[int, int]] = []
    tensors_in = 0
    nbytes = 0
    for t, ref in enumerate(lists[0]):
        if ref.size <= 0:
            continue
        tensors_in += 1
        chunks = -(-ref.size // chunk_bytes)
        for c in range(chunks):
            cur.append((t, c))
            nbytes += depth * min(chunk_bytes, ref.size - c * chunk_bytes)
            full_t = tensors_in == max_tensors and c == chunks - 1
            if full_t or len(cur) == max_blocks:
                out.append(ForeachLaunch(np.array(cur, dtype=np.int64), nbytes))
                cur, nbytes = [], 0
                tensors_in = 0 if c == chunks - 1 else 1
    if cur:
        out.append(ForeachLaunch(np.array(cur, dtype=np.int64), nbytes))
    return out


def foreach_pages(
    lists: list[list[TensorRef]], launch: ForeachLaunch, elem_bytes: int, gids: dict[int, np.ndarray]
) -> AffinePages:
    """The walkers of one foreach launch: block b sweeps chunk ``launch.chunks[b]`` of tensor t in every list, one
    iteration (``FOREACH_BLOCK_THREADS x FOREACH_ILP`` elements per list) per unit step; its lanes per list are the
    pages an iteration covers (``gids``: each range's page -> global page id, UvmSim.range_gids)."""
    depth = len(lists)
    it_bytes = FOREACH_BLOCK_THREADS * FOREACH_ILP * elem_bytes
    chunk_bytes = FOREACH_CHUNK_ELEMS * elem_bytes
    per_list = -(-it_bytes // PAGE_BYTES) + 1  # an unaligned iteration spans one page more
    rel = np.array([*(p * PAGE_BYTES for p in range(per_list - 1)), it_bytes - 1], dtype=np.int64)
    t_idx, c_idx = launch.chunks[:, 0], launch.chunks[:, 1]
    n = t_idx.size
    flat, starts = _flat_gids(gids, sorted({r.range_id for lst in lists for r in lst}))
    base = np.empty((n, depth * per_list), dtype=np.int64)
    end = np.empty_like(base)
    rstart = np.empty_like(base)
    writes = np.zeros(depth * per_list, dtype=bool)
    for j, lst in enumerate(lists):
        off = np.array([lst[t].offset for t in range(len(lst))], dtype=np.int64)[t_idx]
        size = np.array([lst[t].size for t in range(len(lst))], dtype=np.int64)[t_idx]
        rs = np.array([starts[lst[t].range_id] for t in range(len(lst))], dtype=np.int64)[t_idx]
        start = off + c_idx * chunk_bytes
        stop = off + np.minimum((c_idx + 1) * chunk_bytes, size)
        cols = slice(j * per_list, (j + 1) * per_list)
        base[:, cols] = start[:, None] + rel[None, :]
        end[:, cols] = stop[:, None]
        rstart[:, cols] = rs[:, None]
        writes[cols] = any(r.write for r in lst)
    steps = -(-chunk_bytes // it_bytes)
    step = np.full(depth * per_list, it_bytes, dtype=np.int64)
    return AffinePages(base=base, end=end, step=step, rstart=rstart, flat=flat, is_write=writes, steps=steps)


def _flat_gids(gids: dict[int, np.ndarray], range_ids: list[int]) -> tuple[np.ndarray, dict[int, int]]:
    """The ranges' page-id tables end to end, and where each starts."""
    starts, parts, pos = {}, [], 0
    for rid in range_ids:
        starts[rid] = pos
        parts.append(gids[rid])
        pos += gids[rid].size
    return (np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)), starts


def window_blocks(src: AffinePages, resident: int) -> int:
    """VA blocks the first ``resident`` walkers touch over all their steps (the launch's concurrent working set)."""
    w = np.arange(min(resident, src.n))
    steps = np.broadcast_to(np.arange(src.steps), (w.size, src.steps))
    g = src.pages(w, steps)
    g = g[g >= 0]
    return int(np.unique(g // PAGES_PER_BLOCK).size)


# -- which traced ops run concurrently ----------------------------------------------------------------------------
ELEM_BYTES = {"fp32": 4, "bf16": 2}
"""Bytes per element of the run dtypes a GEMM's tiles are counted in (IEEE-754 binary32 and bfloat16)."""


def is_foreach(op: str) -> bool:
    """A multi-tensor-apply op (``aten::_foreach_*``, the fused optimizers)."""
    return op.startswith("_foreach_") or op.startswith("_fused_")


@dataclass(frozen=True)
class LaunchPlan:
    """One launch of a traced op for the concurrent engine: its walkers and its share of the op's native time."""

    pages: AffinePages
    resident: int
    sms: int
    native_ns: float


def op_launches(
    op: str,
    rows: list[Row],
    dtype: str,
    gpu_name: str | GpuSpec,
    driver_major: int,
    gids: Callable[[int], np.ndarray],
    native_ns: float,
    capacity_blocks: int,
) -> list[LaunchPlan] | None:
    """The launches of a traced op whose geometry the module docstring gives (foreach ops) when one of their windows
    exceeds ``capacity_blocks`` (:func:`window_blocks`), else None (the address-order model then). ``gids``: a
    range's page -> global page id table (``UvmSim.range_gids``). A launch whose window surely fits (its first wave's
    bytes per list in 2 MiB blocks, plus one block per tensor and list) is not built."""
    e = ELEM_BYTES.get(dtype, 4)
    if not is_foreach(op):
        return None
    lists = foreach_lists(rows)
    if lists is None:
        return None
    launches = foreach_launches(lists, e, driver_major)
    total = sum(x.nbytes for x in launches)
    if not launches or total <= 0:
        return None
    resident = resident_blocks(gpu_name, FOREACH_BLOCK_THREADS)
    if all(_window_bound(lists, x, resident, e) <= capacity_blocks for x in launches):
        return None
    tables = {rid: gids(rid) for rid in sorted({r.range_id for lst in lists for r in lst})}
    sms = sm_count(gpu_name)
    plans = [
        LaunchPlan(foreach_pages(lists, x, e, tables), resident, sms, native_ns * x.nbytes / total) for x in launches
    ]
    return plans if needs_concurrency(plans, capacity_blocks) else None


def windows_fit(
    op: str, rows: list[Row], dtype: str, gpu_name: str | GpuSpec, driver_major: int, capacity_blocks: int
) -> bool:
    """True when every launch of a foreach op surely fits the GPU (its first wave's bytes per list in 2 MiB blocks
    plus one block per tensor and list: whatever the tensors' offsets); independent of where the tensors are."""
    e = ELEM_BYTES.get(dtype, 4)
    lists = foreach_lists(rows) if is_foreach(op) else None
    if lists is None:
        return True
    resident = resident_blocks(gpu_name, FOREACH_BLOCK_THREADS)
    launches = foreach_launches(lists, e, driver_major)
    return all(_window_bound(lists, x, resident, e) <= capacity_blocks for x in launches)


def _window_bound(lists: list[list[TensorRef]], launch: ForeachLaunch, resident: int, elem_bytes: int) -> int:
    """An upper bound of a foreach launch's window in blocks (see :func:`op_launches`)."""
    wave = launch.chunks[:resident]
    chunk = FOREACH_CHUNK_ELEMS * elem_bytes
    tensors = np.unique(wave[:, 0]).size
    out = 0
    for lst in lists:
        size = np.array([lst[t].size for t in wave[:, 0].tolist()], dtype=np.int64)
        nbytes = int(np.minimum(chunk, size - wave[:, 1] * chunk).sum())
        out += -(-nbytes // VA_BLOCK_BYTES) + tensors + 1
    return out


def needs_concurrency(plans: list[LaunchPlan], capacity_blocks: int) -> bool:
    """True when some launch's window (:func:`window_blocks`) exceeds the GPU's blocks: its walkers can lose pages
    they still need to each other's faults."""
    return any(window_blocks(p.pages, p.resident) > capacity_blocks for p in plans)
