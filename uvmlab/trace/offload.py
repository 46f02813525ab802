"""CPU offload of the optimizer (the ZeRO-Offload idea) as a transformation of a CUDA-orchestrated trace. Torch-free.

ZeRO-Offload (Ren et al., USENIX ATC'21, arXiv 2101.06840; DeepSpeed's ``zero_optimization.offload_optimizer``,
www.deepspeed.ai/tutorials/zero-offload) keeps the fp32 master parameters, the optimizer state and the optimizer
step on the host; each iteration the gradients go device-to-host, the CPU runs Adam, and the updated parameters
go host-to-device. Forward and backward are unchanged, so the device side of such a run is the trace of the plain
job with its optimizer phase replaced; this module does that replacement (no new capture is needed):

- every allocation of category ``optimizer_state`` and every allocation made in the ``optimizer`` phase (the
  device step's temporaries) is removed, with its accesses: the device never holds the optimizer;
- every ``optimizer`` kernel is removed and, in its place, each iteration gets three events
  (kernels column ``api``, read by ``uvmlab.sim.uvm.replay``):

  1. ``offload:grad_dtoh`` (api ``memcpy_dtoh``): reads every gradient alive at the step (``cudaMemcpyAsync``
     device-to-host into pinned host buffers), timed at the link bandwidth (``CostParams.link_bytes_per_s``,
     UVMSmart's transfer curve, uvmlab.sim.uvm.timing) plus the faults of gradient pages that are not resident;
  2. ``offload:cpu_step`` (api ``host``, column ``host_ns``): the optimizer step on the CPU, trainable parameters /
     :data:`CPU_ADAM_PARAMS_PER_S`; the GPU waits (the step needs every gradient and the next forward every
     parameter);
  3. ``offload:param_htod`` (api ``memcpy_htod``): writes every trainable parameter (host-to-device copy of the
     updated fp32 master copy), an explicit copy like the study's retained copies (``UvmSim.memcpy_htod``).

So the link carries 2 x the trainable parameter bytes per iteration (fp32 gradients down, fp32 parameters up).

Approximations (docs/advise.md): the three steps are serial (the simple loop a user writes; DeepSpeed overlaps
the gradient copies with backward and the parameter copies with the next forward, so this is an upper bound on
its time); a device-to-host copy of managed pages that were evicted is charged as a fault-in, though the driver
could copy them host-side; the host memory is unlimited (pinned buffers of 4 x the parameters for Adam).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from uvmlab.errors import InputError
from uvmlab.trace.schema import NEVER_FREED, Trace

CPU_ADAM_PARAMS_PER_S = 2.8e8
"""Parameters per second of the host's Adam step: torch's CPU Adam (``foreach=True``, fp32) measured on the
machine that built uvmlab: one thread, 25 x 1M parameters, 282-288 M parameters per CPU-second (torch 2.14.1,
2026-11-23, ``python benchmarks/cpu_adam.py``; wall time under a load of 8 on 2 cores was 93-98 M/s). A
single-core figure; DeepSpeedCPUAdam (AVX, multi-threaded) is 5-7x faster than PyTorch's CPU Adam (DeepSpeed
ZeRO-Offload tutorial, www.deepspeed.ai/tutorials/zero-offload)."""
SEQ_SPREAD = 4
"""Seqs are multiplied by this to leave room for the three inserted events before each step."""


@dataclass
class StrippedStep:
    """A trace with its optimizer phase taken out (:func:`strip_optimizer_step`), seqs multiplied by
    :data:`SEQ_SPREAD`; the events that replace the step go into the free seqs around each removed step."""

    allocations: pd.DataFrame
    kernels: pd.DataFrame
    accesses: pd.DataFrame
    steps: pd.DataFrame
    """One row per iteration with a step: ``iteration``, ``first`` and ``last`` (spread seqs of its first and last
    removed kernel)."""
    stream: int
    next_kernel_id: int


def strip_optimizer_step(trace: Trace, keep_state: bool = False) -> StrippedStep:
    """Remove every ``optimizer`` kernel and every allocation made in the ``optimizer`` phase (the device step's
    temporaries), with their accesses; the ``optimizer_state`` allocations go too unless ``keep_state``."""
    a, k, acc = trace.allocations, trace.kernels, trace.accesses
    opt_k = k[(k["phase"] == "optimizer") & (k["iteration"] >= 0)]
    if opt_k.empty:
        raise InputError("the trace has no optimizer step to replace")
    state = a["category"] == "optimizer_state"
    drop_a = ((a["phase"] == "optimizer") & (a["iteration"] >= 0) & ~state) | (state & (not keep_state))
    dropped_ids = set(a.loc[drop_a, "alloc_id"].tolist())
    keep_a = a[~drop_a].copy()
    keep_k = k[~k["kernel_id"].isin(opt_k["kernel_id"])].copy()
    keep_acc = acc[acc["kernel_id"].isin(keep_k["kernel_id"]) & ~acc["alloc_id"].isin(dropped_ids)].copy()
    for col in ("alloc_seq", "free_seq"):
        keep_a[col] = np.where(keep_a[col] == NEVER_FREED, NEVER_FREED, keep_a[col] * SEQ_SPREAD)
    keep_k["seq"] = keep_k["seq"] * SEQ_SPREAD
    for col, default in (("api", ""), ("host_ns", np.nan)):
        if col not in keep_k.columns:
            keep_k[col] = default
    g = opt_k.groupby("iteration")["seq"]
    steps = pd.DataFrame({"first": g.min() * SEQ_SPREAD, "last": g.max() * SEQ_SPREAD}).reset_index()
    return StrippedStep(keep_a, keep_k, keep_acc, steps, int(opt_k["stream"].iloc[0]), int(k["kernel_id"].max()) + 1)


def assemble(
    trace: Trace, s: StrippedStep, new_k: list[dict[str, Any]], new_acc: list[dict[str, Any]], allocations: Any = None
) -> Trace:
    """The stripped trace plus the new events (kernels and their accesses), validated."""
    kernels = pd.concat([s.kernels, pd.DataFrame(new_k).astype({"iteration": "int32", "stream": "int32"})])
    kernels = kernels.sort_values("seq", kind="stable").reset_index(drop=True)
    kernels["api"] = kernels["api"].fillna("")
    accesses = pd.concat([s.accesses, pd.DataFrame(new_acc, columns=trace.accesses.columns)], ignore_index=True)
    a = s.allocations if allocations is None else allocations
    return Trace(allocations=a.reset_index(drop=True), kernels=kernels, accesses=accesses, header=dict(trace.header))


def event(kid: int, seq: int, name: str, it: int, stream: int, api: str, host_ns: float = np.nan) -> dict[str, Any]:
    """One inserted kernels row (an API call, a copy or host work: no FLOPs)."""
    return {
        "kernel_id": kid,
        "seq": seq,
        "name": name,
        "phase": "optimizer",
        "iteration": it,
        "flops": 0.0,
        "stream": stream,
        "api": api,
        "host_ns": host_ns,
    }


def offload_optimizer(trace: Trace, params_per_s: float = CPU_ADAM_PARAMS_PER_S, overlap: bool = False) -> Trace:
    """``trace`` (orchestrated) with the optimizer state and step on the host (module docstring). A new Trace.

    ``overlap``: the CPU step runs while the GPU does the next forward and backward (ZeRO-Offload's one-step
    delayed parameter update): the step is a ``host_async`` event (the stream does not wait for it) and each
    iteration's parameter upload moves to just before the next iteration's gradient download, where it waits for
    the CPU step (``uvmlab.sim.uvm.replay``): every iteration after the first lasts max(its forward and backward, the
    CPU step) plus the copies. The last step's upload falls after the end of the trace.
    """
    a = trace.allocations
    n_params = int(trace.header.get("parameter_count") or 0)
    trainable = int(trace.header.get("trainable_parameter_bytes") or 0)
    total = int(trace.header.get("parameter_bytes") or 0)
    if total and trainable:  # the CPU steps only trainable parameters
        n_params = round(n_params * trainable / total)
    s = strip_optimizer_step(trace)
    params = s.allocations[s.allocations["category"] == "parameter"]
    grads = s.allocations[s.allocations["category"] == "gradient"]
    kid = s.next_kernel_id
    new_k: list[dict[str, Any]] = []
    new_acc: list[dict[str, Any]] = []
    dtoh_bytes = 0

    def add(seq: int, name: str, it: int, api: str, tensors: pd.DataFrame, is_write: bool, host_ns: float) -> None:
        nonlocal kid
        new_k.append(event(kid, seq, name, it, s.stream, api, host_ns))
        new_acc.extend(
            {"kernel_id": kid, "alloc_id": int(a_id), "offset_bytes": 0, "size_bytes": int(n), "is_write": is_write}
            for a_id, n in zip(tensors["alloc_id"], tensors["size_bytes"], strict=True)
        )
        kid += 1

    step_ns = n_params / params_per_s * 1e9
    for j, (it, s0) in enumerate(zip(s.steps["iteration"].tolist(), s.steps["first"].tolist(), strict=True)):
        alive = (grads["alloc_seq"] < s0) & ((grads["free_seq"] == NEVER_FREED) | (grads["free_seq"] > s0))
        dtoh_bytes = int(grads.loc[alive, "size_bytes"].sum())  # the last iteration's (steady state)
        if overlap and j > 0:  # the previous step's upload, overlapped with this iteration's forward and backward
            add(s0 - 3, "offload:param_htod", int(it), "memcpy_htod", params, True, np.nan)
        add(s0 - 2, "offload:grad_dtoh", int(it), "memcpy_dtoh", grads[alive], False, np.nan)
        add(s0 - 1, "offload:cpu_step", int(it), "host_async" if overlap else "host", params.iloc[0:0], False, step_ns)
        if not overlap:
            add(s0, "offload:param_htod", int(it), "memcpy_htod", params, True, np.nan)
    out = assemble(trace, s, new_k, new_acc)
    out.header["offload_optimizer"] = {
        "cpu_params": n_params,
        "cpu_params_per_s": params_per_s,
        "overlap": overlap,
        "dtoh_bytes_per_iteration": dtoh_bytes,
        "htod_bytes_per_iteration": int(params["size_bytes"].sum()),
        "removed_optimizer_state_bytes": int(a.loc[a["category"] == "optimizer_state", "size_bytes"].sum()),
    }
    out.header["notes"] = [
        *out.header.get("notes", []),
        "optimizer offloaded to the CPU (uvmlab.trace.offload): optimizer state and step removed from the device; "
        "per iteration gradients DtoH, a CPU step"
        + (" overlapped with the next forward/backward" if overlap else "")
        + ", parameters HtoD",
    ]
    out.validate("offloaded trace")
    return out


def offload_optimizer_of(trace: Trace, optimizer: str, overlap: bool = False) -> Trace:
    """:func:`offload_optimizer` for a job trained with ``optimizer`` (sgd without momentum keeps no state)."""
    if optimizer == "sgd":
        raise InputError("optimizer sgd (no momentum) keeps no optimizer state: there is nothing to offload")
    return offload_optimizer(trace, overlap=overlap)
