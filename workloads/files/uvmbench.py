"""uvmbench (eunomia-bpf/gpu_ext ``microbench/memory``) as a uvmlab program: page-strided streams and a pointer chase.

``uvmlab run workloads/files/uvmbench.py --option kernel=seq_stream --option mode=uvm --option size_factor=1.25
--gpu RTX5090 --gpu-memory 33669316608 --pca off``

What the real program does (``main.cu`` and ``kernels/synthetic.cuh`` at gpu_ext 3f4cc2d / noob512/uvm 5a9f2f2), and
how this file says it with the program API (docs/workloads.md "Program files"):

* working set ``W = size_factor x total_bytes``, ``total_bytes`` the ``cudaMemGetInfo`` total (default
  33,669,316,608 B: the RTX 5090 of gpu_ext's ``t0rq3_results.csv``, ``working_set_bytes`` at 1.0x). Run it on a
  GPU of that memory (``--gpu-memory 33669316608``) with one managed range per array (``--pca off``: main.cu
  calls ``cudaMallocManaged`` per array);
* ``seq_stream`` / ``rand_stream``: two managed float arrays ``input`` and ``output`` of ``W / 2`` bytes each; the
  CPU writes every element of ``input`` (``uvm.host_write``: its pages start on the CPU), ``output`` is untouched;
  ``256 x 256 = 65,536`` threads, thread ``t`` owns chunk ``t`` of each array (rounded up to whole pages) and reads
  ``input[i]`` then writes ``output[i]`` every ``stride_bytes`` through it: ascending (``seq_chunk_kernel``:
  ``pattern="sequential"``), or one element per page in the order of ``rand_chunk_kernel``'s LCG with base seed
  ``0x12345678`` (``pattern="lcg"``; it ignores ``stride_bytes``). Warps of 32 lanes run in lockstep (the
  ``warp_size`` default). The native time is that of lone 32 B sectors, one per access (``touched_bytes``).
* ``pointer_chase`` (``run_pointer_chase``): one managed array of 12-byte ``Node``s (90 % of ``W``, each thread's
  chunk rounded up to whole 341-node "pages" of 4,092 B) and ``T`` output floats. A GPU kernel
  (``init_chunks_kernel``, grid-stride: it writes the array in address order, ``pattern="address"``) links each
  node to a node of its own chunk; each thread then follows 8 dependent ``next`` pointers from its chunk's first
  node and writes ``output[t]``. [approximation: the 8 nodes a thread reads are declared as 8 accesses spread over
  its chunk (``stride_bytes`` = chunk / 8) in a seeded random order (``pattern="random"``), not the chain's exact
  nodes: the same pages per thread and per launch, the same lockstep of a warp's lanes.]
* 2 warm-up launches, then the timed launches: ``uvm.iterations()`` (``--iterations``, default 3); the CSV reports
  the median of the timed ones.

Modes (``--option mode=``; ``apply_uvm_hints`` in synthetic.cuh issues the hint on both arrays after the
initialisation, before the warm-ups):

* ``device``: ``cudaMalloc`` arrays: written here as both arrays prefetched to the GPU right after allocation
  (resident before anything touches them; the host-to-device copy of the input is not timed by uvmbench and not
  modelled); main.cu refuses ``size_factor`` above 0.8 (cudaMalloc cannot oversubscribe), so does this file;
* ``uvm``: no hint; ``uvm_prefetch``: ``cudaMemPrefetchAsync`` of both arrays to the GPU (``uvm.prefetch``);
* ``uvm_advise_read``: ``cudaMemAdviseSetReadMostly``; ``uvm_advise_pref_gpu`` / ``uvm_advise_pref_cpu``:
  ``cudaMemAdviseSetPreferredLocation`` GPU / CPU; ``uvm_advise_access``: ``cudaMemAdviseSetAccessedBy`` GPU.

The file imports nothing from uvmlab. How the simulator replays the access patterns, hints and host writes:
docs/uvm-sim.md.
"""

OPTIONS = {
    "kernel": "seq_stream",
    "mode": "uvm",
    "size_factor": 1.0,
    "total_bytes": 33_669_316_608,
    "stride_bytes": 4096,
}
DESCRIPTION = "uvmbench (gpu_ext microbench): page-strided streams or a pointer chase over managed memory"

