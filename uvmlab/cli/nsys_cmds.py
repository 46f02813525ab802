"""`uvmlab nsys summarize|import`, `uvmlab compare`, `uvmlab calibrate` (Nsight Systems exports, measured vs
simulated)."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import click

from uvmlab.console import note, print_table

ITERATION_HELP = (
    "Regular expression for iteration NVTX ranges; its first group is the iteration number "
    "[default: 'iteration N', as uvmlab's GPU runner emits]."
)


@click.group("nsys")
def nsys() -> None:
    """Read Nsight Systems SQLite exports (nsys export --type sqlite), 2021.2 to 2026.1 schemas."""


@nsys.command("summarize")
@click.argument("report", type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["table", "json", "csv"]), default="table", show_default=True)
@click.option("--iteration-pattern", default=None, help=ITERATION_HELP)
def summarize_cmd(report: Path, fmt: str, iteration_pattern: str | None) -> None:
    """Unified Memory statistics of REPORT.sqlite: faults, migrations, per-kernel and per-iteration attribution.

    Figures that were not collected print n/a (null in JSON), never 0. Also gives the totals of
    `nsys stats -r um_total_sum,um_sum`, including where those reports refuse to run.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from uvmlab.console import err
    from uvmlab.nsys import schema as S
    from uvmlab.nsys.kernel_stats import DEFAULT_ITERATION_PATTERN
    from uvmlab.nsys.read import open_export
    from uvmlab.nsys.stats import summarize
    from uvmlab.nsys.tables import summary_csv_rows, summary_tables

    with open_export(report) as ex:
        for w in ex.warnings:
            note(f"warning: {w}")
        total = (ex.row_count(S.GPU_FAULTS) or 0) + (ex.row_count(S.MEMCPY) or 0)
        columns = (TextColumn("reading fault and copy rows"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=err, transient=True, disable=total < 1_000_000) as bar:
            task = bar.add_task("rows", total=total)
            s = summarize(ex, iteration_pattern or DEFAULT_ITERATION_PATTERN, progress=lambda n: bar.advance(task, n))
    if fmt == "json":
        click.echo(json.dumps(s.to_dict(), indent=2, default=str))
    elif fmt == "csv":
        w = csv.writer(sys.stdout)
        w.writerow(["table", "row", "column", "value"])
        w.writerows(summary_csv_rows(s))
    else:
        for title, cols, rows in summary_tables(s):
            print_table(title, cols, rows)


@nsys.command("import")
@click.argument("report", type=click.Path(path_type=Path))
@click.option("-o", "--out", type=click.Path(path_type=Path), required=True, help="Run directory to write.")
@click.option("--force", is_flag=True, help="Overwrite a complete run directory.")
@click.option("--iteration-pattern", default=None, help=ITERATION_HELP)
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def import_cmd(report: Path, out: Path, force: bool, iteration_pattern: str | None, fmt: str) -> None:
    """Write a measured run directory (result.json + iterations/kernels/migrations/memory tables) from REPORT."""
    from uvmlab.nsys.kernel_stats import DEFAULT_ITERATION_PATTERN
    from uvmlab.nsys.measured import import_export

    rd, result = import_export(
        report, out, force=force, iteration_pattern=iteration_pattern or DEFAULT_ITERATION_PATTERN
    )
    if fmt == "json":
        click.echo(json.dumps(result, indent=2, default=str))
        return
    for w in result["nsys"]["warnings"]:
        note(f"warning: {w}")
    print_table("Measured run", ["key", "value"], [[k, v] for k, v in result.items() if k != "nsys"])
    note(rd.summary_line())


@click.command("compare")
@click.argument("run_a", type=click.Path(path_type=Path))
@click.argument("run_b", type=click.Path(path_type=Path))
@click.option("-o", "--out", type=click.Path(path_type=Path), default=None, help="Folder for tables and figures.")
@click.option("--force", is_flag=True, help="Replace an earlier comparison in -o.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def compare_cmd(run_a: Path, run_b: Path, out: Path | None, force: bool, fmt: str) -> None:
    """Compare two run directories side by side (RUN_A is the reference): totals, per iteration, per kernel.

    Works for measured vs simulated and for two simulated runs (e.g. PCA on vs off). Relative error is
    (B - A) / |A|; n/a where either side lacks the figure. With -o, writes comparison.json, tables and figures.
    """
    from uvmlab.compare import compare_runs, write_comparison
    from uvmlab.outputs import check_output_folder

    if out is not None:
        check_output_folder(out, ["comparison.json", "tables", "figures"], [run_a, run_b], force)
    cmp = compare_runs(run_a, run_b)
    if out is not None:
        written = write_comparison(cmp, out)
        note(f"Wrote {out} ({len(written)} files)")
    if fmt == "json":
        click.echo(json.dumps(cmp.to_dict(), indent=2, default=str))
        return
    for title, cols, rows in cmp.tables():
        print_table(title, cols, rows)
    for n in cmp.notes:
        note(n)


@click.command("calibrate")
@click.argument("report", type=click.Path(path_type=Path), required=False)
@click.option("-o", "--out", type=click.Path(path_type=Path), required=True, help="Parameter file to write (JSON).")
@click.option(
    "--sim-run",
    type=click.Path(path_type=Path),
    default=None,
    help="A simulated run of the same job: fits the kernel time scale from matched kernels.",
)
@click.option(
    "--base",
    type=click.Path(path_type=Path),
    default=None,
    help="Start from this parameter file instead of the built-in defaults.",
)
@click.option("--microbench", is_flag=True, help="Measure the parameters on this machine's GPU instead (GPU only).")
@click.option("--force", is_flag=True, help="Replace an existing parameter file -o.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def calibrate_cmd(
    report: Path | None, out: Path, sim_run: Path | None, base: Path | None, microbench: bool, force: bool, fmt: str
) -> None:
    """Fit the simulator's cost parameters (uvmlab.sim.timing.CostParams) from REPORT.sqlite and write them.

    Fits only what the export supports (link bandwidth from UM migrations, per-batch fault cost from GPU fault
    records, kernel time scale with --sim-run) and keeps the defaults for the rest; the file says which is which.
    """
    from uvmlab.calibrate import calibrate, calibrate_microbench
    from uvmlab.errors import InputError
    from uvmlab.outputs import check_output_file

    check_output_file(out, [report, sim_run, base], force)

    if microbench:
        doc = calibrate_microbench(out)
    else:
        if report is None:
            raise InputError("give REPORT.sqlite to calibrate from, or --microbench to measure on this GPU")
        doc = calibrate(report, out, sim_run=sim_run, base=base)
    if fmt == "json":
        click.echo(json.dumps(doc, indent=2, default=str))
        return
    fitted = doc.get("fitted", {})
    print_table(
        "Cost parameters",
        ["parameter", "value", "fitted"],
        [[k, v, "fitted" if k in fitted else "default"] for k, v in doc["params"].items()],
    )
    for n in doc.get("notes", []):
        note(n)
    note(f"Wrote {out}")


nsys.add_command(summarize_cmd)
nsys.add_command(import_cmd)

COMMANDS = [nsys, compare_cmd, calibrate_cmd]
