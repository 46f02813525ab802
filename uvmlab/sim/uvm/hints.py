"""Per-tensor UVM hints (issue 16): remote access, read duplication, next-kernel prefetch, discard. Torch-free.

Four policies a user applies with a few lines of PyTorch (docs/advise.md), each modelled from the driver
(NVIDIA/open-gpu-kernel-modules 595.45.04, ``kernel-open/nvidia-uvm/``, "[OGKM]") and the CUDA 13 runtime headers:

* **Preferred location CPU + accessed-by GPU** (``UvmKnobs.advise_remote``): ``cudaMemAdvise`` with
  ``cudaMemAdviseSetPreferredLocation`` = CPU and ``cudaMemAdviseSetAccessedBy`` = the GPU on a tensor. The driver
  keeps the pages on the CPU and maps them into the GPU's page tables (``uvm_va_policy.h`` preferred_location /
  accessed_by_mask; ``uvm_va_block.c`` ``block_service_finish_map_accessed_by``), so GPU accesses go over the link
  with no fault and no migration. Model (:meth:`HintService.remote_access`): the bytes a kernel touches cost
  link time (reads and writes in their own direction; the kernel lasts max(native, link time)); pages never
  populated are populated on the CPU by a first-touch fault (charged as a fault batch); the pages take no GPU
  memory and are never evicted.
* **Read-mostly** (``advise_read_mostly``): ``cudaMemAdviseSetReadMostly`` on each advised tensor (its
  allocation's byte range, :attr:`HintPlan.read_mostly_spans`) before the first kernel that touches it, through
  the same ``UvmSim.advise`` a program's ``uvm.advise`` call takes (uvmlab.sim.uvm.advice: read duplicates, the
  write faults on pages the GPU maps read-only, eviction of duplicates without DtoH), so the policy is modelled
  by the rules rq4 validates (docs/uvm-sim.md "cudaMemAdvise"). Before 2026-11-29 it had a model of its own
  (duplicates of the pages a read migrated from the CPU, one collapse per duplicate written), which missed the
  write faults on every step.
* **Prefetch the next kernel's tensors** (``prefetch_next_kernels``, categories ``prefetch_next_categories``):
  ``cudaMemPrefetchAsync`` (``UvmSim.prefetch``, [OGKM] ``uvm_migrate.c``) of kernel i+N's parameters and
  optimizer state, issued while kernel i runs. Its time is hidden behind kernel i's native time; only the excess
  delays kernel i+1 (the replay, :func:`prefetch_rows`).
* **Discard freed blocks** (``discard_min_bytes``): ``cudaMemDiscardBatchAsync(void **dptrs, size_t *sizes, size_t
  count, unsigned long long flags, cudaStream_t stream)`` (CUDA 13.0 ``cuda_runtime_api.h``): "the contents of
  that range are no longer useful"; undone by a write or a prefetch. The driver's ``discarded_pages`` mask
  ([OGKM] ``uvm_va_block.h``; ``uvm_policy.c`` ``uvm_api_discard``) is skipped by eviction copies and cleared on
  migration or eviction; a fully discarded 2 MiB block's root chunk moves to the PMM's DISCARDED list, evicted
  before used chunks (``uvm_pmm_gpu_mark_root_chunk_discarded``). Model (:meth:`HintService.discard`): the whole
  pages of a freed block are marked; evicting them costs no DtoH and leaves them resident nowhere (the next touch
  zero-fills); their CPU copies are dropped; a fully discarded block goes to the front of the eviction order; the
  mark is cleared when the allocator hands the block to a new tensor (which writes it before reading it).

Approximations (docs/advise.md): remote access acts per access of an advised tensor, not per page (a page shared
with an unadvised neighbour can be pulled to the GPU by the neighbour's fault and the tree prefetcher); read
duplication acts per page, as CUDA rounds an advised range out to CPU pages (whichever tensor then reads them); the
advice is issued at the tensor's first kernel (a program issues it once after creating the model); the link
time of remote access is the 2 MiB transfer rate (``CostParams.link_bytes_per_s``), an upper bound for scattered
accesses; the cost of one discard call is :data:`DISCARD_CALL_NS`, not measured.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from uvmlab.sim.uvm.faults import UvmCounters
from uvmlab.sim.uvm.knobs import PAGE_BYTES, PAGES_PER_BIG_PAGE, PAGES_PER_BLOCK, UvmKnobs
from uvmlab.sim.uvm.runs import run_lengths
from uvmlab.sim.uvm.timing import transfer_time_ns
from uvmlab.trace.schema import NEVER_FREED, Trace

DISCARD_CALL_NS = 10_000.0
"""One ``cudaMemDiscardBatchAsync`` call from the allocator's free hook [U: not measured; the same order as
``CostParams.managed_alloc_ns``, one UVM ioctl (UVM_DISCARD, [OGKM] uvm_ioctl.h:1007)]."""

Row = tuple[int, int, int, bool]


def remote_link_ns(read_bytes: float, write_bytes: float, link_bytes_per_s: float) -> float:
    """Link time (ns) of remote accesses (mapped, not migrated): reads and writes each use their own direction of
    the link, at the 2 MiB transfer rate (an upper bound for scattered accesses: module docstring)."""
    return max(read_bytes, write_bytes) / link_bytes_per_s * 1e9


class HintService:
    """The per-tensor hint half of UvmSim (mixed in; uses its bitmaps, per-slot lists, LRM, counters).

    State: ``_dup`` (pages whose CPU copy is still valid: read duplicates) and ``_disc`` (discarded pages), both
    slot x 512 bool like ``_gpu``; ``_hinted`` turns on the eviction rule that consults them (set by the knobs, or by
    the first call that can make such pages: a direct ``discard`` or ``advise`` without the knobs is modelled in full
    too). ``_disc_slots`` holds every slot whose ``_disc`` row may have a page (a superset: a
    speed-up, the rows stay the truth); read duplicates exist only where ``_dups_possible`` says.
    """

    def remote_access(self, rows: list[Row]) -> tuple[UvmCounters, float]:
        """Accesses to tensors advised preferred-location CPU + accessed-by GPU; return (counters, link ns).

        GPU-resident pages are accessed locally; the others over the link (``remote_bytes``); pages resident
        nowhere are first populated on the CPU by a fault (one batch per ``pages_per_batch`` pages).
        """
        k = self._k
        read_b = write_b = 0.0
        first = blocks = first_w = 0
        for range_id, offset, size, is_write in rows:
            segs = self._segments(int(range_id), int(offset), int(size))
            n_all = sum(hi - lo for _, lo, hi in segs)
            n_remote = 0
            for s, lo, hi in segs:
                g = self._gpu[s, lo:hi]
                c = self._cpu[s, lo:hi]
                new = ~(g | c)
                nn = np.count_nonzero(new)
                if nn:
                    fresh = np.zeros(PAGES_PER_BLOCK, dtype=bool)
                    fresh[lo:hi] = new
                    k.stall_ns += self._cpu_alloc_ns(s, fresh=fresh)  # zeroed CPU chunks, mapped for the GPU
                    c |= new
                    self._cpu_count[s] += nn
                    first += nn
                    first_w += nn if is_write else 0
                    blocks += 1
                n_remote += (hi - lo) - np.count_nonzero(g)
            if n_all and n_remote:
                b = int(size) * n_remote / n_all
                if is_write:
                    write_b += b
                else:
                    read_b += b
        if first:
            per = self._per_batch
            nb = -(-first // per)
            raw = min(float(self.knobs.fault_batch_count) * nb, first * self.costs.raw_entries_per_fault)
            k.fault_count += first
            k.write_fault_count += first_w
            k.read_fault_count += first - first_w
            k.fault_batch_count += nb
            k.raw_fault_entries += raw
            k.stall_ns += nb * self.costs.batch_turnaround_ns + raw * self.costs.fault_entry_ns
            k.stall_ns += blocks * self.costs.block_service_ns
        k.remote_bytes += int(read_b + write_b)
        return self._flush_kernel_counters(), remote_link_ns(read_b, write_b, self.costs.link_bytes_per_s)

    def protect(self, rows: list[Row]) -> None:
        """Move the GPU chunks of ``rows`` (the next kernels' accesses) to the most-recently-used end of the
        eviction order, so an eviction takes other data first (``prefetch_protect_next``); no cost, no transfer."""
        lrm, has = self._lrm, self._has_chunk
        for range_id, offset, size, _ in rows:
            for s, _, _ in self._segments(int(range_id), int(offset), int(size)):
                if has[s]:
                    lrm.move_to_end(s)

    def discard(self, range_id: int, offset: int, size: int) -> int:
        """``cudaMemDiscardBatchAsync`` of the whole pages of a byte range; return the pages discarded."""
        p0 = -(-int(offset) // PAGE_BYTES) * PAGE_BYTES
        p1 = (int(offset) + int(size)) // PAGE_BYTES * PAGE_BYTES
        if p1 <= p0:
            return 0
        self._hinted = True  # evictions now consult the discarded pages
        total = 0
        dups = self._dups_possible
        for s, lo, hi in self._segments(int(range_id), p0, p1 - p0):
            self._disc[s, lo:hi] = True
            self._disc_slots.add(s)
            if dups:
                self._dup[s, lo:hi] = False  # discarding breaks read duplication (va_block_discard_locked)
            if self._cpu_count[s]:  # a CPU copy of dead data is never migrated back: the page is resident nowhere
                c = self._cpu[s, lo:hi]
                nc = int(np.count_nonzero(c))
                c[:] = False
                self._cpu_count[s] -= nc
            total += hi - lo
            if self._has_chunk[s] and (hi - lo == self._npages[s] or self._disc[s, : self._npages[s]].all()):
                self._disc_fifo[s] = None  # onto the DISCARDED list's tail (root_chunk_update_eviction_list)
                self._disc_fifo.move_to_end(s)
        return total

    def _pick_discarded(self) -> int | None:
        """The first block on the DISCARDED list that is still fully discarded and holds a chunk, or None.

        The PMM evicts root chunks from its UNUSED, then DISCARDED, then USED list ([OGKM] uvm_pmm_gpu.h:189-200,
        uvm_pmm_gpu.c ``get_first_allocated_chunk``); a block leaves the list when a page is made live again.
        """
        fifo = self._disc_fifo
        while fifo:
            s, _ = fifo.popitem(last=False)
            if self._has_chunk[s] and self._slot_range[s] >= 0 and self._disc[s, : self._npages[s]].all():
                return s
        return None

    def undiscard(self, range_id: int, offset: int, size: int) -> UvmCounters:
        """The allocator hands the block to a new tensor, which writes it: its pages are live again.

        The discard unmapped the GPU's pages (``UVM_DISCARD_FLAGS_UNMAP``: without it a GPU write to a still-mapped
        page would not reach the driver and the page would stay discarded, so the runtime must unmap), so the new
        tensor's first touch of a discarded page still resident on the GPU is a write fault that maps it again
        ([OGKM] ``uvm_va_block.c``: a mapping with write permission clears the discard status): charged as fault
        batches and block services, no transfer, one fault per 64 KiB big page holding such pages (the fault
        granularity grows to whole big pages when nothing thrashes: [OGKM] ``uvm_perf_prefetch.c``
        ``grow_fault_granularity``; an assumption: the remap path was not traced). Returns those counters.
        """
        maybe = self._disc_slots
        segs = [seg for seg in self._segments(int(range_id), int(offset), int(size)) if seg[0] in maybe]
        if segs:  # the blocks that may hold discarded pages, all at once
            rows = np.array([seg[0] for seg in segs], dtype=np.intp)
            cols = np.arange(PAGES_PER_BLOCK)
            win = (cols >= np.array([seg[1] for seg in segs])[:, None]) & (
                cols < np.array([seg[2] for seg in segs])[:, None]
            )
            disc = self._disc[rows]
            live = disc & win & self._gpu[rows]
            per_block = np.count_nonzero(live.reshape(len(segs), -1, PAGES_PER_BIG_PAGE).any(axis=2), axis=1)
            left = disc & ~win
            self._disc[rows] = left
            maybe.difference_update(rows[~left.any(axis=1)].tolist())  # rows now clear
            n = int(per_block.sum())  # one fault per big page
            if n:
                self._charge_write_faults(n, int(np.count_nonzero(per_block)))
        return self._flush_kernel_counters()

    def _charge_write_faults(self, n: int, blocks: int) -> None:
        """``n`` write faults over ``blocks`` VA blocks that move no data (remap / collapse)."""
        k = self._k
        nb = -(-n // self._per_batch)
        raw = min(float(self.knobs.fault_batch_count) * nb, n * self.costs.raw_entries_per_fault)
        k.fault_count += n
        k.write_fault_count += n
        k.fault_batch_count += nb
        k.raw_fault_entries += raw
        k.stall_ns += nb * self.costs.batch_turnaround_ns + raw * self.costs.fault_entry_ns
        k.stall_ns += blocks * self.costs.block_service_ns

    def _evict_hinted(self, v: int, row: np.ndarray) -> tuple[int, int, float]:
        """Eviction of slot ``v`` when hints are on: duplicates and discarded pages are not copied back.

        Returns (pages copied DtoH, DtoH runs, transfer ns); updates the CPU bitmap and the saved-bytes counter.
        """
        n = self._res_count[v]
        disc, dup = self._disc[v], self._dup[v]
        if self._hint_arrays:
            self._after_eviction(v, row & ~disc)  # accessed-by processors map the evicted pages
        if not ((v in self._disc_slots and disc.any()) or (self._dups_possible and dup.any())):  # the plain rule
            self._cpu_count[v] += n
            if n == self._npages[v]:
                self._cpu[v] = row
                return n, 1, self._transfer_ns(n)
            self._cpu[v] |= row
            runs = run_lengths(row)
            return n, len(runs), transfer_time_ns(runs * PAGE_BYTES, self.costs.link_bytes_per_s)
        keep = row & ~disc  # discarded pages end resident nowhere
        wb = keep & ~dup
        n_wb = int(np.count_nonzero(wb))
        self._cpu[v] |= keep
        self._cpu_count[v] += int(np.count_nonzero(keep))
        self._k.writeback_saved_bytes += (n - n_wb) * PAGE_BYTES
        dup[:] = False
        disc &= ~row  # cleared when evicted ([OGKM] uvm_va_block.h discarded_pages)
        if not n_wb:
            return 0, 0, 0.0
        runs = run_lengths(wb)
        return n_wb, len(runs), transfer_time_ns(runs * PAGE_BYTES, self.costs.link_bytes_per_s)

    def check_hint_invariants(self) -> str | None:
        """A broken hint invariant, or None: read duplicates are GPU-resident and only where something makes them;
        every block with a discarded page is in ``_disc_slots``."""
        if not self._hinted:
            return None  # no duplicate or discarded page exists (check_invariants)
        n = self._n_slots
        if (self._dup[:n] & ~self._gpu[:n]).any():
            return "a read duplicate is not GPU-resident"
        if not self._dups_possible and self._dup.any():
            return "a read duplicate exists but nothing makes duplicates (_dups_possible)"
        if not set(np.flatnonzero(self._disc[:n].any(axis=1)).tolist()) <= self._disc_slots:
            return "a block with discarded pages is missing from _disc_slots"
        return None


@dataclass
class HintPlan:
    """What the replay needs to apply the hint knobs to a trace (built once per run by :func:`plan_hints`)."""

    remote_ids: frozenset[int]
    read_mostly_spans: dict[int, tuple[int, int, int]]
    """(range, offset, size) of each read-mostly allocation (by id): the byte range its ``cudaMemAdvise`` covers."""
    prefetch_ids: frozenset[int]
    alloc_seq: dict[int, int]
    events: list[tuple[int, int, int, int, int]]
    """(seq, kind, range_id, offset, size) sorted by seq; kind 0 = undiscard (allocation), 1 = discard (free)."""
    lookahead: int
    protect_next: bool = False
    """Move the blocks of kernels i+1..i+k to the end of the eviction order before kernel i+k's prefetch."""


