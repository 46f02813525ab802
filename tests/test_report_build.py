"""The sweep report: the study's figures from a sweep's tables, captions, sim-vs-measured errors, no torch."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import sweep_fake_run

from uvmlab.cli import main
from uvmlab.report import build_report
from uvmlab.report.data import load_results, paired_sim_measured
from uvmlab.report.figures import pca_ratio_table
from uvmlab.sweep.aggregate import write_results
from uvmlab.sweep.runner import prepare
from uvmlab.sweep.spec import parse_spec

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SPEC = """
name: r
defaults: {mode: sim, iterations: 2}
grid:
  workload: [{workload: alexnet, batch_size: 2}, gpt2]
  oversub: [1.0, 2, 4]
  pca: [on, off]
"""


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 12-run sweep folder made in-process by the fake run function (synthetic numbers, real layout).

    (test_sweep_runner.py runs sweeps through real worker processes; here speed matters more.)
    """
    out = tmp_path_factory.mktemp("sweep") / "out"
    for entry in prepare(parse_spec(SPEC), out):
        sweep_fake_run.run(entry.config, out=entry.path, force=True)
    write_results(out)
    return out


def test_report_writes_every_study_figure(sweep_dir: Path, tmp_path: Path) -> None:
    html = tmp_path / "rep" / "report.html"
    rep = build_report(sweep_dir, html)
    keys = [f.key for f in rep.figures]
    assert keys == [
        "fig3_slowdown",
        "fig4_pca_ratio",
        "fig5_kernel_memory",
        "fig6_faults",
        "fig7_read_write",
        "fig8_migration_count",
        "fig9_migration_bytes",
        "fig_regime",
    ]
    assert rep.skipped == ["Simulated vs measured: the sweep has no runs with the needed values"]
    for f in rep.figures:
        assert f.path.parent == html.parent / "figures"
        assert f.path.read_bytes()[:8] == PNG_MAGIC
        assert "What was run: " not in f.caption  # said once on the page, above the runs table
    page = html.read_text()
    assert page.count("What was run: ") == 1
    for f in rep.figures:
        assert f'src="figures/{f.path.name}"' in page
    assert "Simulated (uvmlab sim" in page
    assert "A100-80GB" in page and "uvmlab_version test" in page and "python 3" in page
    assert "Headline numbers" in page and "57.74" in page


def test_pca_ratio_is_time_without_over_time_with(sweep_dir: Path) -> None:
    df = load_results(sweep_dir)
    ratio = pca_ratio_table(df).set_index(["workload", "oversub"])["ratio"]
    # fake run: base 2 ms with PCA, 9 ms without; slowdown f**1.5 with, f**0.7 without
    assert ratio[("gpt2", 1.0)] == pytest.approx(4.5)
    assert ratio[("alexnet", 4.0)] == pytest.approx(9 * 4**0.7 / (2 * 4**1.5))


