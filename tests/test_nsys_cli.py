"""`uvmlab nsys summarize` / `nsys import` end to end on the real exports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from uvmlab.cli import main

pytestmark = pytest.mark.real_data


def exports(real_data: Path) -> list[Path]:
    files = sorted((real_data / "nsys").glob("*.sqlite"))
    if not files:
        pytest.skip("no real nsys exports")
    return files


def test_summarize_every_real_export_json(real_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for f in exports(real_data):
        assert main(["nsys", "summarize", str(f), "--format", "json"]) == 0, f
        d = json.loads(capsys.readouterr().out)
        for key, c in d["collection"].items():
            if c["status"] in ("not_collected", "unknown") and key == "gpu_faults":
                assert d["faults"]["gpu_fault_count"] is None, f


def test_summarize_table_prints_na_for_not_collected(real_data: Path) -> None:
    f = real_data / "nsys" / "easycuda_rtx4060_um_migrations_nsys2023.4.4.sqlite"
    if not f.is_file():
        pytest.skip("missing")
    proc = subprocess.run(
        [sys.executable, "-m", "uvmlab", "nsys", "summarize", str(f)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if "gpu_fault_count" in ln)
    assert "n/a" in line and " 0 " not in line
    assert "not_collected" in proc.stdout


def test_import_every_real_export(real_data: Path, tmp_path: Path) -> None:
    for i, f in enumerate(exports(real_data)):
        out = tmp_path / f"run{i}"
        assert main(["nsys", "import", str(f), "-o", str(out), "--format", "json"]) == 0, f
        res = json.loads((out / "result.json").read_text())
        assert res["mode"] == "measured"
        for t in ("iterations", "kernels", "migrations", "memory"):
            assert (out / "tables" / f"{t}.parquet").is_file()
