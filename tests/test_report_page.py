"""The report page: runs table linking to run directories, captions once, headline 'why', figure formats."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest
import sweep_fake_run

from uvmlab.cli import main
from uvmlab.report import build_report
from uvmlab.report.captions import WHY_SIMULATED
from uvmlab.report.html import Section, render
from uvmlab.sweep.aggregate import write_results
from uvmlab.sweep.runner import prepare
from uvmlab.sweep.spec import parse_spec

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
    out = tmp_path_factory.mktemp("sweep") / "out"
    for entry in prepare(parse_spec(SPEC), out):
        sweep_fake_run.run(entry.config, out=entry.path, force=True)
    write_results(out)
    return out


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []
        self.srcs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        d = dict(attrs)
        if tag == "a" and d.get("href") and not str(d["href"]).startswith("#"):
            self.hrefs.append(str(d["href"]))
        if tag in ("img", "object"):
            self.srcs.append(str(d.get("src") or d.get("data")))


def test_runs_table_links_every_run_directory(sweep_dir: Path, tmp_path: Path) -> None:
    html = tmp_path / "rep" / "report.html"
    build_report(sweep_dir, html)
    parser = _Links()
    parser.feed(html.read_text())
    runs = sorted(p.name for p in (sweep_dir / "runs").iterdir())
    assert len(parser.hrefs) == len(runs) == 12
    for href in parser.hrefs:
        target = (html.parent / href).resolve()
        assert target.is_dir() and (target / "result.json").is_file(), href
    assert sorted(Path(h).name for h in parser.hrefs) == runs
    for src in parser.srcs:
        assert (html.parent / src).is_file()
    assert "slowdown vs factor 1 (same PCA)" in html.read_text()  # the study's slowdown column is in the table


def test_each_caption_once_and_headlines_say_why(sweep_dir: Path, tmp_path: Path) -> None:
    html = tmp_path / "report.html"
    rep = build_report(sweep_dir, html)
    page = html.read_text()
    text = re.sub(r"<[^>]+>", " ", page)
    for f in rep.figures:
        assert page.count(f.caption[:80]) == 1, f.key
    assert text.count("What was run:") == 1
    assert "why they differ" in page
    for why in WHY_SIMULATED.values():
        assert why.replace("'", "&#39;")[:60] in page


def test_figure_formats(sweep_dir: Path, tmp_path: Path) -> None:
    for fmt, magic in (("svg", b"<?xml"), ("pdf", b"%PDF")):
        html = tmp_path / fmt / "report.html"
        assert main(["report", str(sweep_dir), "-o", str(html), "--figure-format", fmt, "--format", "json"]) == 0
        figs = sorted(p for p in (html.parent / "figures").iterdir() if not p.name.startswith("."))  # not bookkeeping
        assert figs and all(f.suffix == f".{fmt}" and f.read_bytes().startswith(magic) for f in figs)
        assert f"figures/fig3_slowdown.{fmt}" in html.read_text()
    assert main(["report", str(sweep_dir), "--figure-format", "gif"]) == 2


def test_markup_in_values_is_escaped() -> None:
    df = pd.DataFrame({"run": ["<b>x</b>"], "_href": ["runs/a&b/"], "v": [1.5]})
    page = render("t <1>", "intro & more", [Section("s", "cap <i>", table=df, links={"run": "_href"})])
    assert "<b>x</b>" not in page and "&lt;b&gt;x&lt;/b&gt;" in page
    assert 'href="runs/a&amp;b/"' in page and "_href" not in page
    assert "t &lt;1&gt;" in page and "cap &lt;i&gt;" in page


def test_runs_table_says_each_simulated_runs_regime(tmp_path: Path) -> None:
    """results.parquet's flattened ``regime.*`` columns become one cell; a run without them (measured) stays empty."""
    from uvmlab.report.build import runs_table

    df = pd.DataFrame(
        {
            "workload": ["gpt2"] * 3,
            "oversub": [1.0, 4.0, 8.0],
            "pca": [True, True, True],
            "outcome": ["ok"] * 3,
            "iteration_time_ns": [1e9] * 3,
            "migration_bytes": [0.0] * 3,
            "run_dir": [str(tmp_path / f"r{i}") for i in range(3)],
            "regime.verdict": ["fits", "thrashing", None],
            "regime.thrashing_time_share": [0.0, 0.244, None],
        }
    )
    table = runs_table(df, tmp_path)
    cells = table["regime (thrashing: its share of the time)"].tolist()
    assert cells[:2] == ["fits", "thrashing (24%)"] and pd.isna(cells[2])


def test_the_regime_figure_needs_runs_that_have_a_regime() -> None:
    """Runs written before the regime existed (or measured without migrations) leave the figure out; one run that
    thrashes draws it."""
    from uvmlab.report.figures import fig_regime

    base = {"workload": ["gpt2"], "oversub": [4.0], "pca": [True], "outcome": ["ok"], "mode": ["sim"]}
    assert fig_regime(pd.DataFrame(base)) is None
    assert fig_regime(pd.DataFrame({**base, "regime.verdict": [None]})) is None
    fig = fig_regime(pd.DataFrame({**base, "regime.verdict": ["thrashing"], "regime.thrashing_time_share": [0.24]}))
    assert fig is not None
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert "24%" in texts and "oversubscription factor" in fig.axes[1].get_xlabel()


def test_a_regime_cell_shows_the_worst_of_its_runs() -> None:
    """Two batch sizes of one workload and factor: the cell is the one that thrashes, whatever the order."""
    from uvmlab.report.figures import fig_regime

    runs = pd.DataFrame(
        {
            "workload": ["gpt2", "gpt2"],
            "oversub": [4.0, 4.0],
            "pca": [True, True],
            "outcome": ["ok", "ok"],
            "regime.verdict": ["thrashing", "paging"],
            "regime.thrashing_time_share": [0.3, 0.0],
        }
    )
    for order in (runs, runs.iloc[::-1]):
        texts = [t.get_text() for t in fig_regime(order).axes[0].texts]
        assert texts == ["30%"]
