"""An offline, STWeaver-style allocation planner (seeds/004 section 5.1): the ``planned`` allocator.

Given a whole trace (every allocation with its alloc and free sequence numbers), the planner assigns each
allocation an address in one static pool so that no two live allocations overlap, trying to make the pool as
small as possible. The pool is reserved once (STWeaver pre-allocates "a contiguous memory block equal in size to
the static memory pool"), so the planned allocator's reserved bytes are the pool size at every moment.

What STWeaver does and what we do (simplifications marked *):

1. HomoPhase groups: requests that start and end in the same pair of computation phases. Phases come from the
   trace (``setup``, ``forward``, ``backward``, ``optimizer``, ...); the phase of a free is the phase of the last
   allocation or kernel at or before it. Our groups also key on the iteration, so a group is local in time.
2. Local plan per group. * STWeaver packs a group contiguously and relies on fusion to remove "spatio-temporal
   bubbles"; our phases are coarse (a whole forward pass), so we pack each group with first fit by address
   (requests by size, largest first, each at the lowest offset free over its lifetime), which leaves no bubble a
   later request could fill.
3. Fusion of adjacent groups (the end phase of one is the start phase of the other): the smaller group is inserted
   into the larger one's plan (* first fit by address instead of the paper's end-time-ordered scan) and the fusion
   is kept when the time-memory product TMP = sum(s * (te - ts)) / (D.s * (D.te - D.ts)) (paper Eq. 1) beats the
   area-weighted average TMP of the two.
4. Each local plan becomes one request (size D.s, lifetime [D.ts, D.te)). HomoSize groups: requests of equal size,
   processed in descending size. Requests of size S are first inserted into free intervals of the memory already
   laid out for larger sizes (lowest address free over the request's lifetime), and the rest get new memory layers
   built by the paper's Algorithm 1 (append to the layer whose last request ended latest before this one starts,
   else open a new layer of height S on top).
5. * No dynamic (MoE) layers and no online fallback allocator: every request in the trace is planned.
6. Sizes are aligned up to ``PLAN_ALIGN_BYTES`` (PyTorch's kMinBlockSize, reference/allocator.md section 2.1).

``plan(trace, grouping="best")`` builds both the HomoPhase plan and a plan with one group per request (steps 4-5
only), and keeps the smaller pool: an offline planner can afford to try both (documented in docs/fragmentation.md).
Torch-free; deterministic (stable sorts, ties broken by alloc_id).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from sortedcontainers import SortedDict, SortedList

from uvmlab.errors import InputError, InvariantError
from uvmlab.trace.schema import NEVER_FREED, Trace
from uvmlab.trace.summary import peak_live

PLAN_ALIGN_BYTES = 512
"""Alignment of planned blocks: PyTorch's kMinBlockSize (c10/cuda/CUDACachingAllocator.cpp, 512 bytes)."""
GROUPINGS = ("best", "homophase", "none")


@dataclass
class PlannedPlacement:
    """What :meth:`Plan.as_placement` returns (the columns of ``uvmlab.sim.allocator.placement.Placement``)."""

    blocks: pd.DataFrame
    ranges: pd.DataFrame
    timeline: pd.DataFrame
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    oom_seq: int | None = None


