"""Fault-batch servicing of the UVM simulator (mixed into :class:`uvmlab.sim.uvm.driver.UvmSim`).

Split from uvm.py to keep modules small. A kernel's missing pages are cut into batches of
``knobs.pages_per_batch`` unique pages (reads before writes); each VA block's share of a batch is serviced by
the tree prefetcher, chunk allocation (eviction) and migration / zero-fill. Blocks with no GPU-resident page
touched over one page interval use a memoized plan (the same rules, computed once per (interval, budget)).
Consecutive such blocks that hold no chunk and are never populated or entirely on the CPU (the blocks of a tensor
that is faulted in whole, the common case under oversubscription) are serviced as one run: the same result as
block by block, their evictions found first and their counters summed (``_apply_plan_run``; the float sums may
differ in their last bits, tests/test_uvm_block_runs.py compares the two).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import numpy as np

from uvmlab.sim.uvm.knobs import PAGE_BYTES, PAGES_PER_BLOCK
from uvmlab.sim.uvm.prefetch import prefetch_pages
from uvmlab.sim.uvm.runs import htod_record_count, run_lengths
from uvmlab.sim.uvm.thrashing import GPU
from uvmlab.sim.uvm.tile_schedule import TileSchedule, block_groups, build_schedule, fetch_batches
from uvmlab.sim.uvm.timing import transfer_time_ns

Stages = list[tuple[np.ndarray, bool]]
"""A kernel's pages in fault order: (global page ids, is_write) per stage (``FaultService.access_in_order``)."""
TILE_SCHEDULE_BYTES = 256 << 20
"""Cost, not physics: the memoized tile schedules' arrays are kept up to this size, then dropped (GPT-2 x4 PCA on
builds 191 schedules; a 5M-node GCN's GEMMs hold about 1 MiB each)."""


@dataclass
class UvmCounters:
    """Event counts of a kernel (or of a whole run). Field names follow uvmlab.stats.schema.FAULT_COLUMNS."""

    fault_count: int = 0
    read_fault_count: int = 0
    write_fault_count: int = 0
    fault_batch_count: int = 0
    htod_count: int = 0
    htod_bytes: int = 0
    dtoh_count: int = 0
    dtoh_bytes: int = 0
    eviction_count: int = 0
    fault_htod_bytes: int = 0
    prefetch_htod_bytes: int = 0
    zero_fill_bytes: int = 0
    htod_records: int = 0
    """UM HtoD migrations as Nsight Systems records them: one per contiguous run *per cause* (the faulted pages and
    the prefetcher's pages of a block are separate copies), e.g. 12 records per sequentially swept 2 MiB block in
    csc746_a100_um_migrations (4 KiB + 60 KiB, 4 KiB + 60 KiB, 4 KiB + 124 KiB, ... 4 KiB + 1020 KiB). ``htod_count``
    counts one per contiguous run."""
    memcpy_htod_count: int = 0
    memcpy_htod_bytes: int = 0
    raw_fault_entries: float = 0.0
    stall_ns: float = 0.0
    """Time the faulting kernel waits for the bottom half (batches, evictions, transfers)."""
    remote_bytes: int = 0
    """Bytes the GPU read or wrote over the link in place (remote mappings, uvmlab.sim.uvm.advice and .hints)."""
    remote_read_bytes: int = 0
    """Of ``remote_bytes``, the bytes the GPU read (the host-to-device direction of the link)."""
    remote_write_bytes: int = 0
    """Of ``remote_bytes``, the bytes the GPU wrote (the device-to-host direction)."""
    cpu_fault_count: int = 0
    """CPU page faults UVM serviced (host reads and writes of managed memory, uvmlab.sim.uvm.host)."""
    collapse_count: int = 0
    """Read-duplicated pages whose other copy a write revoked (uvmlab.sim.uvm.advice, .host)."""
    read_only_write_faults: int = 0
    """GPU write faults on resident pages the GPU maps read-only (read-mostly memory: a duplicate collapsing, or a
    sole copy whose write a prefetch region revoked; uvmlab.sim.uvm.advice): permission faults, nothing moves."""
    writeback_saved_bytes: int = 0
    """GPU-resident bytes evicted without a DtoH copy: read duplicates and discarded pages (uvm_hints)."""
    refetched_chunks: int = 0
    """Chunks a kernel allocated again after evicting them itself earlier in the same kernel (``UvmSim.one_kernel``):
    LRM eviction took blocks it still needed, because its own data does not fit or its blocks are old on the LRM
    list (docs/uvm-sim.md "The regime"; ``uvmlab.uvm.regime``)."""

    def add(self, other: UvmCounters) -> None:
        mine, theirs = self.__dict__, other.__dict__  # a replay adds one kernel's counters per kernel: no fields()
        for name in COUNTER_NAMES:
            mine[name] += theirs[name]

    def as_dict(self) -> dict[str, float]:
        return {name: self.__dict__[name] for name in COUNTER_NAMES}

    def scale(self, factor: int, batches: bool = True) -> None:
        """Multiply every count, byte and time by ``factor`` (a scaled replay, uvmlab.sim.uvm.order); the fault
        batch count too unless ``batches`` is False (a stream kernel's scaled run already counts the real batches:
        each holds ``fault_batch_count / factor`` sampled entries, uvmlab.sim.uvm.streams)."""
        if factor == 1:
            return
        mine = self.__dict__
        for name in COUNTER_NAMES:
            if name != "fault_batch_count" or batches:
                mine[name] *= factor


