"""The UVM tree prefetcher (``uvm_perf_prefetch.c``, uvm.md 1.5), vectorized over the VA blocks of one batch.

For each faulted VA block the driver builds a binary tree over the block's 512 pages. A page is *marked* if it
is resident on the destination, faulted in this batch, or shares a 64 KiB big page with a faulted page
(``grow_fault_granularity``). For every faulted page it takes the largest aligned subtree containing that page in
which strictly more than ``threshold`` percent of the pages are marked, and migrates that subtree whole.

Implementation note: the union over faulted pages of "largest qualifying ancestor" equals the union of *every*
qualifying subtree that contains at least one faulted page (a qualifying subtree containing page p lies inside
p's largest qualifying ancestor). That turns the per-page walk into 10 reshape-and-sum steps over a (B, 512)
array, one per tree level.

Partial blocks (a range's last block, shorter than 2 MiB) keep a 512-leaf tree; pages past the block's end are
never marked and a subtree's size is clipped at the block end (as the driver clips its bitmap tree at
``leaf_count``). Approximation: the driver aligns the tree to big-page boundaries of the block's VA; managed
ranges here start 2 MiB-aligned, so the offset is always 0.
"""

from __future__ import annotations

import numpy as np

from uvmlab.sim.uvm.knobs import PAGES_PER_BIG_PAGE, PAGES_PER_BLOCK

_LEVEL_SIZES = tuple(1 << k for k in range(PAGES_PER_BLOCK.bit_length()))  # 1, 2, 4, ..., 512 pages
_SIZES = np.array(_LEVEL_SIZES)[None, :]
_PAGE_INDEX = np.arange(PAGES_PER_BLOCK)


def grow_to_big_pages(faulted: np.ndarray) -> np.ndarray:
    """Mark the whole 64 KiB big page around every faulted page: (B, 512) bool -> (B, 512) bool."""
    b = faulted.shape[0]
    big = faulted.reshape(b, PAGES_PER_BLOCK // PAGES_PER_BIG_PAGE, PAGES_PER_BIG_PAGE).any(axis=2)
    return np.repeat(big, PAGES_PER_BIG_PAGE, axis=1)


def prefetch_pages(
    resident: np.ndarray,
    faulted: np.ndarray,
    npages: np.ndarray,
    threshold_percent: int,
    exclude: np.ndarray | None = None,
) -> np.ndarray:
    """Pages the prefetcher adds to a batch's faults, per block.

    ``resident``: (B, 512) pages already resident on the GPU; ``faulted``: (B, 512) pages faulted in this batch;
    ``npages``: (B,) valid pages per block. Returns (B, 512) bool: pages to migrate in addition to the faulted
    ones (never resident, never faulted, never past the block end). ``exclude``: the pages never to return, when
    they differ from ``resident`` (a CPU fault marks every CPU-resident page but skips only those the CPU already
    maps: ``uvm_perf_prefetch_prenotify_fault_migrations``, uvm_perf_prefetch.c).

    Only the 10 ancestors of each faulted page can qualify (module docstring), so their marked-page counts are
    read off a prefix sum of the marked pages, and each faulted page's largest qualifying ancestor is added to
    the region through a difference array: the cost grows with the faulted pages, not with the tree's levels.
    """
    b = resident.shape[0]
    npg = npages[:, None]
    valid = _PAGE_INDEX[None, :] < npg
    marked = (resident | grow_to_big_pages(faulted)) & valid
    prefix = np.zeros((b, PAGES_PER_BLOCK + 1), dtype=np.int32)
    np.cumsum(marked, axis=1, out=prefix[:, 1:])
    blk, page = np.nonzero(faulted)
    starts = (page[:, None] // _SIZES) * _SIZES  # (F, levels): each faulted page's aligned ancestors
    ends = starts + _SIZES
    rows = blk[:, None]
    counts = prefix[rows, ends] - prefix[rows, starts]
    eff = np.minimum(np.maximum(npages[blk][:, None] - starts, 0), _SIZES)  # subtree size clipped at the block end
    qualifies = counts * 100 > eff * threshold_percent  # counts <= eff, so eff > 0 here
    has = qualifies.any(axis=1)
    top = _SIZES.size - 1 - np.argmax(qualifies[:, ::-1], axis=1)  # the largest qualifying ancestor
    edges = np.zeros((b, PAGES_PER_BLOCK + 1), dtype=np.int32)
    sel = np.flatnonzero(has)
    np.add.at(edges, (blk[sel], starts[sel, top[sel]]), 1)
    np.add.at(edges, (blk[sel], ends[sel, top[sel]]), -1)
    region = np.cumsum(edges[:, :PAGES_PER_BLOCK], axis=1) > 0
    return region & ~(resident if exclude is None else exclude) & ~faulted & valid
