"""Fragmentation characterization (STWeaver, seeds/004 sections 2.2 and 8.1) of a trace or a replayed snapshot.

Definitions (STWeaver): memory efficiency ``E = M_a / M_r`` (allocated over reserved); at the peak it is
"the ratio of the max allocated memory to the max reserved memory", and the fragmentation ratio is ``1 - E``.

We take ``M_a`` as the live *requested* tensor bytes (the trace's sizes, before any allocator rounding), the same
numerator for every allocator, so efficiency differences are the allocators' alone. (PyTorch's
``max_memory_allocated()`` counts rounded block bytes; that number is reported too, as ``pca`` allocated.)
Allocators compared:

- ``pca``: uvmlab's caching-allocator simulator, ``uvmlab.sim.allocator.placement.place(trace, "pca")``;
- ``pca-recorded`` (snapshots only): the real run's peak reserved bytes from the snapshot;
- ``planned``: the offline STWeaver-style plan (``uvmlab.sim.allocator.planner``), a static pool reserved once;
- ``lower-bound``: the peak of live requested bytes (no allocator can reserve less).

The "reduction of fragmentation" of the planner is ``1 - frag(planned) / frag(pca)`` (STWeaver reports 79.2 % on
average over its dense and MoE models, up to 100 %).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from uvmlab.errors import UnavailableError
from uvmlab.sim.allocator.planner import Plan, plan
from uvmlab.trace.schema import Trace

STWEAVER_REPORTED = {
    "mean_fragmentation_reduction": 0.792,
    "dense_efficiency_min": 0.95,
    "pytorch_efficiency_range": (0.572, 0.938),
}
"""STWeaver's headline numbers (seeds/004: abstract; section 8.2): fragmentation reduced by 79.2 % on average,
> 95 % efficiency on dense models, PyTorch 2.3 at 57.2-93.8 %."""


@dataclass
class Fragmentation:
    """Per-allocator peaks and efficiencies, and the timelines behind them."""

    name: str
    table: pd.DataFrame
    """allocator, peak_reserved_bytes, peak_allocated_bytes (live requested), efficiency, fragmentation_ratio."""
    timeline: pd.DataFrame
    """seq, live_bytes, pca_reserved_bytes (NaN where unavailable), planned_reserved_bytes."""
    plan: Plan
    notes: list[str] = field(default_factory=list)

    def row(self, allocator: str) -> dict[str, Any] | None:
        """The table row of ``allocator`` as a dict (None when absent)."""
        r = self.table[self.table["allocator"] == allocator]
        return None if r.empty else r.iloc[0].to_dict()

    def reduction(self) -> float:
        """1 - frag(planned) / frag(pca); NaN when PCA is unavailable or not fragmented."""
        p, q = self.row("pca"), self.row("planned")
        if p is None or q is None or p["fragmentation_ratio"] <= 0:
            return math.nan
        return 1.0 - q["fragmentation_ratio"] / p["fragmentation_ratio"]


def _pca_placement(trace: Trace, alloc_conf: str) -> Any:
    from uvmlab.sim.allocator import placement

    settings = None
    if alloc_conf:
        from uvmlab.sim.allocator.allocconf import AllocatorSettings

        settings = AllocatorSettings.parse(alloc_conf)
    return placement.place(trace, "pca", settings=settings)


def characterize(
    trace: Trace,
    name: str = "",
    alloc_conf: str = "",
    recorded_peak_reserved_bytes: float | None = None,
    grouping: str = "best",
) -> Fragmentation:
    """Efficiency and fragmentation of PCA (simulated; recorded when given), the planned allocator and the bound."""
    live = trace.live_bytes()
    peak_live = int(live.max()) if len(live) else 0  # = uvmlab.sim.allocator.planner.lower_bound_bytes(trace)
    notes: list[str] = []
    pl = plan(trace, grouping)
    pl.check_invariants()
    notes.extend(pl.notes)
    rows: list[dict[str, Any]] = []

    def add(allocator: str, reserved: float, allocated_blocks: float = math.nan) -> None:
        eff = peak_live / reserved if reserved and reserved > 0 else math.nan
        rows.append(
            {
                "allocator": allocator,
                "peak_reserved_bytes": float(reserved),
                "peak_allocated_bytes": float(peak_live),
                "peak_block_bytes": float(allocated_blocks),
                "efficiency": eff,
                "fragmentation_ratio": 1.0 - eff if not math.isnan(eff) else math.nan,
            }
        )

    pca_reserved = pd.Series(np.nan, index=live.index)
    try:
        placement = _pca_placement(trace, alloc_conf)
    except UnavailableError as exc:
        notes.append(f"pca: {exc}")
    else:
        add("pca", placement.peak_reserved_bytes, placement.peak_allocated_bytes)
        tl = placement.timeline.set_index("seq")["reserved_bytes"]
        pca_reserved = tl.reindex(live.index, method="ffill")
    if recorded_peak_reserved_bytes is not None and not math.isnan(recorded_peak_reserved_bytes):
        add("pca-recorded", recorded_peak_reserved_bytes)
    add("planned", pl.pool_bytes, pl.peak_allocated_bytes)
    add("lower-bound", peak_live, peak_live)
    timeline = pd.DataFrame(
        {
            "seq": live.index.to_numpy(),
            "live_bytes": live.to_numpy(),
            "pca_reserved_bytes": pca_reserved.to_numpy(dtype=float),
            "planned_reserved_bytes": float(pl.pool_bytes),
        }
    )
    return Fragmentation(name or str(trace.header.get("workload", "trace")), pd.DataFrame(rows), timeline, pl, notes)


def workload_trace(cfg: Any, gpu_name: str = "A100-80GB") -> tuple[Trace, list[str]]:
    """The CUDA-level trace of a workload: captured (cached) and orchestrated for ``gpu_name`` when possible."""
    from uvmlab.gpus import get_gpu
    from uvmlab.trace.cache import get_trace
    from uvmlab.trace.orchestrate import to_cuda

    return to_cuda(get_trace(cfg), get_gpu(gpu_name)), []


def characterize_snapshot(path: str | Path, device: int | None = None, grouping: str = "best") -> Fragmentation:
    """Characterize a real snapshot: its alloc/free stream (uvmlab.evaluate.ground_truth.snapshot_trace), with the
    recorded peak reserved bytes next to the simulated PCA. For a trace that starts mid-run, the blocks live at its
    start are rebuilt as first allocations, and the recorded peak includes cache built before the trace."""
    from uvmlab.evaluate.ground_truth import snapshot_case

    case = snapshot_case(path, device)
    frag = characterize(
        case.trace,
        name=case.case_id,
        alloc_conf=case.alloc_conf,
        recorded_peak_reserved_bytes=case.measured_peak_bytes,
        grouping=grouping,
    )
    frag.notes.extend(case.notes)
    return frag


def characterize_source(
    source: str, cfg: Any = None, device: int | None = None, grouping: str = "best", gpu_name: str = "A100-80GB"
) -> Fragmentation:
    """Characterize a snapshot pickle, a trace directory, or (else) the workload ``cfg`` (a WorkloadConfig)."""
    from uvmlab.evaluate.ground_truth import SNAPSHOT_SUFFIXES

    src = Path(source)
    if src.suffix in SNAPSHOT_SUFFIXES and src.is_file():
        return characterize_snapshot(src, device, grouping)
    if src.is_dir() and (src / "trace.json").is_file():
        from uvmlab.trace.schema import read_trace

        return characterize(read_trace(src), name=src.name, grouping=grouping)
    if cfg is None:
        from uvmlab.config import WorkloadConfig

        cfg = WorkloadConfig(workload=source)
    trace, notes = workload_trace(cfg, gpu_name)
    name = cfg.workload if cfg.batch_size is None else f"{cfg.workload}:{cfg.batch_size}"
    frag = characterize(trace, name=name, grouping=grouping)
    frag.notes.extend(notes)
    return frag


def figure(frag: Fragmentation) -> Any:
    """Reserved bytes over the trace (PCA, planned) against live bytes, and PCA's efficiency over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tl = frag.timeline
    gib = 2**30
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(7.5, 5.5), sharex=True, gridspec_kw={"height_ratios": [2, 1]})
    x = np.arange(len(tl))
    ax.plot(x, tl["live_bytes"] / gib, lw=0.8, color="C0", label="live tensors (lower bound at its peak)")
    if tl["pca_reserved_bytes"].notna().any():
        ax.plot(x, tl["pca_reserved_bytes"] / gib, lw=1.0, color="C1", label="PCA reserved (simulated)")
    ax.plot(x, tl["planned_reserved_bytes"] / gib, lw=1.0, ls="--", color="C2", label="planned pool (STWeaver-style)")
    rec = frag.row("pca-recorded")
    if rec is not None:
        ax.axhline(rec["peak_reserved_bytes"] / gib, color="black", lw=0.8, ls=":", label="PCA peak (recorded)")
    ax.set_ylabel("memory (GiB)")
    ax.set_title(f"Fragmentation: {frag.name}")
    ax.legend(fontsize=8)
    with np.errstate(divide="ignore", invalid="ignore"):
        eff_pca = 100 * tl["live_bytes"] / tl["pca_reserved_bytes"]
        eff_plan = 100 * tl["live_bytes"] / tl["planned_reserved_bytes"]
    if tl["pca_reserved_bytes"].notna().any():
        ax2.plot(x, eff_pca, lw=0.8, color="C1", label="PCA")
    ax2.plot(x, eff_plan, lw=0.8, ls="--", color="C2", label="planned")
    ax2.set_ylabel("efficiency (%)")
    ax2.set_xlabel("allocation / free event (trace order)")
    ax2.set_ylim(0, 105)
    ax2.legend(fontsize=8)
    fig.tight_layout()
    return fig


def write_fragmentation(frag: Fragmentation, out: Any, config: dict[str, Any], force: bool = False) -> Path:
    """Write config.json, tables (summary, timeline, plan), the figure, and result.json into ``out``."""
    import matplotlib.pyplot as plt

    from uvmlab.files.rundir import RunDir

    rd = RunDir.for_writing(out, force)  # refuses a foreign folder or a complete one without force; locks it
    rd.write_json(rd.config_json, config)
    rd.write_table("fragmentation", frag.table)
    rd.write_table("timeline", frag.timeline)
    rd.write_table("plan", frag.plan.blocks)
    fig = figure(frag)
    rd.write_figure("fragmentation", fig)
    plt.close(fig)
    result = {
        "name": frag.name,
        "allocators": {r["allocator"]: r for r in frag.table.to_dict("records")},
        "fragmentation_reduction": frag.reduction(),
        "plan": {"grouping": frag.plan.grouping, "groups": frag.plan.n_groups, "fusions": frag.plan.n_fusions},
        "stweaver_reported": STWEAVER_REPORTED,
        "notes": frag.notes,
    }
    rd.write_json(rd.result_json, result)
    rd.release()
    return rd.path
