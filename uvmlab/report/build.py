"""``build_report(sweep_dir, out_html)``: every figure of the study the sweep can support, captions, HTML.

Outputs (docs/safety.md): the figures go to ``figures/`` beside the page, a :class:`ReportFigures` folder
(uvmlab.files.owned: marker, writer's lock, manifest), so a figure file of the user's with one of the report's names is
never replaced (the folder is refused, even with ``--force``) and a rebuild removes only the figures uvmlab wrote.
The page is written last; an old page is removed before the figures are rebuilt, so a report that fails halfway
(a full disk) leaves no page that looks complete. Nothing is written through a symbolic link: the default folder
``SWEEP/report`` (uvmlab's own), ``figures/`` and the page may not be links.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from uvmlab.errors import InputError, InvariantError
from uvmlab.files.atomic import atomic_write_text
from uvmlab.files.owned import OwnedFolder
from uvmlab.report import captions, figures
from uvmlab.report.data import load_results, ok_runs, paired_sim_measured, pick_kernel_runs, workload_order
from uvmlab.report.html import Section, relative, render
from uvmlab.sweep.aggregate import BROKEN
from uvmlab.uvm.regime import label as regime_label


@dataclass(frozen=True)
class FigureFile:
    """One written PNG."""

    key: str
    title: str
    path: Path
    runs: int
    caption: str


@dataclass
class Report:
    """What build_report wrote."""

    html: Path
    figures: list[FigureFile] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    broken: list[str] = field(default_factory=list)
    """Run ids whose result.json cannot be read (outcome broken): listed on the page, in no figure."""

    def to_dict(self) -> dict[str, Any]:
        """JSON form (``--format json``)."""
        return {
            "html": str(self.html),
            "figures": [
                {"key": f.key, "path": str(f.path), "runs": f.runs, "caption": f.caption} for f in self.figures
            ],
            "skipped": list(self.skipped),
            "broken": list(self.broken),
        }


FIGURE_KEYS = ("fig3_slowdown", "fig4_pca_ratio", "fig5_kernel_memory", "fig6_faults", "fig7_read_write",
               "fig8_migration_count", "fig9_migration_bytes", "fig_regime", "fig_sim_vs_measured")  # fmt: skip
"""The figures a report may write (``figures/KEY.<format>``)."""


def figure_files(figure_format: str = "png") -> list[str]:
    """The file names a report may write into ``figures/`` beside its page."""
    return [f"{key}.{figure_format}" for key in FIGURE_KEYS]


class ReportFigures(OwnedFolder):
    """The ``figures/`` folder beside a report page (module docstring)."""

    kind = "report figures"
    complete_name = None

    def __init__(self, path: str | os.PathLike[str]) -> None:
        from uvmlab.files.rundir import FIGURE_FORMATS

        super().__init__(path)
        self.names = tuple(f"{key}.{fmt}" for key in FIGURE_KEYS for fmt in FIGURE_FORMATS)


def _save(folder: ReportFigures, fig: Any, path: Path, fmt: str = "png") -> None:
    folder.write_file_with(path, lambda tmp: fig.savefig(tmp, format=fmt, dpi=110))


def _report_outputs(sweep_dir: Path, out_html: str | os.PathLike[str] | None) -> tuple[Path, ReportFigures]:
    """The page's path and its figures folder, prepared (locked); refuses links; the old page is removed."""
    default = out_html is None
    html_path = sweep_dir / "report" / "report.html" if default else Path(out_html)
    for path in ([html_path.parent] if default else []) + [html_path]:
        if path.is_symlink():
            raise InputError(f"{path} is a symbolic link; uvmlab does not write a report through links")
    if html_path.exists() and not html_path.is_file():
        raise InputError(f"{html_path} exists and is not a file; choose another page name")
    folder = ReportFigures(html_path.parent / "figures")
    if default and folder.path.is_dir() and not folder.path.is_symlink() and not folder.is_owned():
        folder.mark_owned()  # SWEEP/report is uvmlab's own: figures an older uvmlab wrote there are adopted by name
    folder.prepare(force=True)  # removes the figures uvmlab wrote there before, nothing else
    if html_path.is_file():  # replaced (the caller checked --force for a page the user named)
        html_path.unlink()
    return html_path, folder


