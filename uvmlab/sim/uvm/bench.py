"""uvmbench (eunomia-bpf/gpu_ext ``microbench/memory``) as a workload of the UVM simulator: no training loop.

What the real program does (``main.cu``, ``kernels/synthetic.cuh`` at gpu_ext 3f4cc2d / noob512/uvm 5a9f2f2):

* working set ``W = size_factor x total`` with ``total`` = ``cudaMemGetInfo`` total (33,669,316,608 B on the RTX 5090
  of ``t0rq3_results.csv``); two managed arrays ``input`` and ``output`` of ``W / 2`` each;
* the CPU writes every element of ``input`` (a host loop: its pages start CPU-resident); ``output`` is untouched;
* 256 x 256 = 65,536 threads; thread ``t`` owns chunk ``t`` (``ceil(N / T)`` elements rounded up to a page) and reads
  ``input[i]`` then writes ``output[i]`` every ``stride_bytes`` (4096 in t0rq3: one element per page) through its
  chunk, ascending (``seq_stream``); ``rand_stream`` probes one element per page of its chunk in the order of
  ``rand_chunk_kernel``'s LCG (``StreamKernel`` order ``lcg``: a thread whose step shares a factor with its chunk's
  page count revisits a subset of its pages and never touches the rest, uvmlab.sim.uvm.streams);
* 2 warm-up launches, then ``iterations`` timed launches; the CSV reports the median.
* ``pointer_chase`` (``run_pointer_chase``, ``pointer_chunk_kernel``): one managed array of 12-byte ``Node``s
  (``{unsigned next; float data; float padding[1];}``, 90 % of ``W``; each thread's chunk rounded up to whole
  341-node "pages" of 4,092 B, so chunks are not page-aligned) and ``T`` output floats. A GPU kernel
  (``init_chunks_kernel``, grid-stride, so it writes the array in address order) sets node ``i``'s ``next`` to a
  node of its own chunk, ``lcg(i) % nodes_per_chunk``; ``output`` is not touched before the timed kernel. Each
  thread then follows 8 dependent ``next`` pointers from its chunk's first node (8 nodes read: ``chase_steps``)
  and writes ``output[t]``. uvmlab computes every thread's 8 nodes exactly and replays them as a
  ``StreamKernel`` of order ``visits`` (warps in lockstep: a warp waits for its slowest lane's page), then the
  output write as one more access [approximations: a node is charged to the page of its first byte (1 node in
  341 straddles two pages); the output write is replayed after the chase instead of per thread].

* every lane of a warp runs the same loop (``pages_in_chunk`` trips: seq reads ``input[i]`` and writes
  ``output[i]`` at the first element of each page, ``stride_elems`` = 1024; rand does the same in its LCG order and
  ignores ``stride_bytes``), so the 32 lanes of a warp probe their pages in lockstep (``StreamKernel.warp_size``).

The simulator runs the same program at ``1 / scale`` of the memory (GPU capacity, arrays and thread count all
divided by ``scale``; the chunk per thread keeps its size), fetches ``256 / scale`` fault entries per batch (the
same share of the threads per batch as the real run) and multiplies times by ``scale``: every count of blocks,
faults and transfers scales with the sizes and the batch count is the real one, so the scaled run has the same
dynamics [approximation, checked by tests/test_uvm_streams.py::test_uvmbench_scale_invariance; the 1.0x point,
whose overflow is 537 MB, is the least scale-stable: seq_stream 137 / 165 / 223 ms at scale 8 / 16 / 32].
Native kernel time: a roofline over the 32 B sectors touched, each access a lone sector of its own page, at
``CostParams.sector_memory_efficiency`` (the RTX 5090 profile fits it on seq_stream in ``device`` mode at 0.5x).

**Modes** (``--mode``; ``apply_uvm_hints`` in synthetic.cuh applies the hint to both arrays after the host
initialisation, before the warm-ups). Where the driver puts a faulting page is
``block_select_processor_residency`` (NVIDIA/open-gpu-kernel-modules 595.45.04, ``kernel-open/nvidia-uvm/
uvm_va_block.c``); the CSV times the launches after the two warm-ups, so only the steady state matters:

* ``device``: ``cudaMalloc``; the native kernel only.
* ``uvm``: no hint (above).
* ``uvm_prefetch``: ``cudaMemPrefetchAsync`` of both arrays to the GPU, then ``cudaDeviceSynchronize``
  (``UvmSim.prefetch``), untimed.
* ``uvm_advise_pref_gpu`` (preferred location the GPU): "if the faulting processor is the preferred location always
  migrate": GPU faults migrate as without the hint; without eviction the run is ``uvm``'s.
* ``uvm_advise_read`` (read-mostly): a read fault makes a read duplicate on the GPU, a write makes the page the
  writer's (``can_read_duplicate``: the faulting processor gets a local copy either way); after the warm-ups every
  page is local and the launch is native [the model's reading: the measured RTX 5090 time is 4 orders of magnitude
  above it, unexplained (docs/uvm-sim.md)].
* ``uvm_advise_pref_cpu`` (preferred location the CPU): a GPU fault on a CPU-resident page, or on one resident
  nowhere, selects the preferred location, which the GPU can access over the link: the page stays (or is
  populated) on the CPU and the GPU maps it. Every timed access is remote: the launch costs the link time of its
  sectors (``uvm_hints.remote_link_ns``, reads and writes in their own directions) or the native time, the larger.
* ``uvm_advise_access`` (accessed-by the GPU): a GPU fault on a page resident on a processor the GPU can access
  keeps it there and adds the mapping; a page resident nowhere goes to the faulting GPU. So the host-written array
  (seq/rand ``input``) is read remotely, the GPU-written ones are local.
  In both remote modes only the steady launch is modelled: the warm-ups' first-touch faults are not simulated
  (``BenchResult.times_ns`` repeats the steady launch), and no page moves.

The hint modes other than ``uvm_prefetch`` are modelled only without eviction (the working set fits the GPU;
rq4 runs at 0.25x): what preferred locations and duplicates do to eviction order is not modelled here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from uvmlab.errors import InputError
from uvmlab.gpus import GPUS, GpuSpec
from uvmlab.sim.uvm.driver import UvmSim
from uvmlab.sim.uvm.hints import remote_link_ns
from uvmlab.sim.uvm.knobs import PAGE_BYTES, UvmKnobs
from uvmlab.sim.uvm.streams import StreamKernel, lcg
from uvmlab.sim.uvm.timing import CostParams, kernel_time_ns

RTX5090_TOTAL_BYTES = 33_669_316_608
"""``cudaMemGetInfo`` total in gpu_ext t0rq3_results.csv (``working_set_bytes`` at size_factor 1.0)."""
THREADS = 256 * 256
"""``numBlocks * blockSize`` in synthetic.cuh ``run_seq_stream`` / ``run_rand_stream``."""
WARMUP = 2
"""``time_kernel(launch, /*warmup=*/2, ...)`` in synthetic.cuh."""
SECTOR_BYTES = 32
"""DRAM access granularity of one strided element (an L2 sector)."""
KERNELS = {"seq_stream": "sequential", "rand_stream": "lcg", "pointer_chase": "visits"}
NODE_BYTES = 12
"""``sizeof(Node)`` of synthetic.cuh: ``unsigned next; float data; float padding[1]`` (its comment says 16)."""
CHASE_STEPS = 8
"""``chase_steps`` of ``run_pointer_chase``."""
CHASE_NODES_SHARE = 0.9
"""``run_pointer_chase`` splits the working set: nodes 90 %, output 10 % (then allocates ``T`` floats of output)."""
WARP = 32
"""Threads per warp (CUDA); every lane of a warp runs the same number of loop trips in both kernels
(``pages_in_chunk`` is the same for all but the last chunk), so a warp's lanes probe their pages in lockstep."""
RAND_BASE_SEED = 0x12345678
"""``base_seed`` of ``run_rand_stream`` in synthetic.cuh."""
MODES = (
    "device",
    "uvm",
    "uvm_prefetch",
    "uvm_advise_read",
    "uvm_advise_pref_gpu",
    "uvm_advise_pref_cpu",
    "uvm_advise_access",
)
"""uvmbench's ``--mode`` values (main.cu; ``apply_uvm_hints`` in synthetic.cuh); the module docstring says how each
is modelled."""
DEVICE_MAX_FACTOR = 0.8
"""main.cu: "device mode requires size_factor <= 0.8 to avoid OOM" (cudaMalloc cannot oversubscribe)."""
NO_EVICTION_MODES = ("uvm_advise_read", "uvm_advise_pref_gpu", "uvm_advise_pref_cpu", "uvm_advise_access")
"""Modes modelled only when the working set fits the GPU (module docstring)."""


