"""Child step of ``uvmlab collect``: uvmbench-style page-strided streams over managed memory (CuPy).

``python -m uvmlab.measure.gpu.kit.uvm_step OUT --factors 0.25,0.5,0.9 [--kernels seq_stream,rand_stream]
[--modes device,uvm] [--iterations 5]``

The program is uvmbench's (eunomia-bpf/gpu_ext ``microbench/memory``: ``main.cu``, ``kernels/synthetic.cuh``
``seq_chunk_kernel`` / ``rand_chunk_kernel``, as workloads/files/uvmbench.py describes it), so the scorecard compares
it with
the same simulation it already runs for the RTX 5090 data: two float arrays ``input`` and ``output`` of ``W / 2``
each, the CPU writes every element of ``input`` (its pages start on the host), 256 x 256 threads, thread ``t`` owns
chunk ``t`` (``ceil(N / T)`` elements rounded up to a page) and reads ``input[i]`` then writes ``output[i]`` at the
first element of each 4 KiB page of its chunk: in order (``seq_stream``) or in the LCG order of
``rand_chunk_kernel`` (``uvmlab.sim.uvm.streams.lcg_page_order``: ``seed = lcg(base ^ t)``, ``step = seed | 1``,
``offset = lcg(seed ^ 0xDEADBEEF) % P``, page ``(offset + p * step) % P``). Two warm-up launches, then
``iterations`` timed launches (CUDA events); the row reports the median, as uvmbench's CSV does.

The one difference: the working set is ``factor x free memory`` measured at the start (``cudaMemGetInfo``), not
uvmbench's ``size_factor x total``, so that the default factors (at most 0.9) never ask for more managed memory than
the card has free; ``streams.csv`` carries both (``free_factor`` and uvmbench's ``size_factor`` = W / total).
Modes: ``uvm`` (``cudaMallocManaged``) and ``device`` (``cudaMalloc``, only where W fits: uvmbench refuses device mode
above 0.8 of total). Each row's allocation is freed before the next. A working set above the managed limit of the
measured free memory (uvmlab.measure.gpu.kit.sizing: 10 % of it, at least 2 GiB, stays free) is cut to it, and the
row says so (``limited_by_margin``).

What a row below the free memory settles (issue 43 defect 10): its timed launches run after two warm-ups, with every
page resident: they measure the kernel's resident speed only (no fault is left). So the first launch is timed too
(``cold_ms``): in ``uvm`` mode it migrates the host-written input to the GPU (HtoD, one fault-driven pass with no
eviction) and first-touches the output (populated and zero-filled on the GPU), the two costs the simulator charges
for a first pass (``block_first_gpu_ns``, the link); in ``device`` mode it is the kernel's cold-cache time.
``cold_ms - median_ms`` is then the first-touch plus migration cost of the working set. Fault counts of that pass
need nsys (elsewhere: the lent machine has none); what oversubscription costs needs a factor above 1
(``--allow-oversubscription``, on a GPU of one's own).
"""

from __future__ import annotations

import argparse
import ctypes
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from uvmlab.errors import UnavailableError, UvmlabError

THREADS_PER_BLOCK = 256
BLOCKS = 256
"""``numBlocks`` x ``blockSize`` of synthetic.cuh's ``run_seq_stream`` / ``run_rand_stream``
(workloads/files/uvmbench.py)."""
PAGE_ELEMS = 1024
"""Floats per 4 KiB page: the stride of t0rq3's one element per page."""
WARMUP = 2
"""uvmbench times after two warm-up launches (``time_kernel(launch, 2, ...)``)."""
RAND_BASE_SEED = 0x12345678
"""``base_seed`` of ``run_rand_stream`` (workloads/files/uvmbench.py RAND_BASE_SEED)."""
DEVICE_MAX_FACTOR = 0.8
KERNELS = ("seq_stream", "rand_stream")
MODES = ("uvm", "device")

_SRC = r"""
extern "C" __global__ void seq_stream(const float* in, float* out, long long n, long long chunk) {
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long start = t * chunk, end = start + chunk < n ? start + chunk : n;
    for (long long i = start; i < end; i += 1024) out[i] = in[i] + 1.0f;
}
extern "C" __global__ void rand_stream(const float* in, float* out, long long n, long long chunk,
                                       unsigned int base_seed) {
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long start = t * chunk, end = start + chunk < n ? start + chunk : n;
    if (start >= end) return;
    long long pages = (end - start + 1023) / 1024;
    unsigned int seed = 1664525u * (base_seed ^ (unsigned int)t) + 1013904223u;
    unsigned long long step = (unsigned long long)(seed | 1u) % (unsigned long long)pages;
    unsigned long long offset = (unsigned long long)(1664525u * (seed ^ 0xDEADBEEFu) + 1013904223u) % pages;
    for (long long p = 0; p < pages; ++p) {
        long long i = start + (long long)((offset + (unsigned long long)p * step) % pages) * 1024;
        if (i < end) out[i] = in[i] + 1.0f;
    }
}
"""


