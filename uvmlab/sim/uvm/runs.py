"""Runs of pages: one transfer per contiguous run, and nsys's HtoD records split by cause (torch-free)."""

from __future__ import annotations

import numpy as np

_FALSE = np.zeros(1, dtype=bool)


def run_lengths(row: np.ndarray) -> np.ndarray:
    """Lengths (pages) of the runs of True in a 1-D bool array: one transfer per contiguous run (padded with False
    at both ends, the value changes alternate run starts and run ends)."""
    padded = np.concatenate((_FALSE, row, _FALSE))
    edges = np.flatnonzero(padded[1:] != padded[:-1])
    return edges[1::2] - edges[::2]


def htod_record_count(moved: np.ndarray, faulted: np.ndarray) -> int:
    """nsys-style HtoD records of moving the pages ``moved`` (1-D bool), split by cause: one per contiguous run of
    ``moved & faulted`` plus one per run of ``moved & ~faulted``, i.e. ``run_lengths`` of both (the test checks),
    counted in one pass: a record starts at each moved page whose predecessor is not moved or has the other cause.
    """
    start = moved.copy()
    start[1:] &= ~moved[:-1] | (faulted[1:] != faulted[:-1])
    return int(np.count_nonzero(start))