@dataclass
class BenchResult:
    """Simulated uvmbench run: per-launch times (ns, real scale) and counters of the timed launches."""

    times_ns: list[float]
    median_ms: float
    htod_bytes: int
    dtoh_bytes: int
    fault_count: int
    fault_batch_count: int
    eviction_count: int
    remote_bytes: int = 0
    """Bytes a timed launch reads or writes remotely (mapped host memory), summed over the timed launches."""


def simulate_uvmbench(
    kernel: str,
    size_factor: float,
    *,
    mode: str = "uvm",
    iterations: int = 3,
    total_bytes: int = RTX5090_TOTAL_BYTES,
    gpu: GpuSpec | None = None,
    costs: CostParams | None = None,
    knobs: UvmKnobs | None = None,
    stride_bytes: int = PAGE_BYTES,
    scale: int = 16,
) -> BenchResult:
    """Simulate ``uvmbench --kernel=KERNEL --mode=MODE --size_factor=F`` (module docstring)."""
    gpu = gpu or GPUS["RTX5090"]
    costs = (costs or CostParams()).for_gpu(gpu)
    if mode not in MODES:
        raise InputError(f"unknown uvmbench mode {mode!r}; known: {', '.join(MODES)}")
    if mode == "device" and size_factor > DEVICE_MAX_FACTOR:
        raise InputError(f"uvmbench refuses device mode above size_factor {DEVICE_MAX_FACTOR} (got {size_factor})")
    capacity = (total_bytes - gpu.context_bytes) // scale
    array = int(total_bytes * size_factor) // 2 // scale
    sim = UvmSim(capacity, knobs, costs, gpu)
    n_streams = max(1, THREADS // scale)
    order = KERNELS.get(kernel)
    if order is None:
        raise InputError(f"unknown uvmbench kernel {kernel!r}; known: {', '.join(KERNELS)}")
    tail: tuple[tuple[int, int, int, bool], ...] = ()
    if order == "visits":
        kern, sectors, tail = _pointer_chase(sim, int(total_bytes * size_factor), scale)
        sizes, host_written = {0: kern.accesses[0][2], 1: tail[0][2]}, False
    else:
        sim.map_range(0, array)
        sim.map_range(1, array)
        sim.host_write(0, 0, array)
        if order == "lcg":  # rand_chunk_kernel ignores stride_bytes: one element per page
            stride_bytes = PAGE_BYTES
        accesses = ((0, 0, array, False), (1, 0, array, True))
        kern = StreamKernel(
            accesses, n_streams, order, stride_bytes, seed=RAND_BASE_SEED, tid_stride=scale, warp_size=WARP
        )
        per_array = float(-(-array // max(stride_bytes, 1)) * SECTOR_BYTES * scale)
        sectors, sizes, host_written = (per_array, per_array), {0: array, 1: array}, True
    if mode in NO_EVICTION_MODES and sim.mapped_bytes > capacity:
        raise InputError(
            f"uvmbench mode {mode} is modelled only when the working set fits the GPU (size_factor {size_factor} "
            "does not)"
        )
    sector_costs = costs.for_scattered_sectors()

    def native_ns(nbytes: float) -> float:
        return float(kernel_time_ns(np.array([0.0]), np.array([nbytes]), gpu, sector_costs)[0])

    native = native_ns(sum(sectors))
    remote = _remote_sectors(mode, sectors, host_written)
    if remote is not None:
        read_b, write_b = remote
        link = costs.link_bytes_per_s or gpu.link_bytes_per_s
        t = max(native_ns(sum(sectors) - read_b - write_b), remote_link_ns(read_b, write_b, link))
        return BenchResult([t] * (WARMUP + iterations), t / 1e6, 0, 0, 0, 0, 0, int((read_b + write_b) * iterations))
    if mode == "device":
        return BenchResult([native] * (WARMUP + iterations), native / 1e6, 0, 0, 0, 0, 0)
    if mode == "uvm_prefetch":
        for range_id, size in sizes.items():
            sim.prefetch(range_id, 0, size)
    times: list[float] = []
    timed = []
    for i in range(WARMUP + iterations):
        c = sim.access_streams(kern)
        if tail:
            c.add(sim.access(tail))
        times.append(native + scale * (1 - costs.fault_overlap) * c.stall_ns)
        if i >= WARMUP:
            timed.append(c)
    t = times[WARMUP:]
    return BenchResult(
        times_ns=times,
        median_ms=float(sorted(t)[len(t) // 2]) / 1e6,
        htod_bytes=scale * sum(c.htod_bytes for c in timed),
        dtoh_bytes=scale * sum(c.dtoh_bytes for c in timed),
        fault_count=scale * sum(c.fault_count for c in timed),
        fault_batch_count=sum(c.fault_batch_count for c in timed),  # batches already hold 1/scale of the entries
        eviction_count=scale * sum(c.eviction_count for c in timed),
    )


def _remote_sectors(mode: str, sectors: tuple[float, float], host_written: bool) -> tuple[float, float] | None:
    """(read, write) bytes a launch accesses remotely in a remote-mapping mode, else None (module docstring).

    ``sectors``: the lone-sector bytes of array 0 (read) and array 1 (written) per launch at full scale;
    ``host_written``: array 0 was written by the CPU before the first launch (so it is CPU-resident)."""
    if mode == "uvm_advise_pref_cpu":
        return sectors
    if mode == "uvm_advise_access":
        return (sectors[0] if host_written else 0.0), 0.0
    return None


def chase_visits(n_streams: int, nodes_per_chunk: int, tid_stride: int) -> np.ndarray:
    """(n_streams, CHASE_STEPS) node offsets within its chunk that each sampled thread reads, in order.

    Sampled thread ``i`` is thread ``i * tid_stride`` of the real launch: its chain starts at its chunk's first node
    and follows ``next = chunk_start + lcg(node) % nodes_per_chunk`` (``init_chunks_kernel``, global node ids)."""
    start = np.arange(n_streams, dtype=np.uint64) * np.uint64(tid_stride * nodes_per_chunk)
    cur = start.copy()
    out = np.empty((n_streams, CHASE_STEPS), dtype=np.int64)
    for step in range(CHASE_STEPS):
        out[:, step] = (cur - start).astype(np.int64)
        cur = start + lcg(cur & np.uint64(0xFFFFFFFF)) % np.uint64(nodes_per_chunk)
    return out


def _pointer_chase(
    sim: UvmSim, working_set: int, scale: int
) -> tuple[StreamKernel, tuple[float, float], tuple[tuple[int, int, int, bool], ...]]:
    """Map and GPU-initialise ``run_pointer_chase``'s arrays at 1/``scale``; return (kernel, (node, output) sector
    bytes per launch at full scale, the output write)."""
    nodes_per_page = PAGE_BYTES // NODE_BYTES
    total_nodes = int(working_set * CHASE_NODES_SHARE) // NODE_BYTES
    per_thread = -(-total_nodes // THREADS)
    per_chunk = -(-per_thread // nodes_per_page) * nodes_per_page  # rounded up to whole 341-node "pages"
    n_streams = max(1, THREADS // scale)
    nodes_bytes = n_streams * per_chunk * NODE_BYTES
    out_bytes = n_streams * 4
    sim.map_range(0, nodes_bytes)
    sim.map_range(1, out_bytes)
    sim.access(((0, 0, nodes_bytes, True),))  # init_chunks_kernel: the GPU writes every node, in address order
    offsets = chase_visits(n_streams, per_chunk, scale)
    node = np.arange(n_streams, dtype=np.int64)[:, None] * per_chunk + offsets
    visits = node * NODE_BYTES // PAGE_BYTES
    kern = StreamKernel(
        ((0, 0, nodes_bytes, False),), n_streams, "visits", tid_stride=scale, warp_size=WARP, visits=visits
    )
    sectors = (float(THREADS * CHASE_STEPS * SECTOR_BYTES), float(THREADS * SECTOR_BYTES))
    return kern, sectors, ((1, 0, out_bytes, True),)
