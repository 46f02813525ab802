"""Edits of a Trace that insert events between existing ones: the tool of the data-parallel layouts. Torch-free.

An inserted event is placed relative to an event of the trace (an *anchor*: its seq) with :meth:`TraceEdit.before`
or :meth:`TraceEdit.after`; events at one anchor keep the order they were inserted in. :meth:`TraceEdit.build`
sorts every event (allocations, frees, kernels) by (anchor seq, place) and numbers them again, so the result has
the distinct, ordered seqs a Trace requires. All seqs given to the methods are the original trace's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from uvmlab.errors import InvariantError
from uvmlab.trace.schema import KERNEL_OPTIONAL, NEVER_FREED, Trace

Key = tuple[int, int]
"""(anchor seq, place): place 0 is the anchor itself; negative places come before it, positive after."""
BEFORE_BASE = -(1 << 40)


@dataclass
class Remap:
    """Accesses of the kernels with original seq in [lo, hi] to ``alloc_id`` go to ``target`` at ``offset``."""

    alloc_id: int
    lo: int
    hi: int
    target: int
    offset: int = 0
    scale: float = 1.0
    """Offsets and sizes within the old allocation are multiplied by this (a gradient mapped onto its shard)."""


@dataclass
class TraceEdit:
    """A pending set of changes to ``trace`` (see the module docstring)."""

    trace: Trace
    sizes: dict[int, int] = field(default_factory=dict)
    """alloc_id -> new size of an existing allocation."""
    alloc_keys: dict[int, Key] = field(default_factory=dict)
    free_keys: dict[int, Key | None] = field(default_factory=dict)
    """alloc_id -> new free event (None: never freed)."""
    removed: set[int] = field(default_factory=set)
    removed_kernels: set[int] = field(default_factory=set)
    new_allocs: list[dict[str, Any]] = field(default_factory=list)
    new_kernels: list[dict[str, Any]] = field(default_factory=list)
    new_accesses: list[dict[str, Any]] = field(default_factory=list)
    remaps: list[Remap] = field(default_factory=list)
    scaled: dict[int, float] = field(default_factory=dict)
    """alloc_id -> factor for the offsets and sizes of accesses outside every remap (a resized allocation)."""
    _counters: dict[int, list[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        a, k = self.trace.allocations, self.trace.kernels
        self.next_alloc = int(a["alloc_id"].max()) + 1 if len(a) else 0
        self.next_kernel = int(k["kernel_id"].max()) + 1 if len(k) else 0
        self.stream_default = int(k["stream"].iloc[0]) if len(k) else 0
        self._a_by_id = a.set_index("alloc_id", drop=False)
        seqs = [a["alloc_seq"].to_numpy(), k["seq"].to_numpy()]
        self._phase_seq = np.concatenate(seqs)
        self._phase_of = np.concatenate([a["phase"].to_numpy(), k["phase"].to_numpy()])
        self._iter_of = np.concatenate([a["iteration"].to_numpy(), k["iteration"].to_numpy()])
        order = np.argsort(self._phase_seq, kind="stable")
        self._phase_seq, self._phase_of, self._iter_of = (
            self._phase_seq[order],
            self._phase_of[order],
            self._iter_of[order],
        )

    # ---- placing events ------------------------------------------------------------------------------------
    def before(self, seq: int) -> Key:
        """A place just before the event at ``seq``, after the places taken there so far."""
        c = self._counters.setdefault(int(seq), [0, 0])
        c[0] += 1
        return int(seq), BEFORE_BASE + c[0]

    def after(self, seq: int) -> Key:
        """A place just after the event at ``seq``, after the places taken there so far."""
        c = self._counters.setdefault(int(seq), [0, 0])
        c[1] += 1
        return int(seq), c[1]

    def phase_at(self, seq: int) -> tuple[str, int]:
        """Phase and iteration of the trace at ``seq`` (those of the last event at or before it)."""
        i = int(np.searchsorted(self._phase_seq, seq, side="right")) - 1
        i = max(i, 0)
        return str(self._phase_of[i]), int(self._iter_of[i])

    # ---- allocations ---------------------------------------------------------------------------------------
    def size_of(self, alloc_id: int) -> int:
        """Current size of an allocation (new or existing)."""
        if alloc_id in self.sizes:
            return self.sizes[alloc_id]
        if alloc_id >= int(self.trace.allocations["alloc_id"].max() + 1 if len(self.trace.allocations) else 0):
            return int(self.new_allocs[alloc_id - self._first_new()]["size_bytes"])
        return int(self._a_by_id.at[alloc_id, "size_bytes"])

    def _first_new(self) -> int:
        a = self.trace.allocations
        return int(a["alloc_id"].max()) + 1 if len(a) else 0

    def resize(self, alloc_id: int, size: int) -> None:
        """Give an existing allocation a new size; accesses outside remaps scale with it."""
        old = int(self._a_by_id.at[alloc_id, "size_bytes"])
        self.sizes[alloc_id] = int(size)
        if old > 0 and size != old:
            self.scaled[alloc_id] = size / old

    def free_at(self, alloc_id: int, key: Key | None) -> None:
        """Move the free of an existing allocation to ``key`` (None: never freed)."""
        self.free_keys[alloc_id] = key

    def remove(self, alloc_id: int) -> None:
        """Drop an existing allocation and its accesses."""
        self.removed.add(int(alloc_id))

    def remove_kernel(self, kernel_id: int) -> None:
        """Drop an existing kernel and its accesses."""
        self.removed_kernels.add(int(kernel_id))

    def add(
        self,
        size: int,
        at: Key,
        free: Key | None,
        category: str,
        op: str,
        stream: int | None = None,
    ) -> int:
        """A new allocation of ``size`` bytes made at ``at`` and freed at ``free`` (None: never); its alloc_id."""
        aid = self.next_alloc
        self.next_alloc += 1
        phase, it = self.phase_at(at[0])
        self.new_allocs.append(
            {
                "alloc_id": aid,
                "size_bytes": int(size),
                "at": at,
                "free": free,
                "category": category,
                "phase": phase,
                "iteration": it,
                "op": op,
                "stream": self.stream_default if stream is None else int(stream),
            }
        )
        return aid

    def set_free(self, alloc_id: int, key: Key | None) -> None:
        """Set the free of an allocation added by :meth:`add`."""
        row = self.new_allocs[alloc_id - self._first_new()]
        if row["alloc_id"] != alloc_id:
            raise InvariantError(f"TraceEdit: allocation {alloc_id} was not added by this edit")
        row["free"] = key

    # ---- kernels -------------------------------------------------------------------------------------------
    def kernel(self, name: str, at: Key, touches: list[tuple[int, int, int, bool]], stream: int | None = None) -> int:
        """A new kernel (a collective or a copy) at ``at`` touching (alloc_id, offset, size, is_write) ranges."""
        kid = self.next_kernel
        self.next_kernel += 1
        phase, it = self.phase_at(at[0])
        self.new_kernels.append(
            {
                "kernel_id": kid,
                "at": at,
                "name": name,
                "phase": phase,
                "iteration": it,
                "flops": 0.0,
                "stream": self.stream_default if stream is None else int(stream),
            }
        )
        for aid, off, size, write in touches:
            if size > 0:
                self.new_accesses.append(
                    {
                        "kernel_id": kid,
                        "alloc_id": int(aid),
                        "offset_bytes": int(off),
                        "size_bytes": int(size),
                        "is_write": bool(write),
                    }
                )
        return kid

    def remap(self, alloc_id: int, lo: int, hi: int, target: int, offset: int = 0, scale: float = 1.0) -> None:
        """Accesses to ``alloc_id`` by the kernels with original seq in [lo, hi] go to ``target`` + ``offset``
        (offsets and sizes scaled by ``scale``). The first remap that matches an access wins."""
        self.remaps.append(Remap(int(alloc_id), int(lo), int(hi), int(target), int(offset), float(scale)))

    # ---- result --------------------------------------------------------------------------------------------
    def build(self, header: dict[str, Any] | None = None) -> Trace:
        """The edited Trace (seqs numbered again; validated)."""
        t = self.trace
        a = t.allocations[~t.allocations["alloc_id"].isin(self.removed)].copy()
        if self.sizes:
            new = a["alloc_id"].map(self.sizes)
            a["size_bytes"] = new.fillna(a["size_bytes"]).astype(np.int64)
        n_old = len(a)
        ids = a["alloc_id"].to_numpy()
        a_major = a["alloc_seq"].to_numpy().astype(np.int64)
        a_minor = np.zeros(n_old, dtype=np.int64)
        f_major = a["free_seq"].to_numpy().astype(np.int64)
        f_minor = np.zeros(n_old, dtype=np.int64)
        pos = {int(x): i for i, x in enumerate(ids)}
        for aid, key in self.alloc_keys.items():
            if aid in pos:
                a_major[pos[aid]], a_minor[pos[aid]] = key
        for aid, fkey in self.free_keys.items():
            if aid in pos:
                if fkey is None:
                    f_major[pos[aid]], f_minor[pos[aid]] = NEVER_FREED, 0
                else:
                    f_major[pos[aid]], f_minor[pos[aid]] = fkey
        new_a = pd.DataFrame(self.new_allocs)
        if len(new_a):
            a_major = np.concatenate([a_major, [k[0] for k in new_a["at"]]])
            a_minor = np.concatenate([a_minor, [k[1] for k in new_a["at"]]])
            f_major = np.concatenate([f_major, [NEVER_FREED if k is None else k[0] for k in new_a["free"]]])
            f_minor = np.concatenate([f_minor, [0 if k is None else k[1] for k in new_a["free"]]])
            extra = new_a.drop(columns=["at", "free"]).assign(alloc_seq=0, free_seq=0)
            for col in a.columns:
                if col not in extra.columns:
                    extra[col] = _default(a[col])
            a = pd.concat([a, extra[a.columns].astype(a.dtypes.to_dict())], ignore_index=True)
        k = t.kernels[~t.kernels["kernel_id"].isin(self.removed_kernels)].copy()
        k_major = k["seq"].to_numpy().astype(np.int64)
        k_minor = np.zeros(len(k), dtype=np.int64)
        new_k = pd.DataFrame(self.new_kernels)
        if len(new_k):
            k_major = np.concatenate([k_major, [x[0] for x in new_k["at"]]])
            k_minor = np.concatenate([k_minor, [x[1] for x in new_k["at"]]])
            extra = new_k.drop(columns=["at"])
            for col in k.columns:
                if col not in extra.columns:  # an optional column's schema default (uvmlab.trace.schema)
                    extra[col] = KERNEL_OPTIONAL[col][1] if col in KERNEL_OPTIONAL else _default(k[col])
            k = pd.concat([k, extra[k.columns].astype(k.dtypes.to_dict())], ignore_index=True)
        # one numbering of every event: allocations, frees, kernels
        freed = f_major != NEVER_FREED
        n_a, n_k = len(a), len(k)
        major = np.concatenate([a_major, f_major[freed], k_major])
        minor = np.concatenate([a_minor, f_minor[freed], k_minor])
        order = np.lexsort((minor, major))
        rank = np.empty(len(order), dtype=np.int64)
        rank[order] = np.arange(len(order), dtype=np.int64)
        a["alloc_seq"] = rank[:n_a]
        free_seq = np.full(n_a, NEVER_FREED, dtype=np.int64)
        free_seq[freed] = rank[n_a : n_a + int(freed.sum())]
        a["free_seq"] = free_seq
        k["seq"] = rank[n_a + int(freed.sum()) :]
        acc = self._accesses(t)
        limit = acc["alloc_id"].map(dict(zip(a["alloc_id"].tolist(), a["size_bytes"].tolist(), strict=True)))
        acc = acc[limit.notna()].copy()  # accesses of removed allocations that no remap moved
        limit = limit[limit.notna()].astype(np.int64).to_numpy()
        off = np.minimum(acc["offset_bytes"].to_numpy(), np.maximum(limit - 1, 0))
        acc["offset_bytes"] = off
        acc["size_bytes"] = np.maximum(np.minimum(acc["size_bytes"].to_numpy(), limit - off), 0)
        acc = acc[acc["size_bytes"] > 0].reset_index(drop=True)
        k = k.sort_values("seq", kind="stable").reset_index(drop=True)
        a = a.sort_values("alloc_id", kind="stable").reset_index(drop=True)
        out = Trace(allocations=a, kernels=k, accesses=acc, header=dict(header if header is not None else t.header))
        out.validate("sharded trace")
        if n_k != len(k):
            raise InvariantError("TraceEdit: kernels lost while numbering events")
        return out

    def _accesses(self, t: Trace) -> pd.DataFrame:
        acc = t.accesses[~t.accesses["kernel_id"].isin(self.removed_kernels)].copy()
        seq_of = dict(zip(t.kernels["kernel_id"].tolist(), t.kernels["seq"].tolist(), strict=True))
        kseq = acc["kernel_id"].map(seq_of).to_numpy()
        aid = acc["alloc_id"].to_numpy().copy()
        off = acc["offset_bytes"].to_numpy().astype(np.float64)
        size = acc["size_bytes"].to_numpy().astype(np.float64)
        remapped = np.zeros(len(acc), dtype=bool)
        rows_of: dict[int, np.ndarray] = {}
        if self.remaps or self.scaled:
            order = np.argsort(aid, kind="stable")
            keys, starts = np.unique(aid[order], return_index=True)
            bounds = [*starts[1:], len(order)]
            rows_of = {int(k): order[s0:s1] for k, s0, s1 in zip(keys, starts, bounds, strict=True)}
        original = aid.copy()
        for r in self.remaps:
            rows = rows_of.get(r.alloc_id)
            if rows is None:
                continue
            sel = rows[(kseq[rows] >= r.lo) & (kseq[rows] <= r.hi) & ~remapped[rows]]
            aid[sel] = r.target
            off[sel] = off[sel] * r.scale + r.offset
            size[sel] = np.maximum(size[sel] * r.scale, 1)
            remapped[sel] = True
        for a_id, f in self.scaled.items():
            rows = rows_of.get(a_id)
            if rows is None:
                continue
            sel = rows[~remapped[rows] & (original[rows] == a_id)]
            off[sel] *= f
            size[sel] = np.maximum(size[sel] * f, 1)
        acc["alloc_id"] = aid
        acc["offset_bytes"] = off.astype(np.int64)
        acc["size_bytes"] = size.astype(np.int64)
        acc = acc[~acc["alloc_id"].isin(self.removed)]
        if self.new_accesses:
            acc = pd.concat([acc, pd.DataFrame(self.new_accesses, columns=acc.columns)], ignore_index=True)
        return acc.reset_index(drop=True)


def _default(col: pd.Series) -> Any:
    """The fill value of a column the new rows do not set and the schema gives no default for."""
    if col.dtype == object or pd.api.types.is_string_dtype(col):
        return ""
    if pd.api.types.is_float_dtype(col):
        return np.nan
    return 0
