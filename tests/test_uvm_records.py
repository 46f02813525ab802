"""Run lengths of a page mask, and the nsys-style HtoD record count of a serviced block: one pass, equal to
counting both causes' runs."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from uvmlab.sim.uvm.knobs import PAGES_PER_BLOCK
from uvmlab.sim.uvm.runs import htod_record_count, run_lengths

bools = st.lists(st.booleans(), min_size=PAGES_PER_BLOCK, max_size=PAGES_PER_BLOCK)


@settings(deadline=None)
@given(st.lists(st.booleans(), max_size=2 * PAGES_PER_BLOCK))
def test_run_lengths_are_the_lengths_of_the_true_runs(row: list[bool]) -> None:
    """Against itertools.groupby, in order, empty and all-True rows included."""
    from itertools import groupby

    expected = [len(list(g)) for value, g in groupby(row) if value]
    got = run_lengths(np.array(row, dtype=bool))
    assert got.dtype == np.int64 and got.tolist() == expected


@settings(deadline=None)  # a loaded machine must not fail a property
@given(bools, bools)
def test_record_count_is_the_runs_of_each_cause(moved: list[bool], faulted: list[bool]) -> None:
    m, f = np.array(moved), np.array(faulted)
    assert htod_record_count(m, f) == run_lengths(m & f).size + run_lengths(m & ~f).size


@settings(deadline=None)
@given(st.integers(0, PAGES_PER_BLOCK), st.integers(0, PAGES_PER_BLOCK), st.integers(1, 64))
def test_record_count_on_runs_and_strides(lo: int, hi: int, stride: int) -> None:
    """Prefetcher-like masks (a contiguous range) with strided faulted pages inside."""
    m = np.zeros(PAGES_PER_BLOCK, dtype=bool)
    m[lo:hi] = True
    f = np.zeros(PAGES_PER_BLOCK, dtype=bool)
    f[lo:hi:stride] = True
    assert htod_record_count(m, f) == run_lengths(m & f).size + run_lengths(m & ~f).size


def test_record_count_examples() -> None:
    m = np.zeros(PAGES_PER_BLOCK, dtype=bool)
    f = np.zeros(PAGES_PER_BLOCK, dtype=bool)
    assert htod_record_count(m, f) == 0
    m[:16] = True
    f[0] = True
    assert htod_record_count(m, f) == 2  # 4 KiB faulted + 60 KiB prefetched (csc746's pattern)
    f[:] = True
    assert htod_record_count(m, f) == 1  # one cause, one run: the input arrays are left unchanged
    assert m[:16].all() and not m[16:].any()
