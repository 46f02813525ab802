"""The NVIDIA UVM driver as a CPU simulator (reference/uvm.md sections 0, 1 and 6). Torch-free.

State lives in one :class:`UvmSim`. Managed ranges (one per ``cudaMallocManaged``) are cut into 2 MiB VA blocks;
each block keeps 512-page bitmaps (numpy) of GPU and CPU residency. GPU capacity is counted in chunks: a full
2 MiB block takes one 2 MiB root chunk the first time any page becomes GPU-resident.

Rules (each from uvm.md):

* Faults (1.4): a kernel's missing pages are cut into batches of at most ``knobs.pages_per_batch`` unique pages
  (a model of fault concurrency; the driver's cap is ``fault_batch_count`` = 256 entries), taken in the kernel's
  access order: read accesses first, then write accesses (a warp writes after its loads return). A page both read
  and written faults once, as a read (read faults map read-write, 1.4 "Read faults are upgraded").
* Per VA block of a batch (1.5): the tree prefetcher (:mod:`uvmlab.sim.prefetch`) adds pages; the block gets a
  chunk if it has none, evicting first if the GPU is full; pages resident on the CPU move HtoD (cause ``fault``
  for faulted pages, ``prefetch`` for the prefetcher's), pages resident nowhere are zero-filled with no transfer
  (1.2, 1.10); the block's chunk moves to the tail of the LRM list (1.6).
* Eviction (1.6): the victim is the chunk *least recently migrated into* (GPU accesses never update the order);
  every GPU-resident page of its block is copied DtoH (no dirty tracking); pages become CPU-resident.
* ``unmap_range`` (``cudaFree``, 1.10, 4.4): the range is destroyed; its chunks are freed with no DtoH.
* ``memcpy_htod`` (the study's retained ``cudaMemcpyAsync`` of inputs and parameters): the copy engine writes
  the pages, which become GPU-resident without replayable faults; counted apart from UM migrations.

Approximations (also in docs/uvm-sim.md):

* Each managed range starts 2 MiB-aligned (so small ranges do not share VA blocks; uvm.md 7.5 is open). A block
  shorter than 2 MiB takes its size rounded up to 64 KiB of capacity and is evicted on its own (the driver carves
  such chunks from split root chunks and evicts whole root chunks).
* Single touch: a page a kernel has already faulted in is not faulted again by the same kernel even if it is
  evicted before the kernel ends (uvm.md 6 step 3); pages are checked in access order when the kernel reaches them.
* Within a batch, blocks are serviced in the kernel's access order (the driver sorts by address; the order only
  changes which block is most recently migrated).
* Thrashing mitigation and access counters are off (uvm.md 1.7, 1.8: they do not act in single-GPU eviction).
* The UNUSED/DISCARDED lists are not modelled: a chunk exists only while its block has GPU-resident pages.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, fields

import numpy as np

from uvmlab.errors import InputError, InvariantError
from uvmlab.gpus import DEFAULT_GPU, GPUS, GpuSpec
from uvmlab.sim.prefetch import prefetch_pages
from uvmlab.sim.timing import CostParams, transfer_time_ns
from uvmlab.sim.uvm_knobs import BIG_PAGE_BYTES, PAGE_BYTES, PAGES_PER_BLOCK, VA_BLOCK_BYTES, UvmKnobs

Access = tuple[int, int, int, bool]
"""(range_id, offset_bytes, size_bytes, is_write): one byte range a kernel touches."""


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
    memcpy_htod_count: int = 0
    memcpy_htod_bytes: int = 0
    raw_fault_entries: float = 0.0
    stall_ns: float = 0.0
    """Time the faulting kernel waits for the bottom half (batches, evictions, transfers)."""

    def add(self, other: UvmCounters) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def as_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _run_lengths(row: np.ndarray) -> np.ndarray:
    """Lengths (pages) of the runs of True in a 1-D bool array: one transfer per contiguous run."""
    d = np.diff(np.concatenate(([0], row.view(np.int8), [0])))
    return np.flatnonzero(d == -1) - np.flatnonzero(d == 1)


class UvmSim:
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
        self.costs = (costs or CostParams()).for_gpu(gpu or GPUS[DEFAULT_GPU])
        self.used_bytes = 0
        n = 64
        self._gpu = np.zeros((n, PAGES_PER_BLOCK), dtype=bool)
        self._cpu = np.zeros((n, PAGES_PER_BLOCK), dtype=bool)
        self._npages = np.zeros(n, dtype=np.int64)
        self._chunk_bytes = np.zeros(n, dtype=np.int64)
        self._res_count = np.zeros(n, dtype=np.int64)
        self._has_chunk = np.zeros(n, dtype=bool)
        self._had_gpu = np.zeros(n, dtype=bool)
        self._fault_migrations = np.zeros(n, dtype=np.int64)
        self._slot_range = np.full(n, -1, dtype=np.int64)
        self._slot_bidx = np.zeros(n, dtype=np.int64)
        self._n_slots = 0
        self._free_slots: list[int] = []
        self._ranges: dict[int, np.ndarray] = {}
        self._range_size: dict[int, int] = {}
        self._lrm: OrderedDict[int, None] = OrderedDict()
        self.totals = UvmCounters()
        self._k = UvmCounters()
        self.events: list[tuple] | None = [] if record_events else None
        # conservation ledger (bytes): what has been made GPU-resident vs what left by DtoH
        self.populated_gpu_bytes = 0
        self.peak_used_bytes = 0

    # -- slots ---------------------------------------------------------------------------------
    def _grow(self, need: int) -> None:
        n = self._gpu.shape[0]
        if need <= n:
            return
        new = max(need, 2 * n)
        for name in (
            "_gpu",
            "_cpu",
            "_npages",
            "_chunk_bytes",
            "_res_count",
            "_has_chunk",
            "_had_gpu",
            "_fault_migrations",
            "_slot_range",
            "_slot_bidx",
        ):
            old = getattr(self, name)
            arr = np.zeros((new, *old.shape[1:]), dtype=old.dtype)
            arr[:n] = old
            setattr(self, name, arr)

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
        pages = np.full(nblocks, PAGES_PER_BLOCK, dtype=np.int64)
        tail = int(size_bytes) - (nblocks - 1) * VA_BLOCK_BYTES
        pages[-1] = -(-tail // PAGE_BYTES)
        small = -(-pages * PAGE_BYTES // BIG_PAGE_BYTES) * BIG_PAGE_BYTES
        chunk = np.where(pages == PAGES_PER_BLOCK, VA_BLOCK_BYTES, small)
        self._gpu[slots] = False
        self._cpu[slots] = False
        self._npages[slots] = pages
        self._chunk_bytes[slots] = chunk
        self._res_count[slots] = 0
        self._has_chunk[slots] = False
        self._had_gpu[slots] = False
        self._fault_migrations[slots] = 0
        self._slot_range[slots] = range_id
        self._slot_bidx[slots] = np.arange(nblocks)
        self._ranges[range_id] = slots
        self._range_size[range_id] = int(size_bytes)

    def unmap_range(self, range_id: int) -> int:
        """``cudaFree`` of a managed range: destroy it, free its chunks without DtoH. Returns its block count."""
        slots = self._ranges.pop(range_id, None)
        if slots is None:
            raise InvariantError(f"managed range {range_id} is freed but not mapped")
        del self._range_size[range_id]
        freed = 0
        for s in slots.tolist():
            if self._has_chunk[s]:
                freed += int(self._chunk_bytes[s])
                del self._lrm[s]
        self.used_bytes -= freed
        self._has_chunk[slots] = False
        self._gpu[slots] = False
        self._cpu[slots] = False
        self._res_count[slots] = 0
        self._slot_range[slots] = -1
        self._free_slots.extend(slots.tolist())
        if self.events is not None:
            self.events.append(("destroy", range_id, len(slots), freed))
        return len(slots)

    @property
    def mapped_bytes(self) -> int:
        """Bytes of live managed ranges."""
        return sum(self._range_size.values())

    # -- helpers -------------------------------------------------------------------------------
    def _segments(self, range_id: int, offset: int, size: int) -> list[tuple[int, int, int]]:
        """(slot, first_page, end_page) per VA block of a byte range, in address order."""
        slots = self._ranges.get(range_id)
        if slots is None:
            raise InvariantError(f"access to managed range {range_id}, which is not mapped")
        if size <= 0:
            return []
        end = min(offset + size, self._range_size[range_id])
        if offset < 0 or offset >= end:
            raise InvariantError(f"access [{offset}, {offset + size}) outside range {range_id}")
        p0 = offset // PAGE_BYTES
        p1 = -(-end // PAGE_BYTES)
        b0, b1 = p0 // PAGES_PER_BLOCK, (p1 - 1) // PAGES_PER_BLOCK
        if b0 == b1:
            return [(int(slots[b0]), p0 - b0 * PAGES_PER_BLOCK, p1 - b0 * PAGES_PER_BLOCK)]
        out = [(int(slots[b0]), p0 - b0 * PAGES_PER_BLOCK, PAGES_PER_BLOCK)]
        out.extend((int(s), 0, PAGES_PER_BLOCK) for s in slots[b0 + 1 : b1].tolist())
        out.append((int(slots[b1]), 0, p1 - b1 * PAGES_PER_BLOCK))
        return out

    def _evict_one(self) -> None:
        """Evict the least recently migrated chunk: DtoH every GPU-resident page of its block."""
        if not self._lrm:
            raise InvariantError("eviction needed but no chunk is evictable")
        v, _ = self._lrm.popitem(last=False)
        row = self._gpu[v]
        n = int(self._res_count[v])
        runs = _run_lengths(row)
        self._cpu[v] |= row
        self._gpu[v] = False
        self._res_count[v] = 0
        self._has_chunk[v] = False
        self.used_bytes -= int(self._chunk_bytes[v])
        k = self._k
        k.eviction_count += 1
        k.dtoh_bytes += n * PAGE_BYTES
        k.dtoh_count += len(runs)
        k.stall_ns += self.costs.evict_fixed_ns + transfer_time_ns(runs * PAGE_BYTES, self.costs.link_bytes_per_s)
        if self.events is not None:
            self.events.append(("evict", int(self._slot_range[v]), int(self._slot_bidx[v]), n))

    def _ensure_chunk(self, s: int) -> None:
        if self._has_chunk[s]:
            return
        need = int(self._chunk_bytes[s])
        while self.capacity_bytes - self.used_bytes < need:
            self._evict_one()
        self.used_bytes += need
        self.peak_used_bytes = max(self.peak_used_bytes, self.used_bytes)
        self._has_chunk[s] = True
        self._lrm[s] = None
        if not self._had_gpu[s]:
            self._had_gpu[s] = True
            self._k.stall_ns += self.costs.block_first_gpu_ns

    def _populate(self, s: int, mask: np.ndarray) -> tuple[int, np.ndarray]:
        """Make ``mask`` pages of slot ``s`` GPU-resident; return (zero-filled pages, HtoD run lengths)."""
        self._ensure_chunk(s)
        cpu_row = self._cpu[s]
        h = mask & cpu_row
        n_all = int(mask.sum())
        n_h = int(h.sum())
        runs = _run_lengths(h) if n_h else np.empty(0, dtype=np.int64)
        self._gpu[s] |= mask
        cpu_row &= ~mask
        self._res_count[s] += n_all
        self._lrm.move_to_end(s)
        self.populated_gpu_bytes += n_all * PAGE_BYTES
        return n_all - n_h, runs

    # -- host side -----------------------------------------------------------------------------
    def host_write(self, range_id: int, offset: int, size: int) -> None:
        """The CPU writes a byte range (e.g. initialises an array): pages become CPU-resident.

        GPU-resident pages are first migrated back (a CPU fault, DtoH, uvm.md 1.10).
        """
        for s, lo, hi in self._segments(range_id, offset, size):
            back = self._gpu[s, lo:hi]
            n = int(back.sum())
            if n:
                runs = _run_lengths(back)
                self._k.dtoh_bytes += n * PAGE_BYTES
                self._k.dtoh_count += len(runs)
                self._gpu[s, lo:hi] = False
                self._res_count[s] -= n
                if self._res_count[s] == 0 and self._has_chunk[s]:
                    self._has_chunk[s] = False
                    self.used_bytes -= int(self._chunk_bytes[s])
                    del self._lrm[s]
            self._cpu[s, lo:hi] = True
        self._flush_kernel_counters()

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
            if mask.any():
                self._populate(s, mask)
        self._k.memcpy_htod_count += 1
        self._k.memcpy_htod_bytes += int(size)
        self._k.stall_ns += transfer_time_ns(np.array([size]), self.costs.link_bytes_per_s)
        return self._flush_kernel_counters()

    # -- kernels -------------------------------------------------------------------------------
    def access(self, accesses: Iterable[Access]) -> UvmCounters:
        """Run one kernel touching ``accesses``; return its counters (faults, batches, migrations, stall time)."""
        reads: list[tuple[int, int, int]] = []
        writes: list[tuple[int, int, int]] = []
        for range_id, offset, size, is_write in accesses:
            (writes if is_write else reads).extend(self._segments(int(range_id), int(offset), int(size)))
        for segs, is_write in ((reads, False), (writes, True)):
            if segs:
                self._run_stage(segs, is_write)
        return self._flush_kernel_counters()

    def _run_stage(self, segs: list[tuple[int, int, int]], is_write: bool) -> None:
        res_count, npages, gpu = self._res_count, self._npages, self._gpu
        per_batch = self.knobs.pages_per_batch
        budget = per_batch
        batch: dict[int, np.ndarray] = {}
        for s, lo, hi in segs:
            while res_count[s] < npages[s]:
                miss = ~gpu[s, lo:hi]
                pending = batch.get(s)
                if pending is not None:
                    miss &= ~pending[lo:hi]
                idx = np.flatnonzero(miss)
                if idx.size == 0:
                    break
                take = idx[:budget]
                if pending is None:
                    pending = batch[s] = np.zeros(PAGES_PER_BLOCK, dtype=bool)
                pending[lo + take] = True
                budget -= take.size
                if budget > 0:
                    break
                self._service_batch(batch, is_write)
                batch = {}
                budget = per_batch
                lo = lo + int(take[-1]) + 1
                if lo >= hi:
                    break
        if batch:
            self._service_batch(batch, is_write)

    def _service_batch(self, batch: dict[int, np.ndarray], is_write: bool) -> None:
        """Service one fault batch: per VA block, prefetch, chunk (evict), migrate or zero-fill, LRM update."""
        k, costs, knobs = self._k, self.costs, self.knobs
        slot_list = list(batch)
        slots = np.array(slot_list, dtype=np.int64)
        faulted = np.stack([batch[s] for s in slot_list])
        n_faults = int(faulted.sum())
        per_block_faults = faulted.sum(axis=1)
        self._fault_migrations[slots] += per_block_faults
        if knobs.prefetch_enable:
            extra = prefetch_pages(self._gpu[slots], faulted, self._npages[slots], knobs.prefetch_threshold)
            extra[self._fault_migrations[slots] < knobs.prefetch_min_faults] = False
        else:
            extra = np.zeros_like(faulted)
        res_before = self._res_count[slots].copy()
        htod_runs: list[np.ndarray] = []
        zero_pages = 0
        for i, s in enumerate(slot_list):
            f_row = faulted[i]
            if knobs.prefetch_enable and self._res_count[s] != res_before[i]:
                # evicted while an earlier block of this batch was serviced: the prefetcher sees the new state
                extra[i] = prefetch_pages(
                    self._gpu[s : s + 1], faulted[i : i + 1], self._npages[s : s + 1], knobs.prefetch_threshold
                )[0]
            mask = (f_row | extra[i]) & ~self._gpu[s]
            cpu_before = self._cpu[s] & mask
            fault_h = int((cpu_before & f_row).sum())
            pre_h = int(cpu_before.sum()) - fault_h
            z, runs = self._populate(s, mask)
            zero_pages += z
            if runs.size:
                htod_runs.append(runs)
            k.fault_htod_bytes += fault_h * PAGE_BYTES
            k.prefetch_htod_bytes += pre_h * PAGE_BYTES
            if self.events is not None:
                self.events.append(
                    (
                        "service",
                        int(self._slot_range[s]),
                        int(self._slot_bidx[s]),
                        int(f_row.sum()),
                        int(mask.sum()),
                        fault_h + pre_h,
                        z,
                    )
                )
        all_runs = np.concatenate(htod_runs) if htod_runs else np.empty(0, dtype=np.int64)
        k.htod_count += int(all_runs.size)
        k.htod_bytes += int(all_runs.sum()) * PAGE_BYTES
        k.zero_fill_bytes += zero_pages * PAGE_BYTES
        k.fault_batch_count += 1
        k.fault_count += n_faults
        if is_write:
            k.write_fault_count += n_faults
        else:
            k.read_fault_count += n_faults
        raw = min(float(knobs.fault_batch_count), n_faults * costs.raw_entries_per_fault)
        k.raw_fault_entries += raw
        k.stall_ns += (
            costs.batch_turnaround_ns
            + costs.fault_entry_ns * raw
            + costs.block_service_ns * len(slot_list)
            + transfer_time_ns(all_runs * PAGE_BYTES, costs.link_bytes_per_s)
            + zero_pages * PAGE_BYTES / costs.zero_fill_bytes_per_s * 1e9
        )
        if self.events is not None:
            self.events.append(("batch", "write" if is_write else "read", n_faults, len(slot_list)))

    def _flush_kernel_counters(self) -> UvmCounters:
        k = self._k
        self.totals.add(k)
        self._k = UvmCounters()
        return k

    # -- checks --------------------------------------------------------------------------------
    def resident_bytes(self) -> int:
        """Bytes of GPU chunks in use (capacity consumed)."""
        return self.used_bytes

    def check_invariants(self) -> None:
        """Raise InvariantError if the state breaks a documented invariant."""
        n = self._n_slots
        live = self._slot_range[:n] >= 0
        gpu, cpu = self._gpu[:n], self._cpu[:n]
        if (gpu & cpu).any():
            raise InvariantError("a page is resident on both the GPU and the CPU (migrations move, not copy)")
        if not np.array_equal(gpu.sum(axis=1), self._res_count[:n]):
            raise InvariantError("per-block resident page counts disagree with the bitmaps")
        if ((self._res_count[:n] > 0) & ~self._has_chunk[:n]).any():
            raise InvariantError("a block has GPU-resident pages but no GPU chunk")
        if (self._has_chunk[:n] & ~live).any():
            raise InvariantError("a destroyed range still holds a GPU chunk")
        used = int(self._chunk_bytes[:n][self._has_chunk[:n]].sum())
        if used != self.used_bytes:
            raise InvariantError(f"chunk accounting: {used} B in chunks, {self.used_bytes} B counted")
        if self.used_bytes > self.capacity_bytes:
            raise InvariantError(f"resident chunks {self.used_bytes} B exceed capacity {self.capacity_bytes} B")
        if set(self._lrm) != set(np.flatnonzero(self._has_chunk[:n]).tolist()):
            raise InvariantError("the LRM list and the set of allocated chunks differ")
        valid = np.arange(PAGES_PER_BLOCK)[None, :] < self._npages[:n, None]
        if ((gpu | cpu) & ~valid).any():
            raise InvariantError("a page past the end of its block is resident")
        if self.totals.dtoh_bytes > self.populated_gpu_bytes:
            raise InvariantError("more bytes left the GPU than were ever made resident there")
