"""``uvmlab sweep`` (run a YAML grid of configurations; ``sweep collect``) and ``uvmlab report``."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from uvmlab.cli.options import PathParam, figure_format_option, format_option, out_option


class _SweepGroup(click.Group):
    """``uvmlab sweep SPEC ...`` is short for ``uvmlab sweep run SPEC ...``."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


@click.group(cls=_SweepGroup)
def sweep() -> None:
    """Run a characterization sweep from a YAML spec (each configuration in its own process, resumable).

    \b
    uvmlab sweep experiments/lin_jeon_2025.yaml -o sweeps/lin --jobs 2
    uvmlab sweep SPEC workload=gpt2,bert oversub=1,2,4 -o DIR  # override grid axes
    uvmlab sweep SPEC -o DIR --executor slurm --dry-run   # show the job-array plan and sbatch script
    uvmlab sweep collect DIR                              # rebuild DIR/results.parquet
    """


@sweep.command("run")
@click.argument("spec", type=PathParam("input", folder=False, dir_okay=False, path_type=Path))
@click.argument("overrides", nargs=-1, metavar="[KEY=V1,V2,...]...")
@out_option(
    "Sweep folder (runs/<workload>-x<F>-pca<on|off>-<hash>/ per configuration, results.parquet).",
    type=PathParam("output", folder=True, file_okay=False, path_type=Path),
    required=True,
)
@click.option(
    "--executor",
    type=click.Choice(["local", "slurm", "submitit-local"]),
    default="local",
    show_default=True,
    help="local processes, a Slurm job array (submitit), or submitit's local executor.",
)
@click.option(
    "--jobs",
    "-j",
    type=int,
    default=1,
    show_default=True,
    help="Simulation runs at once (local executor; GPU runs always go one at a time).",
)
@click.option("--dry-run", is_flag=True, help="Validate and print the plan; run nothing.")
@click.option("--retry-failed", is_flag=True, help="Run again the configurations whose outcome was 'error'.")
@click.option(
    "--max-configs",
    type=click.IntRange(min=1, max=100_000),
    default=None,
    help="Most configurations the spec may expand to, checked before they are built [default: 10,000; at most "
    "100,000, what one machine can prepare; a --dry-run of any size builds only the configurations it shows].",
)
@click.option("--configs-per-task", type=int, default=None, help="Configurations per Slurm array task.")
@click.option("--time-min", type=int, default=None, help="Slurm time limit per configuration, minutes.")
@click.option("--gpus", type=int, default=None, help="GPUs per Slurm array task.")
@click.option("--partition", default=None, help="Slurm partition.")
@click.option("--array-parallelism", type=int, default=None, help="Slurm array tasks running at once.")
@format_option()
def sweep_run(
    spec: Path,
    overrides: tuple[str, ...],
    out: Path,
    executor: str,
    jobs: int,
    dry_run: bool,
    retry_failed: bool,
    max_configs: int | None,
    configs_per_task: int | None,
    time_min: int | None,
    gpus: int | None,
    partition: str | None,
    array_parallelism: int | None,
    fmt: str,
) -> None:
    """Run every configuration of SPEC into OUT (completed runs are skipped; a killed sweep resumes).

    KEY=V1,V2 overrides replace a grid axis (or add one), Hydra-style: uvmlab sweep SPEC workload=gpt2,bert
    oversub=1,2,4 -o DIR. Each run goes to OUT/runs/<workload>-x<F>-pca<on|off>-<short hash>.
    """
    from uvmlab.console import note, print_csv, print_table
    from uvmlab.errors import InputError
    from uvmlab.sweep.runner import executor_plan, plan_entries, render_sbatch, run_sweep
    from uvmlab.sweep.slurm import check_slurm_field
    from uvmlab.sweep.spec import DEFAULT_MAX_CONFIGS, SAMPLE_CONFIGS, load_spec

    sample = SAMPLE_CONFIGS if dry_run else None  # a dry run counts the spec and builds only what it shows
    loaded = load_spec(spec, overrides, max_configs=max_configs or DEFAULT_MAX_CONFIGS, sample=sample)
    overrides: dict[str, tuple[str, Any]] = {
        "configs_per_task": ("--configs-per-task", configs_per_task),
        "time_min": ("--time-min", time_min),
        "gpus_per_task": ("--gpus", gpus),
        "partition": ("--partition", partition),
        "array_parallelism": ("--array-parallelism", array_parallelism),
    }
    checked: dict[str, Any] = {}
    for key, (flag, value) in overrides.items():
        if value is not None:
            try:
                checked[key] = check_slurm_field(key, value)  # the same rules as the spec's slurm: section
            except InputError as exc:
                raise InputError(f"{flag} {exc}") from None
    slurm = replace(loaded.slurm, **checked)
    if dry_run:
        entries = plan_entries(loaded, out)
        plan = executor_plan(loaded, entries, out, executor, slurm)
        if fmt == "json":
            click.echo(
                json.dumps(
                    {
                        "name": loaded.name,
                        "count": loaded.size,
                        "shown": len(entries),
                        "configs": [
                            {"run_id": e.run_id, "status": e.status, "config": e.config.to_dict()} for e in entries
                        ],
                        "plan": plan.to_dict() if plan else None,
                    },
                    indent=2,
                )
            )
            return
        rows = [
            (
                e.run_id,
                e.config.workload.workload,
                e.config.workload.batch_size,
                e.config.oversub,
                "on" if e.config.pca else "off",
                e.config.mode,
                e.status,
            )
            for e in entries
        ]
        cols = ["run", "workload", "batch", "oversub", "PCA", "mode", "status"]
        if fmt == "csv":
            print_csv(("configs", cols, rows))
            return
        title = f"{loaded.name}: {len(entries)} configurations ({loaded.duplicates} duplicates dropped)"
        if loaded.sampled:
            title = (
                f"{loaded.name}: {loaded.size:,} configurations (the product of the axes and the include entries, "
                f"before exclusions and duplicates); the first {len(entries):,}"
            )
        print_table(title, cols, rows)
        if plan is not None:
            click.echo(f"array of {len(plan.chunks)} tasks; submitit parameters: {json.dumps(plan.parameters)}")
            if plan.cluster == "slurm" and plan.chunks:
                click.echo(render_sbatch(plan))
        return
    summary = run_sweep(loaded, out, executor=executor, jobs=jobs, retry_failed=retry_failed, slurm=slurm)
    if fmt == "json":
        click.echo(json.dumps(summary.to_dict(), indent=2))
        _raise_if_failed(summary, out)
        return
    table = (
        f"sweep {loaded.name} -> {out}",
        ["configurations", "skipped (complete)", "ran", "outcomes", "wall time (s)"],
        [
            (
                summary.total,
                summary.skipped,
                summary.ran,
                ", ".join(f"{k} {v}" for k, v in sorted(summary.outcomes.items())) or "-",
                round(summary.wall_time_s, 1),
            )
        ],
    )
    if fmt == "csv":
        print_csv(table)
    else:
        print_table(*table)
    for line in summary.errors:
        note(line, style="yellow")
    note(f"Wrote {summary.results_path}; next: uvmlab report {out}")
    _raise_if_failed(summary, out)