def test_slowdown_vs_oversub1_is_relative_to_factor_one_only(sweep_dir: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(sweep_dir, copy)
    for result in (copy / "runs").glob("*/result.json"):
        data = json.loads(result.read_text())
        data["slowdown_vs_native"] = 1000.0  # differs from the factor-1.0 ratio, so the test sees which one is used
        result.write_text(json.dumps(data))
    write_results(copy)
    df = load_results(copy).set_index(["workload", "oversub", "pca"])
    assert df.loc[("alexnet", 4.0, True), "slowdown_vs_oversub1"] == pytest.approx(4**1.5)
    assert df.loc[("gpt2", 2.0, False), "slowdown_vs_oversub1"] == pytest.approx(2**0.7)
    assert df.loc[("gpt2", 2.0, False), "slowdown_vs_native"] == 1000.0  # result.json's, under its own name
    for run in (copy / "runs").iterdir():  # without factor-1.0 runs there is no such ratio: null, never another one
        if json.loads((run / "result.json").read_text())["oversub"] == 1.0:
            shutil.rmtree(run)
    write_results(copy)
    df = load_results(copy)
    assert df["slowdown_vs_oversub1"].isna().all() and (df["slowdown_vs_native"] == 1000.0).all()


def test_missing_statistics_skip_a_figure_not_fake_zeros(sweep_dir: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(sweep_dir, copy)
    for result in (copy / "runs").glob("*/result.json"):
        data = json.loads(result.read_text())
        data["read_fault_count"] = None
        data["write_fault_count"] = None
        result.write_text(json.dumps(data))
    write_results(copy)
    rep = build_report(copy)
    assert "fig7_read_write" not in [f.key for f in rep.figures]
    assert any(s.startswith("Figure 7") for s in rep.skipped)
    assert (copy / "report" / "report.html").is_file()


def test_sim_vs_measured_pairs_and_errors(sweep_dir: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(sweep_dir, copy)
    # a "measured" twin of two runs: same configuration but mode gpu, iteration time twice the simulated one
    twins = 0
    for run in sorted((copy / "runs").iterdir())[:2]:
        cfg = json.loads((run / "config.json").read_text())
        res = json.loads((run / "result.json").read_text())
        cfg["mode"] = "gpu"
        res["mode"] = "gpu"
        res["iteration_time_ns"] = 2 * res["iteration_time_ns"]
        twin = copy / "runs" / f"{run.name}-gpu"
        shutil.copytree(run, twin)
        (twin / "config.json").write_text(json.dumps(cfg))
        (twin / "result.json").write_text(json.dumps(res))
        twins += 1
    write_results(copy)
    pairs = paired_sim_measured(load_results(copy))
    assert len(pairs) == twins
    assert (pairs["iteration_time_ns_measured"] / pairs["iteration_time_ns_sim"]).tolist() == [2.0, 2.0]
    rep = build_report(copy)
    assert "fig_sim_vs_measured" in [f.key for f in rep.figures]
    page = (copy / "report" / "report.html").read_text()
    assert "iteration_time_ns error %" in page
    assert "-50" in page  # (sim - measured) / measured = -50 %
    assert "measured on a GPU" in page


def test_failed_runs_are_listed(sweep_dir: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(sweep_dir, copy)
    victim = sorted((copy / "runs").iterdir())[0]
    data = json.loads((victim / "result.json").read_text())
    data.update(outcome="oom", error="simulated device out of memory (test)", iteration_time_ns=None)
    (victim / "result.json").write_text(json.dumps(data))
    write_results(copy)
    build_report(copy)
    page = (copy / "report" / "report.html").read_text()
    assert "Runs that did not finish" in page and "simulated device out of memory (test)" in page


def test_report_cli_and_bad_input(sweep_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    html = tmp_path / "x" / "r.html"
    assert main(["report", str(sweep_dir), "-o", str(html), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["html"] == str(html) and len(data["figures"]) == 8
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["report", str(empty)]) == 2
    assert "not a sweep folder" in capsys.readouterr().err


def test_report_does_not_import_torch(sweep_dir: Path, tmp_path: Path) -> None:
    code = (
        "import sys\nfrom uvmlab.report import build_report\n"
        f"build_report({str(sweep_dir)!r}, {str(tmp_path / 'r.html')!r})\n"
        "sys.exit(1 if 'torch' in sys.modules else 0)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_results_table_has_config_and_result_columns(sweep_dir: Path) -> None:
    df = pd.read_parquet(sweep_dir / "results.parquet")
    assert len(df) == 12
    for col in (
        "run_id",
        "cfg_workload",
        "cfg_batch_size",
        "cfg_oversub",
        "cfg_pca",
        "cfg_mode",
        "outcome",
        "slowdown_vs_native",
        "native_pca_time_ns",
        "slowdown_vs_oversub1",
        "htod_bytes",
        "env_uvmlab_version",
    ):
        assert col in df.columns, col
    assert df.loc[df["cfg_workload"] == "alexnet", "cfg_batch_size"].eq(2).all()
    at1 = df[df["cfg_oversub"] == 1.0]
    assert at1["slowdown_vs_oversub1"].eq(1.0).all() and len(at1) > 0
    report_view = load_results(sweep_dir).set_index("run_id")["slowdown_vs_oversub1"]
    assert df.set_index("run_id")["slowdown_vs_oversub1"].equals(report_view.loc[df["run_id"]])


def test_sweep_collect_rebuilds_results(sweep_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(sweep_dir, copy)
    (copy / "results.parquet").unlink()
    shutil.rmtree(sorted((copy / "runs").iterdir())[0] / "tables")  # tables do not matter to the results table
    (sorted((copy / "runs").iterdir())[1] / "result.json").unlink()  # an incomplete run is not a row
    assert main(["sweep", "collect", str(copy), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["rows"] == 11 and data["outcomes"] == {"ok": 11}
    assert len(pd.read_parquet(copy / "results.parquet")) == 11


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_report_page_beside_the_sweep_is_written(
    sweep_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 29: `uvmlab report SWEEP -o report.html` in the sweep's parent was refused ("-o . holds the input")
    though it touches nothing of the sweep. Refused still: an output that is an input, and our own figure files
    without --force; a user's other files in figures/ are no reason to refuse."""
    parent = tmp_path / "project"
    shutil.copytree(sweep_dir.parent, parent)
    sweep = parent / sweep_dir.name
    before = _tree(sweep)
    monkeypatch.chdir(parent)
    (parent / "figures").mkdir()
    (parent / "figures" / "mine.png").write_bytes(b"user's")
    assert main(["report", sweep.name, "-o", "report.html", "--format", "json"]) == 0
    written = json.loads(capsys.readouterr().out)
    assert (parent / "report.html").is_file() and len(written["figures"]) == 8
    assert all((parent / "figures" / Path(f["path"]).name).is_file() for f in written["figures"])
    assert _tree(sweep) == before and (parent / "figures" / "mine.png").read_bytes() == b"user's"
    assert main(["report", sweep.name, "-o", "other.html"]) == 2  # figures/fig3_slowdown.png is there now
    assert "already holds fig3_slowdown.png" in capsys.readouterr().err
    assert main(["report", sweep.name, "-o", "other.html", "--force"]) == 0
    assert main(["report", sweep.name, "-o", f"{sweep.name}/results.parquet", "--force"]) == 2
    assert _tree(sweep) == before
