"""One pass over the fault and migration tables: route every event to its kernel, iteration or API-call bucket.

``Router`` holds the (small) interval arrays the events are matched against; ``Partial`` the sums one pass (or one
part of it) produces; partial results add up, so the GPU fault table can be read in rowid ranges by several worker
processes (``scan_faults_parallel``) and merged. Sums are integers, so the result does not depend on the order in
which parts finish. The attribution rules are those of ``uvmlab.measure.nsys.attribute`` and
``uvmlab.measure.nsys.kernel_stats``.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from uvmlab.measure.nsys import schema as S
from uvmlab.measure.nsys.attribute import assign, group_key
from uvmlab.measure.nsys.read import Export, open_export

EVENT_COLS = (
    "fault_records",
    "fault_count",
    "read_fault_count",
    "write_fault_count",
    "htod_count",
    "htod_bytes",
    "dtoh_count",
    "dtoh_bytes",
)
FOLD_ENTRIES = 16_000_000
"""Partial per-address sums kept before folding them (16 M entries = 256 MB of keys and values)."""
MAX_WORKERS = 4
"""Upper bound of worker processes reading the fault table (``UVMLAB_NSYS_WORKERS`` overrides; 1 = no workers)."""


def _sum_by_key(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(unique keys, summed values), vectorized."""
    uniq, inv = np.unique(keys, return_inverse=True)
    return uniq, np.bincount(inv, weights=values, minlength=len(uniq)).astype(np.int64)


@dataclass
class FaultScan:
    """What one pass over the GPU fault table gathers besides attribution: totals by access type, per address."""

    has_address: bool = True
    records: int = 0
    by_access: dict[str, int] = field(default_factory=lambda: {name: 0 for name in S.ACCESS_TYPE.values()})
    address_parts: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)

    def add(self, access: np.ndarray, n: np.ndarray, address: np.ndarray) -> None:
        self.records += len(n)
        ids = np.clip(access, 0, len(S.ACCESS_TYPE))
        sums = np.bincount(ids, weights=n, minlength=len(S.ACCESS_TYPE) + 1)
        for i, v in enumerate(sums):
            self.by_access[S.ACCESS_TYPE.get(i, "unknown")] += int(v)
        self.address_parts.append(_sum_by_key(address, n))
        self._maybe_fold()

    def merge(self, other: FaultScan) -> None:
        self.records += other.records
        for k, v in other.by_access.items():
            self.by_access[k] = self.by_access.get(k, 0) + v
        self.address_parts += other.address_parts
        self._maybe_fold()

    def _maybe_fold(self) -> None:
        """Fold the partial per-address sums once they hold more than FOLD_ENTRIES entries (bounded memory)."""
        if len(self.address_parts) > 1 and sum(len(k) for k, _ in self.address_parts) > FOLD_ENTRIES:
            self._fold()

    def _fold(self) -> None:
        keys = np.concatenate([k for k, _ in self.address_parts])
        vals = np.concatenate([v for _, v in self.address_parts])
        self.address_parts = [_sum_by_key(keys, vals)]

    def by_address(self) -> pd.Series:
        """GPU faults (Σ numberOfPageFaults) per faulting page address."""
        if not self.address_parts:
            return pd.Series([], dtype="int64")
        if len(self.address_parts) > 1:
            self._fold()
        keys, vals = self.address_parts[0]
        return pd.Series(vals, index=keys)


@dataclass
class Router:
    """Interval arrays events are matched against (picklable, for worker processes)."""

    k_s: np.ndarray
    k_e: np.ndarray
    k_grp: np.ndarray
    k_itpos: np.ndarray  # kernel -> iteration position (-1 none)
    it_s: np.ndarray
    it_e: np.ndarray
    it_pid: np.ndarray
    api_sets: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]  # (start, end, pid, names), in priority

    @property
    def n_k(self) -> int:
        return len(self.k_s)

    @property
    def n_i(self) -> int:
        return len(self.it_s)


