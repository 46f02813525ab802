"""What every data-parallel layout reads from the captured trace: parameters, units, windows, gradients, the
optimizer's allocations. Torch-free (uvmlab.trace.shard)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from uvmlab.errors import InputError
from uvmlab.trace.schema import NEVER_FREED, Trace
from uvmlab.trace.shard.edit import TraceEdit
from uvmlab.trace.shard.units import ROOT, assign_units, phase_spans, read_parameters, windows

COMM = "communication"
"""Category of a buffer a collective writes into or reads from (all-gather outputs, reduce-scatter inputs and
outputs that are not gradients, DDP's buckets, ZeRO's ipg buckets)."""


@dataclass
class Layout:
    """The captured single-GPU trace, read for one data-parallel layout (``unit_kind``: units.assign_units)."""

    trace: Trace
    world_size: int
    unit_kind: str = "blocks"
    params: pd.DataFrame = field(init=False)
    edit: TraceEdit = field(init=False)

    def __post_init__(self) -> None:
        t = self.trace
        if int((t.header.get("config") or {}).get("accumulation_steps", 1)) > 1:
            raise InputError(
                "gradient accumulation under a data-parallel layout (--shard) is not modelled; estimate one "
                "micro-batch (drop --accumulation-steps) or leave out --shard"
            )
        self.params = read_parameters(t)
        self.params["unit"] = assign_units(self.params, self.unit_kind).to_numpy()
        self.edit = TraceEdit(t)
        a = t.allocations
        self._free = dict(zip(a["alloc_id"].tolist(), a["free_seq"].tolist(), strict=True))
        self._alloc = dict(zip(a["alloc_id"].tolist(), a["alloc_seq"].tolist(), strict=True))
        self.spans = phase_spans(t)
        self.iterations = sorted(int(i) for i in self.spans.loc[self.spans["phase"] == "forward", "iteration"])
        w = windows(t, self.params, self.params["unit"])
        rows = list(w.itertuples(index=False))
        self.win = {(int(u), int(i), str(p)): (int(f), int(last)) for u, i, p, f, last, _g in rows}
        self.grad_last = {(int(u), int(i)): int(g) for u, i, p, _f, _l, g in rows if p == "backward"}

    # ---- units ---------------------------------------------------------------------------------------------
    def unit_ids(self) -> list[int]:
        """Units in the order of their first forward access (the root first: it is gathered at forward start)."""
        first = {}
        for (u, it, ph), (f, _l) in self.win.items():
            if ph == "forward" and it == self.iterations[0]:
                first[u] = f
        units = sorted(set(self.params["unit"].tolist()), key=lambda u: (u != ROOT, first.get(u, 1 << 62), u))
        return units

    def members(self, unit: int) -> pd.DataFrame:
        """The parameters of ``unit`` (model order)."""
        return self.params[self.params["unit"] == unit]

    def window(self, unit: int, iteration: int, phase: str) -> tuple[int, int] | None:
        """(first, last) kernel seq of ``unit`` in ``phase`` of ``iteration`` (None: not touched)."""
        return self.win.get((unit, iteration, phase))

    def reduce_point(self, unit: int, iteration: int, after: int) -> int:
        """Where ``unit``'s gradients of ``iteration`` can be reduced: after ``after`` (its last kernel) and after the
        last kernel touching one of its gradients."""
        return max(after, self.grad_last.get((unit, iteration), -1))

    def span(self, iteration: int, phase: str) -> tuple[int, int] | None:
        """First and last seq of ``phase`` in ``iteration``."""
        s = self.spans[(self.spans["iteration"] == iteration) & (self.spans["phase"] == phase)]
        if s.empty:
            return None
        return int(s["first"].iloc[0]), int(s["last"].iloc[0])

    def setup_end(self) -> int:
        """Seq of the last setup event."""
        s = self.spans[self.spans["phase"] == "setup"]
        return int(s["last"].max()) if len(s) else 0

    # ---- gradients -----------------------------------------------------------------------------------------
    def grads(self, iteration: int, members: pd.DataFrame | None = None) -> list[tuple[int, int]]:
        """(param alloc_id, gradient alloc_id) of the trainable parameters with a gradient in ``iteration``."""
        p = self.params if members is None else members
        out = []
        pos = self.iterations.index(iteration)
        for aid, grads in zip(p["alloc_id"], p["grads"], strict=True):
            if pos < len(grads) and grads[pos] >= 0:
                out.append((int(aid), int(grads[pos])))
        return out

    def ready_seq(self, grad_id: int) -> int:
        """Seq of the last kernel of the gradient's iteration that touches it before the optimizer (when it is
        ready: its autograd hook fires); its allocation seq if none."""
        if not hasattr(self, "_ready"):
            k, acc = self.trace.kernels, self.trace.accesses
            bk = k[k["phase"] == "backward"].set_index("kernel_id")["seq"]
            x = acc[acc["kernel_id"].isin(bk.index)]
            self._ready = x.assign(seq=bk.loc[x["kernel_id"]].to_numpy()).groupby("alloc_id")["seq"].max().to_dict()
        return int(self._ready.get(grad_id, self.alloc_seq(grad_id)))

    def free_seq(self, alloc_id: int) -> int:
        """Original free seq of an allocation (NEVER_FREED: never)."""
        return int(self._free[alloc_id])

    def alloc_seq(self, alloc_id: int) -> int:
        """Original allocation seq."""
        return int(self._alloc[alloc_id])

    def free_key_of(self, alloc_id: int) -> tuple[int, int] | None:
        """The original free of an allocation as an edit key (None: never freed)."""
        f = self.free_seq(alloc_id)
        return None if f == NEVER_FREED else (f, 0)

    # ---- optimizer -----------------------------------------------------------------------------------------
    def optimizer_allocations(self) -> pd.DataFrame:
        """Allocations of the optimizer: its state and the step's temporaries (phase ``optimizer``)."""
        a = self.trace.allocations
        return a[(a["category"] == "optimizer_state") | ((a["phase"] == "optimizer") & (a["iteration"] >= 0))]

    def scale_optimizer(self, shard_bytes: dict[int, int]) -> None:
        """Resize the optimizer's state and step temporaries as their parameters' shards (``shard_bytes``:
        param alloc_id -> bytes this rank holds). APPROXIMATION: an allocation is matched to a trainable parameter
        by element count (its byte size over the state's element size, 4 or the parameter's); one that matches
        none is divided by the world size."""
        p = self.params[self.params["trainable"]]
        by_numel: dict[int, float] = {}
        for aid, numel, nbytes in zip(p["alloc_id"], p["numel"], p["bytes"], strict=True):
            by_numel.setdefault(int(numel), shard_bytes.get(int(aid), int(nbytes)) / max(int(nbytes), 1))
        sizes = sorted({int(x) for x in p["itemsize"]} | {4})
        for aid, size in zip(*(self.optimizer_allocations()[c] for c in ("alloc_id", "size_bytes")), strict=True):
            ratio = next((by_numel[size // s] for s in sizes if size % s == 0 and size // s in by_numel), None)
            new = int(np.ceil(size / self.world_size)) if ratio is None else round(size * ratio)
            self.edit.resize(int(aid), new)