def chunk_elems(n: int, threads: int = BLOCKS * THREADS_PER_BLOCK) -> int:
    """Elements per thread: ``ceil(n / threads)`` rounded up to a whole page (synthetic.cuh)."""
    return math.ceil(math.ceil(n / threads) / PAGE_ELEMS) * PAGE_ELEMS


def measure(
    factors: tuple[float, ...], kernels: tuple[str, ...], modes: tuple[str, ...], iterations: int
) -> list[dict[str, Any]]:
    """The rows of streams.csv (uvmlab.measure.gpu.kit.layout.STREAM_COLUMNS) on this process's GPU (CuPy)."""
    try:
        import cupy as cp
    except ImportError:
        raise UnavailableError("the uvm step needs CuPy: pip install 'uvmlab[gpu]' (cupy-cuda13x)") from None
    rt = cp.cuda.runtime
    module = {k: cp.RawKernel(_SRC, k) for k in kernels}
    stream = cp.cuda.Stream(non_blocking=True)
    from uvmlab.measure.gpu.kit.sizing import managed_limit

    free, total = (int(x) for x in rt.memGetInfo())
    rows: list[dict[str, Any]] = []
    for mode in modes:
        for factor in factors:
            asked = int(factor * free)
            limited = mode == "uvm" and asked > managed_limit(free)
            if limited:
                asked = managed_limit(free)
            working = asked // (2 * 4 * PAGE_ELEMS) * (2 * 4 * PAGE_ELEMS)
            if mode == "device" and working > DEVICE_MAX_FACTOR * total:
                continue
            n = working // 2 // 4
            for kernel in kernels:
                cold, times = _run(cp, rt, module[kernel], stream, kernel, mode, n, iterations)
                med = float(np.median(times))
                rows.append(
                    {
                        "kernel": kernel,
                        "mode": mode,
                        "size_factor": working / total,
                        "working_set_bytes": working,
                        "bytes_accessed": working,
                        "iterations": iterations,
                        "median_ms": med,
                        "min_ms": float(min(times)),
                        "max_ms": float(max(times)),
                        "bw_GBps": working / (med / 1e3) / 1e9 if med > 0 else None,
                        "free_factor": factor,
                        "free_bytes": free,
                        "total_bytes": total,
                        "cold_ms": cold,
                        "limited_by_margin": limited,
                    }
                )
    return rows


def _run(
    cp: Any, rt: Any, kern: Any, stream: Any, kernel: str, mode: str, n: int, iterations: int
) -> tuple[float, list[float]]:
    """Allocate, write the input on the host, launch WARMUP + iterations times: (the first, cold launch's ms, the
    timed launches' ms)."""
    nbytes = n * 4
    if mode == "uvm":
        a, b = cp.cuda.malloc_managed(nbytes), cp.cuda.malloc_managed(nbytes)
        ptr_in, ptr_out = a.ptr, b.ptr
        ctypes.memset(ptr_in, 0, nbytes)  # the CPU writes every page of input: host-resident
    else:
        ptr_in, ptr_out = rt.malloc(nbytes), rt.malloc(nbytes)
    chunk = chunk_elems(n)
    args: tuple[Any, ...] = (np.uint64(ptr_in), np.uint64(ptr_out), np.int64(n), np.int64(chunk))
    if kernel == "rand_stream":
        args = (*args, np.uint32(RAND_BASE_SEED))
    times = []
    cold = float("nan")
    try:
        for i in range(WARMUP + iterations):
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record(stream)
            with stream:
                kern((BLOCKS,), (THREADS_PER_BLOCK,), args)
            end.record(stream)
            end.synchronize()
            ms = float(cp.cuda.get_elapsed_time(start, end))
            if i == 0:
                cold = ms
            if i >= WARMUP:
                times.append(ms)
    finally:
        if mode == "device":
            rt.free(ptr_in)
            rt.free(ptr_out)
    return cold, times


def main(argv: list[str] | None = None) -> int:
    from uvmlab.measure.gpu.kit.layout import STREAM_COLUMNS, write_csv

    parser = argparse.ArgumentParser(
        prog="python -m uvmlab.measure.gpu.kit.uvm_step", description=__doc__.splitlines()[0]
    )
    parser.add_argument("out", type=Path)
    parser.add_argument("--factors", required=True)
    parser.add_argument("--kernels", default=",".join(KERNELS))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--iterations", type=int, default=5)
    args = parser.parse_args(argv)
    try:
        rows = measure(
            tuple(float(f) for f in args.factors.split(",")),
            tuple(k for k in args.kernels.split(",") if k),
            tuple(m for m in args.modes.split(",") if m),
            args.iterations,
        )
    except UvmlabError as exc:
        print(f"uvmlab uvm step: error: {exc}", file=sys.stderr)
        return exc.exit_code
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / "streams.csv", rows, STREAM_COLUMNS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
