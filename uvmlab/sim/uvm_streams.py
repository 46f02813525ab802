"""Kernels whose threads each walk their own share of memory: interleaved fault arrival (mixed into UvmSim).

A CUDA kernel's warps run together. When every thread scans its own contiguous chunk (uvmbench's
``seq_chunk_kernel`` / ``rand_chunk_kernel``, eunomia-bpf/gpu_ext ``microbench/memory/kernels/synthetic.cuh``),
the faults that reach the driver at any moment come from *all* the chunks at once, one page per stalled thread,
not from one block after the other in address order. This module models that:

* A :class:`StreamKernel` cuts each of its byte ranges into ``n_streams`` page-aligned chunks; stream ``i`` visits
  chunk ``i`` of every range in step (``input[i]`` then ``output[i]``), touching one page every ``stride_bytes``
  (page-strided views are charged by the pages they touch, not by their byte span). ``order`` is a property of
  the kernel: ``sequential`` (ascending pages) or ``random`` (a per-stream permutation of its pages).
* Threads whose next page is resident run on at no cost (their time is the kernel's native time); a thread whose
  page is missing stalls and has exactly one fault outstanding.
* The driver fetches up to ``fault_batch_count`` (256) entries per batch (uvm.md 1.4,
  ``uvm_gpu_replayable_faults.c`` ``fetch_fault_buffer_entries``): the stalled threads' pages, distinct because
  the chunks are disjoint, so a batch fills with distinct pages (no duplicates, one raw entry per fault). Which
  stalled threads make it into a batch rotates (the fault buffer is a ring; BATCH_FLUSH discards the rest, which
  refault after the replay). The batch's pages are serviced per VA block as in :mod:`uvmlab.sim.uvm_faults`
  (prefetcher, chunk allocation with LRM eviction, migration / zero-fill), then the threads resume.

The consequence the address-order model missed: at an oversubscription factor near 1, the warps of resident
blocks finish their chunks while the faulting ones wait, so the least-recently-migrated chunks evicted for the
faulting blocks belong to threads that are already done; only the overflow migrates each pass, and the jump from
1.0x to 1.25x appears (tests/test_uvm_streams.py, uvmlab/validate/uvm_checks.py).

Approximations: no arrival times (all stalled threads are candidates for every batch); a thread's read and the
dependent write are separate steps; thrashing mitigation is not triggered (its detector ignores eviction-caused
migrations, ``uvm_perf_thrashing.c`` ``thrashing_event_cb``, uvm.md 1.7).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from uvmlab.errors import InputError
from uvmlab.sim.uvm_faults import UvmCounters
from uvmlab.sim.uvm_knobs import PAGE_BYTES, PAGES_PER_BLOCK

ORDERS = ("sequential", "random")


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

    def __post_init__(self) -> None:
        if self.order not in ORDERS:
            raise InputError(f"access order must be one of {ORDERS}, not {self.order!r}")
        if self.n_streams < 1 or self.stride_bytes < 1:
            raise InputError("a stream kernel needs n_streams >= 1 and stride_bytes >= 1")


def _chunk_pages(n_pages: int, n_streams: int) -> int:
    """Pages per thread chunk (the chunk rounded up to whole pages, as synthetic.cuh does)."""
    return max(1, -(-n_pages // n_streams))


class StreamService:
    """The interleaved-arrival path of UvmSim (uses its bitmaps, ``_segments``, ``_service_block``, counters)."""

    def _stream_pages(self, kern: StreamKernel) -> tuple[np.ndarray, np.ndarray]:
        """(S, L) global page ids (slot * 512 + page, -1 = none) and is-write flags, in each thread's order."""
        rng = np.random.default_rng(kern.seed)
        stride_pages = max(1, kern.stride_bytes // PAGE_BYTES)
        per_range = []
        for range_id, offset, size, is_write in kern.accesses:
            segs = self._segments(int(range_id), int(offset), int(size))
            if not segs:
                continue
            gids = np.concatenate([s * PAGES_PER_BLOCK + np.arange(lo, hi) for s, lo, hi in segs])
            chunk = _chunk_pages(len(gids), kern.n_streams)
            pad = kern.n_streams * chunk - len(gids)
            grid = np.concatenate([gids, np.full(pad, -1, dtype=np.int64)]).reshape(kern.n_streams, chunk)
            grid = grid[:, ::stride_pages]
            if kern.order == "random":
                grid = np.take_along_axis(
                    grid, rng.permuted(np.tile(np.arange(grid.shape[1]), (len(grid), 1)), axis=1), 1
                )
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
        """Run one stream kernel (module docstring); return its counters."""
        pages, writes = self._stream_pages(kern)
        if pages.size == 0:
            return self._flush_kernel_counters()
        n_s, length = pages.shape
        valid = pages >= 0
        safe = np.where(valid, pages, 0)
        pos = np.zeros(n_s, dtype=np.int64)
        cols = np.arange(length)[None, :]
        per_batch = int(self.knobs.fault_batch_count)
        rotate = 0
        k = self._k
        while True:
            res = self._gpu.reshape(-1)[safe] | ~valid
            blocked = ~res & (cols >= pos[:, None])
            has = blocked.any(axis=1)
            if not has.any():
                break
            first = blocked.argmax(axis=1)
            pos = np.where(has, first, length)
            stalled = np.flatnonzero(has)
            take = (
                stalled[:per_batch]
                if self.knobs.stream_priority == "lowest"
                else np.roll(stalled, -(rotate % len(stalled)))[:per_batch]
            )
            rotate += len(take)
            gid = pages[take, first[take]]
            is_w = writes[take, first[take]]
            slots = gid // PAGES_PER_BLOCK
            order = np.argsort(slots, kind="stable")  # the driver sorts a batch by address (uvm.md 1.4)
            slots, gid, is_w = slots[order], gid[order], is_w[order]
            bounds = np.flatnonzero(np.diff(slots)) + 1
            for grp in np.split(np.arange(len(slots)), bounds):
                s = int(slots[grp[0]])
                faulted = np.zeros(PAGES_PER_BLOCK, dtype=bool)
                faulted[gid[grp] - s * PAGES_PER_BLOCK] = True
                self._service_block(s, faulted)
            n_w = int(is_w.sum())
            n = len(gid)
            k.fault_batch_count += 1
            k.fault_count += n
            k.write_fault_count += n_w
            k.read_fault_count += n - n_w
            k.raw_fault_entries += n
            k.stall_ns += self.costs.batch_turnaround_ns + self.costs.fault_entry_ns * n
            self._open_faults = 0
            self._open_blocks = 0
        return self._flush_kernel_counters()
