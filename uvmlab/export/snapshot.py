"""A simulated run as a PyTorch memory snapshot whose entries say something in memory_viz.

The allocator model (``uvmlab.sim.allocator.recorded.recorded_run``) replays the run's trace once more with
``record_events``;
each recorded trace entry then gets:

* ``frames``: four pseudo stack frames, innermost first, in PyTorch's frame format ``{filename, line, name}``
  (memory_viz shows them as ``filename:line:name``): ``op:0:<aten op that allocated the tensor>``,
  ``category:0:<parameter|activation|...>``, ``phase:0:<forward|backward|...>``, ``iteration:<i>:iteration <i>``
  (``i`` = -1 for setup). A free carries the frames of the tensor it frees; a ``segment_*``/``oom`` entry those
  of the alloc/free that caused it. Live blocks carry the frames of the alloc that made them.
* ``time_us``: simulated time in microseconds (integer, as PyTorch writes it) = end of the last simulated kernel
  launched before the event (0 before the first kernel). Approximation: the simulator has no host clock, so an
  allocation is placed on the GPU timeline between kernels, where the caching allocator's effect is visible.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from uvmlab.errors import InvariantError
from uvmlab.trace.schema import NEVER_FREED, Trace

FRAME_FIELDS = ("op", "category", "phase", "iteration")
"""The pseudo frames of every entry, innermost first (see the module docstring)."""


def _frames(op: str, category: str, phase: str, iteration: int) -> list[dict[str, Any]]:
    return [
        {"filename": "op", "line": 0, "name": op},
        {"filename": "category", "line": 0, "name": category},
        {"filename": "phase", "line": 0, "name": phase},
        {"filename": "iteration", "line": int(iteration), "name": f"iteration {int(iteration)}"},
    ]


def _seq_frames(trace: Trace) -> dict[int, list[dict[str, Any]]]:
    """Frames of every alloc and free seq of ``trace`` (a free gets its tensor's frames)."""
    a = trace.allocations
    cols = [a[c].tolist() for c in ("alloc_seq", "free_seq", "op", "category", "phase", "iteration")]
    out: dict[int, list[dict[str, Any]]] = {}
    for alloc_seq, free_seq, op, cat, phase, it in zip(*cols, strict=True):
        fr = _frames(op, cat, phase, it)
        out[int(alloc_seq)] = fr
        if free_seq != NEVER_FREED:
            out[int(free_seq)] = fr
    return out


def seq_times_us(trace: Trace, kernels: pd.DataFrame, seqs: list[int]) -> np.ndarray:
    """Simulated time (integer us) of each event ``seq``: end of the last kernel with a smaller seq, else 0.

    ``kernels`` is the run's kernels table (kernel_id, end_ns); the trace's kernels give each kernel's seq.
    """
    k = trace.kernels[["kernel_id", "seq"]].merge(kernels[["kernel_id", "end_ns"]], on="kernel_id", how="inner")
    k = k.sort_values("seq", kind="stable")
    kseq = k["seq"].to_numpy(np.int64)
    kend = np.maximum.accumulate(k["end_ns"].to_numpy(np.float64)) if len(k) else np.zeros(0)
    idx = np.searchsorted(kseq, np.asarray(seqs, dtype=np.int64), side="left") - 1
    ns = np.where(idx >= 0, kend[np.maximum(idx, 0)] if len(kend) else 0.0, 0.0)
    return np.rint(ns / 1000.0).astype(np.int64)


def run_snapshot_dicts(
    trace: Trace, pca: bool, kernels: pd.DataFrame, peak_reserved_bytes: int | None = None, alloc_conf: str = ""
) -> tuple[list[dict[str, Any]], list[list[dict[str, Any]]]]:
    """(segments, device_traces) of a simulated run with frames and simulated ``time_us`` (module docstring).

    ``trace`` is the CUDA-orchestrated trace the run placed, ``kernels`` its kernels table; the allocator is
    replayed without a memory limit, as ``uvmlab.uvm.simulate.prepare`` places it. ``peak_reserved_bytes`` (the
    placement's) is checked against the replay's.
    """
    from uvmlab.sim.allocator.allocconf import AllocatorSettings
    from uvmlab.sim.allocator.recorded import recorded_run

    seqs: list[int] = []
    sim = recorded_run(trace, "pca" if pca else "nocache", AllocatorSettings.parse(alloc_conf), None, entry_seqs=seqs)
    if peak_reserved_bytes is not None and sim.peak_reserved_bytes != peak_reserved_bytes:
        raise InvariantError(
            f"snapshot replay peak reserved {sim.peak_reserved_bytes} B != the run's {peak_reserved_bytes} B"
        )
    segments, traces = sim.to_snapshot_dicts()
    annotate(trace, segments, traces, seqs, kernels)
    return segments, traces


def annotate(
    trace: Trace,
    segments: list[dict[str, Any]],
    traces: list[list[dict[str, Any]]],
    seqs: list[int],
    kernels: pd.DataFrame | None = None,
) -> None:
    """Give the last device's entries (one per ``seqs`` item) and the live blocks their frames, in place; with
    ``kernels`` (a run's kernels table) also simulated ``time_us``, else ``time_us`` stays the event index
    (``uvmlab estimate --snapshot`` has no clock)."""
    entries = traces[-1]
    if len(entries) != len(seqs):
        raise InvariantError(f"{len(entries)} snapshot entries but {len(seqs)} recorded seqs")
    frames = _seq_frames(trace)
    times = seq_times_us(trace, kernels, seqs).tolist() if kernels is not None else [e["time_us"] for e in entries]
    live: dict[int, list[dict[str, Any]]] = {}
    for e, seq, t in zip(entries, seqs, times, strict=True):
        e["frames"] = frames.get(seq, [])
        e["time_us"] = int(t)
        if e["action"] == "alloc":
            live[e["addr"]] = e["frames"]
        elif e["action"] == "free_completed":
            live.pop(e["addr"], None)
    for s in segments:
        for b in s["blocks"]:
            if b["state"] == "active_allocated":
                b["frames"] = live.get(b["address"], [])


def write_run_snapshot(
    path: str | Path,
    trace: Trace,
    pca: bool,
    kernels: pd.DataFrame,
    peak_reserved_bytes: int | None = None,
    alloc_conf: str = "",
) -> Path:
    """Write the annotated snapshot of a simulated run to ``path`` (see :func:`run_snapshot_dicts`)."""
    from uvmlab.trace.snapshot import write_snapshot

    segments, traces = run_snapshot_dicts(trace, pca, kernels, peak_reserved_bytes, alloc_conf)
    # PyTorch's snapshots carry PYTORCH_CUDA_ALLOC_CONF; the caching switch is recorded only when caching is off,
    # because PYTORCH_NO_CUDA_MEMORY_CACHING set to any value (even "0") turns caching off (uvmlab.measure.gpu.worker).
    settings = {"PYTORCH_CUDA_ALLOC_CONF": alloc_conf}
    if not pca:
        settings["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    return write_snapshot(path, segments, traces, allocator_settings=settings)