RUN_COLUMNS = {
    "run_id": "run",
    "workload": "workload",
    "cfg_batch_size": "batch",
    "oversub": "factor",
    "pca": "PCA",
    "mode": "mode",
    "outcome": "outcome",
    "iteration_ms": "iteration (ms)",
    "slowdown_vs_oversub1": "slowdown vs factor 1 (same PCA)",
    "fault_count": "page faults",
    "migration_gib": "migrated (GiB)",
    "regime_text": "regime (thrashing: its share of the time)",
    "error": "error",
}
"""The runs table of the page: results.parquet column -> heading."""


def runs_table(df: pd.DataFrame, page_dir: Path) -> pd.DataFrame:
    """One row per run (ok first, then oom/error), the run id linking to its directory (relative to the page)."""
    t = df.assign(
        iteration_ms=df["iteration_time_ns"] / 1e6,
        migration_gib=df["migration_bytes"] / (1 << 30),
        pca=df["pca"].map(lambda v: None if v is None or v is pd.NA else ("on" if v else "off")),
    )
    if "regime.verdict" in t.columns:  # simulated runs (result.json ``regime``, flattened by uvmlab.sweep.aggregate)
        t["regime_text"] = [
            regime_label(v, s)
            for v, s in zip(t["regime.verdict"], t.get("regime.thrashing_time_share", [None] * len(t)), strict=True)
        ]
    order = {w: i for i, w in enumerate(workload_order(t["workload"]))}
    t = t.assign(_ok=t["outcome"] != "ok", _w=t["workload"].map(order), _pca=t["pca"] != "on").sort_values(
        ["_ok", "_w", "_pca", "oversub"], kind="stable"
    )
    cols = [c for c in RUN_COLUMNS if c in t.columns and (c != "error" or t[c].notna().any())]
    out = t[cols].rename(columns=RUN_COLUMNS).reset_index(drop=True)
    out["_href"] = [relative(Path(p), page_dir) + "/" for p in t["run_dir"]]
    return out


def build_report(
    sweep_dir: str | os.PathLike[str],
    out_html: str | os.PathLike[str] | None = None,
    figure_format: str = "png",
) -> Report:
    """Write the figures (``figure_format``, in ``figures/`` beside the page) and the HTML page for ``sweep_dir``.

    The page: headline numbers beside the study's (with why they differ), what was run (said once) and a table
    of the runs linking to their directories, then each figure with its own caption.
    """
    from uvmlab.files.rundir import check_figure_format

    check_figure_format(figure_format)
    sweep_dir = Path(sweep_dir)
    df = load_results(sweep_dir)
    html_path, folder = _report_outputs(sweep_dir, out_html)
    with folder:
        return _build(sweep_dir, df, html_path, folder, figure_format)


