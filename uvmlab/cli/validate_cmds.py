"""`uvmlab validate`: the fidelity scorecard (every real data set we hold, measured vs predicted)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from uvmlab.cli.options import PathParam, out_option
from uvmlab.console import note, print_table

TABLE_COLUMNS = ["dataset", "case", "quantity", "measured", "predicted", "ratio", "within 1.5x", "within 2x", "fitted"]


@click.command("validate")
@click.argument("data_dir", type=PathParam("input", folder=True, path_type=Path), required=False)
@click.option("--fast", is_flag=True, help="Only the CI subset of checks (under 2 minutes).")
@click.option("--check", "only", multiple=True, metavar="NAME", help="Run only this check (repeatable).")
@out_option("Run directory to write.", type=PathParam("output", folder=True, path_type=Path), default=None)
@click.option("--force", is_flag=True, help="Overwrite a complete run directory.")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "csv"]), default="table", show_default=True)
@click.option(
    "--verbose",
    "-v",
    is_flag=True,
    help="Also print the per-point table (thousands of rows; -o DIR writes it to tables/scorecard.parquet).",
)
@click.option(
    "--jobs",
    type=click.IntRange(min=1),
    default=None,
    help="Worker processes for the long checks (default: the CPUs this process may use). The points do not "
    "depend on it.",
)
def validate_cmd(
    data_dir: Path | None,
    fast: bool,
    only: tuple[str, ...],
    out: Path | None,
    force: bool,
    fmt: str,
    verbose: bool,
    jobs: int | None,
) -> None:
    """Run every registered fidelity check on DATA_DIR: measured vs predicted, the verdict per family.

    DATA_DIR defaults to $UVMLAB_REAL_DATA, else ../shared/real-data beside the checkout. Checks whose folder is
    absent are skipped with the reason. The verdict is given per family (memory, allocator, UVM timing, UVM
    structure, nsys), weakest first: validation points (not those used for fitting) within 1.5x and 2x. The
    per-point table: --verbose, or -o DIR (tables/scorecard.parquet, figures/scorecard.png, result.json). Exit
    code 1 when a validation point leaves the band it promises, 3 when a check crashed (a uvmlab bug).
    """
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    from uvmlab.console import plain, progress_bar
    from uvmlab.errors import InvariantError, UvmlabError
    from uvmlab.validate.scorecard import load_checks, resolve_data_dir, select_checks, usable_cpus, validate

    data_dir = resolve_data_dir(data_dir)  # bad input fails before the progress bar starts
    total = len(select_checks(load_checks(), fast, only))
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with progress_bar(*columns) as bar:
        task = bar.add_task("running checks", total=total)
        card = validate(
            data_dir,
            fast=fast,
            only=only,
            out=out,
            force=force,
            progress=lambda name: bar.update(task, advance=1, description=f"ran {plain(name)}"),
            jobs=jobs or usable_cpus(),
            advance=lambda name, done, n: bar.update(task, description=f"{plain(name)}: {done}/{n}"),
        )
    summary = card.summary()
    if fmt == "json":
        payload = {"summary": summary, "points": json.loads(card.frame().to_json(orient="records"))}
        click.echo(json.dumps(payload, indent=2))
    elif fmt == "csv":
        card.frame().to_csv(sys.stdout, index=False)
    else:
        _print_verdict(card, summary, verbose, out)
    for name, why in card.skipped.items():
        note(f"skipped {name}: {why}")
    if out is not None:
        note(f"Wrote {out} (result.json, tables/scorecard.parquet, figures/scorecard.png)")
    if card.errors:
        name, why = next(iter(card.errors.items()))
        raise InvariantError(f"check {name} crashed ({why}); {len(card.errors)} check(s) in all: a bug in uvmlab")
    broken = card.broken_bands()
    if broken:
        p = broken[0]
        raise UvmlabError(
            f"{len(broken)} validation point(s) left their band, e.g. {p.dataset} {p.case} {p.quantity}: "
            f"predicted {p.predicted} vs measured {p.measured} (band {p.band:g}x)"
        )


def _print_verdict(card: Any, summary: dict[str, Any], verbose: bool, out: Path | None) -> None:
    """The verdict per family, weakest first, on stdout (the per-point table only with ``verbose``); the counts per
    data set, over all points and the time on stderr."""
    from uvmlab.validate.scorecard import family_lines, overall_line, weakest_first

    if verbose:
        rows = [
            [p.dataset, p.case, f"{p.quantity} ({p.unit})", _value(p.measured),
             _value(p.predicted), p.ratio, _flag(p.within(1.5)), _flag(p.within(2.0)), "fitted" if p.fitted else ""]
            for _, p in card.points
        ]  # fmt: skip
        print_table("Fidelity scorecard (ratio = predicted / measured)", TABLE_COLUMNS, rows)
    print_table("Fidelity by family (validation points; weakest first)", ["family", "verdict"], family_lines(summary))
    for ds in weakest_first(summary["by_dataset"]):
        c = summary["by_dataset"][ds]
        v = c["validation_points"]
        note(f"  {ds}: {c['validation_within_1.5x']}/{v} within 1.5x, {c['validation_within_2x']}/{v} within 2x")
    note(overall_line(summary))
    if not verbose and out is None:
        note("the per-point table: --verbose, or -o DIR (tables/scorecard.parquet)")
    note(f"time: {card.wall_seconds:.1f} s wall, {card.cpu_seconds:.1f} s CPU (with worker processes); per check:")
    for name, (wall, cpu) in card.timings.items():
        note(f"  {name}: {wall:.1f} s wall, {cpu:.1f} s CPU")


def _value(v: float | None) -> float | int | None:
    """Integral values (counts, bytes) print as integers."""
    return int(v) if v is not None and float(v).is_integer() else v


def _flag(v: bool | None) -> str:
    return "n/a" if v is None else ("yes" if v else "no")


COMMANDS = [validate_cmd]
