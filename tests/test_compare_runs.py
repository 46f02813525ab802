"""`uvmlab compare`: hand-built run directories, measured runs from real exports, and real simulated runs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from uvmlab.cli import main
from uvmlab.files.rundir import RunDir
from uvmlab.measure.compare import compare_runs, rel_error
from uvmlab.report.compare_figures import write_comparison
from uvmlab.stats.schema import ITERATION_COLUMNS, KERNEL_COLUMNS, MEMORY_COLUMNS, RESULT_KEYS

GH200 = "cudamicrobench_gh200_um_gpu_faults_nsys2023.4.4.sqlite"


def make_run(path: Path, *, pca: bool, faults: list[int], names: list[str], fp: int, shim_peak: int | None = None):
    rd = RunDir(path)
    rd.prepare()
    res = dict.fromkeys(RESULT_KEYS)
    res.update(
        mode="sim",
        outcome="ok",
        pca=pca,
        oversub=2.0,
        footprint_bytes=fp,
        fault_count=sum(faults),
        iterations=2,
        htod_bytes=4096 * sum(faults),
    )
    n = len(names)
    k = pd.DataFrame({c: np.zeros(n, dtype=np.int64) for c in KERNEL_COLUMNS if c not in ("name", "phase")})
    k["name"], k["phase"] = names, "forward"
    k["kernel_id"] = np.arange(n)
    k["iteration"] = np.arange(n) % 2
    k["duration_ns"] = 1000 + np.arange(n)
    k["fault_count"] = faults
    its = pd.DataFrame({c: np.zeros(2, dtype=np.int64) for c in ITERATION_COLUMNS})
    its["iteration"] = [0, 1]
    its["fault_count"] = [sum(faults[0::2]), sum(faults[1::2])]
    mem = pd.DataFrame({c: [0.0, float(fp)] for c in MEMORY_COLUMNS})
    rd.write_table("kernels", k)
    rd.write_table("iterations", its)
    rd.write_table("memory", mem)
    if shim_peak is not None:
        from uvmlab.measure.gpu.shim import LOG_HEADER_BYTES, LOG_MAGIC, LOG_RECORD_DTYPE, LOG_VERSION

        rec = np.zeros(2, dtype=LOG_RECORD_DTYPE)
        rec["op"], rec["ptr"], rec["size"] = [1, 2], [0x1000, 0x1000], [shim_peak, 0]
        header = LOG_MAGIC + LOG_VERSION.to_bytes(4, "little") + LOG_RECORD_DTYPE.itemsize.to_bytes(4, "little")
        rd.logs.mkdir(parents=True, exist_ok=True)
        (rd.logs / "run.alloc.bin").write_bytes(header.ljust(LOG_HEADER_BYTES, b"\0") + rec.tobytes())
    rd.write_json(rd.result_json, res)
    return rd


def test_rel_error_rules() -> None:
    assert rel_error(100, 110) == pytest.approx(0.1)
    assert rel_error(-100, -110) == pytest.approx(-0.1)
    assert rel_error(0, 0) == 0.0
    assert rel_error(0, 5) is None
    assert rel_error(None, 5) is None and rel_error(5, float("nan")) is None


def test_compare_two_simulated_runs_pca_on_off(tmp_path: Path) -> None:
    names = ["mm", "relu", "mm", "relu"]
    a = make_run(tmp_path / "on", pca=True, faults=[10, 0, 20, 5], names=names, fp=1000, shim_peak=1200)
    b = make_run(tmp_path / "off", pca=False, faults=[11, 0, 18, 5], names=names, fp=800)
    cmp = compare_runs(a.path, b.path)
    t = cmp.totals.set_index("figure")
    assert t.loc["fault_count", "rel_error"] == pytest.approx((34 - 35) / 35)
    assert t.loc["footprint_bytes", "rel_error"] == pytest.approx(-0.2)
    assert cmp.kernel_match.startswith("matched by (name")
    k = cmp.kernels
    assert list(k["fault_count_a"]) == [10, 0, 20, 5] and list(k["fault_count_b"]) == [11, 0, 18, 5]
    assert k["fault_count_rel_error"].iloc[0] == pytest.approx(0.1)
    its = cmp.iterations.set_index("iteration")
    assert its.loc[0, "fault_count_a"] == 30 and its.loc[0, "fault_count_b"] == 29
    fp = cmp.footprint.set_index("figure")
    assert fp.loc["peak managed bytes (shim log)", "a"] == 1200
    assert pd.isna(fp.loc["peak managed bytes (shim log)", "b"])
    written = write_comparison(cmp, tmp_path / "cmp")
    pngs = [p for p in written if p.suffix == ".png"]
    assert {p.name for p in pngs} >= {"totals_rel_error.png", "footprint.png", "per_iteration.png", "per_kernel.png"}
    assert all(p.stat().st_size > 5000 for p in pngs)
    d = json.loads((tmp_path / "cmp" / "comparison.json").read_text())
    assert d["kernel_match"] == cmp.kernel_match


def test_shim_allocations_table_used_without_logs(tmp_path: Path) -> None:
    a = make_run(tmp_path / "a", pca=True, faults=[1], names=["k"], fp=10)
    b = make_run(tmp_path / "b", pca=True, faults=[1], names=["k"], fp=10)
    shim = pd.DataFrame(
        {
            "role": ["calibrate", "calibrate", "run", "run", "run"],
            "op": ["malloc", "free", "malloc", "malloc", "free"],
            "ptr": np.array([1, 1, 1, 2, 1], dtype="uint64"),
            "size_bytes": np.array([500, 0, 300, 400, 0], dtype="uint64"),
            "result": np.zeros(5, dtype="int32"),
        }
    )
    RunDir(b.path).write_table("shim_allocations", shim)
    fp = compare_runs(a.path, b.path).footprint.set_index("figure")
    assert fp.loc["peak managed bytes (shim log)", "b"] == 700  # run role: 300 + 400 live together
    assert pd.isna(fp.loc["peak managed bytes (shim log)", "a"])


def test_kernels_matched_by_order_when_names_differ(tmp_path: Path) -> None:
    a = make_run(tmp_path / "a", pca=True, faults=[1, 2], names=["aten::mm", "aten::relu"], fp=10)
    b = make_run(tmp_path / "b", pca=True, faults=[2, 2], names=["ampere_sgemm", "elementwise"], fp=10)
    cmp = compare_runs(a.path, b.path)
    assert cmp.kernel_match.startswith("matched by launch order")
    assert list(cmp.kernels["fault_count_rel_error"]) == [1.0, 0.0]
    c = make_run(tmp_path / "c", pca=True, faults=[2, 2, 3], names=["x", "y", "z"], fp=10)
    cmp = compare_runs(a.path, c.path)
    assert cmp.kernels is None and any("skipped" in n for n in cmp.notes)


def test_compare_bad_inputs(tmp_path: Path) -> None:
    assert main(["compare", str(tmp_path / "nope"), str(tmp_path / "nope2")]) == 2
    (tmp_path / "half").mkdir()
    assert main(["compare", str(tmp_path / "half"), str(tmp_path / "half")]) == 2
    a = make_run(tmp_path / "a", pca=True, faults=[1], names=["k"], fp=1)
    (a.path / "tables" / "kernels.parquet").write_text("not parquet")
    assert main(["compare", str(a.path), str(a.path)]) == 2


@pytest.mark.real_data
def test_compare_measured_run_from_real_export(real_data: Path, tmp_path: Path) -> None:
    src = real_data / "nsys" / GH200
    if not src.is_file():
        pytest.skip(f"{src} missing")
    m = tmp_path / "measured"
    assert main(["nsys", "import", str(src), "-o", str(m), "--format", "json"]) == 0
    # B: the same run with 10 % more faults in result.json and kernels
    b = tmp_path / "b"
    shutil.copytree(m, b)
    res = json.loads((b / "result.json").read_text())
    res["fault_count"] = round(res["fault_count"] * 1.1)
    (b / "result.json").write_text(json.dumps(res))
    proc = subprocess.run(
        [sys.executable, "-m", "uvmlab", "compare", str(m), str(b), "-o", str(tmp_path / "cmp"), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    tot = {r["figure"]: r for r in d["totals"]}
    assert tot["fault_count"]["a"] == 4195
    assert tot["fault_count"]["rel_error"] == pytest.approx(0.1, abs=1e-3)
    assert tot["htod_bytes"]["rel_error"] == 0.0
    assert d["kernel_match"].startswith("matched by (name")
    assert len(d["kernels"]) == 201
    assert (tmp_path / "cmp" / "figures" / "footprint.png").is_file()
    assert (tmp_path / "cmp" / "figures" / "totals_rel_error.png").is_file()
