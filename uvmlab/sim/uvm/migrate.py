"""``cudaMemPrefetchAsync`` to the GPU (uvm.md 1.9, ``uvm_migrate.c``), mixed into
:class:`uvmlab.sim.uvm.driver.UvmSim`.

Whole blocks with no GPU-resident page and no cudaMemAdvise policy, never populated or entirely on the CPU (a
prefetched new allocation, a tensor evicted whole) need no bitmap intersection (``_prefetch_whole_block``), and
consecutive such blocks are serviced as one run (``_prefetch_run``): their evictions found first
(``FaultService._run_prefix``), the per-slot state written in one loop, the bitmaps in array operations, the counters
summed. The same result as block by block, up to the order of float additions (tests/test_uvm_block_runs.py and
tests/test_uvm_rules.py compare them).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from uvmlab.sim.uvm.faults import UvmCounters
from uvmlab.sim.uvm.knobs import PAGE_BYTES, PAGES_PER_BLOCK


class MigrateService:
    """The prefetch half of UvmSim (uses its state: bitmaps, per-slot lists, counters, LRM)."""

    whole_block_fast_path: ClassVar[bool] = True
    """:meth:`prefetch` takes :meth:`_prefetch_whole_block` / :meth:`_prefetch_run` where they apply (tests turn
    it off to compare)."""

    def prefetch(self, range_id: int, offset: int, size: int, to_cpu: bool = False) -> UvmCounters:
        """``cudaMemPrefetchAsync`` of a byte range to the GPU (uvm.md 1.9, ``uvm_migrate.c``, cause API_MIGRATE).

        Every block of the range gets its chunk (evicting other managed data if needed) and all its pages become
        GPU-resident: CPU-resident pages move HtoD in one transfer per contiguous run (counted as prefetch
        migrations), never-populated pages are zero-filled. No replayable faults and no fault batches; each block
        pays ``block_service_ns``, and a block's first chunk since its range was created pays
        ``prefetch_first_block_ns`` instead of the fault path's ``block_first_gpu_ns`` (which includes the
        invalid-PDE fault round trips of the Titan V log's first-touch batches). The RTX 5090 profile fits
        ``prefetch_first_block_ns`` on a fit point of the RTX 5090 profile (docs/uvm-sim.md "Cost profiles"). Pages of
        a read-mostly range become read duplicates (``uvm_migrate.c`` ``uvm_va_block_migrate_locked``: the CPU keeps
        its copy), and the GPU's own copies there lose their write permission (``uvm_va_block_make_resident_read_
        duplicate`` revokes it; ``uvm_va_block_migrate_map_mapped_pages`` maps only pages the GPU does not map yet,
        so it stays read-only: uvmlab.sim.uvm.advice, "Read-only sole copies"); never-populated pages are mapped
        read-write (``block_migrate_map_unmapped_pages``). ``to_cpu``: prefetch to the CPU instead
        (``uvmlab.sim.uvm.host``).
        """
        if to_cpu:
            return self.prefetch_to_cpu(range_id, offset, size)
        k = self._k
        run: list[int] = []  # whole blocks for the run path, in address order
        bulk = self.whole_block_fast_path and self.bulk_block_runs and self.events is None
        for s, lo, hi in self._segments(range_id, offset, size):
            if self._thr and s in self._thr:  # a user migration resets the pages' thrashing tracking
                m = np.zeros(PAGES_PER_BLOCK, dtype=bool)
                m[lo:hi] = True
                self.thr_reset(s, m)
            if self._whole_block(s, lo, hi):
                if bulk:  # it holds no chunk, so nothing the run evicts can change it
                    run.append(s)
                else:
                    self._prefetch_whole_block(s)
                continue
            if run:  # before this block's state is read: the run's evictions may take it
                self._prefetch_run(run)
                run = []
                if self._whole_block(s, lo, hi):  # evicted by the run just serviced
                    self._prefetch_whole_block(s)
                    continue
            if self._hint_arrays:  # entering read duplication revokes the GPU's write on its own copies
                self._gro[s, lo:hi] |= self._rm[s, lo:hi] & self._gpu[s, lo:hi] & ~self._dup[s, lo:hi]
            if self._res_count[s] >= self._npages[s]:
                continue  # every page resident already
            mask = np.zeros(PAGES_PER_BLOCK, dtype=bool)
            mask[lo:hi] = True
            mask &= ~self._gpu[s]
            if not mask.any():
                continue
            dup = mask & self._rm[s] & self._cpu[s] if self._hint_arrays else None  # read-mostly: duplicated
            keep_cmap = self._cmap[s] & dup if dup is not None else None
            zero, runs = self._populate(s, mask, fault_path=False)
            if dup is not None and dup.any():
                self._dup[s] |= dup
                self._cmap[s] |= keep_cmap
            if runs.size:
                self._add_htod_runs(runs)
                k.htod_records += runs.size
                k.prefetch_htod_bytes += int(runs.sum()) * PAGE_BYTES
            k.zero_fill_bytes += zero * PAGE_BYTES
            k.stall_ns += self.costs.block_service_ns + zero * self._zero_ns_per_page
        if run:
            self._prefetch_run(run)
        return self._flush_kernel_counters()

    def _whole_block(self, s: int, lo: int, hi: int) -> bool:
        """Pages [lo, hi) are all of block ``s``, which has no GPU-resident page and no policy and is never
        populated or entirely on the CPU (so :meth:`_prefetch_whole_block` applies)."""
        npages = self._npages[s]
        return (
            self.whole_block_fast_path
            and lo == 0
            and hi == npages
            and self._res_count[s] == 0
            and self._cpu_count[s] in (0, npages)
            and (not self._hint_arrays or not self._pol_any[s])
        )

    def _prefetch_whole_block(self, s: int) -> None:
        """:meth:`prefetch` of one block that :meth:`_whole_block` accepts, without bitmaps to intersect: its chunk
        (evicting if needed), then the run path's commit (the same state changes and counters as the general loop,
        up to the order of float additions; the tests compare both). A prefetched new allocation takes this path."""
        self._ensure_chunk(s, fault_path=False)  # pays the first chunk's cost; the commit then finds had_gpu set
        self._commit_prefetch([s])

    def _prefetch_run(self, run: list[int]) -> None:
        """:meth:`_prefetch_whole_block` of consecutive whole blocks (module docstring), as one run."""
        self._chunk_runs(
            run, lambda i: self._prefetch_whole_block(run[i]), lambda i, j: self._commit_prefetch(run[i:j])
        )

    def _commit_prefetch(self, slots: list[int]) -> None:
        """Prefetch the whole blocks ``slots``, whose chunks are free (or, one block, just taken and last on the LRM
        list): per-slot state, bitmaps, counters."""
        k = self._k
        npages, cpu_count, res_count, has_chunk, had_gpu = (
            self._npages,
            self._cpu_count,
            self._res_count,
            self._has_chunk,
            self._had_gpu,
        )
        pages = h_blocks = h_pages = 0
        first_ns = 0.0
        t_h = 0.0
        full: list[int] = []
        tail: list[int] = []
        on_cpu: list[int] = []
        lrm = self._lrm
        evicted_in, serial, refetched = self._evicted_in, self._serial, 0
        for s in slots:
            lrm[s] = None  # joins the LRM list's end in address order, or stays there (one is just taken)
            n = npages[s]
            if not had_gpu[s]:
                had_gpu[s] = True
                first_ns += self._first_gpu_ns(s, fault_path=False)
            if not has_chunk[s] and evicted_in[s] == serial:  # a chunk just taken counted it (``_ensure_chunk``)
                refetched += 1
            has_chunk[s] = True
            res_count[s] = n
            n_h = cpu_count[s]
            if n_h:
                cpu_count[s] = 0
                h_blocks += 1
                h_pages += n_h
                t_h += self._transfer_ns(n_h)
                on_cpu.append(s)
            pages += n
            (full if n == PAGES_PER_BLOCK else tail).append(s)
        self._gpu[full] = True
        for s in tail:
            self._gpu[s, : npages[s]] = True
        if on_cpu:
            self._cpu[on_cpu] = False  # entirely on the CPU before (nothing past a block's pages is ever set)
        if self._hint_arrays:  # no policy bit on the blocks (the caller checks): _after_gpu_populate's unmapping
            self._gmap[full] = False
            self.unmap_cpu(full, True)
            for s in tail:
                self._gmap[s, : npages[s]] = False
                self.unmap_cpu(s, np.arange(PAGES_PER_BLOCK) < npages[s])
        self.populated_gpu_bytes += pages * PAGE_BYTES
        zero = pages - h_pages
        costs = self.costs
        k.htod_count += h_blocks
        k.htod_records += h_blocks
        k.htod_bytes += h_pages * PAGE_BYTES
        k.prefetch_htod_bytes += h_pages * PAGE_BYTES
        k.zero_fill_bytes += zero * PAGE_BYTES
        k.refetched_chunks += refetched
        k.stall_ns += t_h + len(slots) * costs.block_service_ns + zero * self._zero_ns_per_page + first_ns


__all__ = ["MigrateService"]