def _raise_if_failed(summary: Any, out: Path) -> None:
    """Exit non-zero (1) when any configuration of the sweep did not succeed, in this run or, not retried, in an
    earlier one; say how many."""
    from uvmlab.errors import UvmlabError

    bad = {k: v for k, v in summary.outcomes.items() if k not in ("ok", "oom") and v}
    if bad or summary.errors:
        n = sum(bad.values())
        kinds = ", ".join(f"{v} {k}" for k, v in sorted(bad.items()))
        raise UvmlabError(
            f"{n} of {summary.ran} configurations did not finish ({kinds or 'array task errors'}); "
            f"see {out}/runs/*/result.json and logs/, and rerun with --retry-failed"
        )
    if summary.failed_earlier:
        raise UvmlabError(
            f"{summary.failed_earlier} of {summary.total} configurations failed in an earlier run of this sweep "
            f"(outcome error) and were not run again; see {out}/runs/*/result.json, and rerun with --retry-failed"
        )


@sweep.command("collect")
@click.argument("out", type=PathParam("inout", folder=True, file_okay=False, path_type=Path))
@format_option()
def sweep_collect(out: Path, fmt: str) -> None:
    """Rebuild OUT/results.parquet from the run directories (one row per complete run)."""
    import pandas as pd

    from uvmlab.console import print_csv, print_table
    from uvmlab.sweep.aggregate import write_results

    path = write_results(out)
    df = pd.read_parquet(path)
    counts = df["outcome"].value_counts().to_dict() if "outcome" in df else {}
    if fmt == "json":
        click.echo(json.dumps({"results": str(path), "rows": len(df), "outcomes": counts}))
        return
    table = (f"{path}", ["rows", "outcomes"], [(len(df), ", ".join(f"{k} {v}" for k, v in counts.items()))])
    if fmt == "csv":
        print_csv(table)
    else:
        print_table(*table)


