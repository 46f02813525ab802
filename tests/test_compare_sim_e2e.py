"""`uvmlab compare` on real simulated runs (uvmlab run, PCA on vs off) and against a measured run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from uvmlab.cli import main

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sim_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("sim")
    runs = []
    for pca in ("on", "off"):
        out = root / f"pca_{pca}"
        code = main(
            ["run", "alexnet", "--oversub", "2", "--pca", pca, "-b", "8", "-n", "2", "-o", str(out), "--mode", "sim"]
        )
        assert code == 0, f"uvmlab run --pca {pca} failed with exit code {code}"
        runs.append(out)
    return runs[0], runs[1]


def test_compare_pca_on_vs_off(sim_runs, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    on, off = sim_runs
    out = tmp_path / "cmp"
    assert main(["compare", str(on), str(off), "-o", str(out), "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    a = json.loads((on / "result.json").read_text())
    b = json.loads((off / "result.json").read_text())
    tot = {r["figure"]: r for r in d["totals"]}
    assert tot["fault_count"]["a"] == a["fault_count"] and tot["fault_count"]["b"] == b["fault_count"]
    assert tot["fault_count"]["rel_error"] == pytest.approx((b["fault_count"] - a["fault_count"]) / a["fault_count"])
    assert d["kernel_match"].startswith("matched by (name")
    assert len(d["iterations"]) == 2
    regimes = [n for n in d["notes"] if n.startswith("regime: ")]  # both simulated runs say their regime
    assert len(regimes) == 1 and f"A {a['regime']['verdict']}" in regimes[0]
    for fig in ("totals_rel_error", "footprint", "per_iteration", "per_kernel"):
        assert (out / "figures" / f"{fig}.png").stat().st_size > 5000
    assert main(["compare", str(on), str(off)]) == 0
    assert "Totals" in capsys.readouterr().out


def test_compare_measured_vs_simulated(
    sim_runs, real_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = real_data / "nsys" / "cudamicrobench_gh200_um_gpu_faults_nsys2023.4.4.sqlite"
    if not src.is_file():
        pytest.skip("missing export")
    m = tmp_path / "measured"
    assert main(["nsys", "import", str(src), "-o", str(m), "--format", "json"]) == 0
    capsys.readouterr()
    assert main(["compare", str(m), str(sim_runs[0]), "-o", str(tmp_path / "cmp"), "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["kernels"] is None and any("per-kernel comparison skipped" in n for n in d["notes"])
    assert any(n.startswith("regime: A fits, B ") for n in d["notes"])  # the export's regime, from its migrations
    assert (tmp_path / "cmp" / "figures" / "footprint.png").is_file()