@dataclass
class Partial:
    """Sums of one pass (or part): per kernel and per iteration (index 0 = none), outside buckets, fault scan."""

    k: dict[str, np.ndarray]
    i: dict[str, np.ndarray]
    outside: dict[str, dict[str, int]]
    scan: FaultScan
    copies: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)  # (virtualAddress, [d2h,h2d,dd,hd])

    def copy_frame(self) -> pd.DataFrame:
        """um_sum's copy part: per virtualAddress DtoH/HtoD bytes and summed durations (columns a,cpu,gpu,d2h,h2d,
        dd,hd)."""
        cols = ["a", "cpu", "gpu", "d2h", "h2d", "dd", "hd"]
        if not self.copies:
            return pd.DataFrame(columns=cols)
        keys = np.concatenate([k for k, _ in self.copies])
        vals = np.concatenate([v for _, v in self.copies])
        uniq, inv = np.unique(keys, return_inverse=True)
        sums = np.stack([np.bincount(inv, weights=vals[:, j], minlength=len(uniq)) for j in range(4)], axis=1)
        sums = sums.astype(np.int64)
        return pd.DataFrame(
            {"a": uniq, "cpu": 0, "gpu": 0, "d2h": sums[:, 0], "h2d": sums[:, 1], "dd": sums[:, 2], "hd": sums[:, 3]}
        )

    @classmethod
    def empty(cls, router: Router, has_address: bool = True) -> Partial:
        return cls(
            {c: np.zeros(router.n_k + 1, dtype=np.int64) for c in EVENT_COLS},
            {c: np.zeros(router.n_i + 1, dtype=np.int64) for c in EVENT_COLS},
            {},
            FaultScan(has_address=has_address),
        )

    def merge(self, other: Partial) -> None:
        for c in EVENT_COLS:
            self.k[c] += other.k[c]
            self.i[c] += other.i[c]
        for name, b in other.outside.items():
            mine = self.outside.setdefault(name, dict.fromkeys(EVENT_COLS, 0))
            for c, v in b.items():
                mine[c] += v
        self.scan.merge(other.scan)
        self.copies += other.copies


def route(r: Router, part: Partial, s, e, pid, dev, weights: dict[str, np.ndarray]) -> None:
    """Attribute one chunk of events (kernel, else iteration window and API call) and add ``weights`` up."""
    kidx = assign(s, e, group_key(pid, dev), r.k_s, r.k_e, r.k_grp)
    iidx = np.where(kidx >= 0, r.k_itpos[np.maximum(kidx, 0)], -1) if r.n_k else np.full(len(s), -1, np.int64)
    out = np.flatnonzero(kidx < 0)
    if r.n_i and len(out):
        iidx[out] = assign(s[out], e[out], pid[out], r.it_s, r.it_e, r.it_pid)
    for col, w in weights.items():
        part.k[col] += np.bincount(kidx + 1, weights=w, minlength=r.n_k + 1).astype(np.int64)
        part.i[col] += np.bincount(iidx + 1, weights=w, minlength=r.n_i + 1).astype(np.int64)
    if not len(out):
        return
    names = np.full(len(out), "none", dtype=object)
    rest = np.ones(len(out), dtype=bool)
    so, eo, po = s[out], e[out], pid[out]
    for a_s, a_e, a_pid, a_name in r.api_sets:
        todo = np.flatnonzero(rest)
        if not len(todo):
            break
        aidx = assign(so[todo], eo[todo], po[todo], a_s, a_e, a_pid)
        hit = aidx >= 0
        names[todo[hit]] = a_name[aidx[hit]]
        rest[todo[hit]] = False
    frame = pd.DataFrame({"name": names, **{c: w[out] for c, w in weights.items()}})
    for name, sums in frame.groupby("name").sum().iterrows():
        b = part.outside.setdefault(str(name), dict.fromkeys(EVENT_COLS, 0))
        for c in weights:
            b[c] += int(sums[c])


def _fault_sql(ex: Export, where: str = "") -> str:
    t = S.GPU_FAULTS
    return (
        f"SELECT start, {ex.col(t, 'end', 'start')}, "
        f"((globalPid >> {S.PID_SHIFT}) & {S.PID_MASK}) * 4096 + deviceId, "
        f"numberOfPageFaults * 8 + coalesce({ex.col(t, 'faultAccessType', '0')}, 0), "
        f"coalesce({ex.col(t, 'address', '0')}, 0) FROM {t} {where}"
    )


def scan_faults(
    ex: Export,
    r: Router,
    part: Partial,
    chunk_rows: int,
    progress: Callable[[int], None] | None = None,
    where: str = "",
) -> None:
    """Route the GPU fault rows (optionally a ``where`` rowid range) into ``part``, ``chunk_rows`` at a time."""
    dt = np.dtype([(c, np.int64) for c in ("s", "e", "g", "na", "addr")])
    for rows in ex.iter_rows(_fault_sql(ex, where), chunk_rows):
        if progress is not None:
            progress(len(rows))
        arr = np.fromiter(rows, dtype=dt, count=len(rows))
        n, access = arr["na"] >> 3, arr["na"] & 7  # numberOfPageFaults * 8 + access type, packed in SQL
        pid, dev = arr["g"] // 4096, arr["g"] % 4096
        part.scan.add(access, n, arr["addr"])
        route(
            r,
            part,
            arr["s"],
            arr["e"],
            pid,
            dev,
            {
                "fault_records": np.ones(len(arr), np.int64),
                "fault_count": n,
                "read_fault_count": np.where(access == S.ACCESS_READ, n, 0),
                "write_fault_count": np.where(access == S.ACCESS_WRITE, n, 0),
            },
        )


