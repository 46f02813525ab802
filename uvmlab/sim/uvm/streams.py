"""Kernels whose threads each walk their own share of memory: interleaved fault arrival (mixed into UvmSim).

A CUDA kernel's warps run together. When every thread scans its own contiguous chunk (gpu_ext microbench's
``seq_chunk_kernel`` / ``rand_chunk_kernel``, eunomia-bpf/gpu_ext ``microbench/memory/kernels/synthetic.cuh``),
the faults that reach the driver at any moment come from *all* the chunks at once, one page per stalled thread,
not from one block after the other in address order. This module models that:

* A :class:`StreamKernel` cuts each of its byte ranges into ``n_streams`` page-aligned chunks; stream ``i`` visits
  chunk ``i`` of every range in step (``input[i]`` then ``output[i]``), touching one page every ``stride_bytes``
  (page-strided views are charged by the pages they touch, not by their byte span). ``order`` is a property of
  the kernel: ``sequential`` (ascending pages), ``random`` (a per-stream permutation of its pages) or ``lcg``
  (gpu_ext microbench's ``rand_chunk_kernel``, below) or ``shuffled`` (the range's pages in one seeded random
  permutation, dealt to the threads in chunks: a thread's pages are spread over the whole range, as the rows an index of
  unknown content selects, uvmlab.sim.uvm.order) or ``visits`` (pages of the range the caller lists per thread and
  step, e.g. a pointer chase; no chunking). A thread uses the same page order in every range it walks (the
  kernels read ``input[i]`` and write ``output[i]`` at the same ``i``).
* ``lcg`` reproduces ``rand_chunk_kernel`` of gpu_ext ``microbench/memory/kernels/synthetic.cuh`` (3f4cc2d): thread
  ``tid`` draws ``seed = lcg(base_seed ^ tid)``, ``step = seed | 1``, ``offset = lcg(seed ^ 0xDEADBEEF) % P`` and
  visits page ``(offset + p * step) % P`` for ``p < P`` (``P`` its chunk's pages, ``lcg(x) = 1664525 x +
  1013904223`` mod 2^32). The code comment calls it a permutation, but ``step`` is only guaranteed odd: when
  ``g = gcd(step, P) > 1`` the thread visits ``P / g`` distinct pages ``g`` times each and never touches the rest.
  With that microbenchmark's chunk sizes (P = 63 pages at 1.0x, 79 at 1.25x, 95 at 1.5x) that leaves 66 %, 99 % and 80
  % of the pages touched: this, not the order itself, is why rand_stream beats seq_stream at 1.0x and 1.5x. Stream
  ``i`` of a scaled-down run stands for thread ``i * tid_stride`` (uvmlab.sim.uvm.order); ``seed`` is
  ``base_seed``.
* Threads run in warps of ``warp_size`` lanes (SIMT: the lanes execute each load and store together; the
  microbenchmark's lanes have equal loop trip counts, ``pages_in_chunk``). A warp whose lanes' pages at its current
  step are all resident runs on at no cost (its time is the kernel's native time); a warp with a lane whose page is
  missing stalls on that step and raises one fault per missing lane (uvm.md 1.3: the warp stalls, the uTLB writes an
  entry per missing page); it moves to its next step when every lane has completed that step. ``warp_size`` 1
  is the independent-thread model.
* Replays complete lanes one by one (forward progress): the replay that ends a batch retries every faulting
  access, each "correctly translated or faulted again" (``UVM_FAULT_REPLAY_TYPE_START``, ``uvm_hal_types.h``), so a
  lane whose page is resident at the replay completes its access and does not need that page again at that step.
  The pages of the block a batch services last are resident at its replay, so every batch completes a lane, even
  when one warp step spans more 2 MiB blocks than the GPU holds (then the real GPU crawls too: thrashing
  mitigation ignores eviction-caused migrations, ``uvm_perf_thrashing.c`` ``thrashing_event_cb``).
* The driver fetches up to ``fault_batch_count`` (256) entries per batch (uvm.md 1.4,
  ``uvm_gpu_replayable_faults.c`` ``fetch_fault_buffer_entries``): the stalled warps' pages, distinct because
  the chunks are disjoint, so a batch fills with distinct pages (no duplicates, one raw entry per fault); the
  entries past the batch size wait (BATCH_FLUSH discards them and the warps refault after the replay). Which
  stalled warps make it into a batch is the model knob ``stream_priority`` (``lowest``: the oldest warps first;
  ``rotate``: round-robin; ``random``: a seeded random order each batch). A scaled-down run (``tid_stride`` > 1)
  fetches ``fault_batch_count / tid_stride`` entries per batch, so that a batch serves the same share of the
  threads as in the real launch (before, 256 entries of 4,096 sampled threads stood for 256 of 65,536 real ones:
  16x the real share, which made the simulated service order depend on the scale). The batch's pages are
  serviced per VA block as in :mod:`uvmlab.sim.uvm.faults` (prefetcher, chunk allocation with LRM eviction,
  migration / zero-fill), then the warps resume.

The consequence the address-order model missed: at an oversubscription factor near 1, the warps of resident
blocks finish their chunks while the faulting ones wait, so the least-recently-migrated chunks evicted for the
faulting blocks belong to threads that are already done; only the overflow migrates each pass, and the jump from
1.0x to 1.25x appears (tests/test_uvm_streams.py, uvmlab/validate/uvm_checks.py).

Approximations: no arrival times (all stalled warps are candidates for every batch); a thread's read and the
dependent write are separate steps; a sampled warp is 32 adjacent sampled chunks (as a real warp's are); thrashing
mitigation is not triggered (its detector ignores eviction-caused migrations, ``uvm_perf_thrashing.c``
``thrashing_event_cb``, uvm.md 1.7).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from uvmlab.errors import InputError
from uvmlab.sim.uvm.concurrent import Launch, TablePages
from uvmlab.sim.uvm.faults import UvmCounters
from uvmlab.sim.uvm.knobs import PAGE_BYTES

ORDERS = ("sequential", "random", "lcg", "visits", "shuffled")
LCG_A, LCG_C = 1664525, 1013904223
"""``lcg_random`` in gpu_ext ``microbench/memory/kernels/synthetic.cuh`` (unsigned 32-bit arithmetic)."""
LCG_OFFSET_XOR = 0xDEADBEEF
"""``lcg_random(seed ^ 0xDEADBEEF)`` picks a thread's first page (same file)."""


