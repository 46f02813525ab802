"""Each seed-grid workload's working sets and knees, with uvmlab's footprint and with the study's (analysis only).

The knee of a working set ``ws`` is the oversubscription factor footprint / ws beyond which it no longer fits in
the memory UVM may use (``uvmlab.sim.uvm.whatif``). Working sets are measured from the trace's kernel accesses
through the placement (chunk-rounded 2 MiB VA blocks, one steady iteration: the last of ``--iterations``). The
study's footprints are its Table 2 (seeds/003); using them assumes the study's extra footprint is cold (allocated,
never touched), which is the hypothesis under test, not a fact. Prints a Markdown table and writes OUT/knees.csv;
``--figure`` also draws OUT/slowdown_whatif.png from the default grid CSV and a ``--pad-to-study`` grid CSV.

Usage: python tools/uvm_knee.py [--out docs/uvm-grid-whatif] [--figure docs/uvm-grid/grid.csv PADDED/grid.csv]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from uvmlab.sim.uvm.whatif import PHASES, knee, working_sets
from uvmlab.uvm import study

STUDY_PCA_MEAN, STUDY_PCA_MAX = study.HEADLINES["mean_slowdown_pca"], study.HEADLINES["max_slowdown_pca"]
STUDY_DROPS = study.DROPS
WS_KEYS = ("kernel_max", *(f"{p}_union" for p in PHASES), "iteration_union")


def knee_rows(workloads: list[str], iterations: int, pcas: tuple[bool, ...]) -> pd.DataFrame:
    """One row per (workload, PCA): footprints, working sets (MiB) and knees with both footprints."""
    from uvmlab.config import RunConfig, WorkloadConfig
    from uvmlab.uvm.simulate import prepare

    rows = []
    for w in workloads:
        for pca in pcas:
            prep = prepare(RunConfig(WorkloadConfig(w, iterations=iterations), oversub=1.0, pca=pca, mode="sim"))
            ws = working_sets(prep)
            fp, study_fp = prep.footprint_bytes, study.FOOTPRINT_MB[w] * 2**20
            row: dict = {"workload": w, "pca": "on" if pca else "off", "footprint_mb": fp / 2**20}
            row["study_footprint_mb"] = study_fp / 2**20
            for k in WS_KEYS:
                row[f"{k}_mb"] = ws[k] / 2**20
            for k in WS_KEYS:
                row[f"knee_{k}"] = knee(fp, ws[k])
                row[f"study_knee_{k}"] = knee(max(fp, study_fp), ws[k])  # a larger own footprint is left unpadded
            rows.append(row)
    return pd.DataFrame(rows)


def markdown(df: pd.DataFrame) -> str:
    """The knee table as Markdown (MiB; knees as factors)."""
    head = (
        "| workload | PCA | footprint ours / study (MiB) | largest kernel | forward | backward | optimizer |"
        " iteration | knee fwd / bwd / opt / iter, ours | same, study's footprint |"
    )
    lines = [head, "|---|---|---|---|---|---|---|---|---|---|"]
    for _, r in df.iterrows():
        ws = " | ".join(f"{r[f'{k}_mb']:,.0f}" for k in WS_KEYS)
        ours = " / ".join(f"{r[f'knee_{k}']:.2f}" for k in WS_KEYS[1:])
        theirs = " / ".join(f"{r[f'study_knee_{k}']:.2f}" for k in WS_KEYS[1:])
        fps = f"{r['footprint_mb']:,.0f} / {r['study_footprint_mb']:,.0f}"
        lines.append(f"| {r['workload']} | {r['pca']} | {fps} | {ws} | {ours} | {theirs} |")
    return "\n".join(lines)


def figure(default_csv: Path, padded_csv: Path, out: Path) -> None:
    """Slowdown vs factor per padded workload: uvmlab's footprint, padded to the study's, the study's headlines.

    Slowdown is ``slowdown_vs_oversub1`` (iteration time / the same PCA setting's at factor 1), the study's Figure 3.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base, pad = pd.read_csv(default_csv), pd.read_csv(padded_csv)
    ws = [w for w in study.WORKLOADS if w in set(pad["workload"]) and pad.loc[pad["workload"] == w, "pad_mb"].max() > 0]
    fig, axes = plt.subplots(1, len(ws), figsize=(4.2 * len(ws), 3.8), squeeze=False)
    for ax, w in zip(axes[0], ws, strict=True):
        for df, lab, ls in ((base, "uvmlab footprint", "-"), (pad, "padded to study's", "--")):
            for pca, color in (("on", "tab:blue"), ("off", "tab:orange")):
                g = df[(df["workload"] == w) & (df["pca"] == pca)].sort_values("oversub")
                s1 = g["iteration_ms"] / g.loc[g["oversub"] == 1.0, "iteration_ms"].iloc[0]
                ax.plot(g["oversub"], s1, ls, color=color, marker="o", ms=3, label=f"{lab}, PCA {pca}")
        ax.axhline(STUDY_PCA_MEAN, color="gray", ls=":", lw=1, label="study PCA mean 7.29x")
        ax.axhline(STUDY_PCA_MAX, color="black", ls=":", lw=1, label="study PCA max 57.74x")
        if w in STUDY_DROPS:
            ax.axvline(STUDY_DROPS[w], color="red", ls=":", lw=1, label=f"study: drop beyond x{STUDY_DROPS[w]:g}")
        ax.set_yscale("log")
        ax.set_title(w)
        ax.set_xlabel("oversubscription factor (footprint / GPU memory)")
        ax.set_ylabel("slowdown vs factor 1, same PCA setting (x)")
    axes[0][0].legend(fontsize=6)
    fig.suptitle("Footprint what-if (analysis only): uvmlab sim, A100-80GB profile, 10 iterations")
    fig.tight_layout()
    fig.savefig(out / "slowdown_whatif.png", dpi=90)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("docs/uvm-grid-whatif"))
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--workloads", default=",".join(study.WORKLOADS))
    ap.add_argument("--pca", choices=("on", "off", "both"), default="both")
    ap.add_argument("--figure", nargs=2, type=Path, metavar=("DEFAULT_CSV", "PADDED_CSV"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.figure:
        figure(*args.figure, args.out)
        return
    pcas = {"on": (True,), "off": (False,), "both": (True, False)}[args.pca]
    df = knee_rows(args.workloads.split(","), args.iterations, pcas)
    df.to_csv(args.out / "knees.csv", index=False, float_format="%.4g")
    print(markdown(df))


if __name__ == "__main__":
    main()
