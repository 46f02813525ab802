"""Activation offload (``torch.autograd.graph.save_on_cpu``) as a transformation of a CUDA-orchestrated trace.

``save_on_cpu`` (torch/autograd/graph.py, torch 2.14.1 as installed) is a pair of saved-tensor hooks: when autograd
saves a tensor for backward, ``pack_to_cpu`` copies it to (pinned) host memory and autograd keeps only the host
copy, so the device tensor is freed once the forward no longer uses it; when backward needs it,
``unpack_from_cpu`` copies it back into a new device tensor. Both copies are issued on the current stream. Every
saved tensor is packed, parameters included (a layer saves its weight for the input gradient): the parameter stays
on the device (the module holds it), and backward reads a fresh device copy of it.

The transformation (no new capture; the device side of a save_on_cpu run):

- the saved tensors are the activations (made in forward, alive at its end: ``uvmlab.trace.capture`` rule 5) that a
  backward kernel reads, and the parameters read by a forward kernel and by the backward kernels that follow it;
- after a saved tensor's last forward access: ``offload:act_dtoh`` (api ``memcpy_dtoh``, reads it; one event per
  point, all tensors packed there), and an activation is freed right after it;
- before its first backward access: a new device allocation of the same size (category ``activation``, phase
  ``backward``) and ``offload:act_htod`` (api ``memcpy_htod``, writes it); every backward access of the tensor
  (for a parameter: in that backward pass) reads the copy instead; the copy is freed when the activation was (a
  parameter's copy: after its last access in that backward pass).

Seqs are renumbered in event order. Approximations (docs/advise.md): a saved view is copied whole (its
allocation); the copies are serial with the kernels (save_on_cpu issues them on the compute stream; with
``pin_memory=True`` they are asynchronous to the host, not to the stream); the host memory is unlimited; a tensor
that autograd saves but no backward kernel reads is not packed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from uvmlab.errors import InputError
from uvmlab.trace.schema import NEVER_FREED, Trace

_BEFORE_ALLOC, _BEFORE_COPY, _EVENT, _AFTER_COPY, _AFTER_FREE = -2, -1, 0, 1, 2
"""Sub-order of the events around one original seq (new seqs are the ranks of (seq, sub-order, n))."""


def _passes(kernels: pd.DataFrame) -> pd.Series:
    """Per kernel (index kernel_id): the number of the forward pass it belongs to, or whose backward it is in."""
    k = kernels.sort_values("seq")
    fwd = (k["phase"] == "forward").to_numpy()
    starts = fwd & ~np.r_[False, fwd[:-1]]
    return pd.Series(np.cumsum(starts), index=k["kernel_id"].to_numpy())


def _saved(trace: Trace) -> pd.DataFrame:
    """The saved tensors: alloc_id, npass, f_last (its last forward access seq), b_first, b_last (its backward
    accesses in that pass), is_act (an activation; else a parameter)."""
    a, k, acc = trace.allocations, trace.kernels, trace.accesses
    passes = _passes(k)
    kk = k.set_index("kernel_id")
    cat = a.set_index("alloc_id")["category"]
    x = acc.assign(
        seq=acc["kernel_id"].map(kk["seq"]),
        phase=acc["kernel_id"].map(kk["phase"]),
        npass=acc["kernel_id"].map(passes),
        cat=acc["alloc_id"].map(cat),
    )
    x = x[x["cat"].isin(("activation", "parameter"))]
    f = x[x["phase"] == "forward"].groupby(["alloc_id", "npass"])["seq"].max().rename("f_last")
    b = x[x["phase"] == "backward"].groupby(["alloc_id", "npass"])["seq"].agg(["min", "max"])
    span = b.rename(columns={"min": "b_first", "max": "b_last"}).join(f, how="inner").reset_index()
    span["is_act"] = span["alloc_id"].map(cat).eq("activation")
    return span.sort_values(["f_last", "alloc_id"], kind="stable").reset_index(drop=True)


def offload_activations(trace: Trace) -> Trace:
    """``trace`` (orchestrated) as a ``save_on_cpu`` run's device side (module docstring). A new Trace."""
    a, k, acc = trace.allocations, trace.kernels, trace.accesses
    span = _saved(trace)
    if span.empty:
        raise InputError("no tensor is read in both forward and backward: there are no saved tensors to offload")
    rows = a.set_index("alloc_id")
    it_of_seq = k.set_index("seq")["iteration"]
    kernel_key = {int(i): (int(q), _EVENT, 0) for i, q in zip(k["kernel_id"], k["seq"], strict=True)}
    alloc_key = {int(i): (int(q), _EVENT, 0) for i, q in zip(a["alloc_id"], a["alloc_seq"], strict=True)}
    free_key = {int(i): (int(q), _EVENT, 0) for i, q in zip(a["alloc_id"], a["free_seq"], strict=True) if q >= 0}
    copies: dict[tuple[int, int], list[tuple[int, int]]] = {}  # (seq, sub-order) -> [(alloc_id, bytes)]
    new_a: list[dict[str, Any]] = []
    copy_of: dict[tuple[int, int], int] = {}  # (alloc_id, pass) -> the backward copy's alloc_id
    next_id = int(a["alloc_id"].max()) + 1
    for n, (aid, npass, b_first, b_last, f_last, act) in enumerate(
        zip(*(span[c].tolist() for c in ("alloc_id", "npass", "b_first", "b_last", "f_last", "is_act")), strict=True)
    ):
        size = int(rows.at[aid, "size_bytes"])
        copies.setdefault((f_last, _AFTER_COPY), []).append((aid, size))
        copies.setdefault((b_first, _BEFORE_COPY), []).append((next_id, size))
        alloc_key[next_id] = (b_first, _BEFORE_ALLOC, n)
        if act:  # the device tensor goes once packed; the copy lives until the activation's own free
            if aid in free_key:
                free_key[next_id] = free_key[aid]
            free_key[aid] = (f_last, _AFTER_FREE, n)
        else:  # a parameter stays; its unpacked copy goes after the pass's last backward access
            free_key[next_id] = (b_last, _AFTER_FREE, n)
        new_a.append(
            {
                "alloc_id": next_id,
                "size_bytes": size,
                "category": "activation",
                "phase": "backward",
                "iteration": int(it_of_seq[b_first]),
                "op": "offload:act_htod",
                "stream": int(rows.at[aid, "stream"]),
            }
        )
        copy_of[(aid, npass)] = next_id
        next_id += 1
    new_k: list[dict[str, Any]] = []
    new_acc: list[dict[str, Any]] = []
    kid = int(k["kernel_id"].max()) + 1
    stream = int(k["stream"].iloc[0])
    for (q, sub), tensors in sorted(copies.items()):
        up = sub == _BEFORE_COPY
        kernel_key[kid] = (q, sub, 0)
        new_k.append(
            {
                "kernel_id": kid,
                "seq": 0,
                "name": "offload:act_htod" if up else "offload:act_dtoh",
                "phase": "backward" if up else "forward",
                "iteration": int(it_of_seq[q]),
                "flops": 0.0,
                "stream": stream,
                "api": "memcpy_htod" if up else "memcpy_dtoh",
            }
        )
        new_acc.extend(
            {"kernel_id": kid, "alloc_id": t, "offset_bytes": 0, "size_bytes": b, "is_write": up} for t, b in tensors
        )
        kid += 1
    acc2 = acc.copy()  # backward accesses of a saved tensor read its copy
    passes = _passes(k)
    bwd = acc2["kernel_id"].map(k.set_index("kernel_id")["phase"]).eq("backward").to_numpy()
    pairs = zip(acc2["alloc_id"].tolist(), acc2["kernel_id"].map(passes).tolist(), strict=True)
    target = np.array([copy_of.get((int(x), int(p)), -1) for x, p in pairs], dtype=np.int64)
    swap = bwd & (target >= 0)
    acc2.loc[swap, "alloc_id"] = target[swap]
    keys = [*alloc_key.values(), *free_key.values(), *kernel_key.values()]
    rank = {key: i for i, key in enumerate(sorted(set(keys)))}
    if len(rank) != len(keys):
        raise InputError("offload_activations: two events share a position")
    a2 = pd.concat([a, pd.DataFrame(new_a)], ignore_index=True)
    a2["alloc_seq"] = [rank[alloc_key[int(i)]] for i in a2["alloc_id"]]
    a2["free_seq"] = [rank[free_key[int(i)]] if int(i) in free_key else NEVER_FREED for i in a2["alloc_id"]]
    a2 = a2.astype({"iteration": "int32", "stream": "int32", "alloc_seq": "int64", "free_seq": "int64"})
    kernels = pd.concat([k, pd.DataFrame(new_k)], ignore_index=True)
    kernels["seq"] = [rank[kernel_key[int(i)]] for i in kernels["kernel_id"]]
    kernels["api"] = kernels["api"].fillna("") if "api" in kernels.columns else ""
    kernels = kernels.astype({"iteration": "int32", "stream": "int32"}).sort_values("seq", kind="stable")
    accesses = pd.concat([acc2, pd.DataFrame(new_acc, columns=acc.columns)], ignore_index=True)
    header = dict(trace.header)
    header["offload_activations"] = {
        "saved_tensors": len(span),
        "saved_activations": int(span["is_act"].sum()),
        "dtoh_bytes": int(sum(b for (_, sub), ts in copies.items() if sub == _AFTER_COPY for _, b in ts)),
    }
    header["notes"] = [
        *header.get("notes", []),
        "saved tensors offloaded to the host (uvmlab.trace.offload_activations, torch.autograd.graph.save_on_cpu)",
    ]
    out = Trace(a2, kernels.reset_index(drop=True), accesses, header)
    out.validate("activation-offloaded trace")
    return out