@dataclass(frozen=True)
class StreamKernel:
    """A kernel of ``n_streams`` threads, each scanning its own chunk of every range in ``accesses``."""

    accesses: tuple[tuple[int, int, int, bool], ...]
    """(range_id, offset_bytes, size_bytes, is_write) per range the kernel walks, in the order a thread touches
    them within one step (e.g. read input, then write output)."""
    n_streams: int
    order: str = "sequential"
    stride_bytes: int = PAGE_BYTES
    seed: int = 0
    """``random``: the generator's seed; ``lcg``: the kernel's ``base_seed``."""
    tid_stride: int = 1
    """A scaled-down run: stream ``i`` stands for ``tid_stride`` threads of the real launch (``lcg``: it is thread
    ``i * tid_stride``). A driver batch of ``fault_batch_count`` entries then holds ``fault_batch_count /
    tid_stride`` of the sampled threads' faults and its turnaround is charged ``1 / tid_stride`` (the caller
    multiplies the stall by the scale), so a batch serves the same share of the threads as in the real run."""
    warp_size: int = 1
    """Threads per SIMT warp: a warp's threads execute each load/store together (module docstring)."""
    access_orders: tuple[str, ...] = ()
    """Per access, its own order ("sequential", "random", "lcg" or "shuffled"), overriding ``order`` (empty:
    every access takes ``order``): e.g. a gather walks the indexed operand in a random order and its index and
    output in sequence (uvmlab.sim.uvm.order). Not with order ``visits``."""
    access_visits: tuple[np.ndarray | None, ...] = field(default=(), compare=False)
    """Per access, the pages of that access each thread visits step by step ((n_streams, steps), -1: none) in place
    of chunking it (a gather's declared index, uvmlab.sim.uvm.index_order), or None; empty: none."""
    resident: int = 0
    """Threads in flight at once (occupancy, uvmlab.sim.uvm.occupancy; 0: every thread): more are launched as
    resident warps retire, in thread order."""
    sms: int = 1
    """SMs the resident warps are spread over (the ``sm`` arrival order)."""
    native_ns: float = 0.0
    """The kernel's native (all-resident) time, spread evenly over its waves, steps and accesses (0: warps progress
    without time between batches, the model before issue 41). In a scaled replay: the real time / ``tid_stride``."""
    sub: int = 1
    """Accesses of a thread to each visited page in a row (``stride_bytes`` below a page: 4096 / stride)."""
    visits: np.ndarray | None = field(default=None, compare=False)
    """Order ``visits``: (n_streams, steps) page indices within each range that each thread touches, step by step
    (-1: nothing), e.g. a pointer chase whose addresses the caller computed; the ranges
    are not cut into chunks."""

    def __post_init__(self) -> None:
        if self.order not in ORDERS:
            raise InputError(f"access order must be one of {ORDERS}, not {self.order!r}")
        if (self.order == "visits") != (self.visits is not None):
            raise InputError("order 'visits' needs a visits array, and only it takes one")
        if self.visits is not None and (self.visits.ndim != 2 or self.visits.shape[0] != self.n_streams):
            raise InputError(f"visits must be (n_streams, steps), not {self.visits.shape}")
        if self.access_orders and (
            len(self.access_orders) != len(self.accesses)
            or self.order == "visits"
            or not set(self.access_orders) <= {"sequential", "random", "lcg", "shuffled"}
        ):
            raise InputError("access_orders needs one of sequential/random/lcg per access (not with visits)")
        if self.access_visits and (
            len(self.access_visits) != len(self.accesses)
            or any(v is not None and (v.ndim != 2 or v.shape[0] != self.n_streams) for v in self.access_visits)
        ):
            raise InputError("access_visits needs one (n_streams, steps) array or None per access")
        if min(self.n_streams, self.stride_bytes, self.tid_stride, self.warp_size, self.sms, self.sub) < 1:
            raise InputError("a stream kernel needs n_streams, stride_bytes, tid_stride, warp_size, sms, sub >= 1")
        if self.resident < 0 or not self.native_ns >= 0:
            raise InputError("a stream kernel needs resident >= 0 and native_ns >= 0")


