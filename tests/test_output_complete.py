"""Machine-readable output never drops data (issue 29): every ``--format csv`` / ``json`` row is there, counted
against its source; only a human table may show the first rows of a long table, and it says so. Numbers in a
table column share one format."""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from uvmlab.cli import main
from uvmlab.console import format_number, print_table

REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "docs" / "examples" / "tiny_mlp.py")
TINY_ARGS = [TINY, "--option", "hidden=512", "-b", "64", "-n", "2", "--mode", "sim", "--oversub", "2"]
GH200 = "cudamicrobench_gh200_um_gpu_faults_nsys2023.4.4.sqlite"
EXPONENT = re.compile(r"\d\.\d+e[+-]\d\d")


def _csv_rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def _count(rows: list[dict[str, str]], table: str) -> int:
    return sum(r["table"] == table for r in rows)


# -- the mechanism ----------------------------------------------------------------------------------------------
def test_a_cut_table_says_so_and_csv_never_cuts(capsys: pytest.CaptureFixture[str]) -> None:
    print_table("Per kernel", ["kernel"], [[i] for i in range(30)], max_rows=20)
    out = capsys.readouterr().out
    assert "[first 20 of 30 rows; all of them: --format csv or --format json]" in out
    cells = [ln.strip("| ") for ln in out.splitlines() if ln.startswith("|")]
    assert "19" in cells and "20" not in cells
    print_table("Short", ["kernel"], [[i] for i in range(5)], max_rows=20)
    assert "first" not in capsys.readouterr().out


def test_one_number_format_per_column(capsys: pytest.CaptureFixture[str]) -> None:
    """compare printed 9.292e+09 beside 2,271,870,976 in one column (floats went through 4 significant digits)."""
    assert format_number(9_291_834_567.25) == "9,291,834,567"
    assert format_number(2_271_870_976) == "2,271,870,976"
    assert format_number(2.0) == "2" and format_number(34.8412) == "34.84" and format_number(0.5) == "0.5"
    assert format_number(1234.5) == "1,234" and format_number(float("nan")) == "n/a"
    print_table("t", ["figure", "A"], [["iteration_time_ns", 9_291_834_567.25], ["htod_bytes", 2_271_870_976]])
    out = capsys.readouterr().out
    assert "9,291,834,567" in out and "2,271,870,976" in out and not EXPONENT.search(out)


# -- compare ----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("runs")
    assert main(["run", *TINY_ARGS, "--pca", "on", "-o", str(d / "on")]) == 0
    assert main(["run", *TINY_ARGS, "--pca", "off", "-o", str(d / "off")]) == 0
    return d / "on", d / "off"


def test_compare_csv_and_json_have_every_kernel(
    two_runs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = two_runs
    kernels = len(pd.read_parquet(a / "tables" / "kernels.parquet"))
    iterations = len(pd.read_parquet(a / "tables" / "iterations.parquet"))
    assert kernels > 20 and kernels == len(pd.read_parquet(b / "tables" / "kernels.parquet"))  # one trace
    capsys.readouterr()
    assert main(["compare", str(a), str(b), "--format", "csv"]) == 0
    rows = _csv_rows(capsys.readouterr().out)
    assert _count(rows, "per_kernel") == kernels and _count(rows, "per_iteration") == iterations
    assert main(["compare", str(a), str(b), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["kernels"]) == kernels and len(doc["iterations"]) == iterations
    assert main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert f"[first 20 of {kernels} rows; all of them: --format csv or --format json]" in out
    assert not EXPONENT.search(out)


# -- workloads --all --------------------------------------------------------------------------------------------
def test_workloads_all_csv_and_json_list_every_name(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``workloads --all --format csv`` kept the 6 built-ins of 1,467 names (the named models were left out)."""
    import workloads.info
    from workloads.registry import WORKLOADS

    named = [
        {"prefix": "timm", "package": "timm 1.0", "names": [f"model_{i}" for i in range(1200)], "note": "n"},
        {"prefix": "hf", "package": "transformers 5", "names": ["gpt2", "llama"], "note": "configs"},
    ]
    monkeypatch.setattr(workloads.info, "named_models", lambda: named)  # the listing itself imports timm: slow
    assert main(["workloads", "--all", "--format", "csv"]) == 0
    rows = _csv_rows(capsys.readouterr().out)
    assert _count(rows, "workloads") == len(WORKLOADS) and _count(rows, "named_models") == 1202
    assert {r["name"] for r in rows} >= {"timm:model_1199", "hf:llama", *WORKLOADS}
    assert main(["workloads", "--all", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["builtin"]) == len(WORKLOADS) and sum(len(f["names"]) for f in doc["named"]) == 1202


# -- evaluate ---------------------------------------------------------------------------------------------------
def test_evaluate_csv_has_the_summary_and_every_run(
    real_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    snaps = tmp_path / "snaps"
    snaps.mkdir()
    for name in (
        "HugePandaCoder__octree-nca-groupeq__3e8aa21a__mem_snapshots_traditional_single_step.pickle",
        "silmont2000__assignment2-systems__75d09aad__mem_snapshot.pickle",
    ):
        shutil.copy(real_data / "snapshots" / name, snaps / name)
    assert main(["evaluate", str(snaps), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert main(["evaluate", str(snaps), "--format", "csv"]) == 0
    rows = _csv_rows(capsys.readouterr().out)
    assert _count(rows, "summary") == len(doc["summary"]) == 4
    assert _count(rows, "per_run") == len(doc["per_run"]) == 8
    mre = {r["estimator"]: float(r["mre"]) for r in rows if r["table"] == "summary"}
    assert mre == pytest.approx({r["estimator"]: r["mre"] for r in doc["summary"]})


# -- nsys summarize ---------------------------------------------------------------------------------------------
def test_nsys_summarize_csv_matches_json_and_prints_hex_addresses(
    real_data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    export = real_data / "nsys" / GH200
    assert main(["nsys", "summarize", str(export), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert main(["nsys", "summarize", str(export), "--format", "csv"]) == 0
    rows = _csv_rows(capsys.readouterr().out)
    tops = [r for r in rows if r["table"] == "um_sum_top_addresses"]
    assert len(tops) == len(doc["um_sum"]) > 0
    assert [int(r["address"], 16) for r in tops] == [r["address"] for r in doc["um_sum"]]
    assert all(re.fullmatch(r"0x[0-9a-f]+", r["address"]) for r in tops)
    assert _count(rows, "page_faults") == len(doc["faults"])
    assert main(["nsys", "summarize", str(export)]) == 0
    assert "0x" in capsys.readouterr().out


def test_gpus_csv_lists_every_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    from uvmlab.gpus import GPUS

    assert main(["gpus", "--format", "csv"]) == 0
    assert len(_csv_rows(capsys.readouterr().out)) == len(GPUS)
    assert main(["gpus", "--format", "json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["known"]) == len(GPUS)
