"""Occupancy-bounded concurrent kernels: every resident walker in flight at once (mixed into UvmSim). Torch-free.

A GPU keeps every resident warp of a kernel in flight (SMs x resident warps per SM, bounded by the blocks the
kernel launches and their resources: ``uvmlab.sim.uvm.occupancy``). Each warp stalls on its own faults while the
others run; the faults of all stalled warps fill the driver's batches; LRM eviction of 2 MiB root chunks can take
chunks that other in-flight warps still need, so they fault again. This module is that model, for every kernel
whose concurrent working set (its *window*) decides the fault pattern: declared program kernels
(``uvmlab.sim.uvm.streams``), traced torch ops whose window does not fit (``occupancy.launches_of``: foreach
launches, GEMM tiles, strided elementwise fronts).

**Walkers.** A kernel is ``n`` walkers (a warp, or a CTA whose threads synchronise every step, e.g. a GEMM's
k-loop) launched in index order; at most ``resident`` run at once, one per *slot*; slot ``r`` is on SM ``r % sms``
and a retiring walker's slot takes the next walker (the block scheduler hands a freed SM the next block). A walker
walks ``steps`` unit steps; at step ``u`` its ``lanes`` lanes touch the pages ``pages(walker, u)`` (-1: none). A
unit step is ``sub`` real accesses of each lane to the same page (e.g. a thread reading a row 4 B at a time: 1024
accesses per 4 KiB page), so a lane needs its page for the whole unit step.

**Time.** Each access of a walker takes ``access_ns`` (the kernel's native time spread over its waves, steps and
accesses: all resident walkers run concurrently). A round is one fault batch: its service time (turnaround,
entries, block services, transfers, evictions: ``FaultService`` and the cost model) passes for every walker, and
the walkers not stalled advance through steps whose pages are resident during it (``access_ns`` 0: unbounded, the
model before issue 41). When no walker is stalled the clock jumps to the next stall or retirement. The kernel lasts
until its last walker retires: its native time when nothing faults, overlapping faults with the work of the
walkers that are not stalled otherwise.

**Faults.** A walker whose current page is missing stalls and raises one entry per missing page: the uTLB of its SM
merges the misses of its walkers on one page ("Within a uTLB, entries with the same address are merged",
reference/uvm.md 1.4), walkers on other SMs raise their own. The next batch takes up to ``fault_batch_count``
entries (``/ tid_stride`` in a scaled replay) in the arrival order of ``UvmKnobs.stream_priority`` (``lowest``:
the lowest walker ids, the oldest warps, first; ``sm``: each SM's walkers oldest first, the SMs interleaved entry by
entry; ``rotate``; ``random``), serviced per VA block (prefetcher, chunk, LRM eviction, migration:
``FaultService._service_block``); entries of one page from several SMs are duplicates (counted in
``raw_fault_entries``, serviced once).

**Replay: forward progress.** The replay retries every faulting access (``UVM_FAULT_REPLAY_TYPE_START``,
``uvm_hal_types.h``): a lane whose page is resident then completes its access, so a walker whose lanes have all
completed their current access advances by one access, even if its pages were never all resident together.
Within a unit step of several accesses the lanes need their pages again at the next access: a lane whose page
was evicted meanwhile faults again. That is the cascade: when the window of all in-flight walkers exceeds the GPU,
LRM evicts chunks that walkers still need, and a page can fault many times within one kernel.

**Thrashing mitigation does not act on it**: ``thrashing_event_cb`` (``uvm_perf_thrashing.c``, 595.45.04) returns at
once for eviction-caused migrations, and it creates per-page tracking for a block only when the block's previous
migration went to a different processor within the lapse; with one GPU, the GPU faults only ever migrate pages to
the GPU (``uvmlab.sim.uvm.thrashing`` models where it does act: CPU-GPU ping-pong).

**Steady state** (``UvmKnobs.cascade_steady``): a cascade is 1e7-1e8 faults of rounds that repeat. Every
:data:`STEADY_WINDOW` rounds the engine compares the last three windows: their rates (lane accesses completed, time,
faults, bytes, evictions per round) must agree within :data:`STEADY_TOLERANCE`, the GPU must be full at each
window's end (no filling phase), the resident share of a seeded sample of the pages the rest of the launch will touch
must stay within :data:`STEADY_AHEAD_DRIFT` (what was run was as resident as what is left), and at least
:data:`STEADY_MIN_LEFT` windows of work must remain. Then the rest of the launch is extrapolated at their mean rate
(every counter and the time), the walkers are retired and the GPU state is left as it was at that point (a cascade's
resident chunks are the most recently migrated ones; the next kernel sees those of that point, not of the end: an
approximation of the end state). The error is measured against the full simulation in
tests/test_uvm_concurrent.py and benchmarks/uvm_cascade_speed.py (docs/uvm-sim.md).

Approximations (docs/uvm-sim.md "Concurrent kernels"): the evictions of a batch are applied before the walkers'
concurrent progress during it is checked; the pages a batch brings are usable for that progress (the driver replays
at the end of the batch); a walker's lanes move together (a warp in lockstep; a CTA between barriers); a unit step's
pages are taken at its first access.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from uvmlab.errors import SimulationStalledError
from uvmlab.sim.uvm.faults import COUNTER_NAMES, UvmCounters
from uvmlab.sim.uvm.knobs import PAGE_BYTES, PAGES_PER_BLOCK, VA_BLOCK_BYTES

SCAN_WINDOW = 16
"""Unit steps a walker's first look-ahead covers (it doubles each round): a cost knob; the result does not
depend on it."""
STALL_BATCH_LIMIT = 64
"""Fault batches in a row that complete no lane before the engine gives up (a uvmlab bug, never a workload's)."""
# [U] STEADY_WINDOW .. STEADY_SAMPLE: no source fixes them; chosen on the cascades of tests/test_uvm_concurrent.py and
# benchmarks/uvm_cascade_speed.py, where the extrapolation is within 1.2 % of the full simulation.
STEADY_WINDOW = 128
"""Rounds per window of the steady-state test (three windows in a row must agree: no launch of fewer than 384
rounds, about 100,000 faults, is ever extrapolated)."""
STEADY_TOLERANCE = 0.03
"""Largest spread (relative to the largest) of three windows' per-round rates that counts as a steady state."""
STEADY_MIN_LEFT = 16
"""Extrapolate only when at least this many windows' worth of work remains (else simulate to the end)."""
STEADY_AHEAD_DRIFT = 0.03
"""Largest change of the resident share of the pages ahead over the last three window ends: a constant share means
the part of the launch already run was as resident as the rest (residency changing only by the launch's own work)."""
STEADY_FREE_CHUNKS = 4
"""A steady state needs the GPU full: at most this many 2 MiB chunks free at each window's end."""
STEADY_SAMPLE = 2048
"""Walker steps sampled to measure that share."""
STEADY_RATES = ("fault_count", "htod_bytes", "dtoh_bytes", "eviction_count")
"""Counters whose per-round rates must agree between windows for a steady state (besides the accesses completed
and the time)."""


class WalkerPages(Protocol):
    """The pages each walker's lanes touch, unit step by unit step."""

    n: int
    """Walkers of the launch."""
    lanes: int
    steps: int
    """Unit steps of every walker."""

    def pages(self, walkers: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """(len(walkers), lanes, steps.shape[1]) global page ids (slot * 512 + page; -1 none); ``steps`` is
        (len(walkers), k), each in [0, steps)."""
        ...

    def writes(self, walkers: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """Is-write flags of the same shape (the fault's access type)."""
        ...


@dataclass
class TablePages:
    """Walkers of ``lanes`` consecutive rows of a (threads, steps) page table (a warp of threads)."""

    table: np.ndarray
    """(threads, steps) global page ids, -1 none (rows padded to a multiple of ``lanes`` here)."""
    is_write: np.ndarray
    lanes: int
    n: int = field(init=False)
    steps: int = field(init=False)

    def __post_init__(self) -> None:
        rows, self.steps = self.table.shape
        self.n = -(-rows // self.lanes)
        pad = self.n * self.lanes - rows
        if pad:  # a last, partial warp: its missing lanes never fault
            self.table = np.pad(self.table, ((0, pad), (0, 0)), constant_values=-1)
            self.is_write = np.pad(self.is_write, ((0, pad), (0, 0)))
        self._lane = np.arange(self.lanes)

    def _index(self, walkers: np.ndarray, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rows = (walkers[:, None] * self.lanes + self._lane[None, :])[:, :, None]
        return rows, steps[:, None, :]

    def pages(self, walkers: np.ndarray, steps: np.ndarray) -> np.ndarray:
        return self.table[self._index(walkers, steps)]

    def writes(self, walkers: np.ndarray, steps: np.ndarray) -> np.ndarray:
        return self.is_write[self._index(walkers, steps)]


@dataclass
class AffinePages:
    """Walkers whose lanes each move through memory by a fixed stride per unit step: lane j of walker w touches byte
    ``base[w, j] + u * step[j]`` of its range at unit step u while that is below ``end[w, j]`` (a foreach block's
    chunk, a GEMM CTA's panel rows; uvmlab.sim.uvm.occupancy). Bytes are offsets in the lane's managed range; its
    pages map to global page ids through ``flat[rstart[w, j] + byte // 4096]`` (the ranges' page tables end to
    end)."""

    base: np.ndarray  # (n, lanes) int64
    end: np.ndarray  # (n, lanes) int64
    step: np.ndarray  # (lanes,) int64
    rstart: np.ndarray  # (n, lanes) int64
    flat: np.ndarray  # int64 global page ids
    is_write: np.ndarray  # (lanes,) bool
    steps: int
    n: int = field(init=False)
    lanes: int = field(init=False)

    def __post_init__(self) -> None:
        self.n, self.lanes = self.base.shape

    def pages(self, walkers: np.ndarray, steps: np.ndarray) -> np.ndarray:
        byte = self.base[walkers][:, :, None] + steps[:, None, :] * self.step[None, :, None]
        ok = byte < self.end[walkers][:, :, None]
        idx = self.rstart[walkers][:, :, None] + byte // PAGE_BYTES
        return np.where(ok, self.flat[np.where(ok, idx, 0)], -1)

    def writes(self, walkers: np.ndarray, steps: np.ndarray) -> np.ndarray:
        return np.broadcast_to(self.is_write[None, :, None], (walkers.size, self.lanes, steps.shape[1]))


@dataclass(frozen=True)
class Launch:
    """How a launch runs: occupancy, SMs, time per access, accesses per unit step."""

    resident: int = 0
    """Walkers in flight at once (0: all of them)."""
    sms: int = 1
    """SMs the slots are spread over (the ``sm`` arrival order)."""
    access_ns: float = 0.0
    """Native time of one access of one walker while the resident walkers all run (0: unbounded progress)."""
    sub: int = 1
    """Accesses per unit step (a lane touches its page this many times in a row)."""
    tid_stride: int = 1
    """A scaled replay: a batch holds ``fault_batch_count / tid_stride`` entries and its turnaround is charged
    ``1 / tid_stride`` (uvmlab.sim.uvm.streams)."""
    seed: int = 0
    """The ``random`` arrival order's seed."""


@dataclass
class _Slots:
    """The in-flight walkers: one row per residency slot."""

    wid: np.ndarray  # walker id, -1 empty
    acc: np.ndarray  # accesses completed
    done: np.ndarray  # (slots, lanes) lanes whose current access completed
    stall_at: np.ndarray  # time the walker stalled (inf: running or empty)
    sm: np.ndarray
    cur: np.ndarray  # (slots, lanes) pages of a stalled walker's current unit step (fixed while it is stalled)
    curw: np.ndarray  # (slots, lanes) their is-write flags


class ConcurrentService:
    """The concurrent-kernel path of UvmSim (uses its bitmaps, ``_service_block`` and counters)."""

    def run_walkers(self, src: WalkerPages, launch: Launch) -> float:
        """Run one launch (module docstring) on the current counters (``self._k``); return its duration (ns)."""
        return _Engine(self, src, launch).run()

    def access_launches(self, launches: list[tuple[WalkerPages, Launch]], native_ns: float) -> UvmCounters:
        """One kernel made of ``launches`` run one after the other on the stream; its counters' ``stall_ns`` is its
        time beyond ``native_ns``, the launches' native time (the engine overlaps faults with the work of the
        walkers that are not stalled)."""
        k = self._k  # type: ignore[attr-defined]
        before = k.stall_ns
        dur = sum(self.run_walkers(src, launch) for src, launch in launches)
        k.stall_ns = before + max(0.0, dur - native_ns)
        return self._flush_kernel_counters()  # type: ignore[attr-defined]


class _Engine:
    """One launch's run: the slots, the clock, the rounds."""

    def __init__(self, sim: ConcurrentService, src: WalkerPages, launch: Launch) -> None:
        self.sim, self.src, self.launch = sim, src, launch
        self.k: UvmCounters = sim._k  # type: ignore[attr-defined]
        knobs = sim.knobs  # type: ignore[attr-defined]
        self.flat_gpu = sim._gpu.reshape(-1)  # type: ignore[attr-defined]  # a view: no map_range during a kernel
        self.per_walker = src.steps * launch.sub  # accesses of one walker
        self.total = src.n * self.per_walker
        n_slots = min(src.n, launch.resident or src.n)
        self.s = _Slots(
            wid=np.arange(n_slots, dtype=np.int64),
            acc=np.zeros(n_slots, dtype=np.int64),
            done=np.zeros((n_slots, src.lanes), dtype=bool),
            stall_at=np.full(n_slots, np.inf),
            sm=np.arange(n_slots, dtype=np.int64) % max(1, launch.sms),
            cur=np.full((n_slots, src.lanes), -1, dtype=np.int64),
            curw=np.zeros((n_slots, src.lanes), dtype=bool),
        )
        self.next_wid = n_slots
        self.now = 0.0
        self.end = 0.0
        self.completed = 0  # accesses of retired walkers
        self.per_batch = max(1, int(knobs.fault_batch_count) // int(launch.tid_stride))
        self.turnaround = sim.costs.batch_turnaround_ns / int(launch.tid_stride)  # type: ignore[attr-defined]
        self.entry_ns = sim.costs.fault_entry_ns  # type: ignore[attr-defined]
        self.prio = knobs.stream_priority
        self.rng = np.random.default_rng(launch.seed)
        self.rotate = 0
        self.steady_on = bool(knobs.cascade_steady)
        self.snaps: list[np.ndarray] = []
        self.used: list[int] = []  # GPU bytes in chunks after each round
        self.ahead: list[float] = []  # resident share of the pages ahead, at each window's end
        self.extrapolated = False

    # -- page look-ups -------------------------------------------------------------------------
    def _missing(self, slots: np.ndarray, units: np.ndarray) -> np.ndarray:
        """(slots, lanes, k): accesses at unit steps ``units`` (slots, k) whose page is missing (steps past the
        end and lanes without a page never are)."""
        steps = self.src.steps
        g = self.src.pages(self.s.wid[slots], np.minimum(units, steps - 1))
        miss = (g >= 0) & ~self.flat_gpu[np.maximum(g, 0)]
        miss &= (units < steps)[:, None, :]
        return miss

    def _first_pending(self, slots: np.ndarray, limit: np.ndarray) -> np.ndarray:
        """Each slot's first unit step in [current, limit) whose pages are not all resident (``limit``: none)."""
        start = self.s.acc[slots] // self.launch.sub
        out = limit.copy()
        todo = np.flatnonzero(start < limit)
        first = start.copy()
        width = SCAN_WINDOW
        while todo.size:
            units = first[todo][:, None] + np.arange(width)[None, :]
            blocked = self._missing(slots[todo], units).any(axis=1) & (units < limit[todo][:, None])
            hit = blocked.any(axis=1)
            out[todo[hit]] = first[todo[hit]] + blocked[hit].argmax(axis=1)
            more = ~hit & (first[todo] + width < limit[todo])
            first[todo[more]] += width
            todo = todo[more]
            width *= 2
        return out

    # -- progress ------------------------------------------------------------------------------
    def _progress(self, slots: np.ndarray, budget: float | np.ndarray, t0: float | np.ndarray) -> None:
        """Let the running walkers in ``slots`` work for ``budget`` ns from time ``t0``: through resident unit
        steps until they stall, retire or run out of time (a freed slot takes the next walker, which works on with
        what is left of the budget)."""
        s, sub, steps, a_ns = self.s, self.launch.sub, self.src.steps, self.launch.access_ns
        budget = np.broadcast_to(np.asarray(budget, dtype=float), slots.shape).copy()
        t0 = np.broadcast_to(np.asarray(t0, dtype=float), slots.shape).copy()
        while slots.size:
            acc = s.acc[slots]
            if a_ns > 0:
                cap = np.minimum(np.floor(budget / a_ns), float(self.per_walker)).astype(np.int64)
                limit = np.minimum((acc + cap) // sub + 1, steps)
            else:
                cap = np.full(slots.size, self.per_walker, dtype=np.int64)
                limit = np.full(slots.size, steps, dtype=np.int64)
            first = self._first_pending(slots, limit)
            at_end = first >= steps
            stop = np.where(at_end, self.per_walker, np.maximum(first * sub, acc))
            reach = stop - acc
            ok = reach <= cap
            new_acc = np.where(ok, stop, acc + cap)
            moved = new_acc != acc
            s.acc[slots] = new_acc
            s.done[slots[moved]] = False
            t_event = t0 + reach * a_ns
            stalls = ok & ~at_end
            if stalls.any():
                st = slots[stalls]
                s.stall_at[st] = t_event[stalls]
                self._cache_pages(st)
            retire = ok & at_end
            if not retire.any():
                return
            slots, budget, t0 = self._retire(slots[retire], t_event[retire], budget[retire] - reach[retire] * a_ns)

    def _retire(self, slots: np.ndarray, t: np.ndarray, left: np.ndarray) -> tuple[np.ndarray, ...]:
        """Retire the walkers in ``slots`` (at times ``t``); the first freed slots take the next walkers. Return
        the new walkers' (slots, budgets left, start times)."""
        s = self.s
        self.completed += self.per_walker * slots.size
        self.end = max(self.end, float(t.max()))
        n_new = min(slots.size, self.src.n - self.next_wid)
        order = np.argsort(t, kind="stable")
        gone = slots[order[n_new:]]
        s.wid[gone] = -1
        s.stall_at[gone] = np.inf
        take = order[:n_new]
        new = slots[take]
        s.wid[new] = np.arange(self.next_wid, self.next_wid + n_new)
        self.next_wid += n_new
        s.acc[new] = 0
        s.done[new] = False
        s.stall_at[new] = np.inf
        return new, np.maximum(left[take], 0.0), t[take]

    def _cache_pages(self, slots: np.ndarray) -> None:
        """Remember the pages of the current unit step of walkers that just stalled."""
        s = self.s
        units = np.minimum(s.acc[slots] // self.launch.sub, self.src.steps - 1)[:, None]
        s.cur[slots] = self.src.pages(s.wid[slots], units)[:, :, 0]
        s.curw[slots] = self.src.writes(s.wid[slots], units)[:, :, 0]

    def _live(self) -> tuple[np.ndarray, np.ndarray]:
        """(running slots, stalled slots)."""
        s = self.s
        live = s.wid >= 0
        stalled = np.isfinite(s.stall_at)
        return np.flatnonzero(live & ~stalled), np.flatnonzero(live & stalled)

    # -- batches -------------------------------------------------------------------------------
    def _order(self, stalled: np.ndarray) -> np.ndarray:
        """The stalled slots in the order their entries reach the fault buffer (``stream_priority``): ``lowest``
        and ``sm`` by walker id (the oldest warps first, as a greedy-then-oldest warp scheduler issues them)."""
        base = stalled[np.argsort(self.s.wid[stalled], kind="stable")]
        if self.prio == "rotate":
            k = self.rotate % base.size
            return np.concatenate((base[k:], base[:k]))
        if self.prio == "random":
            return self.rng.permutation(base)
        return base

    def _entries(self, order: np.ndarray, stalled_all: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The fault entries of the stalled slots ``order`` as fetched: (slot index in ``order``, page, is_write),
        one per (walker, page) not completed, in arrival order, at most one batch."""
        s = self.s
        if self.prio != "sm" and order.size > 2 * self.per_batch:
            order = order[: 2 * self.per_batch]  # every stalled walker has an entry: a prefix fills the batch
        g, w = s.cur[order], s.curw[order]
        miss = (g >= 0) & ~self.flat_gpu[np.maximum(g, 0)] & ~s.done[order]
        ws, lane = np.nonzero(miss)
        gid, is_w = g[ws, lane], w[ws, lane]
        if gid.size > 1:  # the walkers of one SM share its uTLB: their misses on one page are one entry
            key = s.sm[order[ws]] * (self.flat_gpu.size + 1) + gid
            _, first = np.unique(key, return_index=True)
            if first.size < gid.size:
                keep = np.sort(first)
                ws, gid, is_w = ws[keep], gid[keep], is_w[keep]
        if ws.size < self.per_batch and order.size < stalled_all.size:  # merged entries: take every walker
            return self._entries(stalled_all, stalled_all)
        if self.prio == "sm" and ws.size:  # each SM's entries oldest first, the SMs interleaved entry by entry
            sm = s.sm[order[ws]]
            srt = np.argsort(sm, kind="stable")
            sms = sm[srt]
            starts = np.flatnonzero(np.r_[True, sms[1:] != sms[:-1]])
            rank = np.empty(ws.size, dtype=np.int64)
            rank[srt] = np.arange(sms.size) - np.repeat(starts, np.diff(np.r_[starts, sms.size]))
            inter = np.lexsort((sm, rank))
            ws, gid, is_w = ws[inter], gid[inter], is_w[inter]
        n = self.per_batch
        return ws[:n], gid[:n], is_w[:n]

    def _batch(self, stalled: np.ndarray) -> int:
        """Fetch and service one batch, then replay; return the lanes the replay completed."""
        s, sim, k = self.s, self.sim, self.k
        order = self._order(stalled)
        ws, gid, is_w = self._entries(order, order)
        if self.prio == "rotate":
            self.rotate += int(np.unique(ws).size)
        raw = int(gid.size)
        ugid, first = np.unique(gid, return_index=True)  # the driver services each page once, in address order
        n_wr = int(is_w[first].sum())
        blk = ugid // PAGES_PER_BLOCK
        bounds = np.flatnonzero(np.diff(blk)) + 1
        for grp in np.split(np.arange(ugid.size), bounds):
            slot = int(blk[grp[0]])
            faulted = np.zeros(PAGES_PER_BLOCK, dtype=bool)
            faulted[ugid[grp] - slot * PAGES_PER_BLOCK] = True
            sim._service_block(slot, faulted)  # type: ignore[attr-defined]
        n = int(ugid.size)
        k.fault_batch_count += 1
        k.fault_count += n
        k.write_fault_count += n_wr
        k.read_fault_count += n - n_wr
        k.raw_fault_entries += raw
        k.stall_ns += self.turnaround + self.entry_ns * raw
        if sim.events is not None:  # type: ignore[attr-defined]  # as FaultService._close_batch
            kind = "write" if n_wr == n else "read" if n_wr == 0 else "mixed"
            sim.events.append(("batch", kind, n, len(bounds) + 1))  # type: ignore[attr-defined]
        sim._open_faults = 0  # type: ignore[attr-defined]
        sim._open_blocks = 0  # type: ignore[attr-defined]
        # the replay: every stalled lane whose page is resident now completes its access
        g = s.cur[stalled]
        now_ok = (g < 0) | self.flat_gpu[np.maximum(g, 0)]
        newly = int(np.count_nonzero(now_ok & ~s.done[stalled]))
        s.done[stalled] |= now_ok
        return newly

    def _release(self, stalled: np.ndarray) -> int:
        """Walkers whose lanes all completed their access advance by one access and run again (a walker whose
        last access that was retires); return how many."""
        s = self.s
        free = stalled[s.done[stalled].all(axis=1)]
        if free.size:
            s.acc[free] += 1
            s.done[free] = False
            s.stall_at[free] = np.inf
            fin = free[s.acc[free] >= self.per_walker]
            if fin.size:
                self._retire(fin, np.full(fin.size, self.now), np.zeros(fin.size))
        return int(free.size)

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> float:
        """Rounds until every walker retired (or a steady state is extrapolated); return the duration (ns)."""
        k = self.k
        idle = 0
        round_ns = 0.0
        running, _ = self._live()
        self._progress(running, 0.0, self.now)
        self._snap()
        while True:
            running, stalled = self._live()
            if round_ns > 0 and running.size:
                self._progress(running, round_ns, self.now - round_ns)
                running, stalled = self._live()
            if not stalled.size:
                if not running.size:
                    break
                self._jump(running)
                round_ns = 0.0
                continue
            before = k.stall_ns
            newly = self._batch(stalled)
            released = self._release(stalled)
            round_ns = k.stall_ns - before
            self.now += round_ns
            self.end = max(self.end, self.now)
            if newly or released:
                idle = 0
            else:
                idle += 1
                if idle >= STALL_BATCH_LIMIT:
                    raise SimulationStalledError(
                        f"the UVM simulation made no progress in {STALL_BATCH_LIMIT} fault batches of one kernel "
                        f"({stalled.size} walkers stalled, GPU capacity "
                        f"{self.sim.capacity_bytes} bytes): "  # type: ignore[attr-defined]
                        "this is a bug in uvmlab's forward-progress rule, please report it"
                    )
            if self.steady_on and self._steady():
                break
        return max(self.end, self.now)

    def _jump(self, running: np.ndarray) -> None:
        """No walker is stalled: advance the clock to the first stall or retirement of the running walkers."""
        a_ns = self.launch.access_ns
        if a_ns <= 0:
            self._progress(running, np.inf, self.now)
            return
        sub, steps = self.launch.sub, self.src.steps
        acc = self.s.acc[running]
        first = self._first_pending(running, np.full(running.size, steps, dtype=np.int64))
        stop = np.where(first >= steps, self.per_walker, np.maximum(first * sub, acc))
        dt = float(((stop - acc) * a_ns).min())
        self._progress(running, dt, self.now)
        self.now += dt
        self.end = max(self.end, self.now)

    # -- steady state --------------------------------------------------------------------------
    def _ahead_resident_share(self) -> float:
        """Share of GPU-resident pages among :data:`STEADY_SAMPLE` pages the rest of the launch will touch (seeded
        sample). The steady rate holds for what is left only if this share stays constant from window to window
        (a pass after the first at 1.0x, whose rest is resident while its start faults, sees it rise)."""
        s, src = self.s, self.src
        rng = np.random.default_rng(len(self.snaps))
        live = np.flatnonzero(s.wid >= 0)
        left_live = self.src.steps - s.acc[live] // self.launch.sub
        unstarted = self.src.n - self.next_wid
        weights = np.concatenate((left_live.astype(float), [float(unstarted) * src.steps]))
        if weights.sum() <= 0:
            return 1.0
        pick = rng.choice(weights.size, size=STEADY_SAMPLE, p=weights / weights.sum())
        in_live = pick < live.size
        wid = np.empty(STEADY_SAMPLE, dtype=np.int64)
        step = np.empty(STEADY_SAMPLE, dtype=np.int64)
        sl = live[pick[in_live]]
        wid[in_live] = s.wid[sl]
        cur = s.acc[sl] // self.launch.sub
        step[in_live] = cur + (rng.random(sl.size) * (src.steps - cur)).astype(np.int64)
        n_new = int((~in_live).sum())
        if n_new:
            wid[~in_live] = self.next_wid + rng.integers(0, max(1, unstarted), n_new)
            step[~in_live] = rng.integers(0, src.steps, n_new)
        g = src.pages(wid, np.minimum(step, src.steps - 1)[:, None])[:, :, 0]
        g = g[g >= 0]
        return float(self.flat_gpu[g].mean()) if g.size else 1.0

    def _done_accesses(self) -> int:
        """Lane accesses completed: whole walker accesses times the lanes, plus the lanes done at the current one
        (a smooth measure of progress while walkers advance lane by lane)."""
        s = self.s
        live = s.wid >= 0
        return (self.completed + int(s.acc[live].sum())) * self.src.lanes + int(np.count_nonzero(s.done[live]))

    def _snap(self) -> None:
        d = self.k.__dict__
        sim = self.sim
        ledger = sim.populated_gpu_bytes  # type: ignore[attr-defined]
        self.snaps.append(
            np.array([self._done_accesses(), self.now, *(d[n] for n in COUNTER_NAMES), ledger], dtype=float)
        )
        self.used.append(sim.used_bytes)  # type: ignore[attr-defined]

    def _steady(self) -> bool:
        """Record this round; every STEADY_WINDOW rounds compare the last three windows and, when they agree and
        enough work is left, extrapolate the rest of the launch (module docstring). True when it did."""
        self._snap()
        n = len(self.snaps) - 1  # rounds recorded
        w = STEADY_WINDOW
        if n < 3 * w or n % w:
            return False
        snaps = self.snaps
        self.ahead.append(self._ahead_resident_share())
        if len(self.ahead) < 3 or max(self.ahead[-3:]) - min(self.ahead[-3:]) > STEADY_AHEAD_DRIFT:
            return False  # the rest of the launch is not as resident as what the windows worked on
        marks = [self.used[-1 - i * w] for i in range(4)]
        cap = self.sim.capacity_bytes  # type: ignore[attr-defined]
        if min(marks) < cap - STEADY_FREE_CHUNKS * VA_BLOCK_BYTES:
            return False  # memory still filling (or emptying): not the state the rest of the launch runs in
        wins = [snaps[-1 - i * w] - snaps[-1 - (i + 1) * w] for i in range(3)]
        if min(x[0] for x in wins) <= 0:
            return False
        idx = [0, 1, *(2 + COUNTER_NAMES.index(c) for c in STEADY_RATES)]
        sel = np.array([x[idx] for x in wins])
        hi, lo = sel.max(axis=0), sel.min(axis=0)
        if ((hi - lo) > STEADY_TOLERANCE * np.maximum(np.abs(hi), 1e-12)).any():
            return False
        rate = sum(wins) / (3 * w)  # per round
        rounds_left = (self.total * self.src.lanes - self._done_accesses()) / rate[0]
        if rounds_left < STEADY_MIN_LEFT * w:
            return False
        d = self.k.__dict__
        for j, name in enumerate(COUNTER_NAMES):
            add = rate[2 + j] * rounds_left
            d[name] += round(add) if isinstance(d[name], (int, np.integer)) else add
        # in a steady state what leaves the GPU came in: the two rates agree up to the windows' noise, and the
        # ledger (UvmSim.check_invariants: DtoH <= populated) takes the larger
        pop = max(rate[-1], rate[2 + COUNTER_NAMES.index("dtoh_bytes")])
        self.sim.populated_gpu_bytes += math.ceil(pop * rounds_left)  # type: ignore[attr-defined]
        self.now += rate[1] * rounds_left
        self.end = max(self.end, self.now)
        self.completed = self.total
        self.s.wid[:] = -1
        self.s.stall_at[:] = np.inf
        self.next_wid = self.src.n
        self.extrapolated = True
        return True