def _chunk_pages(n_pages: int, n_streams: int) -> int:
    """Pages per thread chunk (the chunk rounded up to whole pages, as synthetic.cuh does)."""
    return max(1, -(-n_pages // n_streams))


def lcg(x: np.ndarray) -> np.ndarray:
    """``lcg_random`` of synthetic.cuh on uint64 holding uint32 values."""
    return (np.uint64(LCG_A) * x + np.uint64(LCG_C)) & np.uint64(0xFFFFFFFF)


def lcg_page_order(n_valid: np.ndarray, width: int, base_seed: int, tid_stride: int = 1) -> np.ndarray:
    """(S, width) chunk-page indices in ``rand_chunk_kernel``'s visiting order, -1 past a thread's ``P`` pages.

    ``n_valid[i]`` is thread i's ``pages_in_chunk``; see the module docstring for the formula and its repeats."""
    tid = np.arange(len(n_valid), dtype=np.uint64) * np.uint64(tid_stride)
    seed = lcg(np.uint64(base_seed & 0xFFFFFFFF) ^ tid)
    step = (seed | np.uint64(1)).astype(np.int64)
    p_chunk = np.maximum(n_valid.astype(np.int64), 1)
    offset = (lcg(seed ^ np.uint64(LCG_OFFSET_XOR)) % p_chunk.astype(np.uint64)).astype(np.int64)
    p = np.arange(width, dtype=np.int64)[None, :]
    order = (offset[:, None] + (p * (step % p_chunk)[:, None])) % p_chunk[:, None]
    return np.where(p < n_valid[:, None], order, -1)


class StreamService:
    """The interleaved-arrival path of UvmSim (uses its bitmaps, ``_segments``, ``_service_block``, counters)."""

    def _stream_pages(self, kern: StreamKernel) -> tuple[np.ndarray, np.ndarray]:
        """(S, L) global page ids (slot * 512 + page, -1 = none) and is-write flags, in each thread's order."""
        rng = np.random.default_rng(kern.seed)
        stride_pages = max(1, kern.stride_bytes // PAGE_BYTES)
        per_range = []
        orders: dict[tuple[str, int, bytes], np.ndarray] = {}
        perms: dict[tuple[int, int, int], np.ndarray] = {}  # one page order per thread, shared by its ranges
        for a, (range_id, offset, size, is_write) in enumerate(kern.accesses):
            order = kern.access_orders[a] if kern.access_orders else kern.order
            span = self._page_span(int(range_id), int(offset), int(size))
            if span is None:
                continue
            gids = self.page_gids(int(range_id), np.arange(*span, dtype=np.int64))
            given = kern.access_visits[a] if kern.access_visits else None
            if given is not None:  # this access's visits are given (a declared index): no chunking
                v = np.minimum(given, len(gids) - 1)
                per_range.append((np.where(given >= 0, gids[np.maximum(v, 0)], -1), bool(is_write)))
                continue
            if kern.order == "visits":  # the caller placed every visit: no chunking
                if kern.visits.max(initial=-1) >= len(gids):
                    raise InputError(f"visits index a page past the range's {len(gids)} pages")
                per_range.append((np.where(kern.visits >= 0, gids[np.maximum(kern.visits, 0)], -1), bool(is_write)))
                continue
            if order == "shuffled":  # one seeded permutation of the whole range, dealt to the threads in chunks
                key_r = (int(range_id), int(offset), int(size))  # the same permutation for a read and a write
                if key_r not in perms:
                    perms[key_r] = rng.permutation(len(gids))
                gids = gids[perms[key_r]]
            chunk = _chunk_pages(len(gids), kern.n_streams)
            pad = kern.n_streams * chunk - len(gids)
            grid = np.concatenate([gids, np.full(pad, -1, dtype=np.int64)]).reshape(kern.n_streams, chunk)
            grid = grid[:, ::stride_pages]
            if order not in ("sequential", "shuffled"):
                n_valid = (grid >= 0).sum(axis=1)
                key = (order, grid.shape[1], n_valid.tobytes())
                idx = orders.get(key)
                if idx is None:
                    if order == "random":
                        idx = rng.permuted(np.tile(np.arange(grid.shape[1]), (len(grid), 1)), axis=1)
                    else:
                        idx = lcg_page_order(n_valid, grid.shape[1], kern.seed, kern.tid_stride)
                    orders[key] = idx
                grid = np.where(idx >= 0, np.take_along_axis(grid, np.maximum(idx, 0), 1), -1)
            per_range.append((grid, bool(is_write)))
        if not per_range:
            return np.empty((0, 0), dtype=np.int64), np.empty((0, 0), dtype=bool)
        width = max(g.shape[1] for g, _ in per_range)
        cols, wcols = [], []
        for g, w in per_range:
            g = np.pad(g, ((0, 0), (0, width - g.shape[1])), constant_values=-1)
            cols.append(g)
            wcols.append(np.full(g.shape, w))
        pages = np.stack(cols, axis=2).reshape(kern.n_streams, -1)  # step-major: range 0, range 1, ... per step
        writes = np.stack(wcols, axis=2).reshape(kern.n_streams, -1)
        return pages, writes

    def access_streams(self, kern: StreamKernel) -> UvmCounters:
        """Run one stream kernel through the concurrent engine (uvmlab.sim.uvm.concurrent): warps of
        ``warp_size`` threads, at most ``resident`` in flight, ``native_ns`` spread over their accesses; return its
        counters.

        Forward progress (module docstring, "Replays complete lanes one by one"): a lane whose page is resident
        when the driver replays completes its access at the warp's current step and does not need that page
        again, so every batch completes at least the lanes of the block it serviced last; the engine raises
        :class:`~uvmlab.errors.SimulationStalledError` if ``STALL_BATCH_LIMIT`` batches in a row complete nothing.
        With ``native_ns`` > 0 the counters' ``stall_ns`` is the kernel's time beyond its native time (the engine
        overlaps faults with the work of the warps that are not stalled); with 0 it is the sum of the batches.
        """
        pages, writes = self._stream_pages(kern)
        if pages.size == 0:
            return self._flush_kernel_counters(stream=True)
        src = TablePages(pages, writes, int(kern.warp_size))
        resident = min(src.n, -(-int(kern.resident) // int(kern.warp_size))) if kern.resident else src.n
        waves = -(-src.n // resident)
        access_ns = float(kern.native_ns) / (waves * src.steps * int(kern.sub))
        launch = Launch(resident, int(kern.sms), access_ns, int(kern.sub), int(kern.tid_stride), int(kern.seed))
        k = self._k
        before = k.stall_ns
        dur = self.run_walkers(src, launch)  # type: ignore[attr-defined]
        if access_ns > 0:
            k.stall_ns = before + max(0.0, dur - float(kern.native_ns))
        return self._flush_kernel_counters(stream=True)
