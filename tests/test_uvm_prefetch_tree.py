"""The tree prefetcher against a page-by-page walk of the driver's rule (uvm_perf_prefetch.c, uvm.md 1.5)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from uvmlab.sim.uvm.prefetch import prefetch_pages

PAGES = 512
BIG = 16  # 4 KiB pages per 64 KiB big page


def walk(resident: np.ndarray, faulted: np.ndarray, npages: int, threshold: int, exclude: np.ndarray | None):
    """The rule as the driver states it, one faulted page at a time: mark resident pages and whole big pages
    around faults, then take each faulted page's largest aligned subtree with more than threshold % marked."""
    valid = np.arange(PAGES) < npages
    marked = resident.copy()
    for p in np.flatnonzero(faulted):
        marked[p // BIG * BIG : p // BIG * BIG + BIG] = True
    marked &= valid
    region = np.zeros(PAGES, dtype=bool)
    for p in np.flatnonzero(faulted):
        size = PAGES
        while size >= 1:
            lo = p // size * size
            eff = min(max(npages - lo, 0), size)
            if eff and int(marked[lo : lo + size].sum()) * 100 > eff * threshold:
                region[lo : lo + size] = True
                break
            size //= 2
    return region & ~(resident if exclude is None else exclude) & ~faulted & valid


bitmaps = st.lists(st.booleans(), min_size=PAGES, max_size=PAGES).map(lambda v: np.array(v, dtype=bool))


@settings(max_examples=60, deadline=None)
@given(
    resident=bitmaps,
    faulted=bitmaps,
    npages=st.integers(1, PAGES),
    threshold=st.integers(1, 100),
    with_exclude=st.booleans(),
    density=st.sampled_from([1, 4, 32]),
)
def test_prefetch_equals_the_page_by_page_walk(resident, faulted, npages, threshold, with_exclude, density) -> None:
    faulted = faulted & (np.arange(PAGES) % density == 0) & ~resident & (np.arange(PAGES) < npages)
    resident = resident & (np.arange(PAGES) < npages)
    exclude = (resident & np.roll(resident, 1)) if with_exclude else None
    expected = walk(resident, faulted, npages, threshold, exclude)
    got = prefetch_pages(resident, faulted, npages, threshold, exclude)
    assert np.array_equal(got, expected)
    again = prefetch_pages(resident.copy(), faulted.copy(), npages, threshold, exclude)  # the memoized decision
    assert np.array_equal(again, expected) and not again.flags.writeable


def test_a_memoized_decision_follows_its_inputs_not_the_call_order() -> None:
    """Two states that differ in one resident page get their own decisions, however often either is asked."""
    res = np.zeros(PAGES, dtype=bool)
    res[:200] = True
    f = np.zeros(PAGES, dtype=bool)
    f[300] = True
    with_block = prefetch_pages(res, f, PAGES, 51)
    res2 = res.copy()
    res2[199] = False
    for _ in range(3):
        assert np.array_equal(prefetch_pages(res, f, PAGES, 51), with_block)
        assert np.array_equal(prefetch_pages(res2, f, PAGES, 51), walk(res2, f, PAGES, 51, None))