@click.command("report")
@click.argument(
    "sweep_dir",
    type=PathParam(
        "input",
        folder=True,
        reads=("results.parquet", "sweep.json", "spec.yaml", "runs"),
        file_okay=False,
        exists=True,
        path_type=Path,
    ),
)
@out_option(
    "HTML page to write [default: SWEEP_DIR/report/report.html]; PNGs go beside it in figures/.",
    dest="out_html",
    type=PathParam("output", folder=False, beside=("figures",), dir_okay=False, path_type=Path),
    default=None,
)
@click.option(
    "--force",
    is_flag=True,
    help="Replace an existing -o page and the report's own figures in the figures/ folder beside it.",
)
@format_option()
@figure_format_option()
def report(sweep_dir: Path, out_html: Path | None, force: bool, fmt: str, figure_format: str) -> None:
    """Figures of the seed study (slowdown, per-kernel memory, faults, migrations) and an HTML page for a sweep."""
    from uvmlab.console import note, print_csv, print_table
    from uvmlab.files.outputs import check_output_file, check_output_folder
    from uvmlab.report import build_report
    from uvmlab.report.build import figure_files

    if out_html is not None:  # the default page inside SWEEP_DIR/report is uvmlab's own and is rebuilt freely
        # what the report reads, and what it writes: the page and its figures (not the page's whole folder, which
        # may be the sweep's parent: `uvmlab report SWEEP -o report.html` touches nothing of SWEEP)
        inputs = [sweep_dir / n for n in ("results.parquet", "sweep.json", "spec.yaml", "runs")]
        check_output_file(out_html, inputs, force)
        check_output_folder(out_html.parent / "figures", figure_files(figure_format), inputs, force)

    built = build_report(sweep_dir, out_html, figure_format=figure_format)
    if fmt == "json":
        click.echo(json.dumps(built.to_dict(), indent=2))
        return
    table = (
        f"report of {sweep_dir}",
        ["figure", "file", "runs"],
        [(f.key, str(f.path), f.runs) for f in built.figures],
    )
    if fmt == "csv":
        print_csv(table)
        return
    print_table(*table)
    for skipped in built.skipped:
        note(f"skipped: {skipped}", style="yellow")
    if built.broken:
        note(
            f"{len(built.broken)} run(s) broken (their result.json cannot be read; e.g. runs/{built.broken[0]}): "
            "listed under 'Runs that did not finish', in no figure",
            style="yellow",
        )
    note(f"Wrote {built.html}")


COMMANDS = [sweep, report]
