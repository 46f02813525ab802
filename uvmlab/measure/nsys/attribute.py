"""Interval attribution: which kernel, API call or iteration an event (fault, migration) falls in.

UM fault and migration rows carry no correlation id, stream or context (reference/nsys.md §0.3), so attribution
is by time overlap on the same process (and device, for kernels). Rules:

* An event [s, e] overlaps an interval [a, b] when a < max(e, s + 1) and b > s (a point event at s falls in
  [a, b) ).
* Among overlapping intervals the one that started last wins (innermost for nested API calls / NVTX ranges;
  the later kernel for concurrent kernels). A migration straddling two kernels goes to the later one, whole:
  rows are not split.
* Events overlapping no kernel go to the "outside any kernel" bucket, sub-divided by the CUDA API call they
  overlap (runtime calls first, then driver calls), or "none".

Vectorized with sorted ``numpy.searchsorted``; the rare events whose last-started candidate does not overlap
but an earlier, longer one does (concurrent kernels) are resolved by a short backward scan.
"""

from __future__ import annotations

import numpy as np


def assign(
    ev_start: np.ndarray,
    ev_end: np.ndarray,
    ev_group: np.ndarray,
    iv_start: np.ndarray,
    iv_end: np.ndarray,
    iv_group: np.ndarray,
) -> np.ndarray:
    """Index (into the interval arrays) of the interval each event is attributed to, or -1.

    Groups (e.g. encoded (pid, device)) must match exactly; intervals need not be sorted.
    """
    n = len(ev_start)
    out = np.full(n, -1, dtype=np.int64)
    if n == 0 or len(iv_start) == 0:
        return out
    ev_start = np.asarray(ev_start, dtype=np.int64)
    ev_end = np.maximum(np.asarray(ev_end, dtype=np.int64), ev_start + 1)
    for g in np.unique(iv_group):
        iv_idx = np.flatnonzero(iv_group == g)
        order = iv_idx[np.lexsort((iv_end[iv_idx], iv_start[iv_idx]))]
        ks = np.asarray(iv_start[order], dtype=np.int64)
        ke = np.asarray(iv_end[order], dtype=np.int64)
        kmax = np.maximum.accumulate(ke)
        ev_idx = np.flatnonzero(ev_group == g)
        if len(ev_idx) == 0:
            continue
        s = ev_start[ev_idx]
        e = ev_end[ev_idx]
        pos = np.searchsorted(ks, e, side="left") - 1
        valid = pos >= 0
        posc = np.where(valid, pos, 0)
        direct = valid & (ke[posc] > s)
        res = np.where(direct, order[posc], -1)
        hard = np.flatnonzero(valid & ~direct & (kmax[posc] > s))
        for h in hard:  # an earlier, longer interval overlaps: scan back to it
            j = int(pos[h]) - 1
            while j >= 0 and ke[j] <= s[h]:
                j -= 1
            res[h] = order[j] if j >= 0 else -1
        out[ev_idx] = res
    return out


def group_key(pid: np.ndarray, device: np.ndarray | None = None) -> np.ndarray:
    """One int64 key per (pid, device); nulls (negative) become their own group."""
    p = np.asarray(pid, dtype=np.int64)
    if device is None:
        return p
    return p * 4096 + np.asarray(device, dtype=np.int64)
