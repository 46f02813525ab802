"""The batches of a kernel faulted in a given order, computed once and replayed in bulk (torch-free).

``FaultService.access_in_order`` fetches batch after batch from a page order (a tiled GEMM's,
uvmlab.sim.uvm.tile_order). A training step runs the same GEMMs on the same places every iteration, and under
oversubscription their VA blocks come back in the same states (evicted whole, or never touched). The batches depend
on nothing but the order and the blocks' GPU- and CPU-resident pages and page counts, so this module computes them
once on a scratch copy of the blocks (:func:`build_schedule`: the same fetch, prefetcher and single-touch rules, no
costs) and sums what each block receives; the driver then applies a whole kernel block by block instead of batch by
batch (``FaultService._bulk_in_order``; tests/test_uvm_tile_order.py checks that both give the same counters and
state).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from uvmlab.sim.uvm.knobs import PAGES_PER_BLOCK
from uvmlab.sim.uvm.prefetch import prefetch_pages
from uvmlab.sim.uvm.runs import htod_record_count, run_lengths


@dataclass(frozen=True)
class BlockTotals:
    """What one block of the kernel receives over all its services."""

    local: int  # index into the kernel's block list
    services: int  # (batch, block) services
    faults: int  # faulted pages
    union: np.ndarray  # (512,) bool: the pages made resident
    pages: int  # pages made resident (faulted + prefetched)
    fault_htod: int  # faulted pages moved from the CPU
    prefetch_htod: int  # prefetched pages moved from the CPU
    zero: int  # pages resident nowhere before: zero-filled
    runs: np.ndarray  # HtoD run lengths of every service
    records: int  # nsys HtoD records


@dataclass(frozen=True)
class TileSchedule:
    """A kernel's batches (fault counts and kind) and per-block totals, in first-service order; ``last_order``
    is the blocks in the order of their last service (the LRM order they leave)."""

    batch_faults: np.ndarray  # unique pages per batch
    batch_writes: np.ndarray  # bool per batch: a write stage's batch
    blocks: list[BlockTotals]
    last_order: list[int]

    @property
    def nbytes(self) -> int:
        """Bytes of the schedule's arrays (what the driver's memo counts against its budget)."""
        per_block = sum(b.union.nbytes + b.runs.nbytes for b in self.blocks)
        return per_block + self.batch_faults.nbytes + self.batch_writes.nbytes


def fetch_batches(seq: np.ndarray, flat: np.ndarray, per_batch: int) -> Iterator[np.ndarray]:
    """The batches a kernel faulting the pages ``seq`` in that order raises, as positions in ``seq``: each the next
    ``per_batch`` pages of the order that are not resident in ``flat`` (a live view of the GPU bitmap: the caller
    services each batch before the next is fetched, so pages it prefetched raise no fault), in order."""
    window = 8 * per_batch
    pos, n = 0, seq.size
    while pos < n:
        taken: list[np.ndarray] = []
        count = 0
        while pos < n and count < per_batch:
            miss = np.flatnonzero(~flat[seq[pos : pos + window]])[: per_batch - count]
            if miss.size:
                taken.append(miss + pos)
                count += miss.size
                pos += int(miss[-1]) + 1 if count >= per_batch else window
            else:
                pos += window
        if not count:
            return
        yield taken[0] if len(taken) == 1 else np.concatenate(taken)


def block_groups(batch: np.ndarray) -> list[np.ndarray]:
    """A sorted batch of page ids cut into its blocks' groups (one group when it lies in one block)."""
    if batch[0] // PAGES_PER_BLOCK == batch[-1] // PAGES_PER_BLOCK:
        return [batch]
    return np.split(batch, np.flatnonzero(np.diff(batch // PAGES_PER_BLOCK)) + 1)


def build_schedule(
    stages: list[tuple[np.ndarray, bool]],
    gpu: np.ndarray,
    cpu: np.ndarray,
    npages: np.ndarray,
    per_batch: int,
    prefetch_threshold: int | None,
) -> TileSchedule:
    """The batches of ``stages`` (local page ids ``block * 512 + page``, in order; is_write) over blocks whose
    GPU- and CPU-resident pages are ``gpu`` and ``cpu`` ((blocks, 512) bool; copied, not changed), ``npages``
    valid pages each; the prefetcher at ``prefetch_threshold`` percent (None: off). The rules are
    ``FaultService.access_in_order``'s and ``_service_block``'s."""
    gpu = gpu.copy()
    start = gpu.copy()
    nb = gpu.shape[0]
    flat = gpu.reshape(-1)
    batch_faults: list[int] = []
    batch_writes: list[bool] = []
    services = np.zeros(nb, dtype=np.int64)
    faults = np.zeros(nb, dtype=np.int64)
    fault_h = np.zeros(nb, dtype=np.int64)
    moved_h = np.zeros(nb, dtype=np.int64)
    runs: list[list[np.ndarray]] = [[] for _ in range(nb)]
    records = np.zeros(nb, dtype=np.int64)
    first: dict[int, None] = {}
    last: dict[int, None] = {}
    for seq, is_write in stages:
        for at in fetch_batches(seq, flat, per_batch):
            batch = np.sort(seq[at])
            for grp in block_groups(batch):
                b = int(grp[0] // PAGES_PER_BLOCK)
                faulted = np.zeros(PAGES_PER_BLOCK, dtype=bool)
                faulted[grp % PAGES_PER_BLOCK] = True
                row = gpu[b]
                if prefetch_threshold is None:
                    mask = faulted & ~row
                else:
                    mask = faulted | prefetch_pages(row, faulted, int(npages[b]), prefetch_threshold)
                cpu_m = cpu[b] & mask
                services[b] += 1
                faults[b] += grp.size
                if cpu_m.any():
                    fault_h[b] += np.count_nonzero(cpu_m & faulted)
                    moved_h[b] += np.count_nonzero(cpu_m)
                    runs[b].append(run_lengths(cpu_m))
                    records[b] += htod_record_count(cpu_m, faulted)
                row |= mask
                first.setdefault(b, None)
                last.pop(b, None)
                last[b] = None
            batch_faults.append(batch.size)
            batch_writes.append(is_write)
    blocks = []
    for b in first:
        union = gpu[b] & ~start[b]
        pages = int(np.count_nonzero(union))
        blocks.append(
            BlockTotals(
                local=b,
                services=int(services[b]),
                faults=int(faults[b]),
                union=union,
                pages=pages,
                fault_htod=int(fault_h[b]),
                prefetch_htod=int(moved_h[b] - fault_h[b]),
                zero=pages - int(moved_h[b]),
                runs=np.concatenate(runs[b]) if runs[b] else np.empty(0, dtype=np.int64),
                records=int(records[b]),
            )
        )
    return TileSchedule(np.array(batch_faults, dtype=np.int64), np.array(batch_writes, dtype=bool), blocks, list(last))