def plan_hints(trace: Trace, blocks: pd.DataFrame, ranges: pd.DataFrame, knobs: UvmKnobs) -> HintPlan:
    """The advised allocation ids per hint and the discard events of the allocator's blocks."""
    al = trace.allocations
    cat = al.set_index("alloc_id")["category"]

    def ids(name: str) -> frozenset[int]:
        cats = knobs.hint_categories(name)
        return frozenset(int(a) for a in cat.index[cat.isin(cats)]) if cats else frozenset()

    events: list[tuple[int, int, int, int, int]] = []
    if knobs.discard_min_bytes:
        b = blocks[["alloc_id", "range_id", "address", "block_bytes"]].merge(
            al[["alloc_id", "alloc_seq", "free_seq"]], on="alloc_id"
        )
        b = b.merge(ranges[["range_id", "address"]].rename(columns={"address": "range_address"}), on="range_id")
        b = b[b["block_bytes"] >= int(knobs.discard_min_bytes)]
        off = (b["address"] - b["range_address"]).astype(np.int64).tolist()
        rid, size = b["range_id"].astype(np.int64).tolist(), b["block_bytes"].astype(np.int64).tolist()
        for q, f, r, o, z in zip(b["alloc_seq"].tolist(), b["free_seq"].tolist(), rid, off, size, strict=True):
            events.append((int(q), 0, r, o, z))
            if f != NEVER_FREED:
                events.append((int(f), 1, r, o, z))
        events.sort(key=lambda e: (e[0], -e[1]))  # at one seq, a free's discard before an allocation's undiscard
    read_mostly = ids("advise_read_mostly")
    spans: dict[int, tuple[int, int, int]] = {}
    if read_mostly:
        b = blocks[blocks["alloc_id"].isin(read_mostly)][["alloc_id", "range_id", "address"]]
        b = b.merge(ranges[["range_id", "address"]].rename(columns={"address": "range_address"}), on="range_id")
        size = al.set_index("alloc_id")["size_bytes"]
        for a, r, addr, base in b[["alloc_id", "range_id", "address", "range_address"]].itertuples(index=False):
            spans[int(a)] = (int(r), int(addr - base), int(size[a]))
    return HintPlan(
        remote_ids=ids("advise_remote"),
        read_mostly_spans=spans,
        prefetch_ids=ids("prefetch_next_categories") if knobs.prefetch_next_kernels else frozenset(),
        alloc_seq=dict(zip(al["alloc_id"].astype(int).tolist(), al["alloc_seq"].astype(int).tolist(), strict=True)),
        events=events,
        lookahead=int(knobs.prefetch_next_kernels),
        protect_next=bool(knobs.prefetch_protect_next) and bool(knobs.prefetch_next_kernels),
    )