@dataclass
class Plan:
    """An offline allocation plan: one address per allocation in a static pool of ``pool_bytes``."""

    blocks: pd.DataFrame
    """alloc_id, address, block_bytes, size_bytes, start_seq, end_seq (exclusive), group_id."""
    pool_bytes: int
    grouping: str
    n_groups: int
    n_fusions: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def peak_reserved_bytes(self) -> int:
        """The pool is reserved for the whole run."""
        return self.pool_bytes

    @property
    def peak_allocated_bytes(self) -> int:
        """Peak of live block bytes under the plan."""
        return int(self.timeline()["allocated_bytes"].max()) if len(self.blocks) else 0

    def timeline(self) -> pd.DataFrame:
        """seq, allocated_bytes (live aligned block bytes), reserved_bytes (the pool) after each event."""
        b = self.blocks
        seq = np.concatenate([b["start_seq"].to_numpy(), b["end_seq"].to_numpy()])
        delta = np.concatenate([b["block_bytes"].to_numpy(), -b["block_bytes"].to_numpy()])
        order = np.lexsort((delta, seq))  # at equal seq, frees (negative) first
        return pd.DataFrame(
            {
                "seq": seq[order],
                "allocated_bytes": np.cumsum(delta[order]),
                "reserved_bytes": np.full(len(seq), self.pool_bytes, dtype=np.int64),
            }
        )

    def as_placement(self) -> PlannedPlacement:
        """The plan in the shape of ``uvmlab.sim.allocator.placement.Placement`` (one managed range: the static pool,
        mapped
        before the first allocation and never freed), so the UVM replay can run the ``planned`` allocator."""
        b = self.blocks
        first = int(b["start_seq"].min()) if len(b) else 0
        blocks = pd.DataFrame(
            {
                "alloc_id": b["alloc_id"].to_numpy(np.int64),
                "address": b["address"].to_numpy(np.int64),
                "block_bytes": b["block_bytes"].to_numpy(np.int64),
                "range_id": np.zeros(len(b), dtype=np.int64),
            }
        )
        ranges = pd.DataFrame(
            {
                "range_id": [0],
                "address": [0],
                "size_bytes": [self.pool_bytes],
                "alloc_seq": [first],
                "free_seq": [NEVER_FREED],
            }
        )
        if self.pool_bytes == 0:
            ranges = ranges.iloc[0:0]
        tl = self.timeline()
        return PlannedPlacement(blocks, ranges, tl, self.peak_allocated_bytes, self.pool_bytes)

    def check_invariants(self) -> None:
        """No two live blocks overlap; every block lies inside the pool; blocks are aligned."""
        b = self.blocks
        if len(b) == 0:
            return
        if (b["address"] < 0).any() or ((b["address"] + b["block_bytes"]) > self.pool_bytes).any():
            raise InvariantError("planner: a block lies outside the pool")
        if (b["address"] % PLAN_ALIGN_BYTES).any():
            raise InvariantError("planner: a block address is not aligned")
        events = sorted(
            [(int(e), 0, int(i)) for i, e in zip(b["alloc_id"], b["end_seq"], strict=True)]
            + [(int(s), 1, int(i)) for i, s in zip(b["alloc_id"], b["start_seq"], strict=True)]
        )
        where = {
            int(i): (int(ad), int(sz)) for i, ad, sz in zip(b["alloc_id"], b["address"], b["block_bytes"], strict=True)
        }
        live: SortedDict = SortedDict()  # address -> end address
        for _, is_alloc, aid in events:
            addr, size = where[aid]
            if size == 0:
                continue
            if not is_alloc:
                live.pop(addr, None)
                continue
            i = live.bisect_right(addr)
            if i > 0:
                paddr = live.keys()[i - 1]
                if live[paddr] > addr:
                    raise InvariantError(f"planner: allocation {aid} at {addr} overlaps a live block at {paddr}")
            if i < len(live) and live.keys()[i] < addr + size:
                raise InvariantError(f"planner: allocation {aid} at {addr} overlaps a live block")
            live[addr] = addr + size