THREADS = 256 * 256
"""``numBlocks * blockSize`` in synthetic.cuh ``run_seq_stream`` / ``run_rand_stream`` / ``run_pointer_chase``."""
WARMUP = 2
"""``time_kernel(launch, /*warmup=*/2, ...)`` in synthetic.cuh."""
SECTOR_BYTES = 32
"""DRAM access granularity of one strided element (an L2 sector)."""
PAGE_BYTES = 4096
RAND_BASE_SEED = 0x12345678
"""``base_seed`` of ``run_rand_stream`` in synthetic.cuh."""
NODE_BYTES = 12
"""``sizeof(Node)`` of synthetic.cuh: ``unsigned next; float data; float padding[1]`` (its comment says 16)."""
CHASE_STEPS = 8
"""``chase_steps`` of ``run_pointer_chase``."""
CHASE_NODES_SHARE = 0.9
"""``run_pointer_chase`` splits the working set: nodes 90 %, output 10 % (then allocates ``T`` floats of output)."""
DEVICE_MAX_FACTOR = 0.8
"""main.cu: "device mode requires size_factor <= 0.8 to avoid OOM"."""
KERNELS = {"seq_stream": "sequential", "rand_stream": "lcg", "pointer_chase": "random"}
MODES = {
    "device": None,
    "uvm": None,
    "uvm_prefetch": None,
    "uvm_advise_read": ("set_read_mostly", None),
    "uvm_advise_pref_gpu": ("set_preferred_location", "gpu"),
    "uvm_advise_pref_cpu": ("set_preferred_location", "cpu"),
    "uvm_advise_access": ("set_accessed_by", "gpu"),
}
"""uvmbench's ``--mode`` values (main.cu) and the ``cudaMemAdvise`` each issues (``apply_uvm_hints``)."""


def _check(options):
    kernel, mode = options["kernel"], options["mode"]
    if kernel not in KERNELS:
        raise ValueError(f"unknown uvmbench kernel {kernel!r}; known: {', '.join(KERNELS)}")
    if mode not in MODES:
        raise ValueError(f"unknown uvmbench mode {mode!r}; known: {', '.join(MODES)}")
    factor = float(options["size_factor"])
    if not factor > 0:
        raise ValueError(f"size_factor must be > 0, not {factor}")
    if mode == "device" and factor > DEVICE_MAX_FACTOR:
        raise ValueError(f"uvmbench refuses device mode above size_factor {DEVICE_MAX_FACTOR} (got {factor})")
    if int(options["stride_bytes"]) < 4:
        raise ValueError(f"stride_bytes must be at least one float (4), not {options['stride_bytes']}")
    return kernel, mode, int(int(options["total_bytes"]) * factor)


def program(uvm, cfg, options):
    """Allocate and initialise the arrays, apply the mode, 2 warm-up launches, then the timed ones."""
    import torch

    kernel, mode, working_set = _check(options)
    dev = uvm.device
    if kernel == "pointer_chase":
        total_nodes = int(working_set * CHASE_NODES_SHARE) // NODE_BYTES
        nodes_per_page = PAGE_BYTES // NODE_BYTES
        per_thread = -(-total_nodes // THREADS)
        per_chunk = -(-per_thread // nodes_per_page) * nodes_per_page  # whole 341-node "pages" per thread
        nodes = torch.empty(THREADS * per_chunk * (NODE_BYTES // 4), dtype=torch.int32, device=dev)
        out = torch.empty(THREADS, dtype=torch.float32, device=dev)
        arrays = (nodes, out)
        if mode == "device":
            for t in arrays:
                uvm.prefetch(t, "gpu")
        uvm.kernel("init_chunks_kernel", writes=[nodes], pattern="address", threads=THREADS)
        stride = max(PAGE_BYTES, per_chunk * NODE_BYTES // CHASE_STEPS)
        sectors = THREADS * (CHASE_STEPS + 1) * SECTOR_BYTES

        def launch():
            uvm.kernel(
                "pointer_chunk_kernel",
                reads=[nodes],
                writes=[out],
                pattern="random",
                threads=THREADS,
                stride_bytes=stride,
                seed=RAND_BASE_SEED,
                touched_bytes=sectors,
            )

    else:
        n = working_set // 2 // 4
        inp = torch.empty(n, dtype=torch.float32, device=dev)
        out = torch.empty(n, dtype=torch.float32, device=dev)
        arrays = (inp, out)
        pattern = KERNELS[kernel]
        stride = PAGE_BYTES if pattern == "lcg" else int(options["stride_bytes"])  # rand_chunk_kernel: per page
        if mode == "device":
            for t in arrays:
                uvm.prefetch(t, "gpu")
        else:
            uvm.host_write(inp)
        accesses = -(-(n * 4) // stride)
        name = "seq_chunk_kernel" if pattern == "sequential" else "rand_chunk_kernel"

        def launch():
            uvm.kernel(
                name,
                reads=[inp],
                writes=[out],
                pattern=pattern,
                threads=THREADS,
                stride_bytes=stride,
                seed=RAND_BASE_SEED,
                touched_bytes=2 * accesses * SECTOR_BYTES,
            )

    if mode == "uvm_prefetch":
        for t in arrays:
            uvm.prefetch(t, "gpu")
    hint = MODES[mode]
    if hint is not None:
        for t in arrays:
            uvm.advise(t, hint[0], hint[1])
    for _ in range(WARMUP):
        launch()
    for _ in uvm.iterations():
        launch()
