"""Tables the sweep report draws from: results.parquet rows made comparable, and per-run kernel tables.

Torch-free; reads only Parquet/JSON. Derived quantities (each documented where the report shows it):

- ``slowdown_vs_native`` / ``slowdown_vs_native_pca``: result.json's values (iteration time / the same job
  all-resident without UVM, with the same PCA setting / with PCA on; docs/result-json.md).
- ``slowdown_vs_oversub1``: the study's definition (seeds/003 section 4.2, figures 3a/3b): iteration time at the
  factor / iteration time of the same job *with the same PCA setting* at factor 1.0 (UVM, no oversubscription)
  in the sweep; null where the sweep has no factor-1.0 run of that job (never another ratio in its place).
- ``migration_count`` = htod_count + dtoh_count; ``migration_bytes`` = htod_bytes + dtoh_bytes
  (the study counts both directions, seeds/003 section 4.5).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from uvmlab.errors import InputError
from uvmlab.files.rundir import RunDir
from uvmlab.stats.schema import FAULT_COLUMNS
from uvmlab.sweep.aggregate import GROUP_KEYS, slowdown_vs_oversub1

STUDY_ORDER = ("alexnet", "resnet50", "resnet101", "gpt2", "bert", "whisper-small")
"""The seed study's order of workloads in its figures (seeds/003, figures 3-9)."""
MEASURED_MODES = ("gpu", "measured")
NATIVE_COLUMNS = ("native_time_ns", "slowdown_vs_native", "native_pca_time_ns", "slowdown_vs_native_pca")
"""result.json's no-UVM references and the slowdowns against them (uvmlab.stats.schema.RESULT_KEYS)."""


def _col(df: pd.DataFrame, name: str) -> pd.Series:
    if name in df.columns:
        return pd.to_numeric(df[name], errors="coerce")
    return pd.Series(np.nan, index=df.index, dtype=float)


def load_results(sweep_dir: str | os.PathLike[str]) -> pd.DataFrame:
    """results.parquet of a sweep (rebuilt when stale), with the derived columns above and a ``label``."""
    from uvmlab.sweep.aggregate import read_results

    df = read_results(sweep_dir)
    if df.empty or "outcome" not in df.columns:
        raise InputError(f"{sweep_dir} has no complete runs yet; run `uvmlab sweep SPEC -o {sweep_dir}` first")
    df = df.copy()
    if "workload" not in df.columns:
        df["workload"] = df.get("cfg_workload")
    df["workload"] = df["workload"].fillna(df.get("cfg_workload", df["workload"]))
    df["workload"] = df["workload"].map(lambda w: Path(w).stem if isinstance(w, str) and w.endswith(".py") else w)
    for key in GROUP_KEYS:
        if key not in df.columns:
            df[key] = None
    if "mode" in df.columns:
        df["mode"] = df["mode"].fillna(df.get("cfg_mode"))
    for key in ("oversub", "pca"):
        if key not in df.columns or df[key].isna().all():
            df[key] = df.get(f"cfg_{key}")
    df["oversub"] = pd.to_numeric(df["oversub"], errors="coerce")
    df["pca"] = df["pca"].astype("boolean")
    for name in (*FAULT_COLUMNS, "iteration_time_ns", *NATIVE_COLUMNS, "footprint_bytes"):
        df[name] = _col(df, name)
    df["migration_count"] = df["htod_count"] + df["dtoh_count"]
    df["migration_bytes"] = df["htod_bytes"] + df["dtoh_bytes"]
    df["slowdown_vs_oversub1"] = slowdown_vs_oversub1(df)
    return df


def ok_runs(df: pd.DataFrame, measured: bool | None = None) -> pd.DataFrame:
    """Runs with outcome ok; ``measured`` True/False keeps measured/simulated runs only."""
    sel = df[df["outcome"] == "ok"]
    if measured is True:
        sel = sel[sel["mode"].isin(MEASURED_MODES)]
    elif measured is False:
        sel = sel[~sel["mode"].isin(MEASURED_MODES)]
    return sel


def workload_order(workloads: list[str] | pd.Series) -> list[str]:
    """The study's order first, then any other workload alphabetically."""
    present = list(dict.fromkeys(w for w in workloads if isinstance(w, str)))
    return [w for w in STUDY_ORDER if w in present] + sorted(w for w in present if w not in STUDY_ORDER)


def pick_kernel_runs(df: pd.DataFrame) -> dict[str, pd.Series]:
    """Per workload, the run whose kernels Figure 5 shows: simulated, PCA on, the smallest factor."""
    sims = ok_runs(df, measured=False)
    if sims.empty:
        sims = ok_runs(df)
    chosen: dict[str, pd.Series] = {}
    for workload in workload_order(sims["workload"]):
        rows = sims[sims["workload"] == workload].copy()
        rows["_pca_rank"] = (~rows["pca"].fillna(False).astype(bool)).astype(int)
        rows = rows.sort_values(["_pca_rank", "oversub", "run_id"])
        for _, row in rows.iterrows():
            if RunDir(row["run_dir"]).table("kernels").is_file():
                chosen[workload] = row
                break
    return chosen


def read_kernels(run_dir: str | os.PathLike[str], max_iterations: int = 5) -> pd.DataFrame:
    """The run's ``kernels`` table, kernels of the first ``max_iterations`` iterations (kernel_id order)."""
    kernels = RunDir(run_dir).read_table("kernels")
    if "kernel_bytes" not in kernels.columns:
        raise InputError(f"the kernels table of {run_dir} lacks column kernel_bytes (uvmlab.stats.schema)")
    if "iteration" in kernels.columns:
        kernels = kernels[(kernels["iteration"] >= 0) & (kernels["iteration"] < max_iterations)]
    return kernels.sort_values("kernel_id").reset_index(drop=True)


def paired_sim_measured(df: pd.DataFrame) -> pd.DataFrame:
    """Measured runs joined with the simulated run of the same configuration (all cfg_* except the mode)."""
    ok = ok_runs(df)
    measured = ok[ok["mode"].isin(MEASURED_MODES)]
    simulated = ok[~ok["mode"].isin(MEASURED_MODES)]
    if measured.empty or simulated.empty:
        return pd.DataFrame()
    keys = [c for c in df.columns if c.startswith("cfg_") and c != "cfg_mode"]
    metrics = ["iteration_time_ns", "slowdown_vs_native", "fault_count", "migration_count", "migration_bytes"]
    left = measured[[*keys, "workload", "oversub", "pca", *metrics]]
    right = simulated[[*keys, *metrics]]
    return left.merge(right, on=keys, suffixes=("_measured", "_sim"))
