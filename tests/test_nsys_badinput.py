"""Unusable inputs give one sentence and exit 2; a newer schema with extra columns gives a warning and a result."""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from uvmlab.cli import main
from uvmlab.errors import InputError
from uvmlab.measure.nsys.read import open_export
from uvmlab.measure.nsys.stats import summarize
from uvmlab.measure.nsys.synthetic import write_synthetic_export

GH200 = "cudamicrobench_gh200_um_gpu_faults_nsys2023.4.4.sqlite"


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "uvmlab", *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def synth(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("nsys") / "synth.sqlite"
    write_synthetic_export(p, faults=300, migrations=50)
    return p


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_truncated_export(tmp_path: Path, synth: Path) -> None:
    bad = tmp_path / "truncated.sqlite"
    data = synth.read_bytes()
    bad.write_bytes(data[: len(data) // 2])
    before = sha(bad)
    with pytest.raises(InputError, match="truncated"):
        open_export(bad)
    proc = run_cli("nsys", "summarize", str(bad))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "truncated" in proc.stderr
    assert proc.stderr.strip().count("\n") == 0  # one sentence
    assert sha(bad) == before


def test_not_sqlite(tmp_path: Path) -> None:
    bad = tmp_path / "report.sqlite"
    bad.write_text("this is a CSV, not a database\n" * 10)
    proc = run_cli("nsys", "summarize", str(bad))
    assert proc.returncode == 2 and "not an SQLite file" in proc.stderr and "Traceback" not in proc.stderr


def test_nsys_rep_instead_of_export(tmp_path: Path) -> None:
    bad = tmp_path / "report1.nsys-rep"
    bad.write_bytes(b"\x00" * 200)
    assert main(["nsys", "summarize", str(bad)]) == 2


def test_missing_file(tmp_path: Path) -> None:
    assert main(["nsys", "summarize", str(tmp_path / "nope.sqlite")]) == 2


def test_sqlite_that_is_not_an_export(tmp_path: Path) -> None:
    db = tmp_path / "other.sqlite"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE people (name TEXT)")
    con.commit()
    con.close()
    before = sha(db)
    proc = run_cli("nsys", "summarize", str(db))
    assert proc.returncode == 2 and "not an Nsight Systems export" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert sha(db) == before


def test_export_missing_required_column(tmp_path: Path, synth: Path) -> None:
    db = tmp_path / "broken.sqlite"
    shutil.copy(synth, db)
    con = sqlite3.connect(db)
    con.execute("ALTER TABLE CUDA_UM_GPU_PAGE_FAULT_EVENTS DROP COLUMN numberOfPageFaults")
    con.commit()
    con.close()
    assert main(["nsys", "summarize", str(db)]) == 2


def test_newer_schema_extra_columns_warns_and_summarizes(tmp_path: Path, real_data: Path) -> None:
    src = real_data / "nsys" / GH200
    if not src.is_file():
        pytest.skip(f"{src} missing")
    db = tmp_path / "newer.sqlite"
    shutil.copy(src, db)
    db.chmod(0o644)
    con = sqlite3.connect(db)
    con.execute("ALTER TABLE CUDA_UM_GPU_PAGE_FAULT_EVENTS ADD COLUMN faultGroupId INTEGER")
    con.execute("ALTER TABLE CUPTI_ACTIVITY_KIND_MEMCPY ADD COLUMN futureColumn TEXT")
    con.commit()
    con.close()
    before = sha(db)
    with open_export(db) as ex:
        assert any("faultGroupId" in w for w in ex.warnings)
        assert any("futureColumn" in w for w in ex.warnings)
        s = summarize(ex)
    assert s.faults["gpu_fault_count"] == 4195
    proc = run_cli("nsys", "summarize", str(db), "--format", "json")
    assert proc.returncode == 0
    assert "warning" in proc.stderr and "faultGroupId" in proc.stderr
    assert sha(db) == before


def test_bad_iteration_pattern(synth: Path) -> None:
    assert main(["nsys", "summarize", str(synth), "--iteration-pattern", "(unclosed"]) == 2


def test_import_onto_a_file_and_directory_input(tmp_path: Path, synth: Path) -> None:
    f = tmp_path / "afile"
    f.write_text("x")
    assert main(["nsys", "import", str(synth), "-o", str(f)]) == 2
    assert main(["nsys", "summarize", str(tmp_path)]) == 2