def split_rows(rows: list[Row], ids: list[int], chosen: frozenset[int]) -> tuple[list[Row], list[int], list[Row]]:
    """(rows of allocations not in ``chosen``, their allocation ids, rows of allocations in ``chosen``)."""
    if not chosen:
        return rows, ids, []
    rest, rest_ids, sel = [], [], []
    for r, a in zip(rows, ids, strict=True):
        if a in chosen:
            sel.append(r)
        else:
            rest.append(r)
            rest_ids.append(a)
    return rest, rest_ids, sel


def prefetch_rows(plan: HintPlan, rows: list[Row], ids: list[int], now_seq: int, mapped: set[int]) -> list[Row]:
    """The rows of a later kernel to prefetch now: allocations of the prefetched categories, already allocated,
    not advised remote (a prefetch would migrate them), in a mapped range; one row per (range, offset)."""
    out: dict[tuple[int, int], Row] = {}
    for r, a in zip(rows, ids, strict=True):
        if a in plan.prefetch_ids and a not in plan.remote_ids and r[0] in mapped and plan.alloc_seq[a] < now_seq:
            key = (r[0], r[1])
            if key not in out or out[key][2] < r[2]:
                out[key] = r
    return list(out.values())


__all__ = ["DISCARD_CALL_NS", "HintPlan", "HintService", "plan_hints", "prefetch_rows", "remote_link_ns"]