COUNTER_NAMES: tuple[str, ...] = tuple(f.name for f in fields(UvmCounters))
"""The fields of :class:`UvmCounters`, in order."""


@dataclass
class FaultPlan:
    """How a block with no GPU-resident page gets the pages [lo, hi) (see ``UvmSim._plan``)."""

    n_closes: int  # batches this plan closes
    first_close_faults: int  # the plan's faults up to the first close (joined to the open batch)
    tail_faults: int  # faults after the last close (left in the open batch)
    subs: list[tuple[int, bool, np.ndarray, np.ndarray, np.ndarray]]  # n_faults, closes, migrated, faulted, runs
    steps: list[tuple[int, bool, int]]  # n_faults, closes batch, migrated pages
    union: np.ndarray
    rest: np.ndarray  # valid pages not in union (the CPU bitmap after the plan, for a block fully on the CPU)
    budget_out: int
    n_faults: int
    n_pages: int
    n_runs: int
    n_records: int  # nsys-style HtoD records of the whole plan for a block entirely on the CPU (per cause)
    sub_records: list[int]  # the same per sub (the slow path's full-CPU case)
    htod_ns: float
    zero_stall_ns: float = 0.0  # block services + zero-fill of the whole plan (block never populated)
    htod_stall_ns: float = 0.0  # block services + HtoD transfers of the whole plan (block entirely on the CPU)


