"""Relaunches served from the L2 cache: the native time of a kernel launched again over data the L2 still holds
(issue 41 section 2). Torch-free.

Every byte a kernel moves was taken as a DRAM byte. A GPU's L2 keeps the lines the last kernel touched until they
are replaced (the CUDA C++ Programming Guide, "Device Memory L2 Access Management", treats data that kernels access
repeatedly as L2-resident, its set-aside only changing which lines are replaced first; nothing between the kernels
of one context flushes it [I]), so a kernel launched again over the same data, when that data fits, reads it from
the L2. Benchmarks do exactly this: warm-up launches, then timed
launches of the same kernel. The evidence that it matters: uvmbench's pointer_chase on the RTX 5090 (gpu_ext t0rq3,
every non-faulting factor) reads 524,288 scattered 12-byte nodes in 0.009 ms per launch, 1.9 TB/s of 32 B sectors,
where the lone-sector DRAM rate that seq_stream measures on the same GPU (0.129 of peak, 231 GB/s) gives 0.082 ms.

The rule (:func:`l2_relaunches`):

* the row before is a launch of the same kernel (same name, same byte ranges, same touched bytes; no API call, copy
  or host step between: a host write or a migration changes the data or its physical pages);
* the lines it touches fit the L2: ``lines x LINE_BYTES <= l2_bytes``. L2 lines are 128 B of four 32 B sectors
  and a miss allocates a whole line for the sectors it fetches (Nsight Compute Kernel Profiling Guide, "Memory
  Tables": L2 line 128 bytes, sector 32 bytes), so a kernel whose every access is a lone 32 B sector (class
  ``sector``: a page-strided stream, a pointer chase) occupies a line per sector it moves, a dense kernel one per
  128 B. This is why rq4's seq_stream at 0.25x (2.1 M lone sectors: 263 MB of lines) is not served from the 96 MB
  L2 of the RTX 5090 (measured: half the 0.5x time, a DRAM rate) while pointer_chase (0.59 M: 75 MB) is;
* at replay time the GPU still maps every page it touches where it was (``UvmSim.in_place``: GPU-resident, or
  CPU-resident and mapped remotely); a page that must migrate has new physical lines, and the launch is timed at
  the DRAM rate (``uvmlab.sim.uvm.replay``).

Its bytes are then L2 hits at :data:`L2_OVER_DRAM` x the DRAM peak (kernel class ``l2``), floored at the launch
floor like every kernel.

Approximations: the L2 is taken as one fully associative LRU cache of its whole capacity (the A100's and H100's L2
are two partitions, and set conflicts evict lines before the capacity is reached: a working set near the
capacity is served partly); only the previous launch is looked at (a kernel relaunched with another kernel between
is a DRAM kernel); remote accesses keep their link time (whether the L2 keeps lines of host memory across
launches is not settled by the data: rq4's pointer_chase with preferred location CPU, 0.014 ms, may read GPU-resident
nodes); L2 hit latency is not modelled (a dependent chain of hits is timed by its bytes).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from uvmlab.gpus import GpuSpec
from uvmlab.sim.uvm.order import SECTOR_BYTES

LINE_BYTES = 128
"""L2 cache line (Nsight Compute Kernel Profiling Guide, "Memory Tables": 128-byte lines of four 32-byte sectors)."""
L2_OVER_DRAM = 3.5
"""[I] L2 hit bandwidth over the DRAM peak: V100 2,048 B/clk at 1.53 GHz (3.1 TB/s) over 900 GB/s is 3.5; A100 5,120
B/clk at 1.41 GHz (7.2 TB/s) over 1,555 GB/s is 4.6 (NVIDIA A100 Tensor Core GPU Architecture whitepaper: "2.3x
the L2 cache read bandwidth of V100", 5,120 against 2,048 bytes per clock). The lower is taken for every GPU; no
other GPU's L2 bandwidth is published."""


def l2_lines(touched_bytes: np.ndarray, lone_sectors: np.ndarray) -> np.ndarray:
    """L2 lines each kernel occupies: one per 32 B sector moved for lone-sector kernels, one per 128 B otherwise."""
    b = np.asarray(touched_bytes, dtype=float)
    return np.where(np.asarray(lone_sectors, dtype=bool), np.ceil(b / SECTOR_BYTES), np.ceil(b / LINE_BYTES))


def l2_relaunches(
    names: Sequence[str],
    rows_of: Callable[[int], Sequence[tuple[int, int, int, bool]]],
    touched_bytes: np.ndarray,
    plain: np.ndarray,
    lone_sectors: np.ndarray,
    gpu: GpuSpec,
) -> frozenset[int]:
    """The kernels (replay-order indices) that are relaunches whose lines fit the L2 (module docstring).
    ``rows_of(i)``: kernel ``i``'s accessed byte ranges (range, offset, size, is_write), asked only of the few
    kernels that pass the cheap tests; ``plain``: rows that are kernel launches (not API calls, copies or host
    steps)."""
    n = len(names)
    if gpu.l2_bytes <= 0 or n < 2:
        return frozenset()
    touched = np.asarray(touched_bytes, dtype=float)
    plain = np.asarray(plain, dtype=bool)
    fits = l2_lines(touched, lone_sectors) * LINE_BYTES <= gpu.l2_bytes
    name = np.asarray(names, dtype=object)
    cand = plain[1:] & plain[:-1] & fits[1:] & (touched[1:] > 0) & (touched[1:] == touched[:-1])
    cand &= name[1:] == name[:-1]
    return frozenset(int(i) for i in np.flatnonzero(cand) + 1 if list(rows_of(i)) == list(rows_of(i - 1)))


__all__ = ["L2_OVER_DRAM", "LINE_BYTES", "l2_lines", "l2_relaunches"]