def _build(sweep_dir: Path, df: pd.DataFrame, html_path: Path, folder: ReportFigures, figure_format: str) -> Report:
    fig_dir = folder.path
    report = Report(html=html_path, broken=[str(r) for r in df.loc[df["outcome"] == BROKEN, "run_id"]])
    ok = ok_runs(df)
    runs_text = captions.describe_runs(df)
    sims = ok_runs(df, measured=False)
    study_df = sims if not sims.empty else ok  # the study figures: simulated runs, or measured if only those

    kernel_runs = pick_kernel_runs(df)
    pca_ratio = figures.pca_ratio_table(study_df)
    plan: list[tuple[str, str, Callable[[], Any], int]] = [
        (
            "fig3_slowdown",
            "Figure 3: slowdown vs oversubscription factor",
            lambda: figures.fig3_slowdown(study_df),
            len(study_df),
        ),
        (
            "fig4_pca_ratio",
            "Figure 4: without PCA vs with PCA",
            lambda: figures.fig4_pca_ratio(study_df),
            len(study_df),
        ),
        (
            "fig5_kernel_memory",
            "Figure 5: memory per kernel over time",
            lambda: figures.fig5_kernel_memory(kernel_runs),
            len(kernel_runs),
        ),
        ("fig6_faults", "Figure 6: page faults", lambda: figures.fig6_faults(study_df), len(study_df)),
        (
            "fig7_read_write",
            "Figure 7: read / write page faults",
            lambda: figures.fig7_read_write(study_df),
            len(study_df),
        ),
        (
            "fig8_migration_count",
            "Figure 8: migration transactions",
            lambda: figures.fig8_migration_count(study_df),
            len(study_df),
        ),
        (
            "fig9_migration_bytes",
            "Figure 9: migration size",
            lambda: figures.fig9_migration_bytes(study_df),
            len(study_df),
        ),
        (
            "fig_regime",
            "Regime: fits, paging or thrashing",
            lambda: figures.fig_regime(df),
            len(ok),
        ),
        (
            "fig_sim_vs_measured",
            "Simulated vs measured",
            lambda: figures.fig_sim_vs_measured(df),
            len(paired_sim_measured(df)),
        ),
    ]
    sections: list[Section] = []
    for key, title, draw, nruns in plan:
        if key not in FIGURE_KEYS:
            raise InvariantError(f"report figure {key} is missing from FIGURE_KEYS (the -o checks name its file)")
        fig = draw()
        if fig is None:
            report.skipped.append(f"{title}: the sweep has no runs with the needed values")
            continue
        path = fig_dir / f"{key}.{figure_format}"
        _save(folder, fig, path, figure_format)
        caption = captions.FIGURE_TEXT[key]  # what was run is said once, above the runs table
        if key == "fig5_kernel_memory":
            caption += f" Runs shown: {_kernel_caption(kernel_runs)}"
        report.figures.append(FigureFile(key, title, path, nruns, caption))
        table = None
        if key == "fig4_pca_ratio":
            table = pca_ratio.pivot(index="workload", columns="oversub", values="ratio").reset_index()
            table.columns = [c if c == "workload" else f"factor {c:g}" for c in table.columns]
        if key == "fig_sim_vs_measured":
            table = _error_table(df)
        sections.append(Section(title, caption, relative(path, html_path.parent), table))
    simulated = not sims.empty
    sections[0:0] = [
        Section(
            "Headline numbers",
            "The study's numbers (seeds/003 section 4.2, measured on an A100 80GB) beside this sweep's, and why "
            + ("simulated numbers differ (docs/figures/README.md)." if simulated else "they may differ."),
            table=captions.headlines(study_df, pca_ratio, simulated=simulated),
        ),
        Section(
            "Runs",
            f"What was run: {runs_text} Each run links to its directory (result.json, tables, figures).",
            table=runs_table(df, html_path.parent),
            links={"run": "_href"},
        ),
    ]
    failed = df[df["outcome"] != "ok"]
    if not failed.empty:
        cols = [c for c in ("run_id", "workload", "oversub", "pca", "mode", "outcome", "error") if c in failed]
        sections.append(
            Section(
                "Runs that did not finish",
                "Outcome oom, error, or broken (a result.json that cannot be read), with the error sentence.",
                table=failed[cols].astype(object).reset_index(drop=True),
            )
        )
    intro = (
        f"Sweep {sweep_dir}: {len(df)} runs ({len(ok)} ok, {len(failed)} oom/error/broken). "
        "Figures follow Lin & Jeon, 'Understanding Oversubscribed Memory Management for Deep Learning "
        "Training' (EuroMLSys '25), figures 3-9."
    )
    atomic_write_text(html_path, render("uvmlab sweep report", intro, sections))
    return report


def _kernel_caption(runs: dict[str, pd.Series]) -> str:
    parts = []
    for workload, row in runs.items():
        pca = "on" if bool(row.get("pca")) else "off"
        parts.append(f"{workload} (run {row['run_id']}, mode {row.get('mode')}, factor {row['oversub']:g}, PCA {pca})")
    return "; ".join(parts) + "."


def _error_table(df: pd.DataFrame) -> pd.DataFrame:
    pairs = paired_sim_measured(df)
    rows = []
    for _, p in pairs.iterrows():
        row: dict[str, Any] = {"workload": p["workload"], "oversub": p["oversub"], "pca": bool(p["pca"])}
        for metric, _label in figures.SIM_VS_MEASURED_METRICS:
            m, s = p[f"{metric}_measured"], p[f"{metric}_sim"]
            row[f"{metric} measured"] = m
            row[f"{metric} sim"] = s
            row[f"{metric} error %"] = 100 * (s - m) / m if m == m and s == s and m else float("nan")
        rows.append(row)
    return pd.DataFrame(rows)