def kernel_local(blocks: np.ndarray, gids: np.ndarray) -> np.ndarray:
    """Global page ids as kernel-local ids ``i * 512 + page``, ``i`` the position of the page's slot in ``blocks``
    (the kernel's blocks in order of first touch, each once)."""
    by_slot = np.argsort(blocks, kind="stable")
    idx = by_slot[np.searchsorted(blocks[by_slot], gids // PAGES_PER_BLOCK)]
    return idx * PAGES_PER_BLOCK + gids % PAGES_PER_BLOCK


class FaultService:
    """The batch-servicing half of UvmSim (uses its state: bitmaps, per-slot lists, counters, LRM)."""

    bulk_tile_schedules: ClassVar[bool] = True
    """:meth:`access_in_order` replays memoized schedules where the state allows (tests turn it off to compare)."""
    bulk_block_runs: ClassVar[bool] = True
    """:meth:`_run_stage` services runs of never-touched blocks with :meth:`_apply_plan_run` (tests turn it off to
    compare it with :meth:`_apply_plan` block by block)."""

    def _run_stage(self, touched: dict[int, Any], is_write: bool, marked: bool = False) -> None:
        """Fault in the missing touched pages, ``pages_per_batch`` unique pages per batch, block by block.

        Prefetch decisions are per VA block, so each block's share of a batch is serviced as soon as it is
        known (the batch's other blocks do not change it). Blocks with no GPU-resident page touched over one
        interval use a memoized plan; consecutive such blocks with no chunk are serviced as one run
        (:meth:`_apply_plan_run`). ``marked``: ``touched`` may hold resident marks (uvmlab.sim.uvm.resident).
        """
        res_count, npages, gpu = self._res_count, self._npages, self._gpu
        has_chunk, cpu_count = self._has_chunk, self._cpu_count
        per_batch = self._per_batch
        advised = self._pol_any  # per-slot "has a cudaMemAdvise policy" flags, None when never advised
        tracked = self._thr  # slots under thrashing tracking: the per-page path (uvmlab.sim.uvm.thrashing)
        memo_ok = not self.knobs.prefetch_enable or self.knobs.prefetch_min_faults == 1
        bulk = memo_ok and self.bulk_block_runs and self.events is None
        run: list[tuple[int, int, int]] = []  # pending blocks of the run path, in touch order
        self._open_faults = 0
        self._open_blocks = 0
        self._kind = "write" if is_write else "read"
        budget = per_batch
        for s, span in self._stage_items(touched) if marked else touched.items():
            if has_chunk[s]:  # visiting it ends a pending run (whose evictions may take its pages)
                if run:
                    budget = self._apply_plan_run(run, budget)
                    run = []
                if res_count[s] >= npages[s] and (advised is None or not advised[s]):
                    continue  # resident: nothing to fault (the common case)
            elif (
                bulk  # no chunk, so no page is GPU-resident and no eviction of the run can change it
                and type(span) is tuple
                and (advised is None or not advised[s])
                and (cpu_count[s] == 0 or cpu_count[s] == npages[s])
                and not (tracked and s in tracked)
            ):
                run.append((s, span[0], span[1]))
                continue
            elif run:
                budget = self._apply_plan_run(run, budget)
                run = []
            if advised is not None and advised[s]:  # the policy path (uvmlab.sim.uvm.hints)
                budget = self._policy_stage_block(s, span, is_write, budget)
                continue
            if res_count[s] >= npages[s]:
                continue
            if type(span) is tuple:
                if memo_ok and res_count[s] == 0 and not (tracked and s in tracked):
                    budget = self._apply_plan(s, span[0], span[1], budget)
                    continue
                want = np.zeros(PAGES_PER_BLOCK, dtype=bool)
                want[span[0] : span[1]] = True
            else:
                want = span
            while True:
                idx = np.flatnonzero(want & ~gpu[s])
                if idx.size == 0:
                    break
                take = idx[:budget]
                want[take] = False  # single touch
                faulted = np.zeros(PAGES_PER_BLOCK, dtype=bool)
                faulted[take] = True
                self._service_block(s, faulted)
                budget -= take.size
                if budget > 0:
                    break
                self._close_batch()
                budget = per_batch
        if run:
            self._apply_plan_run(run, budget)
        if self._open_faults:
            self._close_batch()

    def access_in_order(
        self, order: Stages | Callable[[], Stages], blocks: np.ndarray | None = None, key: object = None
    ) -> UvmCounters:
        """Run one kernel whose pages fault in a given order (a tiled GEMM, uvmlab.sim.uvm.tile_order).

        ``order``: the stages, or a function that builds them (called only when they are needed): (global page
        ids ``slot * 512 + page``, each once, in first-request order; is_write), reads
        before writes. Each batch takes the next ``pages_per_batch`` pages of the order that are not GPU-resident
        when the batch is fetched (pages an earlier batch prefetched raise no fault), sorted as the driver sorts a
        batch (by address: here the blocks in the kernel's order of first touch, ``blocks``, else by slot), and
        serviced block by block (prefetcher, chunk, migration) as the address-order model
        services its batches. A host page of ``g`` 4 KiB pages is the unit of faults (its first page stands for it).
        Single touch as in :meth:`access`: a page the kernel already faulted is not faulted again.

        ``blocks`` (the slots of the kernel's VA blocks, each once) and ``key`` (what besides the blocks' state
        decides the batches: the order's plan and the operands' places): with both, a kernel whose blocks are each
        wholly resident or hold no resident page replays a memoized schedule block by block
        (:meth:`_bulk_in_order`, uvmlab.sim.uvm.tile_schedule), with the same counters and state.
        """
        if blocks is not None and key is not None and self.bulk_tile_schedules:
            done = self._bulk_in_order(order, blocks, key)
            if done is not None:
                return done
        stages = order() if callable(order) else order
        flat = self._gpu.reshape(-1)  # a view: it sees each batch's service before the next fetch
        per_batch, g = self._per_batch, self._g
        self._open_faults = 0
        self._open_blocks = 0
        for gids, is_write in stages:
            self._kind = "write" if is_write else "read"
            if g > 1:  # the host page holding each 4 KiB page, each once, in order of first appearance
                hp = gids - gids % g
                _, first = np.unique(hp, return_index=True)
                gids = hp[np.sort(first)]
            # a batch's blocks in the kernel's order (standing for the driver's address order, as ``access`` does)
            sort_key = kernel_local(blocks, gids) if blocks is not None else gids
            for at in fetch_batches(gids, flat, per_batch):
                batch = gids[at[np.argsort(sort_key[at])]]
                for grp in block_groups(batch):
                    s = int(grp[0] // PAGES_PER_BLOCK)
                    faulted = np.zeros(PAGES_PER_BLOCK, dtype=bool)
                    for j in range(g):  # a host page faults as a whole (clipped at the block end)
                        faulted[np.minimum(grp % PAGES_PER_BLOCK + j, self._npages[s] - 1)] = True
                    self._service_block(s, faulted & ~self._gpu[s])
                self._close_batch()
        return self._flush_kernel_counters()

    def _bulk_in_order(
        self, order: Stages | Callable[[], Stages], blocks: np.ndarray, key: object
    ) -> UvmCounters | None:
        """:meth:`access_in_order` from a memoized schedule (uvmlab.sim.uvm.tile_schedule), keyed on ``key`` and the
        blocks' GPU and CPU bitmaps; None when the state does not allow it: a block tracked by the thrashing
        detector or advised; discarded blocks waiting to be evicted first; host pages above 4 KiB; events recorded;
        the prefetcher waiting for several faults; or an eviction this kernel needs would take one of its own
        blocks."""
        knobs = self.knobs
        if self._g > 1 or self.events is not None or self._disc_fifo:  # discarded blocks go first when evicting
            return None
        if knobs.prefetch_enable and knobs.prefetch_min_faults != 1:
            return None
        sl = blocks.tolist()
        if self._thr_last and any(s in self._thr_last for s in sl):
            return None
        if self._pol_any is not None and any(self._pol_any[s] for s in sl):
            return None
        gpu, cpu = self._gpu[blocks], self._cpu[blocks]
        np_arr = np.array([self._npages[s] for s in sl], dtype=np.int64)
        memo_key = (key, np.packbits(gpu).tobytes(), np.packbits(cpu).tobytes(), np_arr.tobytes())
        sched = self._tile_schedules.get(memo_key)
        if sched is None:
            local = [(kernel_local(blocks, gids), w) for gids, w in (order() if callable(order) else order)]
            threshold = int(knobs.prefetch_threshold) if knobs.prefetch_enable else None
            sched = build_schedule(local, gpu, cpu, np_arr, self._per_batch, threshold)
            self._tile_schedule_bytes += sched.nbytes
            if self._tile_schedule_bytes > TILE_SCHEDULE_BYTES:
                self._tile_schedules.clear()
                self._tile_schedule_bytes = sched.nbytes
            self._tile_schedules[memo_key] = sched
        chunk = self._has_chunk
        need = sum(self._chunk_bytes[sl[b.local]] for b in sched.blocks if not chunk[sl[b.local]])
        free = self.capacity_bytes - self.used_bytes
        if need > free:  # the victims: the head of the LRM list, until the new chunks fit
            mine = set(sl)
            for v in self._lrm:
                if free >= need:
                    break
                if v in mine:
                    return None
                free += self._chunk_bytes[v]
        self._apply_schedule(sched, sl)
        return self._flush_kernel_counters()

    def _apply_schedule(self, sched: TileSchedule, slots: list[int]) -> None:
        """Apply a schedule's per-block totals and batches (``_bulk_in_order``; the state checks passed)."""
        k, costs = self._k, self.costs
        for b in sched.blocks:
            s = slots[b.local]
            self._populate(s, b.union, with_runs=False)  # chunk, bitmaps, counts, mappings; transfers: b.runs
            self._fault_migrations[s] += b.faults
            k.htod_records += b.records
            if b.runs.size:
                self._add_htod_runs(b.runs)
            self._account_pages(b.services, b.fault_htod, b.prefetch_htod, b.zero)
        for b in sched.last_order:
            self._lrm.move_to_end(slots[b])
        bf = sched.batch_faults
        raw = np.minimum(float(self.knobs.fault_batch_count), bf * costs.raw_entries_per_fault)
        self._count_batches(int(bf.size), int(bf.sum()), int(bf[sched.batch_writes].sum()), float(raw.sum()))

    def _count_batches(self, batches: int, faults: int, write_faults: int, raw: float) -> None:
        """Count ``batches`` closed fault batches holding ``faults`` faults (``write_faults`` of them writes) and
        ``raw`` fault-buffer entries, and their stall: a turnaround per batch and ``fault_entry_ns`` per entry."""
        k, costs = self._k, self.costs
        k.fault_batch_count += batches
        k.fault_count += faults
        k.write_fault_count += write_faults
        k.read_fault_count += faults - write_faults
        k.raw_fault_entries += raw
        k.stall_ns += batches * costs.batch_turnaround_ns + costs.fault_entry_ns * raw

    def _close_batch(self) -> None:
        n = -(-self._open_faults // self._g)  # faults are host pages; the bitmaps count 4 KiB pages
        raw = min(float(self.knobs.fault_batch_count), n * self.costs.raw_entries_per_fault)
        self._count_batches(1, n, n if self._kind == "write" else 0, raw)
        if self.events is not None:
            self.events.append(("batch", self._kind, n, self._open_blocks))
        self._open_faults = 0
        self._open_blocks = 0

    def _close_full_batches(self, n: int) -> None:
        """Close ``n`` batches of exactly ``pages_per_batch`` faults each (no events: fast path only)."""
        nf = n * (self._per_batch // self._g)
        self._count_batches(n, nf, nf if self._kind == "write" else 0, n * self._full_raw)

    def _account_pages(self, services: int, fault_h: int, pre_h: int, zero: int) -> None:
        """Bytes and stall of ``services`` block services that moved ``fault_h`` faulted and ``pre_h`` prefetched
        pages HtoD and zero-filled ``zero`` pages (their transfers: ``_add_htod_runs``)."""
        k, costs = self._k, self.costs
        k.fault_htod_bytes += fault_h * PAGE_BYTES
        k.prefetch_htod_bytes += pre_h * PAGE_BYTES
        k.zero_fill_bytes += zero * PAGE_BYTES
        k.stall_ns += services * costs.block_service_ns + zero * self._zero_ns_per_page
        k.stall_ns += (fault_h + pre_h) * costs.migrate_page_ns

    def _account_service(self, s: int, n_faults: int, n_mig: int, fault_h: int, pre_h: int, zero: int) -> None:
        self._open_faults += n_faults
        self._open_blocks += 1
        self._account_pages(1, fault_h, pre_h, zero)
        if self.events is not None:
            rid, bidx = self._slot_range[s], self._slot_bidx[s]
            self.events.append(("service", rid, bidx, n_faults, n_mig, fault_h + pre_h, zero))

    def _add_htod_runs(self, runs: np.ndarray, time_ns: float | None = None) -> None:
        k = self._k
        k.htod_count += int(runs.size)
        k.htod_bytes += int(runs.sum()) * PAGE_BYTES
        if time_ns is None:
            time_ns = self._runs_ns(runs)
        k.stall_ns += time_ns

    def _service_block(self, s: int, faulted: np.ndarray) -> None:
        """Service one VA block's faults of a batch: prefetch, chunk (evict), migrate / zero-fill, LRM."""
        knobs = self.knobs
        n_f = np.count_nonzero(faulted)
        if self._thr and s in self._thr:  # throttling / pinning of thrashing pages (uvmlab.sim.uvm.thrashing)
            faulted = self.thr_hint(s, faulted, GPU)
            if not faulted.any():  # every faulted page is mapped remotely: a service with no migration
                self._account_service(s, n_f, 0, 0, 0, 0)
                return
        self._fault_migrations[s] += n_f
        self._ensure_chunk(s)  # may evict (never this block: it is being serviced)
        row = self._gpu[s]
        if knobs.prefetch_enable and self._fault_migrations[s] >= knobs.prefetch_min_faults:
            mask = faulted | prefetch_pages(row, faulted, self._npages[s], knobs.prefetch_threshold)
        else:
            mask = faulted & ~row
        cpu_m = self._cpu[s] & mask
        fault_h = np.count_nonzero(cpu_m & faulted)
        n_h = np.count_nonzero(cpu_m)
        if n_h:
            self._k.htod_records += htod_record_count(cpu_m, faulted)
        zero, runs = self._populate(s, mask)
        if runs.size:
            self._add_htod_runs(runs)
        self._account_service(s, n_f, np.count_nonzero(mask), fault_h, n_h - fault_h, zero)
        self.thr_note_gpu(s, mask)

    def _plan(self, lo: int, hi: int, budget: int, npages: int) -> FaultPlan:
        """The batches that fault in pages [lo, hi) of a block with no GPU-resident page (memoized)."""
        key = (lo, hi, budget, npages)
        hit = self._plans.get(key)
        if hit is not None:
            return hit
        knobs, per_batch = self.knobs, self._per_batch
        res = np.zeros(PAGES_PER_BLOCK, dtype=bool)
        subs = []
        p = lo
        while p < hi:
            idx = np.flatnonzero(~res[p:hi])
            if idx.size == 0:
                break
            take = p + idx[:budget]
            f = np.zeros(PAGES_PER_BLOCK, dtype=bool)
            f[take] = True
            if knobs.prefetch_enable:
                m = f | prefetch_pages(res, f, npages, knobs.prefetch_threshold)
            else:
                m = f
            res |= m
            budget -= take.size
            closes = budget == 0
            if closes:
                budget = per_batch
            subs.append((int(take.size), closes, m, f, run_lengths(m)))
            p = int(take[-1]) + 1
            if not closes:
                break
        recs = [int(run_lengths(x[3]).size + run_lengths(x[2] & ~x[3]).size) for x in subs]
        all_runs = np.concatenate([x[4] for x in subs]) if subs else np.empty(0, dtype=np.int64)
        closes_at = [i for i, x in enumerate(subs) if x[1]]
        first = closes_at[0] if closes_at else -1
        last = closes_at[-1] if closes_at else -1
        plan = FaultPlan(
            n_closes=len(closes_at),
            first_close_faults=sum(x[0] for x in subs[: first + 1]) if closes_at else 0,
            tail_faults=sum(x[0] for x in subs[last + 1 :]),
            subs=subs,
            steps=[(x[0], x[1], np.count_nonzero(x[2])) for x in subs],
            union=res,
            rest=(np.arange(PAGES_PER_BLOCK) < npages) & ~res,
            budget_out=budget,
            n_faults=sum(x[0] for x in subs),
            n_pages=np.count_nonzero(res),
            n_runs=int(all_runs.size),
            n_records=sum(recs),
            sub_records=recs,
            htod_ns=transfer_time_ns(all_runs * PAGE_BYTES, self.costs.link_bytes_per_s),
        )
        services = self.costs.block_service_ns * len(plan.steps)
        plan.zero_stall_ns = services + plan.n_pages * self._zero_ns_per_page
        plan.htod_stall_ns = services + plan.htod_ns + plan.n_pages * self.costs.migrate_page_ns
        self._plans[key] = plan
        return plan

    def _apply_plan_run(self, run: list[tuple[int, int, int]], budget: int) -> int:
        """:meth:`_apply_plan` of consecutive ``(slot, lo, hi)`` blocks that hold no chunk and are never populated
        or entirely on the CPU, with the same result (counters equal up to the order of float additions).

        The blocks' chunks are allocated in their order: the evictions they need are the first chunks of the LRM
        list (the run's blocks join its end), found before anything changes (:meth:`_run_prefix`). A prefix whose
        evictions are all known is committed at once (:meth:`_commit_run`); a run larger than the free memory plus
        every older chunk goes on from there (its first blocks are then the oldest); a block that needs a chunk
        while a discarded chunk waits (the PMM evicts it first) takes ``_apply_plan``.
        """
        plans, npages = self._plans, self._npages
        steps: list[tuple[int, int, int, int, FaultPlan]] = []  # slot, lo, hi, budget in, plan
        b = budget
        for s, lo, hi in run:
            n = npages[s]
            plan = plans.get((lo, hi, b, n)) or self._plan(lo, hi, b, n)
            if plan.subs:
                steps.append((s, lo, hi, b, plan))
                b = plan.budget_out
        self._chunk_runs(
            [st[0] for st in steps],
            lambda i: self._apply_plan(*steps[i][:4]),
            lambda i, j: self._commit_run(steps[i:j]),
        )
        return b

    def _chunk_runs(self, slots: list[int], one: Callable[[int], Any], commit: Callable[[int, int], None]) -> None:
        """Give the blocks ``slots`` (none holds a chunk) their chunks in order, as runs: for each prefix whose
        evictions :meth:`_run_prefix` finds, evict those chunks and ``commit(i, j)`` the blocks ``slots[i:j]``; a
        block that cannot start one (a discarded chunk waits, or nothing is evictable) goes alone through ``one(i)``.
        """
        i = 0
        while i < len(slots):
            j, victims, used, peak = self._run_prefix(slots, i)
            if j == i:  # a discarded chunk waits, or no chunk is evictable (``_ensure_chunk`` raises)
                one(i)
                i += 1
                continue
            if victims and self._hinted:
                for _ in victims:
                    self._evict_one()  # the hinted rule, which picks the same chunks (no discarded chunk waits)
            elif victims:
                self._evict_front(victims)
            self.used_bytes = used
            self.peak_used_bytes = peak
            commit(i, j)
            i = j

    def _run_prefix(self, slots: list[int], i: int) -> tuple[int, list[int], int, int]:
        """From ``slots[i]`` on, the blocks whose chunks the LRM list's current chunks make room for, changing
        nothing: (end of that prefix, the chunks to evict in order, used bytes and high-water mark after it)."""
        chunk = self._chunk_bytes
        cap, used = self.capacity_bytes, self.used_bytes
        peak = self.peak_used_bytes
        older = iter(self._lrm)
        victims: list[int] = []
        waiting = bool(self._disc_fifo)
        for j in range(i, len(slots)):
            need = chunk[slots[j]]
            if cap - used < need:
                n_before, used_before = len(victims), used
                while cap - used < need:
                    v = None if waiting else next(older, None)
                    if v is None:
                        del victims[n_before:]
                        return j, victims, used_before, peak
                    victims.append(v)
                    used -= chunk[v]
            used += need
            if used > peak:
                peak = used
        return len(slots), victims, used, peak

    def _commit_run(self, steps: list[tuple[int, int, int, int, FaultPlan]]) -> None:
        """Service ``steps`` (their chunks are free now): the batch accounting summed, the per-slot state written in
        tight loops, the bitmaps once per plan (a run's blocks share a few plans)."""
        k, costs, g = self._k, self.costs, self._g
        fbc, rpf = float(self.knobs.fault_batch_count), costs.raw_entries_per_fault
        cpu_count, res_count, has_chunk, had_gpu = self._cpu_count, self._res_count, self._has_chunk, self._had_gpu
        open_f, open_b = self._open_faults, self._open_blocks
        n_closes = close_faults = n_full = 0
        close_raw = 0.0
        groups: dict[int, tuple[FaultPlan, list[int], list[int]]] = {}  # id(plan): plan, new slots, CPU-resident
        lrm = self._lrm
        first_gpu_ns = 0.0
        evicted_in, serial, refetched = self._evicted_in, self._serial, 0
        for s, _, _, _, plan in steps:  # the batches, in order; the chunks join the LRM list's end in touch order
            if plan.n_closes:
                n = -(-(open_f + plan.first_close_faults) // g)
                n_closes += 1
                close_faults += n
                raw = n * rpf
                close_raw += fbc if fbc <= raw else raw  # min(fbc, raw) without the call
                n_full += plan.n_closes - 1
                open_f = plan.tail_faults
                open_b = 1
            else:
                open_f += plan.n_faults
                open_b += 1
            e = groups.get(id(plan))
            if e is None:
                e = groups[id(plan)] = (plan, [], [])
            e[2 if cpu_count[s] else 1].append(s)
            lrm[s] = None  # none is on it (one assignment each: OrderedDict.update is slower)
            has_chunk[s] = True
            if evicted_in[s] == serial:
                refetched += 1
            if not had_gpu[s]:
                had_gpu[s] = True
                first_gpu_ns += self._first_gpu_ns(s)
        self._open_faults, self._open_blocks = open_f, open_b
        stall = 0.0
        zero_pages = htod_runs = htod_recs = htod_pages = fault_h = 0
        for plan, new, on_cpu in groups.values():
            n_pages = plan.n_pages
            if new:
                zero_pages += len(new) * n_pages
                stall += len(new) * plan.zero_stall_ns
                for s in new:
                    res_count[s] = n_pages
            if on_cpu:
                m = len(on_cpu)
                htod_runs += m * plan.n_runs
                htod_recs += m * plan.n_records
                htod_pages += m * n_pages
                fault_h += m * plan.n_faults
                stall += m * plan.htod_stall_ns
                for s in on_cpu:
                    res_count[s] = n_pages
                    cpu_count[s] -= n_pages  # entirely on the CPU before: what the plan did not move stays
                self._cpu[on_cpu] = plan.rest
            rows = np.array(new + on_cpu, dtype=np.intp)
            self._gpu[rows] = plan.union
            if self._hint_arrays:  # no policy bit (the caller checks): _after_gpu_populate's unmapping
                self.unmap_cpu(rows, plan.union)
            if self._thr_last:
                for s in new + on_cpu:
                    self.thr_note_gpu(s, plan.union)
        self.populated_gpu_bytes += (zero_pages + htod_pages) * PAGE_BYTES
        nf = close_faults + n_full * (self._per_batch // g)
        self._count_batches(
            n_closes + n_full, nf, nf if self._kind == "write" else 0, close_raw + n_full * self._full_raw
        )
        k.zero_fill_bytes += zero_pages * PAGE_BYTES
        k.htod_count += htod_runs
        k.htod_records += htod_recs
        k.htod_bytes += htod_pages * PAGE_BYTES
        k.fault_htod_bytes += fault_h * PAGE_BYTES
        k.prefetch_htod_bytes += (htod_pages - fault_h) * PAGE_BYTES
        k.refetched_chunks += refetched
        k.stall_ns += stall + first_gpu_ns

    def _apply_plan(self, s: int, lo: int, hi: int, budget: int) -> int:
        npages = self._npages[s]
        plan = self._plans.get((lo, hi, budget, npages)) or self._plan(lo, hi, budget, npages)
        if not plan.subs:
            return budget
        n_cpu = self._cpu_count[s]
        full_cpu = n_cpu == npages
        if not self._has_chunk[s]:
            self._ensure_chunk(s)
        if self.events is None and (n_cpu == 0 or full_cpu):
            # fast cases: never populated (all zero-fill) or entirely on the CPU (all HtoD)
            k = self._k
            if plan.n_closes == 0:
                self._open_faults += plan.n_faults
            else:
                self._open_faults += plan.first_close_faults
                self._close_batch()
                if plan.n_closes > 1:
                    self._close_full_batches(plan.n_closes - 1)
                self._open_faults = plan.tail_faults
            self._open_blocks += 1
            if n_cpu == 0:
                k.zero_fill_bytes += plan.n_pages * PAGE_BYTES
                k.stall_ns += plan.zero_stall_ns
            else:
                k.htod_count += plan.n_runs
                k.htod_records += plan.n_records
                k.htod_bytes += plan.n_pages * PAGE_BYTES
                k.fault_htod_bytes += plan.n_faults * PAGE_BYTES
                k.prefetch_htod_bytes += (plan.n_pages - plan.n_faults) * PAGE_BYTES
                k.stall_ns += plan.htod_stall_ns
        else:
            for (n_f, closes, mask, faulted, runs), n_rec in zip(plan.subs, plan.sub_records, strict=True):
                n_m = int(runs.sum())
                if n_cpu == 0:
                    self._account_service(s, n_f, n_m, 0, 0, n_m)
                elif full_cpu:
                    self._add_htod_runs(runs)
                    self._k.htod_records += n_rec
                    self._account_service(s, n_f, n_m, n_f, n_m - n_f, 0)
                else:
                    h = self._cpu[s] & mask
                    fh = np.count_nonzero(h & faulted)
                    nh = np.count_nonzero(h)
                    if nh:
                        self._add_htod_runs(run_lengths(h))
                        self._k.htod_records += htod_record_count(h, faulted)
                    self._account_service(s, n_f, n_m, fh, nh - fh, n_m - nh)
                if closes:
                    self._close_batch()
        self._gpu[s] = plan.union
        if self._hint_arrays:  # no policy bit (the caller checks): _after_gpu_populate's unmapping
            self.unmap_cpu(s, plan.union)
        if n_cpu:
            if full_cpu:
                self._cpu[s] = plan.rest
                self._cpu_count[s] = npages - plan.n_pages
            else:
                cpu_row = self._cpu[s]
                cpu_row &= ~plan.union
                self._cpu_count[s] = np.count_nonzero(cpu_row)
        self._res_count[s] = plan.n_pages
        self._lrm.move_to_end(s)
        self.populated_gpu_bytes += plan.n_pages * PAGE_BYTES
        self.thr_note_gpu(s, plan.union)
        return plan.budget_out
