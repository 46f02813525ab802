"""End to end with the real ``uvmlab run`` (simulation mode): a 2-run sweep, then the report.

(experiments/smoke.yaml, 4 runs, is the same thing for users; the test keeps to 2 runs for CI time.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest


@pytest.mark.slow
def test_smoke_sweep_and_report_with_the_real_simulator(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "UVMLAB_SWEEP_RUN_FN"}
    env.setdefault("UVMLAB_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "smoke"
    spec = tmp_path / "smoke.yaml"
    spec.write_text(
        "defaults: {mode: sim, iterations: 2}\n"
        "grid:\n  workload: [{workload: alexnet, batch_size: 2}]\n  oversub: [1, 2]\n  pca: [on, off]\n"
    )
    argv = [sys.executable, "-m", "uvmlab", "sweep", str(spec), "-o", str(out), "--jobs", "1", "--format", "json"]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["total"] == 4  # factor 1 too: Figure 3 divides by it (slowdown_vs_oversub1)
    df = pd.read_parquet(out / "results.parquet")
    assert len(df) == 4
    bad = df[df["outcome"] != "ok"]
    assert bad.empty, bad[["run_id", "outcome", "error"]].to_string()
    assert df["iteration_time_ns"].gt(0).all()
    assert df.loc[df["oversub"] > 1, "fault_count"].gt(0).all(), "oversubscribed runs must fault"
    assert df["cfg_batch_size"].eq(2).all() and set(df["pca"]) == {True, False}
    rep = subprocess.run(
        [sys.executable, "-m", "uvmlab", "report", str(out), "--format", "json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert rep.returncode == 0, rep.stderr
    keys = [f["key"] for f in json.loads(rep.stdout)["figures"]]
    assert {"fig3_slowdown", "fig4_pca_ratio", "fig5_kernel_memory", "fig6_faults", "fig8_migration_count"} <= set(keys)
