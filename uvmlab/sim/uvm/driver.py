"""The NVIDIA UVM driver as a CPU simulator (reference/uvm.md sections 0, 1 and 6). Torch-free.

State lives in one :class:`UvmSim`. Managed ranges (one per ``cudaMallocManaged``) are cut into 2 MiB VA blocks;
each block keeps 512-page bitmaps (numpy) of GPU and CPU residency. GPU capacity is counted in chunks: a full
2 MiB block takes one 2 MiB root chunk the first time any page becomes GPU-resident.

Rules (each from uvm.md):

* Faults (1.4): a kernel's missing pages are cut into batches of at most ``knobs.pages_per_batch`` unique pages
  (a model of fault concurrency; the driver's cap is ``fault_batch_count`` = 256 entries), taken in the kernel's
  access order: read accesses first, then write accesses (a warp writes after its loads return). A page both read
  and written faults once, as a read (read faults map read-write, 1.4 "Read faults are upgraded").
* Per VA block of a batch (1.5): the tree prefetcher (:mod:`uvmlab.sim.uvm.prefetch`) adds pages; the block gets a
  chunk if it has none, evicting first if the GPU is full; pages resident on the CPU move HtoD (cause ``fault``
  for faulted pages, ``prefetch`` for the prefetcher's), pages resident nowhere are zero-filled with no transfer
  (1.2, 1.10); the block's chunk moves to the tail of the LRM list (1.6).
* Eviction (1.6): the victim is the chunk *least recently migrated into* (GPU accesses never update the order);
  every GPU-resident page of its block is copied DtoH (no dirty tracking); pages become CPU-resident.
* ``unmap_range`` (``cudaFree``, 1.10, 4.4): the range is destroyed; its chunks are freed with no DtoH.
* ``memcpy_htod`` (the study's retained ``cudaMemcpyAsync`` of inputs and parameters): the copy engine writes
  the pages, which become GPU-resident without replayable faults; counted apart from UM migrations.

Approximations (also in docs/uvm-sim.md):

* Each managed range starts 2 MiB-aligned (so small ranges do not share VA blocks; uvm.md 7.5 is open). Its last
  block is mapped at the driver's rounded size (``knobs.rounded_tail_bytes``: 64 KiB x 2^i), which the prefetch tree
  covers and which the block takes as capacity; it is evicted on its own (the driver carves such chunks from split
  root chunks and evicts whole root chunks).
* The host page (``GpuSpec.host_page_bytes``, 64 KiB on POWER9 and Grace) is the unit of faults: accesses are
  rounded out to whole host pages and a fault counts one host page; the bitmaps stay 4 KiB (docs/uvm-sim.md).
* cudaMemAdvise policies, remote mappings and host accesses: ``uvmlab.sim.uvm.advice`` and ``uvmlab.sim.uvm.host``.
* Single touch: a page a kernel has already faulted in is not faulted again by the same kernel even if it is
  evicted before the kernel ends (uvm.md 6 step 3); pages are checked in access order when the kernel reaches them.
* Within a batch, blocks are serviced in the kernel's access order (the driver sorts by address; the order only
  changes which block is most recently migrated).
* Thrashing detection, throttling and pinning act on CPU-GPU ping-pong only (uvmlab.sim.uvm.thrashing: the
  detector ignores eviction-caused migrations, uvm.md 1.7); access counters are off (uvm.md 1.8).
* The UNUSED/DISCARDED lists are not modelled: a chunk exists only while its block has GPU-resident pages.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from uvmlab.errors import InputError, InvariantError
from uvmlab.gpus import DEFAULT_GPU, GPUS, GpuSpec, driver_major
from uvmlab.sim.uvm.advice import PREFERRED_PREFETCH_MAJOR, AdviceService
from uvmlab.sim.uvm.concurrent import ConcurrentService
from uvmlab.sim.uvm.cpu_chunks import page_sized_cpu_chunks
from uvmlab.sim.uvm.faults import FaultPlan, FaultService, UvmCounters
from uvmlab.sim.uvm.hints import HintService
from uvmlab.sim.uvm.host import HostService
from uvmlab.sim.uvm.knobs import PAGE_BYTES, PAGES_PER_BLOCK, VA_BLOCK_BYTES, UvmKnobs, rounded_tail_bytes
from uvmlab.sim.uvm.migrate import MigrateService
from uvmlab.sim.uvm.resident import ResidentMarks
from uvmlab.sim.uvm.runs import run_lengths
from uvmlab.sim.uvm.streams import StreamService
from uvmlab.sim.uvm.thrashing import ThrashingService
from uvmlab.sim.uvm.tile_schedule import TileSchedule
from uvmlab.sim.uvm.timing import CostParams, transfer_time_ns

_NO_RUNS = np.empty(0, dtype=np.int64)
RUNS_CACHED = 8
"""Up to this many transfers, ``_runs_ns`` sums cached per-size times instead of evaluating the link curve."""

_WHOLE_BLOCK = (0, PAGES_PER_BLOCK)
"""The span of a block an access covers entirely (shared: spans are never changed in place)."""

Access = tuple[int, int, int, bool]
"""(range_id, offset_bytes, size_bytes, is_write): one byte range a kernel touches."""


class UvmSim(
    FaultService,
    MigrateService,
    ResidentMarks,
    StreamService,
    ConcurrentService,
    ThrashingService,
    HintService,
    AdviceService,
    HostService,
):
    """One GPU's UVM driver state: managed ranges, per-page residency, chunks, the LRM list, counters."""

    def __init__(
        self,
        capacity_bytes: int,
        knobs: UvmKnobs | None = None,
        costs: CostParams | None = None,
        gpu: GpuSpec | None = None,
        record_events: bool = False,
    ) -> None:
        if capacity_bytes < VA_BLOCK_BYTES:
            raise InputError(
                f"GPU memory available to UVM ({capacity_bytes} B) is smaller than one 2 MiB root chunk; "
                "use a smaller oversubscription factor or a larger footprint"
            )
        self.capacity_bytes = int(capacity_bytes)
        self.knobs = knobs or UvmKnobs()
        gpu = gpu or GPUS[DEFAULT_GPU]
        self.costs = (costs or CostParams()).for_gpu(gpu)
        if self.costs.link_bytes_per_s > gpu.link_limit_bytes_per_s * (1 + 1e-9):
            raise InputError(
                f"link bandwidth {self.costs.link_bytes_per_s / 1e9:.1f} GB/s exceeds the peak of the GPU's link "
                f"({gpu.link_limit_bytes_per_s / 1e9:.1f} GB/s, gpus.py)"
            )
        self.used_bytes = 0
        n = 64
        self._gpu = np.zeros((n, PAGES_PER_BLOCK), dtype=bool)
        self._cpu = np.zeros((n, PAGES_PER_BLOCK), dtype=bool)
        self._dup = np.zeros((n, PAGES_PER_BLOCK), dtype=bool)  # read duplicates (uvmlab.sim.uvm.hints)
        self._disc = np.zeros((n, PAGES_PER_BLOCK), dtype=bool)  # discarded pages (uvm_hints)
        self._calloc = np.zeros((n, PAGES_PER_BLOCK), dtype=bool)  # pages holding a CPU chunk (page chunks only)
        self._hinted = bool(self.knobs.advise_read_mostly or self.knobs.discard_min_bytes)
        """The eviction rule consults read duplicates and discarded pages: on from the knobs, or from the first call
        that can make them (``discard``, cudaMemAdvise / host-access state)."""
        self._dups_possible = bool(self.knobs.advise_read_mostly)
        """Read duplicates can exist (the same knobs and calls, uvmlab.sim.uvm.hints): elsewhere ``_dup`` is clear."""
        self.host_page_bytes = max(PAGE_BYTES, int(gpu.host_page_bytes))
        self._g = self.host_page_bytes // PAGE_BYTES  # 4 KiB bitmap pages per host page (the fault unit)
        self.coherent = bool(gpu.coherent)
        self.prefetch_honours_preferred = driver_major(gpu.driver) >= PREFERRED_PREFETCH_MAJOR
        self._page_chunks = page_sized_cpu_chunks(gpu.driver)  # CPU chunks: host pages, or one per block
        self._pol_any: list[bool] | None = None  # per slot: any cudaMemAdvise policy bit (uvmlab.sim.uvm.hints)
        self._hint_arrays: tuple[str, ...] = ()  # the policy / mapping bitmaps, created on first use
        self._disc_fifo: OrderedDict[int, None] = OrderedDict()  # fully discarded blocks, first discarded first
        self._disc_slots: set[int] = set()  # slots whose _disc row may hold a page (uvmlab.sim.uvm.hints)
        # per-slot scalars as Python lists (scalar access is the hot path; numpy scalars are slower)
        self._npages: list[int] = []
        self._chunk_bytes: list[int] = []
        self._res_count: list[int] = []
        self._cpu_count: list[int] = []
        self._has_chunk: list[bool] = []
        self._had_gpu: list[bool] = []
        self._cpu_chunked: list[bool] = []
        """Per slot: no page of the block can get a new CPU chunk (``_cpu_alloc_ns``): from R530 its one chunk exists,
        before R530 every page holds one (``_calloc``). Chunks live until the block is destroyed."""
        self._fault_migrations: list[int] = []
        self._evicted_in: list[int] = []
        """Per slot: the kernel (``_serial``) that last evicted its chunk, -1 if none: a chunk allocated again in the
        same kernel is a refetch (``UvmCounters.refetched_chunks``)."""
        self._slot_range: list[int] = []
        self._slot_bidx: list[int] = []
        self._n_slots = 0
        self._free_slots: list[int] = []
        self._ranges: dict[int, np.ndarray] = {}
        self._range_size: dict[int, int] = {}
        self.mapped_bytes = 0
        """Bytes of live managed ranges (kept as a running sum: the replay reads it after every kernel)."""
        self._lrm: OrderedDict[int, None] = OrderedDict()
        self._decreases = 0
        """Counts the calls that took pages off the GPU (evictions, CPU migrations; uvmlab.sim.uvm.resident)."""
        self._full_ranges: set[int] = set()
        """Ranges known to be entirely GPU-resident (one leaves the set when pages of it leave the GPU)."""
        self._plans: dict[tuple[int, int, int, int], FaultPlan] = {}
        self._tile_schedules: dict[object, TileSchedule] = {}  # FaultService._bulk_in_order's memo
        self._tile_schedule_bytes = 0  # the memo's array bytes (faults.TILE_SCHEDULE_BYTES)
        self._open_faults = 0
        self._open_blocks = 0
        self._kind = "read"
        self._tcache: dict[int, float] = {}
        # per-run constants of the hot path
        self._per_batch = self.knobs.pages_per_batch * self._g  # in 4 KiB pages
        self._full_raw = min(
            float(self.knobs.fault_batch_count), self.knobs.pages_per_batch * self.costs.raw_entries_per_fault
        )
        self._zero_ns_per_page = PAGE_BYTES / self.costs.zero_fill_bytes_per_s * 1e9
        self._host_zero_ns_per_page = PAGE_BYTES / self.costs.host_zero_bytes_per_s * 1e9
        self.totals = UvmCounters()
        self._k = UvmCounters()
        self.events: list[tuple] | None = [] if record_events else None
        # conservation ledger (bytes): what has been made GPU-resident vs what left by DtoH
        self.populated_gpu_bytes = 0
        self.peak_used_bytes = 0
        self._thr_setup()  # thrashing detection (uvmlab.sim.uvm.thrashing)
        self._serial = 0
        """The kernel under way: each call's counters end it (``_flush_kernel_counters``) unless :meth:`one_kernel`
        holds it open."""
        self._held = False
        self.scale = 1
        """A scaled replay (uvmlab.sim.uvm.order): the caller divided capacity, ranges and accesses by it; every
        call's counters are multiplied back by it (``_flush_kernel_counters``)."""

    # -- slots ---------------------------------------------------------------------------------
    _SLOT_DEFAULTS = (
        ("_npages", 0),
        ("_chunk_bytes", 0),
        ("_res_count", 0),
        ("_cpu_count", 0),
        ("_has_chunk", False),
        ("_had_gpu", False),
        ("_cpu_chunked", False),
        ("_fault_migrations", 0),
        ("_evicted_in", -1),
        ("_slot_range", -1),
        ("_slot_bidx", 0),
    )

    def _grow(self, need: int) -> None:
        n = self._gpu.shape[0]
        if need > n:
            new = max(need, 2 * n)
            for name in ("_gpu", "_cpu", "_dup", "_disc", "_calloc", *self._hint_arrays):
                old = getattr(self, name)
                arr = np.zeros((new, PAGES_PER_BLOCK), dtype=bool)
                arr[:n] = old
                setattr(self, name, arr)
        grow = need - len(self._npages)
        if grow > 0:
            for name, default in self._SLOT_DEFAULTS:
                getattr(self, name).extend([default] * grow)
            if self._pol_any is not None:
                self._pol_any.extend([False] * grow)

    def _new_slots(self, k: int) -> np.ndarray:
        reuse = self._free_slots[-k:] if k <= len(self._free_slots) else list(self._free_slots)
        del self._free_slots[len(self._free_slots) - len(reuse) :]
        extra = k - len(reuse)
        if extra:
            self._grow(self._n_slots + extra)
            reuse = reuse + list(range(self._n_slots, self._n_slots + extra))
            self._n_slots += extra
        return np.array(reuse, dtype=np.int64)

    # -- allocator events ----------------------------------------------------------------------
    def map_range(self, range_id: int, size_bytes: int) -> None:
        """``cudaMallocManaged``: a new managed range (2 MiB-aligned), populated nowhere."""
        if range_id in self._ranges:
            raise InvariantError(f"managed range {range_id} is mapped twice")
        if size_bytes <= 0:
            raise InvariantError(f"managed range {range_id} has size {size_bytes}")
        nblocks = -(-int(size_bytes) // VA_BLOCK_BYTES)
        slots = self._new_slots(nblocks)
        tail_chunk = rounded_tail_bytes(int(size_bytes) - (nblocks - 1) * VA_BLOCK_BYTES, self.host_page_bytes)
        tail_pages = tail_chunk // PAGE_BYTES  # the driver's VA range ends at the rounded size (rounded_tail_bytes)
        # a new slot's bitmaps are all False (``_grow``), and ``unmap_range`` clears a freed one's
        for b, slot in enumerate(slots.tolist()):
            last = b == nblocks - 1
            self._npages[slot] = tail_pages if last else PAGES_PER_BLOCK
            self._chunk_bytes[slot] = tail_chunk if last else VA_BLOCK_BYTES
            self._res_count[slot] = 0
            self._cpu_count[slot] = 0
            self._has_chunk[slot] = False
            self._had_gpu[slot] = False
            self._cpu_chunked[slot] = False
            if self._page_chunks:
                self._calloc[slot] = False
            self._fault_migrations[slot] = 0
            self._evicted_in[slot] = -1
            self._slot_range[slot] = range_id
            self._slot_bidx[slot] = b
            if self._pol_any is not None:
                self._pol_any[slot] = False
        self._ranges[range_id] = slots
        self._range_size[range_id] = int(size_bytes)
        self.mapped_bytes += int(size_bytes)

    def unmap_range(self, range_id: int) -> int:
        """``cudaFree`` of a managed range: destroy it, free its chunks without DtoH. Returns its block count."""
        slots = self._ranges.pop(range_id, None)
        if slots is None:
            raise InvariantError(f"managed range {range_id} is freed but not mapped")
        self.mapped_bytes -= self._range_size.pop(range_id)
        self._full_ranges.discard(range_id)
        freed = 0
        slot_list = slots.tolist()
        on_gpu: list[int] = []  # rows whose bitmap holds a page (the counts say which: check_invariants)
        on_cpu: list[int] = []
        for s in slot_list:
            if self._has_chunk[s]:
                freed += self._chunk_bytes[s]
                del self._lrm[s]
                self._has_chunk[s] = False
            if self._res_count[s]:
                on_gpu.append(s)
                self._res_count[s] = 0
            if self._cpu_count[s]:
                on_cpu.append(s)
                self._cpu_count[s] = 0
            self._slot_range[s] = -1
        self.used_bytes -= freed
        if on_gpu:  # an empty fancy index still costs ~2 us (PCA off: ~6,000 unmaps a Whisper-small replay)
            self._gpu[on_gpu] = False
        if on_cpu:
            self._cpu[on_cpu] = False
        rows = slot_list[0] if len(slot_list) == 1 else slots  # basic indexing is faster for the common one block
        # read duplicates and discarded pages exist only under hints (``_hinted``), the policy bitmaps once created
        for name in (*(("_dup", "_disc") if self._hinted else ()), *self._hint_arrays):
            getattr(self, name)[rows] = False
        if self._disc_slots:
            self._disc_slots.difference_update(slot_list)
        self.thr_forget(slot_list)
        self._free_slots.extend(slot_list)
        if self.events is not None:
            self.events.append(("destroy", range_id, len(slots), freed))
        return len(slots)

    # -- helpers -------------------------------------------------------------------------------
    def _page_span(self, range_id: int, offset: int, size: int) -> tuple[int, int] | None:
        """The range's pages [p0, p1) a byte range touches, rounded out to host pages (None: no page)."""
        slots = self._ranges.get(range_id)
        if slots is None:
            raise InvariantError(f"access to managed range {range_id}, which is not mapped")
        if size <= 0:
            return None
        end = min(offset + size, self._range_size[range_id])
        if offset < 0:
            raise InvariantError(f"access at negative offset {offset} of range {range_id}")
        if offset >= end:
            return None  # past the range's end (e.g. a block running into the next expandable-segment mapping)
        p0 = offset // PAGE_BYTES
        p1 = -(-end // PAGE_BYTES)
        if self._g > 1:  # a host page is the unit of faults and mappings: round out to whole host pages
            p0 = p0 // self._g * self._g
            p1 = min(-(-p1 // self._g) * self._g, (len(slots) - 1) * PAGES_PER_BLOCK + self._npages[int(slots[-1])])
        return p0, p1

    def range_gids(self, range_id: int) -> np.ndarray:
        """Global page ids (slot * 512 + page) of every 4 KiB page of a mapped range, in address order."""
        n = -(-self._range_size[range_id] // PAGE_BYTES)
        return self.page_gids(range_id, np.arange(n, dtype=np.int64))

    def kernel_slots(self, accesses: list[Access]) -> np.ndarray:
        """The slots of the VA blocks ``accesses`` touch, each once, in order of first touch."""
        parts = []
        for range_id, offset, size, _ in accesses:
            span = self._page_span(int(range_id), int(offset), int(size))
            if span is not None:
                parts.append(
                    self._ranges[int(range_id)][span[0] // PAGES_PER_BLOCK : (span[1] - 1) // PAGES_PER_BLOCK + 1]
                )
        if not parts:
            return np.empty(0, dtype=np.int64)
        cat = np.concatenate(parts)
        _, first = np.unique(cat, return_index=True)
        return cat[np.sort(first)]

    def page_gids(self, range_id: int, pages: np.ndarray) -> np.ndarray:
        """Global page ids (slot * 512 + page) of the 4 KiB pages ``pages`` (indices within a mapped range)."""
        slots = self._ranges[range_id]
        return slots[pages // PAGES_PER_BLOCK] * PAGES_PER_BLOCK + pages % PAGES_PER_BLOCK

    def _segments(self, range_id: int, offset: int, size: int) -> list[tuple[int, int, int]]:
        """(slot, first_page, end_page) per VA block of a byte range, in address order."""
        span = self._page_span(range_id, offset, size)
        return [] if span is None else self._blocks_of(range_id, *span)

    def _blocks_of(self, range_id: int, p0: int, p1: int) -> list[tuple[int, int, int]]:
        """``_segments`` of the range's pages [p0, p1) (``_page_span``)."""
        slots = self._ranges[range_id]
        b0, b1 = p0 // PAGES_PER_BLOCK, (p1 - 1) // PAGES_PER_BLOCK
        if b0 == b1:
            return [(int(slots[b0]), p0 - b0 * PAGES_PER_BLOCK, p1 - b0 * PAGES_PER_BLOCK)]
        out = [(int(slots[b0]), p0 - b0 * PAGES_PER_BLOCK, PAGES_PER_BLOCK)]
        out += [(s, 0, PAGES_PER_BLOCK) for s in slots[b0 + 1 : b1].tolist()]  # tolist(): Python ints
        out.append((int(slots[b1]), 0, p1 - b1 * PAGES_PER_BLOCK))
        return out

    def _evict_one(self) -> None:
        """Evict the least recently migrated chunk: DtoH every GPU-resident page of its block."""
        if not self._lrm:
            raise InvariantError("eviction needed but no chunk is evictable")
        v = self._pick_discarded() if self._hinted else None  # the PMM's DISCARDED list goes first (uvm_hints)
        if v is None:
            v, _ = self._lrm.popitem(False)
        else:
            del self._lrm[v]
        row = self._gpu[v]
        n = self._res_count[v]
        k = self._k
        self._evicted_in[v] = self._serial
        if not self._cpu_chunked[v]:  # discarded pages are not copied back (uvm_hints): they get no chunk
            k.stall_ns += self._cpu_alloc_ns(v, row & ~self._disc[v] if self._hinted else row)
        self._count_decrease((v,))
        if self._hinted:  # read duplicates and discarded pages are not copied back (uvm_hints)
            n, n_runs, t_ns = self._evict_hinted(v, row)
        elif n == self._npages[v]:  # fully resident: one transfer
            self._cpu_count[v] += n
            n_runs, t_ns = 1, self._transfer_ns(n)
            self._cpu[v] = row
        else:
            self._cpu_count[v] += n
            runs = run_lengths(row)
            n_runs = len(runs)
            t_ns = self._runs_ns(runs)
            self._cpu[v] |= row
        self._gpu[v] = False
        self._res_count[v] = 0
        self._has_chunk[v] = False
        self.used_bytes -= self._chunk_bytes[v]
        k.eviction_count += 1
        k.dtoh_bytes += n * PAGE_BYTES
        k.dtoh_count += n_runs
        k.stall_ns += self.costs.evict_fixed_ns + t_ns
        if self.events is not None:
            self.events.append(("evict", self._slot_range[v], self._slot_bidx[v], n))

    def _evict_front(self, victims: list[int]) -> None:
        """Evict ``victims``, the first ``len(victims)`` chunks of the LRM list in its order, as ``_evict_one``
        would one by one (plain rule only: the caller checks ``_hinted`` is off). ``used_bytes`` is the caller's.
        The bitmaps move back in array operations (fully resident blocks, the common case, and the others)."""
        res_count, npages, cpu_count, has_chunk = self._res_count, self._npages, self._cpu_count, self._has_chunk
        chunked, evicted_in, serial = self._cpu_chunked, self._evicted_in, self._serial
        pop = self._lrm.popitem
        for _ in victims:
            pop(False)  # positional: a keyword argument costs more than the pop itself
        self._count_decrease(victims)
        counts = list(map(res_count.__getitem__, victims))
        pages = sum(counts)
        full: list[int] = []
        part: list[int] = []
        alloc_ns = 0.0
        for v, n in zip(victims, counts, strict=True):
            if not chunked[v]:
                alloc_ns += self._cpu_alloc_ns(v, self._gpu[v])
            cpu_count[v] += n
            res_count[v] = 0
            has_chunk[v] = False
            evicted_in[v] = serial
            (full if n == npages[v] else part).append(v)
        t_ns = 0.0
        n_runs = len(full)
        if full:  # one transfer each
            t_ns += sum(map(self._transfer_ns, map(npages.__getitem__, full)))
            idx = np.array(full, dtype=np.intp)
            self._cpu[idx] = self._gpu[idx]
            self._gpu[idx] = False
        if part:  # one transfer per contiguous run of resident pages, all blocks at once
            idx = np.array(part, dtype=np.intp)
            rows = self._gpu[idx]
            padded = np.zeros((len(part), PAGES_PER_BLOCK + 1), dtype=bool)  # a False column keeps rows' runs apart
            padded[:, :PAGES_PER_BLOCK] = rows
            runs = run_lengths(padded.ravel())
            n_runs += runs.size
            t_ns += self._runs_ns(runs)
            self._cpu[idx] |= rows
            self._gpu[idx] = False
        k = self._k
        k.eviction_count += len(victims)
        k.dtoh_bytes += pages * PAGE_BYTES
        k.dtoh_count += n_runs
        k.stall_ns += len(victims) * self.costs.evict_fixed_ns + t_ns + alloc_ns

    def _runs_ns(self, runs: np.ndarray) -> float:
        """Time (ns) of serial transfers of ``runs`` pages each; few runs are summed from the per-size cache."""
        if runs.size > RUNS_CACHED:
            return transfer_time_ns(runs * PAGE_BYTES, self.costs.link_bytes_per_s)
        return sum(self._transfer_ns(r) for r in runs.tolist())

    def _transfer_ns(self, pages: int) -> float:
        t = self._tcache.get(pages)
        if t is None:
            t = self._tcache[pages] = transfer_time_ns(np.array([pages * PAGE_BYTES]), self.costs.link_bytes_per_s)
        return t

    def _ensure_chunk(self, s: int, fault_path: bool = True) -> None:
        if self._has_chunk[s]:
            return
        need = self._chunk_bytes[s]
        while self.capacity_bytes - self.used_bytes < need:
            self._evict_one()
        self.used_bytes += need
        self.peak_used_bytes = max(self.peak_used_bytes, self.used_bytes)
        self._has_chunk[s] = True
        self._lrm[s] = None
        if self._evicted_in[s] == self._serial:
            self._k.refetched_chunks += 1
        if not self._had_gpu[s]:
            self._had_gpu[s] = True
            self._k.stall_ns += self._first_gpu_ns(s, fault_path)

    def _first_gpu_ns(self, s: int, fault_path: bool = True) -> float:
        """The cost of slot ``s``'s first GPU chunk, from its state before it is populated: the chunk's first-use
        cost when it must be zeroed (a page of the block resident nowhere: ``block_zero_new_gpu_chunk``; the fault
        path's ``block_first_gpu_ns`` includes the invalid-PDE round trips, an API migration pays
        ``prefetch_first_block_ns``), plus the DMA mapping of the block's CPU chunks for the GPU
        (``cpu_chunk_map_ns``, uvmlab.sim.uvm.cpu_chunks)."""
        costs = self.costs
        n_cpu = self._cpu_count[s]
        t = 0.0
        if n_cpu < self._npages[s]:
            t = costs.block_first_gpu_ns if fault_path else costs.prefetch_first_block_ns
        if n_cpu:
            t += self.cpu_chunks(n_cpu) * costs.cpu_chunk_map_ns
        return t

    def _cpu_alloc_ns(self, s: int, moved: np.ndarray | None = None, fresh: np.ndarray | None = None) -> float:
        """Driver time for the CPU chunks slot ``s`` allocates when its ``moved`` pages (a row mask) are copied from
        the GPU to the CPU (an eviction, a CPU fault, a prefetch to the CPU) and its ``fresh`` pages, resident
        nowhere, are populated there (a CPU first touch); call it before the bitmaps change. CPU chunks live until
        the block is destroyed (no migration frees them), so each is paid for once (uvmlab.sim.uvm.cpu_chunks):

        * each new chunk is DMA-mapped for the GPU when the block has GPU state (``block_populate_pages_cpu`` ->
          ``block_add_cpu_chunk`` -> ``uvm_va_block_map_cpu_chunk_on_gpus``): ``cpu_chunk_map_ns``;
        * a new chunk is allocated zeroed (``UVM_CPU_CHUNK_ALLOC_FLAGS_ZERO`` -> ``__GFP_ZERO``, uvm_pmm_sysmem.c)
          when a page of its region is resident nowhere: each fresh host page before R530; from R530 the block's
          whole 2 MiB chunk, at its first population (a later first touch finds it zeroed). At
          ``host_zero_bytes_per_s``.

        Not timed: the page allocation itself (``alloc_pages``; no export separates it from the mapping).
        APPROXIMATION: "GPU state" is read as the block having had a GPU chunk (``_had_gpu``); the driver creates it
        at the GPU's first fault on the block, so a first touch on the CPU caused by a GPU fault (preferred location
        CPU, a remote mapping) is charged the mapping only at the block's first GPU chunk (``_first_gpu_ns``), or never
        while the GPU keeps reading it remotely (480 ns per chunk in the open-driver profiles)."""
        costs = self.costs
        if self._page_chunks:
            row = self._calloc[s]
            new = 0
            t = 0.0
            if moved is not None:
                new += int(np.count_nonzero(moved & ~row))
                row |= moved
            if fresh is not None:
                n_fresh = int(np.count_nonzero(fresh & ~row))
                new += n_fresh
                t += n_fresh * self._host_zero_ns_per_page
                row |= fresh
            self._cpu_chunked[s] = bool(row[: self._npages[s]].all())
            new_chunks = new / self._g
        else:
            any_fresh = fresh is not None and bool(fresh.any())
            if self._cpu_chunked[s] or not (any_fresh or (moved is not None and moved.any())):
                return 0.0  # allocated before, or nothing lands on the CPU (a coherent GPU's page mapped remotely)
            self._cpu_chunked[s] = True
            new_chunks = 1.0
            zeroed = any_fresh or self._res_count[s] + self._cpu_count[s] < self._npages[s]
            t = self._npages[s] * self._host_zero_ns_per_page if zeroed else 0.0
        if self._had_gpu[s]:
            t += new_chunks * costs.cpu_chunk_map_ns
        return t

    def cpu_chunks(self, pages: int, blocks: int = 1) -> float:
        """CPU chunks holding ``pages`` 4 KiB pages of ``blocks`` blocks: one per host page on drivers before R530,
        one per block from R530 (uvmlab.sim.uvm.cpu_chunks)."""
        return pages / self._g if self._page_chunks else float(blocks)

    def _populate(
        self, s: int, mask: np.ndarray, fault_path: bool = True, with_runs: bool = True
    ) -> tuple[int, np.ndarray]:
        """Make ``mask`` pages of slot ``s`` GPU-resident; return (zero-filled pages, HtoD run lengths; none when
        not ``with_runs``: a caller that knows its transfers, FaultService._apply_schedule)."""
        self._ensure_chunk(s, fault_path)
        cpu_row = self._cpu[s]
        h = mask & cpu_row
        n_all = np.count_nonzero(mask)
        n_h = np.count_nonzero(h)
        runs = run_lengths(h) if n_h and with_runs else _NO_RUNS
        self._gpu[s] |= mask
        cpu_row &= ~mask
        self._cpu_count[s] -= n_h
        if self._hint_arrays:
            self._after_gpu_populate(s, mask)
        self._res_count[s] += n_all
        self._lrm.move_to_end(s)
        self.populated_gpu_bytes += n_all * PAGE_BYTES
        return n_all - n_h, runs

    # -- copies (prefetch: uvmlab.sim.uvm.migrate; host reads and writes: uvmlab.sim.uvm.host) --
    def memcpy_htod(self, range_id: int, offset: int, size: int) -> UvmCounters:
        """A retained ``cudaMemcpy`` HtoD into managed memory: pages become GPU-resident, no replayable faults.

        The copied bytes travel as one explicit transfer (counted as ``memcpy_htod_*``, not as UM migrations);
        old CPU copies of the pages are overwritten, not migrated [approximation: uvm.md 1.10 leaves the driver's
        path for copy-engine writes to non-resident managed pages unverified].
        """
        for s, lo, hi in self._segments(range_id, offset, size):
            mask = np.zeros(PAGES_PER_BLOCK, dtype=bool)
            mask[lo:hi] = ~self._gpu[s, lo:hi]
            self._cpu[s, lo:hi] = False
            self._dup[s, lo:hi] = False  # the copy overwrites the page: no other copy stays valid
            self._cpu_count[s] = np.count_nonzero(self._cpu[s])
            if mask.any():
                self._populate(s, mask)
        self._k.memcpy_htod_count += 1
        self._k.memcpy_htod_bytes += int(size)
        self._k.stall_ns += transfer_time_ns(np.array([size]), self.costs.link_bytes_per_s)
        return self._flush_kernel_counters()

    # -- kernels -------------------------------------------------------------------------------
    def access(self, accesses: Iterable[Access]) -> UvmCounters:
        """Run one kernel touching ``accesses``; return its counters (faults, batches, migrations, stall time).

        Pages are grouped per VA block (the driver groups a batch's faults by block and sorts them by address);
        blocks are taken in the order the kernel first touches them, reads before writes.
        """
        if self._hint_arrays or type(accesses) is not list:
            accesses = list(accesses)
        marks = self._marks_for(accesses)  # large accesses that are resident already (uvmlab.sim.uvm.resident)
        stages: tuple[dict[int, Any], dict[int, Any]] = ({}, {})
        marked = [False, False]  # per stage: holds a mark
        for i, (range_id, offset, size, is_write) in enumerate(accesses):
            d = stages[1 if is_write else 0]
            if marks is not None and i in marks:
                d[-1 - i] = marks[i]
                marked[is_write] = True
                continue
            range_id = int(range_id)
            span = self._page_span(range_id, int(offset), int(size))
            if span is None:
                continue
            p0, p1 = span
            b0, b1 = p0 // PAGES_PER_BLOCK, (p1 - 1) // PAGES_PER_BLOCK
            if b1 > b0:
                keys = self._ranges[range_id][b0 : b1 + 1].tolist()
                if not d or d.keys().isdisjoint(keys):  # blocks new to the stage: listed at once, nothing to merge
                    d.update(dict.fromkeys(keys, _WHOLE_BLOCK))
                    d[keys[0]] = (p0 - b0 * PAGES_PER_BLOCK, PAGES_PER_BLOCK)
                    d[keys[-1]] = (0, p1 - b1 * PAGES_PER_BLOCK)
                    continue
            for s, lo, hi in self._blocks_of(range_id, p0, p1):
                cur = d.get(s)
                if cur is None:
                    d[s] = (lo, hi)
                elif type(cur) is tuple:
                    if lo <= cur[1] and hi >= cur[0]:
                        d[s] = (min(lo, cur[0]), max(hi, cur[1]))
                    else:
                        m = np.zeros(PAGES_PER_BLOCK, dtype=bool)
                        m[cur[0] : cur[1]] = True
                        m[lo:hi] = True
                        d[s] = m
                else:
                    cur[lo:hi] = True
        for d, is_write in ((stages[0], False), (stages[1], True)):
            if d:
                self._run_stage(d, is_write, marked[is_write])
        if self._hint_arrays:
            self._count_remote(accesses)  # type: ignore[arg-type]
        return self._flush_kernel_counters()

    def resident(self, accesses: Iterable[Access]) -> bool:
        """True when every page of ``accesses`` is GPU-resident (a kernel over them cannot fault)."""
        gpu = self._gpu
        for range_id, offset, size, _ in accesses:
            for s, lo, hi in self._segments(int(range_id), int(offset), int(size)):
                if not gpu[s, lo:hi].all():
                    return False
        return True

    def _flush_kernel_counters(self, stream: bool = False) -> UvmCounters:
        """The counters of the call that just ended (reset for the next one), multiplied by ``scale`` in a scaled
        replay (``stream``: a stream kernel, whose batch count is already the real one)."""
        k = self._k
        k.scale(self.scale, batches=not stream)
        self.totals.add(k)
        self._k = UvmCounters()
        if not self._held:
            self._serial += 1
        return k

    @contextmanager
    def one_kernel(self) -> Iterator[None]:
        """The calls inside are one kernel (a GEMM's passes, the calls of one replayed row): a chunk one of them
        evicts and another allocates again counts as refetched (``UvmCounters.refetched_chunks``)."""
        held, self._held = self._held, True
        try:
            yield
        finally:
            self._held = held
            if not held:
                self._serial += 1

    # -- checks --------------------------------------------------------------------------------
    def resident_bytes(self) -> int:
        """Bytes of GPU chunks in use (capacity consumed)."""
        return self.used_bytes

    def check_invariants(self) -> None:
        """Raise InvariantError if the state breaks a documented invariant."""
        n = self._n_slots
        live = np.array(self._slot_range[:n], dtype=np.int64) >= 0
        res_count = np.array(self._res_count[:n], dtype=np.int64)
        has_chunk = np.array(self._has_chunk[:n], dtype=bool)
        npages = np.array(self._npages[:n], dtype=np.int64)
        gpu, cpu = self._gpu[:n], self._cpu[:n]
        on_gpu, on_cpu = np.count_nonzero(gpu, axis=1), np.count_nonzero(cpu, axis=1)
        if not np.array_equal(np.count_nonzero(gpu | cpu, axis=1), on_gpu + on_cpu):
            raise InvariantError("a page is resident on both the GPU and the CPU (migrations move, not copy)")
        if not np.array_equal(on_gpu, res_count):
            raise InvariantError("per-block resident page counts disagree with the bitmaps")
        if not np.array_equal(on_cpu, np.array(self._cpu_count[:n], dtype=np.int64)):
            raise InvariantError("per-block CPU page counts disagree with the bitmaps")
        if ((res_count > 0) & ~has_chunk).any():
            raise InvariantError("a block has GPU-resident pages but no GPU chunk")
        if (has_chunk & ~live).any():
            raise InvariantError("a destroyed range still holds a GPU chunk")
        used = int(np.array(self._chunk_bytes[:n], dtype=np.int64)[has_chunk].sum())
        if used != self.used_bytes:
            raise InvariantError(f"chunk accounting: {used} B in chunks, {self.used_bytes} B counted")
        if self.mapped_bytes != sum(self._range_size.values()):
            raise InvariantError(f"mapped bytes {self.mapped_bytes} B disagree with the live ranges' sizes")
        if self.used_bytes > self.capacity_bytes:
            raise InvariantError(f"resident chunks {self.used_bytes} B exceed capacity {self.capacity_bytes} B")
        for rid in self._full_ranges:
            if rid not in self._ranges or (res_count[self._ranges[rid]] < npages[self._ranges[rid]]).any():
                raise InvariantError(f"range {rid} is listed as entirely GPU-resident but is not")
        if set(self._lrm) != set(np.flatnonzero(has_chunk).tolist()):
            raise InvariantError("the LRM list and the set of allocated chunks differ")
        free = ~live
        for name, count in (("_gpu", on_gpu), ("_cpu", on_cpu)):  # a row's count is its bitmap's (checked above)
            if count[free].any() or getattr(self, name)[n:].any():
                raise InvariantError(f"a free slot's {name.strip('_')} bitmap is not clear (map_range relies on it)")
        for name in ("_dup", "_disc"):
            if not self._hinted and getattr(self, name).any():  # unmap_range clears them only under hints
                raise InvariantError(f"the {name.strip('_')} bitmap holds pages but no hint is on")
        for name in (*(("_dup", "_disc") if self._hinted else ()), *self._hint_arrays):
            if getattr(self, name)[:n][free].any() or getattr(self, name)[n:].any():
                raise InvariantError(f"a free slot's {name.strip('_')} bitmap is not clear (map_range relies on it)")
        short = np.flatnonzero(npages < PAGES_PER_BLOCK)  # only a range's last block can end before its 512th page
        valid = np.arange(PAGES_PER_BLOCK)[None, :] < npages[short, None]
        if ((gpu[short] | cpu[short]) & ~valid).any():
            raise InvariantError("a page past the end of its block is resident")
        hint_error = self.check_hint_invariants() or self.check_advice_invariants()
        if hint_error:
            raise InvariantError(hint_error)
        no_cpu_chunk = (
            (cpu & ~self._calloc[:n]).any(axis=1)
            if self._page_chunks
            else (on_cpu > 0) & ~np.array(self._cpu_chunked[:n], dtype=bool)
        )
        if no_cpu_chunk.any():
            raise InvariantError("a CPU-resident page has no CPU chunk (its population skipped _cpu_alloc_ns)")
        if self.totals.dtoh_bytes > self.populated_gpu_bytes * self.scale:  # totals are multiplied back by scale
            raise InvariantError("more bytes left the GPU than were ever made resident there")
