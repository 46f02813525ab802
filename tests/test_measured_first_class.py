"""Measured runs are first-class: nsys import writes figures and tables with the simulated dtypes; compare warns
on different workloads/GPUs, compares raw fault entries with raw fault entries, prints errors in percent."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from uvmlab.cli import main
from uvmlab.measure.compare import RAW_FAULTS_FIGURE, Run, compare_runs, mismatch_warnings, percent

REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "docs" / "examples" / "tiny_mlp.py")
TINY_ARGS = [TINY, "--option", "hidden=2048", "--batch-size", "256", "--iterations", "2", "--mode", "sim"]
EXPORT = "cudamicrobench_gh200_um_gpu_faults_nsys2023.4.4.sqlite"
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, real_data: Path) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("m")
    assert main(["run", *TINY_ARGS, "--oversub", "2", "--pca", "on", "-o", str(d / "sim")]) == 0
    assert main(["nsys", "import", str(real_data / "nsys" / EXPORT), "-o", str(d / "measured")]) == 0
    return d / "sim", d / "measured"


def test_nsys_import_writes_the_run_figures(runs: tuple[Path, Path]) -> None:
    _, measured = runs
    figs = sorted(p.name for p in (measured / "figures").iterdir())
    assert figs == ["faults_migrations.png", "memory_per_kernel.png"]
    assert all((measured / "figures" / f).read_bytes()[:8] == PNG for f in figs)


@pytest.mark.parametrize("table", ["kernels", "iterations", "memory"])
def test_measured_tables_have_the_simulated_dtypes(runs: tuple[Path, Path], table: str) -> None:
    sim, measured = runs
    s = pd.read_parquet(sim / "tables" / f"{table}.parquet")
    m = pd.read_parquet(measured / "tables" / f"{table}.parquet")
    shared = [c for c in s.columns if c in m.columns]
    assert len(shared) >= 4
    assert {c: str(m[c].dtype) for c in shared} == {c: str(s[c].dtype) for c in shared}
    for c in ("start_ns", "end_ns", "duration_ns", "time_ns"):
        if c in shared:
            assert str(s[c].dtype) == "float64"
    if "phase" in m.columns:
        assert m["phase"].eq("").all()  # an export knows no phases: empty, not null


def test_compare_measured_vs_simulated(runs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    sim, measured = runs
    cmp = compare_runs(measured, sim)
    assert any("different GPUs" in n and "GH200" in n for n in cmp.notes)
    row = cmp.totals.set_index("figure").loc[RAW_FAULTS_FIGURE]
    sim_res = json.loads((sim / "result.json").read_text())
    assert row["b"] == sim_res["raw_fault_entries"] != sim_res["fault_count"]
    k = cmp.kernels
    if k is not None and "fault_count_b" in k.columns:
        assert k["fault_count_b"].sum() == pytest.approx(sim_res["raw_fault_entries"], rel=1e-6)
    capsys.readouterr()
    assert main(["compare", str(measured), str(sim)]) == 0
    captured = capsys.readouterr()
    assert "%" in captured.out and "raw fault entries" in captured.out
    assert "warning: the runs are on different GPUs" in captured.err


def test_compare_two_simulated_runs_keeps_unique_pages(runs: tuple[Path, Path]) -> None:
    sim, _ = runs
    cmp = compare_runs(sim, sim)
    assert "fault_count" in set(cmp.totals["figure"]) and RAW_FAULTS_FIGURE not in set(cmp.totals["figure"])
    assert not cmp.notes or all("warning" not in n for n in cmp.notes)


def _run(**result: object) -> Run:
    return Run(Path("x"), dict(result), {})


def test_mismatch_warnings_and_percent() -> None:
    same = _run(workload="gpt2", gpu="NVIDIA A100-SXM4-80GB")
    assert mismatch_warnings(_run(workload="gpt2", gpu="A100-80GB"), same) == []
    w = mismatch_warnings(_run(workload="gpt2", gpu="A100-80GB"), _run(workload="bert", gpu="H100-80GB"))
    assert len(w) == 2 and "different workloads" in w[0] and "different GPUs" in w[1]
    assert mismatch_warnings(_run(workload=None, gpu=None), _run(workload="bert", gpu="H100")) == []
    assert percent(-0.5) == "-50.0 %" and percent(0.123) == "+12.3 %" and percent(None) is None


# -- issue 29: both real exports without NVTX iterations or memory events draw what they have --------------------
A100 = "csc746_a100_um_migrations_nsys2022.2.1.sqlite"


def _ink(png: Path) -> float:
    """Share of the figure's pixels that are not (near) white: a figure of text alone stays under 5 %."""
    import matplotlib.image

    pixels = matplotlib.image.imread(png)[..., :3]
    return float((pixels.min(axis=2) < 0.9).mean())


def _bar_total(ax: object) -> float:
    from matplotlib.patches import Rectangle

    return sum(p.get_height() for p in ax.patches if isinstance(p, Rectangle))  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("export", "faults", "migrations"), [(EXPORT, 4195, 100), (A100, None, 18432)], ids=["gh200", "a100"]
)
def test_a_measured_run_without_iterations_draws_faults_and_migrations_over_time(
    real_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], export: str, faults: int | None,
    migrations: int,
) -> None:  # fmt: skip
    import matplotlib.pyplot as plt

    from uvmlab.stats.figures import faults_migrations_figure, memory_per_kernel_figure

    out = tmp_path / "measured"
    assert main(["nsys", "import", str(real_data / "nsys" / export), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    result = json.loads((out / "result.json").read_text())
    tables = {n: pd.read_parquet(out / "tables" / f"{n}.parquet") for n in ("iterations", "kernels", "migrations")}
    fault_rows = pd.read_parquet(out / "tables" / "faults.parquet")
    assert tables["iterations"].empty and len(tables["migrations"]) == migrations
    assert (int(fault_rows["fault_count"].sum()) if faults else result["fault_count"]) == faults
    fig = faults_migrations_figure(tables["iterations"], "", fault_rows, tables["migrations"])
    a_faults, a_migrations = fig.axes
    assert _bar_total(a_migrations) == pytest.approx(tables["migrations"]["bytes"].sum() / 2**20)
    assert "(MiB)" in a_migrations.get_ylabel() and "(s)" in a_migrations.get_xlabel()
    assert "(count)" in a_faults.get_ylabel()
    assert _bar_total(a_faults) == (faults or 0)  # no fault table in the A100 export: the panel says why
    plt.close(fig)
    fig = memory_per_kernel_figure(tables["kernels"], None)
    assert _bar_total(fig.axes[1]) == pytest.approx(tables["kernels"]["htod_bytes"].sum() / 2**20)
    plt.close(fig)
    for png in ("faults_migrations.png", "memory_per_kernel.png"):
        assert _ink(out / "figures" / png) > 0.08  # the old figures were a sentence on white: under 0.05
    # the summary in words and units, not result.json's keys and nanoseconds
    assert "total_time_ns" not in printed and "htod_bytes" not in printed
    span = f"{result['total_time_ns'] / 1e9:,.3f} s"
    assert f"| time span (first to last GPU activity) | {span}" in " ".join(printed.split())
    htod = next(line for line in printed.splitlines() if line.startswith("| HtoD migrations"))
    assert f"{result['htod_count']:,} (" in htod and "iB)" in htod
