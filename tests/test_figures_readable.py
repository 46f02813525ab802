"""Readable figures: log ticks 1, 2, 5, 10, 20, 50; the run memory figure's legend; --figure-format."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure

from uvmlab.cli import main
from uvmlab.errors import InputError
from uvmlab.files.rundir import RunDir
from uvmlab.report.ticks import log_axis
from uvmlab.stats.figures import memory_per_kernel_figure

REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "docs" / "examples" / "tiny_mlp.py")


def _labels(ax, which: str = "y") -> list[str]:  # type: ignore[no-untyped-def]
    ax.figure.canvas.draw()
    axis = ax.yaxis if which == "y" else ax.xaxis
    lo, hi = ax.get_ylim() if which == "y" else ax.get_xlim()
    return [t.get_text() for t in axis.get_majorticklabels() if lo <= t.get_position()[1 if which == "y" else 0] <= hi]


@pytest.mark.parametrize(
    ("values", "want"),
    [
        ([1.2, 3, 48], ["2", "5", "10", "20"]),  # up to 3 decades: 1, 2, 5 per decade
        ([1, 1e6], ["1", "10", "100", "1,000", "10,000", "100,000", "1,000,000"]),  # wider: decades only
        ([0.3, 0.9], ["0.5"]),
    ],
)
def test_log_ticks_are_plain_readable_numbers(values: list[float], want: list[str]) -> None:
    fig = Figure()
    ax = fig.subplots()
    ax.bar(range(len(values)), values)
    log_axis(ax, "y")
    labels = _labels(ax)
    assert all(w in labels for w in want), labels
    assert not any("10^" in x or "$" in x or "e+" in x for x in labels), labels


def _tables(n_it: int = 3, per: int = 10, pca_off: bool = True) -> tuple[pd.DataFrame, pd.DataFrame]:
    n = n_it * per
    k = pd.DataFrame(
        {
            "kernel_id": np.arange(n),
            "iteration": np.repeat(np.arange(n_it), per),
            "start_ns": np.arange(n) * 1e6,
            "kernel_bytes": np.full(n, 1 << 20),
        }
    )
    alloc = (np.arange(n) % per + 1) * (1 << 20)
    mem = pd.DataFrame(
        {
            "time_ns": k["start_ns"],
            "allocated_bytes": alloc,
            "reserved_bytes": alloc if pca_off else np.full(n, 16 << 20),
            "resident_bytes": alloc // 2,
        }
    )
    return k, mem


def test_run_memory_figure_names_iterations_and_shows_allocated_on_reserved() -> None:
    k, mem = _tables()
    fig = memory_per_kernel_figure(k, mem, "t")
    top, bottom = fig.axes[:2]
    assert "iteration start" in [t.get_text() for t in top.get_legend().get_texts()]
    names = [t.get_text() for t in bottom.get_legend().get_texts()]
    assert "iteration start" in names and any(n.startswith("allocated") for n in names)
    lines = {ln.get_label(): ln for ln in bottom.get_lines()}
    alloc = next(v for n, v in lines.items() if n.startswith("allocated"))
    res = next(v for n, v in lines.items() if n.startswith("reserved"))
    # PCA off: allocated == reserved, so allocated is drawn on top, dashed, and narrower than reserved
    assert alloc.get_zorder() > res.get_zorder() and alloc.get_linestyle() == "--"
    assert alloc.get_linewidth() < res.get_linewidth()
    starts = sorted(x for ln in bottom.lines if ln.get_color() == "red" for x in [ln.get_xdata()[0]])
    assert starts == pytest.approx([0.01, 0.02])  # iterations 1 and 2 start at 10 and 20 ms


def test_measured_memory_without_kernel_bytes_draws_one_panel() -> None:
    k, mem = _tables()
    k["kernel_bytes"] = np.nan
    mem["allocated_bytes"] = np.nan
    fig = memory_per_kernel_figure(k, mem, "t")
    assert len(fig.axes) == 1 and fig.axes[0].get_ylabel() == "memory (MiB)"


def test_rundir_figure_format(tmp_path: Path) -> None:
    fig = Figure()
    fig.subplots().plot([1, 2])
    for fmt, magic in (("png", b"\x89PNG"), ("svg", b"<?xml"), ("pdf", b"%PDF")):
        path = RunDir(tmp_path / fmt, figure_format=fmt).write_figure("f", fig)
        assert path.suffix == f".{fmt}" and path.read_bytes().startswith(magic)
    with pytest.raises(InputError, match="figure format"):
        RunDir(tmp_path, figure_format="gif")


def test_run_cli_figure_format(tmp_path: Path) -> None:
    args = [TINY, "--option", "hidden=512", "--batch-size", "64", "--iterations", "2", "--mode", "sim"]
    assert main(["run", *args, "--oversub", "2", "-o", str(tmp_path / "r"), "--figure-format", "svg"]) == 0
    figs = sorted(p.name for p in (tmp_path / "r" / "figures").iterdir())
    assert figs == ["faults_migrations.svg", "memory_per_kernel.svg"]