def scan_migrations(
    ex: Export, r: Router, part: Partial, chunk_rows: int, progress: Callable[[int], None] | None = None
) -> None:
    """Route the UM HtoD/DtoH migration rows into ``part``; also sums them per virtualAddress (for um_sum)."""
    t = S.MEMCPY
    kinds = f"{S.COPY_KIND_UVM_HTOD},{S.COPY_KIND_UVM_DTOH}"
    sql = (
        f'SELECT start, "end", coalesce({ex.col(t, "globalPid", "0")}, 0), deviceId, coalesce(bytes, 0), '
        f"copyKind, coalesce({ex.col(t, 'virtualAddress', '-1')}, -1) FROM {t} WHERE copyKind IN ({kinds})"
    )
    dt = np.dtype([(c, np.int64) for c in ("s", "e", "g", "d", "b", "k", "va")])
    for rows in ex.iter_rows(sql, chunk_rows):
        if progress is not None:
            progress(len(rows))
        arr = np.fromiter(rows, dtype=dt, count=len(rows))
        pid = (arr["g"] >> S.PID_SHIFT) & S.PID_MASK
        h = arr["k"] == S.COPY_KIND_UVM_HTOD
        dur = arr["e"] - arr["s"]
        route(
            r,
            part,
            arr["s"],
            arr["e"],
            pid,
            arr["d"],
            {
                "htod_count": h.astype(np.int64),
                "htod_bytes": np.where(h, arr["b"], 0),
                "dtoh_count": (~h).astype(np.int64),
                "dtoh_bytes": np.where(~h, arr["b"], 0),
            },
        )
        known = arr["va"] >= 0  # rows without a virtual address (NULL, or schema < 2022) are not per-address
        if known.any():
            vals = np.stack(
                [np.where(~h, arr["b"], 0), np.where(h, arr["b"], 0), np.where(~h, dur, 0), np.where(h, dur, 0)], axis=1
            )[known]
            part.copies.append((arr["va"][known], vals))


def _fault_part(path: str, lo: int, hi: int, r: Router, chunk_rows: int, has_address: bool) -> Partial:
    """Worker: one rowid range of the fault table, in its own read-only connection."""
    part = Partial.empty(r, has_address)
    with open_export(path) as ex:
        scan_faults(ex, r, part, chunk_rows, where=f"WHERE rowid >= {int(lo)} AND rowid < {int(hi)}")
    return part


def rowid_bounds(ex: Export, table: str, chunk_rows: int) -> list[int]:
    """Rowids cutting ``table`` into chunks of ``chunk_rows`` rows each (the last one shorter): ``[a, b)`` pairs of
    consecutive bounds. Chunks are planned by row number, never by rowid range: rowids may be sparse (a table
    whose last rowid is 2**40 has as many chunks as rows allow, not 2**40 / chunk_rows)."""
    starts = ex.query(
        f"SELECT r FROM (SELECT rowid AS r, row_number() OVER (ORDER BY rowid) - 1 AS n FROM {table}) "
        f"WHERE n % {int(chunk_rows)} = 0"
    )
    last = ex.query(f"SELECT max(rowid) FROM {table}")[0][0]
    return [int(r[0]) for r in starts] + ([int(last) + 1] if last is not None else [])


def workers_for(rows: int, chunk_rows: int) -> int:
    """How many worker processes to use for ``rows`` fault rows (1: read in this process)."""
    env = os.environ.get("UVMLAB_NSYS_WORKERS")
    want = int(env) if env and env.isdigit() else min(MAX_WORKERS, os.cpu_count() or 1)
    return max(1, min(want, rows // max(1, chunk_rows)))


def scan_faults_all(
    ex: Export,
    r: Router,
    part: Partial,
    chunk_rows: int,
    progress: Callable[[int], None] | None = None,
    meanwhile: Callable[[], None] | None = None,
) -> None:
    """Route every GPU fault row into ``part``: in this process, or in rowid ranges of ``chunk_rows`` by worker
    processes when the table has several chunks and the machine several CPUs. ``meanwhile`` (e.g. the migration
    scan) runs in this process while the workers read."""
    rows = ex.row_count(S.GPU_FAULTS) or 0
    workers = 1 if ex.in_memory else workers_for(rows, chunk_rows)  # workers reopen the file: SQLite only
    if workers <= 1:
        if rows:
            scan_faults(ex, r, part, chunk_rows, progress)
        if meanwhile is not None:
            meanwhile()
        return
    bounds = rowid_bounds(ex, S.GPU_FAULTS, chunk_rows)
    ctx = multiprocessing.get_context("spawn")  # no fork: the parent may run threads (progress bars)
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        futures = {
            pool.submit(_fault_part, str(ex.path), a, b, r, chunk_rows, part.scan.has_address): b - a
            for a, b in itertools.pairwise(bounds)
        }
        if meanwhile is not None:
            meanwhile()
        for fut in as_completed(futures):
            part.merge(fut.result())
            if progress is not None:
                progress(futures[fut])
