"""The UVM tree prefetcher (``uvm_perf_prefetch.c``, uvm.md 1.5), one VA block of a fault batch at a time.

For each faulted VA block the driver builds a binary tree over the block's 512 pages. A page is *marked* if it
is resident on the destination, faulted in this batch, or shares a 64 KiB big page with a faulted page
(``grow_fault_granularity``). For every faulted page it takes the largest aligned subtree containing that page in
which strictly more than ``threshold`` percent of the pages are marked, and migrates that subtree whole.

Implementation note: the union over faulted pages of "largest qualifying ancestor" equals the union of *every*
qualifying subtree that contains at least one faulted page (a qualifying subtree containing page p lies inside
p's largest qualifying ancestor). That turns the per-page walk into lookups of each faulted page's 10 aligned
ancestors in a prefix sum of the marked pages.

Partial blocks (a range's last block, shorter than 2 MiB) keep a 512-leaf tree; pages past the block's end are
never marked and a subtree's size is clipped at the block end (as the driver clips its bitmap tree at
``leaf_count``). Approximation: the driver aligns the tree to big-page boundaries of the block's VA; managed
ranges here start 2 MiB-aligned, so the offset is always 0.
"""

from __future__ import annotations

import numpy as np

from uvmlab.sim.uvm.knobs import PAGES_PER_BIG_PAGE, PAGES_PER_BLOCK

_SIZES = np.array([1 << k for k in range(PAGES_PER_BLOCK.bit_length())])  # 1, 2, 4, ..., 512 pages
_ALIGN = ~(_SIZES - 1)  # page & _ALIGN[k]: the first page of the page's level-k subtree
_LEVELS = _SIZES.size
_MEMO_LIMIT = 16384  # decisions kept (about 15 MiB, measured with tracemalloc); the memo is emptied when full
_memo: dict[tuple[bytes, bytes, bytes | None, int, int], np.ndarray] = {}


def grow_to_big_pages(faulted: np.ndarray) -> np.ndarray:
    """Mark the whole 64 KiB big page around every faulted page: (512,) bool -> (512,) bool."""
    big = faulted.reshape(PAGES_PER_BLOCK // PAGES_PER_BIG_PAGE, PAGES_PER_BIG_PAGE).any(axis=1)
    return np.repeat(big, PAGES_PER_BIG_PAGE)


def prefetch_pages(
    resident: np.ndarray,
    faulted: np.ndarray,
    npages: int,
    threshold_percent: int,
    exclude: np.ndarray | None = None,
) -> np.ndarray:
    """Pages the prefetcher adds to one VA block's faults of a batch.

    ``resident``: (512,) pages already resident on the destination; ``faulted``: (512,) pages faulted in this
    batch; ``npages``: the block's valid pages. Returns a read-only (512,) bool: pages to migrate in addition to the
    faulted ones (never resident, never faulted, never past the block end). ``exclude``: the pages never to return,
    when they differ from ``resident`` (a CPU fault marks every CPU-resident page but skips only those the CPU
    already maps: ``uvm_perf_prefetch_prenotify_fault_migrations``, uvm_perf_prefetch.c).

    The decision depends on nothing but its arguments, and a replay meets the same block states again and again
    (a sweep's blocks fault the same way), so decisions are memoized on the packed bitmaps.
    """
    key = (
        np.packbits(resident).tobytes(),
        np.packbits(faulted).tobytes(),
        None if exclude is None else np.packbits(exclude).tobytes(),
        int(npages),
        int(threshold_percent),
    )
    hit = _memo.get(key)
    if hit is None:
        if len(_memo) >= _MEMO_LIMIT:
            _memo.clear()
        hit = _decide(resident, faulted, int(npages), int(threshold_percent), exclude)
        hit.flags.writeable = False
        _memo[key] = hit
    return hit


def _decide(
    resident: np.ndarray, faulted: np.ndarray, npages: int, threshold_percent: int, exclude: np.ndarray | None
) -> np.ndarray:
    """:func:`prefetch_pages` without the memo.

    Only the 10 ancestors of each faulted page can qualify (module docstring), so their marked-page counts are
    read off a prefix sum of the marked pages, and each faulted page's largest qualifying ancestor is added to
    the region through a difference array: the cost grows with the faulted pages, not with the tree's levels.
    """
    partial = npages < PAGES_PER_BLOCK
    marked = resident | grow_to_big_pages(faulted)
    if partial:
        marked[npages:] = False
    prefix = np.zeros(PAGES_PER_BLOCK + 1, dtype=np.int32)
    np.cumsum(marked, out=prefix[1:])
    page = np.flatnonzero(faulted)
    starts = page[:, None] & _ALIGN  # (F, levels): each faulted page's aligned ancestors
    ends = starts + _SIZES
    counts = prefix[ends] - prefix[starts]
    eff = np.minimum(np.maximum(npages - starts, 0), _SIZES) if partial else _SIZES  # clipped at the block end
    qualifies = counts * 100 > eff * threshold_percent  # counts <= eff, so eff > 0 here
    top = _LEVELS - 1 - np.argmax(qualifies[:, ::-1], axis=1)  # the largest qualifying ancestor
    rows = np.flatnonzero(qualifies[np.arange(page.size), top])
    lo, hi = starts[rows, top[rows]], ends[rows, top[rows]]
    edges = np.bincount(lo, minlength=PAGES_PER_BLOCK + 1) - np.bincount(hi, minlength=PAGES_PER_BLOCK + 1)
    region = np.cumsum(edges[:PAGES_PER_BLOCK]) > 0
    if partial:
        region[npages:] = False
    return region & ~(resident if exclude is None else exclude) & ~faulted
