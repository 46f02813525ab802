"""The parameters of a captured trace, grouped into the units a data-parallel layout gathers. Torch-free.

The capture writes each parameter's allocation, name, shape, dtype, trainability, block and per-iteration gradient
allocation into the header (uvmlab.trace.param_map). A *unit* is a set of parameters gathered and resharded
together:

- ``blocks`` (FSDP and FSDP2 as users wrap them): one unit per repeated block (``fully_shard(layer)`` for each
  transformer layer, or ``transformer_auto_wrap_policy`` of the layer class) and one root unit for every other
  parameter (embeddings, final norm, head: ``fully_shard(model)``);
- ``modules`` (DeepSpeed ZeRO-3): one unit per module that owns parameters (ZeRO-3 fetches each submodule's own
  parameters before its forward, ``PartitionedParameterCoordinator.fetch_sub_module``).

:func:`windows` gives, per unit and iteration, the first and last kernel of the forward and of the backward that
touches one of the unit's parameters or gradients: where the gathers and frees go.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from uvmlab.errors import InputError
from uvmlab.trace.schema import Trace

ROOT = -1
"""Unit id of the root unit (parameters outside every block)."""


def read_parameters(trace: Trace) -> pd.DataFrame:
    """The header's parameter map as a table: alloc_id, name, shape, itemsize, numel, trainable, module, block,
    grads (list of alloc_ids per iteration); in model order. An InputError for a trace captured without it."""
    entries = trace.header.get("parameters")
    if not entries:
        raise InputError(
            "this trace has no parameter map (captured before uvmlab's data-parallel layouts, or a workload "
            "program without a model): capture it again"
        )
    p = pd.DataFrame(entries)
    p["numel"] = [int(np.prod(s)) if len(s) else 1 for s in p["shape"]]
    p["dim0"] = [int(s[0]) if len(s) else 1 for s in p["shape"]]
    p["row"] = p["numel"] // p["dim0"].clip(lower=1)
    p["bytes"] = p["numel"] * p["itemsize"]
    return p


def assign_units(params: pd.DataFrame, kind: str) -> pd.Series:
    """Unit id of each parameter: ``blocks`` (block index, ROOT outside) or ``modules`` (one id per owning module,
    in model order)."""
    if kind == "blocks":
        return params["block"].astype(int)
    if kind == "modules":
        codes, _ = pd.factorize(params["module"])
        return pd.Series(codes, index=params.index)
    raise ValueError(f"unknown unit kind {kind!r}")


def windows(trace: Trace, params: pd.DataFrame, unit: pd.Series) -> pd.DataFrame:
    """Per (unit, iteration, phase in forward/backward): first and last seq of a kernel touching one of the
    unit's parameters, and (``grad_last``, backward) the last kernel touching one of its gradients of that
    iteration (when they are all ready: the autograd engine may finish a gradient after later units' backward,
    e.g. the cast back of an autocast weight copy). Columns: unit, iteration, phase, first, last, grad_last."""
    owner: dict[int, int] = {}
    grad_ids: set[int] = set()
    for aid, u, grads in zip(params["alloc_id"], unit, params["grads"], strict=True):
        owner[int(aid)] = int(u)
        for g in grads:
            if g >= 0:
                owner[int(g)] = int(u)
                grad_ids.add(int(g))
    acc = trace.accesses
    hit = acc["alloc_id"].isin(list(owner))
    x = acc.loc[hit, ["kernel_id", "alloc_id"]]
    k = trace.kernels.set_index("kernel_id")
    x = x.assign(
        unit=x["alloc_id"].map(owner).to_numpy(),
        seq=k.loc[x["kernel_id"], "seq"].to_numpy(),
        phase=k.loc[x["kernel_id"], "phase"].to_numpy(),
        iteration=k.loc[x["kernel_id"], "iteration"].to_numpy(),
    )
    x = x[x["phase"].isin(("forward", "backward")) & (x["iteration"] >= 0)]
    is_grad = x["alloc_id"].isin(list(grad_ids))
    g = x[~is_grad].groupby(["unit", "iteration", "phase"])["seq"]
    out = pd.DataFrame({"first": g.min(), "last": g.max()})
    out["grad_last"] = x[is_grad].groupby(["unit", "iteration", "phase"])["seq"].max()
    out = out.reset_index()
    out["grad_last"] = out["grad_last"].fillna(-1).astype(np.int64)
    return out


def phase_spans(trace: Trace) -> pd.DataFrame:
    """First and last seq of every (iteration, phase) over allocations and kernels; columns iteration, phase,
    first, last."""
    a, k = trace.allocations, trace.kernels
    ev = pd.concat(
        [
            pd.DataFrame({"seq": a["alloc_seq"], "phase": a["phase"], "iteration": a["iteration"]}),
            pd.DataFrame({"seq": k["seq"], "phase": k["phase"], "iteration": k["iteration"]}),
        ]
    )
    g = ev.groupby(["iteration", "phase"])["seq"]
    return pd.DataFrame({"first": g.min(), "last": g.max()}).reset_index()


def ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` for non-negative integers."""
    return -(-int(a) // int(b))
