"""Per-iteration and per-phase attribution on synthetic exports with NVTX ranges (the GPU runner's layout)."""

from __future__ import annotations

import csv
import io
import json
import sqlite3
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from uvmlab.cli import main
from uvmlab.files.rundir import RunDir
from uvmlab.measure.nsys.measured import import_export
from uvmlab.measure.nsys.read import open_export
from uvmlab.measure.nsys.stats import summarize
from uvmlab.measure.nsys.synthetic import PHASES, write_synthetic_export
from uvmlab.stats.schema import TABLE_COLUMNS

INDEPENDENT_SQL = """
WITH k AS (
  SELECT k.start AS s, k."end" AS e,
    (SELECT CAST(substr(n.text, 11) AS INTEGER) FROM NVTX_EVENTS n JOIN CUPTI_ACTIVITY_KIND_RUNTIME r
       ON r.correlationId = k.correlationId
     WHERE n.text LIKE 'iteration %' AND r.start >= n.start AND r.start < n."end") AS it
  FROM CUPTI_ACTIVITY_KIND_KERNEL k),
w AS (SELECT it, min(s) AS s, max(e) AS e FROM k GROUP BY it)
SELECT (SELECT max(w.it) FROM w WHERE w.s < max(f."end", f.start + 1) AND w.e > f.start) AS it,
       sum(numberOfPageFaults), sum(CASE WHEN faultAccessType = 2 THEN numberOfPageFaults ELSE 0 END)
FROM CUDA_UM_GPU_PAGE_FAULT_EVENTS f GROUP BY 1
"""


@pytest.fixture(scope="module")
def synth(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, int]]:
    p = tmp_path_factory.mktemp("nsys") / "synth.sqlite"
    truth = write_synthetic_export(p, iterations=4, kernels_per_iteration=12, faults=5000, migrations=800, seed=3)
    return p, truth


def test_totals_match_ground_truth(synth) -> None:
    path, truth = synth
    with open_export(path) as ex:
        s = summarize(ex, chunk_rows=700)  # many chunks: chunked attribution must add up
    assert s.faults["gpu_fault_count"] == truth["faults"]
    assert s.faults["read_fault_count"] == truth["read_faults"]
    assert s.faults["write_fault_count"] == truth["write_faults"]
    assert s.migrations["by_direction"]["htod"]["bytes"] == truth["htod_bytes"]
    assert s.migrations["by_direction"]["dtoh"]["count"] == truth["dtoh_count"]
    inside = int(s.kernels["fault_count"].sum())
    outside = sum(b["fault_count"] for b in s.attribution["outside_kernels"].values())
    assert inside + outside == truth["faults"]
    assert inside == s.attribution["inside_kernels"]["fault_count"]


def test_per_iteration_matches_independent_sql(synth) -> None:
    path, truth = synth
    with open_export(path) as ex:
        s = summarize(ex, chunk_rows=1000)
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    want = {it: (n, w) for it, n, w in con.execute(INDEPENDENT_SQL) if it is not None}
    con.close()
    its = s.iterations.set_index("iteration")
    assert list(its.index) == list(range(truth["iterations"]))
    for it, (n, w) in want.items():
        assert its.loc[it, "fault_count"] == n
        assert its.loc[it, "write_fault_count"] == w
    # faults between iteration windows belong to no iteration
    assert its["fault_count"].sum() <= truth["faults"]
    assert (its["duration_ns"] > 0).all()


def test_phases_from_nvtx(synth) -> None:
    path, _ = synth
    with open_export(path) as ex:
        s = summarize(ex)
        nvtx = ex.nvtx_ranges()
        api = ex.api_calls()
    phases = nvtx[nvtx["text"].isin(PHASES)]
    assert len(api) == len(s.kernels)  # one launch call per kernel, in order
    for launch, phase in zip(api["start_ns"], s.kernels["phase"], strict=True):
        hit = phases[(phases["start_ns"] <= launch) & (phases["end_ns"] > launch)]
        assert phase == (hit.iloc[-1]["text"] if len(hit) else "")
    assert set(s.kernels["phase"]) == set(PHASES)


def test_custom_iteration_pattern(synth) -> None:
    path, _ = synth
    with open_export(path) as ex:
        s = summarize(ex, iteration_pattern=r"^forward$")  # no group: ranges are numbered in order
    assert list(s.iterations["iteration"]) == [0, 1, 2, 3]


def test_import_writes_contract_tables(synth, tmp_path: Path) -> None:
    path, truth = synth
    rd, result = import_export(path, tmp_path / "run")
    assert rd.is_complete()
    for name, cols in TABLE_COLUMNS.items():
        df = RunDir(rd.path).read_table(name)
        assert list(df.columns[: len(cols)]) == list(cols)
    mig = rd.read_table("migrations")
    assert len(mig) == truth["htod_count"] + truth["dtoh_count"]
    assert int(mig["bytes"].sum()) == truth["htod_bytes"] + truth["dtoh_bytes"]
    assert set(mig["cause"]) <= {"fault", "prefetch", "eviction", "user_prefetch", "unknown"}
    k = rd.read_table("kernels")
    # migrations' kernel ids agree with the per-kernel sums
    per_kernel = mig[mig["kernel_id"] >= 0].groupby("kernel_id")["bytes"].sum()
    kk = k.set_index("kernel_id")
    assert (per_kernel == (kk.loc[per_kernel.index, "htod_bytes"] + kk.loc[per_kernel.index, "dtoh_bytes"])).all()
    assert result["mode"] == "measured" and result["iterations"] == truth["iterations"]
    assert result["fault_count"] == truth["faults"]
    assert result["fault_batch_count"] is None and result["eviction_count"] is None
    assert result["footprint_bytes"] is None  # memory usage not collected in this export
    assert pd.isna(k["kernel_bytes"]).all()
    # refuses to overwrite, then --force works
    assert main(["nsys", "import", str(path), "-o", str(rd.path)]) == 2
    assert main(["nsys", "import", str(path), "-o", str(rd.path), "--force", "--format", "json"]) == 0


