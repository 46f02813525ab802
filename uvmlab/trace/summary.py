"""Summaries of a Trace for ``uvmlab trace show`` (torch-free).

* counts: allocations, frees, kernels, accesses, iterations;
* per category: number of allocations, total requested bytes, and bytes live at the peak;
* peak live bytes (requested bytes of live storages, over the global event sequence) and where it happens
  (sequence number, phase, iteration);
* per phase: allocations and allocated bytes, kernels and FLOPs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from uvmlab.trace.schema import CATEGORIES, NEVER_FREED, PHASES, Trace


def peak_live(trace: Trace) -> tuple[int, int]:
    """(peak live requested bytes, sequence number of the event that reached it); (0, -1) for an empty trace."""
    live = trace.live_bytes()
    if live.empty:
        return 0, -1
    i = int(np.argmax(live.to_numpy()))
    return int(live.iloc[i]), int(live.index[i])


def live_by_category(trace: Trace, seq: int | None) -> dict[str, int]:
    """Requested bytes alive right after event ``seq``, per allocation category (parameter, activation, ...)."""
    if seq is None:
        return {}
    a = trace.allocations
    alloc_seq, free_seq = a["alloc_seq"].to_numpy(), a["free_seq"].to_numpy()
    alive = (alloc_seq <= seq) & ((free_seq > seq) | (free_seq == NEVER_FREED))
    codes, categories = pd.factorize(a["category"].to_numpy()[alive], sort=True)
    sums = np.zeros(len(categories), dtype=np.int64)
    np.add.at(sums, codes[codes >= 0], a["size_bytes"].to_numpy()[alive][codes >= 0])
    return {str(k): int(v) for k, v in zip(categories, sums, strict=True) if v > 0}


def _phase_at(trace: Trace, seq: int) -> tuple[str | None, int | None]:
    """Phase and iteration of the latest allocation or kernel at or before ``seq``."""
    a = trace.allocations[["alloc_seq", "phase", "iteration"]].rename(columns={"alloc_seq": "seq"})
    k = trace.kernels[["seq", "phase", "iteration"]]
    ev = pd.concat([a, k], ignore_index=True)
    ev = ev[ev["seq"] <= seq]
    if ev.empty:
        return None, None
    row = ev.loc[ev["seq"].idxmax()]
    return str(row["phase"]), int(row["iteration"])


def summarize(trace: Trace) -> dict[str, Any]:
    """A JSON-ready summary of ``trace`` (see the module docstring)."""
    a = trace.allocations
    k = trace.kernels
    peak, peak_seq = peak_live(trace)
    phase, iteration = _phase_at(trace, peak_seq) if peak_seq >= 0 else (None, None)
    live_at_peak = live_by_category(trace, peak_seq)
    by_cat = []
    for cat in CATEGORIES:
        sel = a[a["category"] == cat]
        if sel.empty:
            continue
        by_cat.append(
            {
                "category": cat,
                "allocations": len(sel),
                "allocated_bytes": int(sel["size_bytes"].sum()),
                "live_at_peak_bytes": live_at_peak.get(cat, 0),
            }
        )
    by_phase = []
    for ph in PHASES:
        sa = a[a["phase"] == ph]
        sk = k[k["phase"] == ph]
        if sa.empty and sk.empty:
            continue
        by_phase.append(
            {
                "phase": ph,
                "allocations": len(sa),
                "allocated_bytes": int(sa["size_bytes"].sum()),
                "kernels": len(sk),
                "flops": float(sk["flops"].sum()),
            }
        )
    h = trace.header
    return {
        "workload": h.get("workload"),
        "capture_device": h.get("capture_device"),
        "batch_size": h.get("batch_size"),
        "iterations": trace.n_iterations,
        "parameter_bytes": h.get("parameter_bytes"),
        "allocations": len(a),
        "frees": int((a["free_seq"] != NEVER_FREED).sum()),
        "kernels": len(k),
        "accesses": len(trace.accesses),
        "total_flops": float(k["flops"].sum()),
        "peak_live_bytes": peak,
        "peak_seq": peak_seq,
        "peak_phase": phase,
        "peak_iteration": iteration,
        "categories": by_cat,
        "phases": by_phase,
        "notes": list(h.get("notes", [])),
    }
