"""PCA vs the offline STWeaver-style plan vs the lower bound, for the six workloads and the real snapshots.

    python benchmarks/fragmentation_table.py [--iterations 2] [--workloads gpt2,bert] [--snapshots DIR]
                                             [--csv OUT.csv]

Workloads are traced on the meta device (uvmlab.trace.cache, default batch sizes of the seed study) and
orchestrated for the A100-80GB; snapshots are every real snapshot with alloc events (warm traces included,
marked). Prints one row per input with peak reserved bytes, efficiency (peak live / peak reserved),
fragmentation ratio and the planner's fragmentation reduction, next to STWeaver's reported numbers, and the
time each step took.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

from uvmlab.config import WorkloadConfig
from uvmlab.console import print_table
from uvmlab.errors import UvmlabError
from uvmlab.evaluate.fragmentation import (
    STWEAVER_REPORTED,
    Fragmentation,
    characterize,
    characterize_snapshot,
    workload_trace,
)

WORKLOADS = ("alexnet", "resnet50", "resnet101", "gpt2", "bert", "whisper-small")
GiB = 2**30


def _row(kind: str, name: str, frag: Fragmentation, seconds: float, warm: str = "") -> dict:
    pca = frag.row("pca") or {}
    rec = frag.row("pca-recorded") or {}
    plan = frag.row("planned")
    lb = frag.row("lower-bound")
    return {
        "kind": kind,
        "name": name,
        "allocations": len(frag.plan.blocks),
        "pca_GiB": pca.get("peak_reserved_bytes", float("nan")) / GiB,
        "recorded_GiB": rec.get("peak_reserved_bytes", float("nan")) / GiB,
        "planned_GiB": plan["peak_reserved_bytes"] / GiB,
        "lower_bound_GiB": lb["peak_reserved_bytes"] / GiB,
        "pca_eff": pca.get("efficiency", float("nan")),
        "planned_eff": plan["efficiency"],
        "frag_reduction": frag.reduction(),
        "grouping": frag.plan.grouping,
        "warm": warm,
        "seconds": seconds,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--snapshots", default=str(Path(__file__).resolve().parents[2] / "shared/real-data/snapshots"))
    ap.add_argument("--csv", default=None)
    args = ap.parse_args(argv)
    rows = []
    for w in [w for w in args.workloads.split(",") if w]:
        t0 = time.perf_counter()
        try:
            trace, _ = workload_trace(WorkloadConfig(w, iterations=args.iterations))
            frag = characterize(trace, name=w)
        except UvmlabError as exc:
            print(f"{w}: {exc}", file=sys.stderr)
            continue
        rows.append(_row("workload", w, frag, time.perf_counter() - t0))
        print(f"done {w} in {rows[-1]['seconds']:.1f} s", file=sys.stderr)
    snap_dir = Path(args.snapshots)
    if snap_dir.is_dir():
        from uvmlab.trace.snapshot import read_snapshot

        for f in sorted(p for p in snap_dir.iterdir() if p.suffix in (".pickle", ".pkl")):
            try:
                summary = read_snapshot(f).summary()
            except UvmlabError:
                continue
            for s in summary:
                if not s["actions"].get("alloc"):
                    continue
                start, peak = s["reserved_at_trace_start_bytes"], s["peak_reserved_in_trace_bytes"]
                warm = f"{start / peak:.0%}" if peak and start > 0.05 * peak else ""
                t0 = time.perf_counter()
                try:
                    frag = characterize_snapshot(f, s["device"])
                except UvmlabError as exc:
                    print(f"{f.name}:{s['device']}: {exc}", file=sys.stderr)
                    continue
                name = f"{f.name[:48]}:{s['device']}"
                rows.append(_row("snapshot", name, frag, time.perf_counter() - t0, warm))
    df = pd.DataFrame(rows)
    print_table(
        "Fragmentation: PCA (simulated / recorded) vs planned vs lower bound (GiB; efficiency = peak live / reserved)",
        ["input", "allocs", "PCA", "recorded", "planned", "bound", "PCA eff", "planned eff", "frag. cut", "warm", "s"],
        [
            [
                r["name"],
                r["allocations"],
                r["pca_GiB"],
                r["recorded_GiB"],
                r["planned_GiB"],
                r["lower_bound_GiB"],
                r["pca_eff"],
                r["planned_eff"],
                r["frag_reduction"],
                r["warm"],
                r["seconds"],
            ]
            for r in rows
        ],
    )
    for kind in ("workload", "snapshot"):
        d = df[df["kind"] == kind] if len(df) else df
        if len(d):
            print(
                f"{kind}s: mean PCA efficiency {d['pca_eff'].mean():.3f}, planned {d['planned_eff'].mean():.3f}, "
                f"mean fragmentation reduction {d['frag_reduction'].mean():.3f} over {len(d)} inputs"
            )
    lo, hi = STWEAVER_REPORTED["pytorch_efficiency_range"]
    print(
        f"STWeaver reports: fragmentation reduced by {STWEAVER_REPORTED['mean_fragmentation_reduction']:.1%} on "
        f"average; PyTorch 2.3 efficiency {lo:.1%}-{hi:.1%}; STWeaver > {STWEAVER_REPORTED['dense_efficiency_min']:.0%}"
        " on dense models"
    )
    if args.csv:
        df.to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