def test_cli_formats(synth, capsys: pytest.CaptureFixture[str]) -> None:
    path, truth = synth
    assert main(["nsys", "summarize", str(path), "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["faults"]["gpu_fault_count"] == truth["faults"]
    assert len(d["iterations"]) == truth["iterations"]
    assert main(["nsys", "summarize", str(path), "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert rows and "table" in rows[0]  # wide: one row per entity, a first column naming its table
    assert sum(r["table"] == "per_iteration" for r in rows) == truth["iterations"]
    assert not any(str(path) in v for r in rows for v in r.values() if r["table"] != "export")
    assert main(["nsys", "summarize", str(path)]) == 0
    out = capsys.readouterr().out
    assert "Per iteration" in out and "Top kernels by faults" in out


CPU_FAULT_DDL = (  # documented 2024 DDL (reference/nsys.md §1.3): no real export with CPU faults exists
    "CREATE TABLE CUDA_UM_CPU_PAGE_FAULT_EVENTS (start INTEGER NOT NULL, globalPid INTEGER NOT NULL, "
    "address INTEGER NOT NULL, originalFaultPc INTEGER, CpuInstruction INTEGER NOT NULL, module INTEGER NOT NULL, "
    "unresolvedFaultPc INTEGER)"
)


def test_cpu_faults_counted_as_rows(tmp_path: Path) -> None:
    db = tmp_path / "cpu.sqlite"
    write_synthetic_export(db, faults=100, migrations=20)
    con = sqlite3.connect(db)
    con.execute(CPU_FAULT_DDL)
    con.executemany(
        "INSERT INTO CUDA_UM_CPU_PAGE_FAULT_EVENTS VALUES (?, 0, ?, 0, 1, 1, 0)",
        [(1000 + i, (1 << 40) + (i % 7) * 4096) for i in range(50)],
    )
    con.commit()
    con.close()
    with open_export(db) as ex:
        s = summarize(ex)
        assert len(ex.cpu_faults()) == 50
    assert s.faults["cpu_fault_count"] == 50
    assert s.um_total_sum["nvidia_report_runs"] is True
    assert s.um_total_sum["total_cpu_page_faults"] == 50
    cpu_rows = {r["address"]: r["cpu_faults"] for r in s.um_sum if r["cpu_faults"]}
    assert all(v in (7, 8) for v in cpu_rows.values())


@settings(max_examples=8, deadline=None)
@given(
    iterations=st.integers(1, 4),
    kernels=st.integers(1, 12),
    faults=st.integers(0, 400),
    migrations=st.integers(0, 100),
    seed=st.integers(0, 1000),
    chunk=st.integers(7, 500),
)
def test_attribution_conserves_totals(tmp_path_factory, iterations, kernels, faults, migrations, seed, chunk) -> None:
    db = tmp_path_factory.mktemp("prop") / "p.sqlite"
    truth = write_synthetic_export(
        db, iterations=iterations, kernels_per_iteration=kernels, faults=faults, migrations=migrations, seed=seed
    )
    with open_export(db) as ex:
        s = summarize(ex, chunk_rows=chunk)
    out = s.attribution["outside_kernels"].values()
    for col, total in (
        ("fault_count", truth["faults"]),
        ("htod_bytes", truth["htod_bytes"]),
        ("dtoh_bytes", truth["dtoh_bytes"]),
    ):
        assert int(s.kernels[col].sum()) + sum(b[col] for b in out) == total
        assert 0 <= int(s.iterations[col].sum()) <= total
    assert (s.kernels["iteration"].between(0, iterations - 1)).all()


def test_parallel_fault_scan_equals_single_process(synth, monkeypatch: pytest.MonkeyPatch) -> None:
    path, truth = synth
    monkeypatch.setenv("UVMLAB_NSYS_WORKERS", "1")
    with open_export(path) as ex:
        one = summarize(ex, chunk_rows=900)
    monkeypatch.setenv("UVMLAB_NSYS_WORKERS", "2")
    seen: list[int] = []
    with open_export(path) as ex:
        two = summarize(ex, chunk_rows=900, progress=seen.append)
    assert sum(seen) >= truth["fault_records"]
    assert one.faults == two.faults and one.faults["gpu_fault_count"] == truth["faults"]
    assert one.attribution == two.attribution
    assert one.um_sum == two.um_sum
    pd.testing.assert_frame_equal(one.kernels, two.kernels)
    pd.testing.assert_frame_equal(one.iterations, two.iterations)