def _align(sizes: np.ndarray) -> np.ndarray:
    a = PLAN_ALIGN_BYTES
    return np.maximum(a, -(-sizes // a) * a)


def _first_fit(
    size: int, ts: int, te: int, p_off: np.ndarray, p_size: np.ndarray, p_ts: np.ndarray, p_te: np.ndarray, limit: int
) -> int | None:
    """Lowest offset in [0, limit - size] free over [ts, te) among placed rectangles; None when none."""
    mask = (p_ts < te) & (p_te > ts)
    if not mask.any():
        return 0 if size <= limit else None
    off = p_off[mask]
    end = off + p_size[mask]
    order = np.argsort(off, kind="stable")
    off, end = off[order], end[order]
    reach = np.maximum.accumulate(end)
    pos = np.concatenate(([0], reach))
    nxt = np.concatenate((off, [np.iinfo(np.int64).max]))
    ok = (nxt - pos >= size) & (pos + size <= limit)
    idx = np.flatnonzero(ok)
    return int(pos[idx[0]]) if len(idx) else None


class _Packer:
    """Rectangles (offset, size, [ts, te)) placed so far, in growable numpy arrays."""

    def __init__(self, capacity: int) -> None:
        self.off = np.zeros(capacity, dtype=np.int64)
        self.size = np.zeros(capacity, dtype=np.int64)
        self.ts = np.zeros(capacity, dtype=np.int64)
        self.te = np.zeros(capacity, dtype=np.int64)
        self.n = 0

    def fit(self, size: int, ts: int, te: int, limit: int) -> int | None:
        n = self.n
        return _first_fit(size, ts, te, self.off[:n], self.size[:n], self.ts[:n], self.te[:n], limit)

    def add(self, off: int, size: int, ts: int, te: int) -> None:
        if self.n == len(self.off):
            for name in ("off", "size", "ts", "te"):
                arr = getattr(self, name)
                setattr(self, name, np.concatenate([arr, np.zeros(max(16, len(arr)), dtype=np.int64)]))
        i = self.n
        self.off[i], self.size[i], self.ts[i], self.te[i] = off, size, ts, te
        self.n += 1

    @property
    def height(self) -> int:
        n = self.n
        return int((self.off[:n] + self.size[:n]).max()) if n else 0


_UNBOUNDED = np.iinfo(np.int64).max // 4


def _pack_in_order(
    pk: _Packer, order: list[int], size: np.ndarray, ts: np.ndarray, te: np.ndarray, out: dict[int, int]
) -> dict[int, int]:
    """Add the requests ``order`` to ``pk`` one at a time at the lowest free offset; record them in ``out``."""
    for i in order:
        off = pk.fit(int(size[i]), int(ts[i]), int(te[i]), _UNBOUNDED)
        if off is None:
            raise InvariantError("planner: no offset under an unbounded limit")
        pk.add(off, int(size[i]), int(ts[i]), int(te[i]))
        out[i] = off
    return out


def _pack_local(idx: np.ndarray, size: np.ndarray, ts: np.ndarray, te: np.ndarray) -> dict[int, int]:
    """First fit by address, largest first: relative offsets of the requests ``idx``."""
    order = sorted(idx.tolist(), key=lambda i: (-int(size[i]), int(ts[i]), i))
    return _pack_in_order(_Packer(len(order)), order, size, ts, te, {})


@dataclass
class _Local:
    members: list[int]
    offsets: dict[int, int]
    ps: str
    pe: str

    def extent(self, size: np.ndarray, ts: np.ndarray, te: np.ndarray) -> tuple[int, int, int]:
        s = max(self.offsets[i] + int(size[i]) for i in self.members)
        return s, min(int(ts[i]) for i in self.members), max(int(te[i]) for i in self.members)

    def tmp(self, size: np.ndarray, ts: np.ndarray, te: np.ndarray) -> tuple[float, float]:
        """(TMP, denominator area) of paper Eq. 1."""
        s, a, b = self.extent(size, ts, te)
        used = float(sum(int(size[i]) * (int(te[i]) - int(ts[i])) for i in self.members))
        area = float(s) * float(max(1, b - a))
        return (used / area if area else 1.0), area


def _phase_markers(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    a = trace.allocations
    k = trace.kernels
    seq = np.concatenate([a["alloc_seq"].to_numpy(np.int64), k["seq"].to_numpy(np.int64)])
    lab = np.concatenate(
        [
            (a["iteration"].astype(str) + ":" + a["phase"].astype(str)).to_numpy(object),
            (k["iteration"].astype(str) + ":" + k["phase"].astype(str)).to_numpy(object),
        ]
    )
    order = np.argsort(seq, kind="stable")
    return seq[order], lab[order]


def _homophase_groups(trace: Trace, te: np.ndarray) -> dict[tuple[str, str], list[int]]:
    """Row indices of ``trace.allocations`` by (start "iteration:phase", end "iteration:phase")."""
    a = trace.allocations
    mseq, mlab = _phase_markers(trace)
    start_lab = (a["iteration"].astype(str) + ":" + a["phase"].astype(str)).to_numpy(object)
    pos = np.searchsorted(mseq, te - 1, side="right") - 1
    end_lab = mlab[np.clip(pos, 0, len(mlab) - 1)]
    groups: dict[tuple[str, str], list[int]] = {}
    for i, key in enumerate(zip(start_lab, end_lab, strict=True)):
        groups.setdefault((str(key[0]), str(key[1])), []).append(i)
    return groups


def _fuse(locals_: list[_Local], size: np.ndarray, ts: np.ndarray, te: np.ndarray) -> tuple[list[_Local], int]:
    """One pass of adjacent-group fusion (step 3 of the module docstring)."""
    fused = 0
    locals_ = sorted(locals_, key=lambda g: min(int(ts[i]) for i in g.members))
    out: list[_Local] = []
    for g in locals_:
        target = next((h for h in reversed(out) if h.pe == g.ps), None)
        if target is None:
            out.append(g)
            continue
        big, small = (target, g) if target.extent(size, ts, te)[0] >= g.extent(size, ts, te)[0] else (g, target)
        pk = _Packer(len(big.members) + len(small.members))
        for i in big.members:
            pk.add(big.offsets[i], int(size[i]), int(ts[i]), int(te[i]))
        order = sorted(small.members, key=lambda i: (int(ts[i]), i))
        offsets = _pack_in_order(pk, order, size, ts, te, dict(big.offsets))
        cand = _Local(big.members + small.members, offsets, target.ps, g.pe)
        (t1, w1), (t2, w2), (tc, _) = target.tmp(size, ts, te), g.tmp(size, ts, te), cand.tmp(size, ts, te)
        if tc > (t1 * w1 + t2 * w2) / max(w1 + w2, 1.0):
            out[out.index(target)] = cand
            fused += 1
        else:
            out.append(g)
    return out, fused


def _global(items: list[tuple[int, int, int, int]]) -> dict[int, int]:
    """HomoSize groups and memory layers (step 4): items (key, size, ts, te) -> base address per key."""
    by_size: dict[int, list[tuple[int, int, int, int]]] = {}
    for it in items:
        by_size.setdefault(it[1], []).append(it)
    pk = _Packer(len(items))
    top = 0
    base: dict[int, int] = {}
    for s in sorted(by_size, reverse=True):
        group = sorted(by_size[s], key=lambda it: (it[2], it[0]))
        rest = []
        for key, size, a, b in group:  # insertion into memory laid out for larger sizes
            off = pk.fit(size, a, b, top) if top else None
            if off is None:
                rest.append((key, size, a, b))
            else:
                pk.add(off, size, a, b)
                base[key] = off
        # Algorithm 1: memory layers of height s for the rest
        layers_end: SortedList = SortedList()  # (end, layer index)
        layer_base: list[int] = []
        for key, size, a, b in rest:
            j = layers_end.bisect_left((a, -1)) - 1  # latest end strictly before a
            if j >= 0:
                _end, li = layers_end.pop(j)
            else:
                li = len(layer_base)
                layer_base.append(top)
                top += s
            layers_end.add((b, li))
            pk.add(layer_base[li], size, a, b)
            base[key] = layer_base[li]
    return base


def _intervals(trace: Trace) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    a = trace.allocations.sort_values("alloc_id", kind="stable").reset_index(drop=True)
    if a["alloc_id"].duplicated().any():
        raise InputError("planner: the trace has duplicate alloc_id values")
    ts = a["alloc_seq"].to_numpy(np.int64)
    fs = a["free_seq"].to_numpy(np.int64)
    last = int(max(ts.max(), fs.max(), trace.kernels["seq"].max() if len(trace.kernels) else 0)) + 1
    te = np.where(fs == NEVER_FREED, last, fs)
    return a["alloc_id"].to_numpy(np.int64), _align(a["size_bytes"].to_numpy(np.int64)), ts, te


def _build(trace: Trace, grouping: str) -> Plan:
    ids, size, ts, te = _intervals(trace)
    n = len(ids)
    a = trace.allocations.sort_values("alloc_id", kind="stable").reset_index(drop=True)
    fusions = 0
    if grouping == "homophase":
        sorted_trace = Trace(allocations=a, kernels=trace.kernels)
        locals_ = [
            _Local(members, _pack_local(np.asarray(members), size, ts, te), key[0], key[1])
            for key, members in _homophase_groups(sorted_trace, te).items()
        ]
        locals_, fusions = _fuse(locals_, size, ts, te)
    else:
        locals_ = [_Local([i], {i: 0}, "", "") for i in range(n)]
    items = []
    for k, g in enumerate(locals_):
        s, a0, b0 = g.extent(size, ts, te)
        items.append((k, s, a0, b0))
    bases = _global(items)
    address = np.zeros(n, dtype=np.int64)
    group_id = np.zeros(n, dtype=np.int64)
    for k, g in enumerate(locals_):
        for i in g.members:
            address[i] = bases[k] + g.offsets[i]
            group_id[i] = k
    blocks = pd.DataFrame(
        {
            "alloc_id": ids,
            "address": address,
            "block_bytes": size,
            "size_bytes": a["size_bytes"].to_numpy(np.int64),
            "start_seq": ts,
            "end_seq": te,
            "group_id": group_id,
        }
    )
    pool = int((address + size).max()) if n else 0
    return Plan(blocks, pool, grouping, len(locals_), fusions)


def plan(trace: Trace, grouping: str = "best") -> Plan:
    """Build the offline plan for ``trace`` (``grouping``: best, homophase or none; see the module docstring)."""
    if grouping not in GROUPINGS:
        raise InputError(f"planner grouping must be one of {', '.join(GROUPINGS)}, not {grouping!r}")
    if trace.allocations.empty:
        return Plan(
            pd.DataFrame(
                columns=["alloc_id", "address", "block_bytes", "size_bytes", "start_seq", "end_seq", "group_id"]
            ),
            0,
            grouping,
            0,
        )
    if grouping != "best":
        return _build(trace, grouping)
    a, b = _build(trace, "homophase"), _build(trace, "none")
    best = a if a.pool_bytes <= b.pool_bytes else b
    best.notes.append(f"pool: homophase {a.pool_bytes} B, per-request {b.pool_bytes} B; kept {best.grouping}")
    return best


def lower_bound_bytes(trace: Trace) -> int:
    """Peak of live requested bytes: no allocator can reserve less."""
    return peak_live(trace)[0]
