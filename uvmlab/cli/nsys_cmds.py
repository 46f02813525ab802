"""`uvmlab nsys summarize|import`, `uvmlab compare`, `uvmlab calibrate` (Nsight Systems exports, measured vs
simulated)."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any

import click

from uvmlab.cli.options import PathParam, figure_format_option, format_option, out_option
from uvmlab.console import note, print_csv, print_table, scalar_rows
from uvmlab.units import MiB

KERNEL_ROWS_SHOWN = 20
"""Rows of compare's per-kernel table shown as a table (the title says so; csv and json give every kernel)."""
ITERATION_HELP = (
    "Regular expression for iteration NVTX ranges; its first group is the iteration number "
    "[default: 'iteration N', as uvmlab's GPU runner emits]."
)


@click.group("nsys")
def nsys() -> None:
    """Read Nsight Systems SQLite exports (nsys export --type sqlite), 2021.2 to 2026.1 schemas."""


@nsys.command("summarize")
@click.argument("report", type=PathParam("input", folder=False, path_type=Path))
@format_option(
    "table; json; csv: one row per entity, a first column `table` naming its table (export, "
    "what_was_collected, page_faults, um_migrations, um_total_sum_figures, um_sum_top_addresses, attribution, "
    "per_iteration, top_kernels_by_faults, gpu_memory_usage_events); an empty cell = not collected."
)
@click.option(
    "--table",
    "only",
    default=None,
    metavar="NAME",
    help="Only this table (its name in the csv `table` column); csv then has exactly its columns.",
)
@click.option("--iteration-pattern", default=None, help=ITERATION_HELP)
def summarize_cmd(report: Path, fmt: str, only: str | None, iteration_pattern: str | None) -> None:
    """Unified Memory statistics of REPORT.sqlite: faults, migrations, per-kernel and per-iteration attribution.

    Figures that were not collected print n/a (null in JSON, an empty cell in CSV), never 0. Also gives the
    totals of `nsys stats -r um_total_sum,um_sum`, including where those reports refuse to run.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    from uvmlab.console import progress_bar, table_key
    from uvmlab.errors import InputError
    from uvmlab.measure.nsys import schema as S
    from uvmlab.measure.nsys.kernel_stats import DEFAULT_ITERATION_PATTERN
    from uvmlab.measure.nsys.read import open_export
    from uvmlab.measure.nsys.stats import summarize
    from uvmlab.measure.nsys.tables import summary_tables

    with open_export(report) as ex:
        for w in ex.warnings:
            note(f"warning: {w}")
        total = (ex.row_count(S.GPU_FAULTS) or 0) + (ex.row_count(S.MEMCPY) or 0)
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with progress_bar(*columns, disable=total < 1_000_000) as bar:
            task = bar.add_task("reading fault and copy rows", total=total)
            s = summarize(ex, iteration_pattern or DEFAULT_ITERATION_PATTERN, progress=lambda n: bar.advance(task, n))
    if fmt == "json":
        click.echo(json.dumps(s.to_dict(), indent=2, default=str))
        return
    tables = summary_tables(s)
    if only is not None:
        names = [table_key(t[0]) for t in tables]
        if only not in names:
            raise InputError(f"--table takes one of {', '.join(names)}, not {only!r}")
        tables = [t for t in tables if table_key(t[0]) == only]
    if fmt == "csv":
        print_csv(tables)
    else:
        for title, cols, rows in tables:
            print_table(title, cols, rows)


@nsys.command("import")
@click.argument("report", type=PathParam("input", folder=False, path_type=Path))
@out_option("Run directory to write.", type=PathParam("output", folder=True, path_type=Path), required=True)
@click.option("--force", is_flag=True, help="Overwrite a complete run directory, and an existing --timeline file.")
@click.option("--iteration-pattern", default=None, help=ITERATION_HELP)
@format_option()
@click.option(
    "--timeline",
    "timeline_out",
    type=PathParam("output", folder=False, path_type=Path),
    default=None,
    metavar="FILE.json",
    help="Also write a Chrome trace-event timeline (open in ui.perfetto.dev or chrome://tracing).",
)
@figure_format_option()
def import_cmd(
    report: Path,
    out: Path,
    force: bool,
    iteration_pattern: str | None,
    fmt: str,
    timeline_out: Path | None,
    figure_format: str,
) -> None:
    """Write a measured run directory (result.json + iterations/kernels/migrations/memory tables) from REPORT."""
    from uvmlab.measure.nsys.kernel_stats import DEFAULT_ITERATION_PATTERN
    from uvmlab.measure.nsys.measured import import_export

    rd, result = import_export(
        report,
        out,
        force=force,
        iteration_pattern=iteration_pattern or DEFAULT_ITERATION_PATTERN,
        timeline=timeline_out,
        figure_format=figure_format,
    )
    if timeline_out is not None:
        note(f"Wrote timeline {timeline_out}")
    if fmt == "json":
        click.echo(json.dumps(result, indent=2, default=str))
        return
    for w in result["nsys"]["warnings"]:
        note(f"warning: {w}")
    if fmt == "csv":  # result.json's keys and raw values (bytes, nanoseconds), as the other machine formats
        print_csv(("result", ["key", "value"], scalar_rows(result)))
        return
    print_table(f"Measured run: {report.name}", ["", "value"], _measured_rows(result))
    note(rd.summary_line())


def _measured_rows(r: dict) -> list[tuple[str, str]]:
    """The ``nsys import`` summary in words and units (the raw keys and nanoseconds are in result.json and
    --format json/csv); a figure the export does not have says why it is missing."""
    from uvmlab.units import format_bytes

    nsys = r.get("nsys") or {}
    collection = nsys.get("collection") or {}

    def absent(source: str) -> str:
        c = collection.get(source) or {}
        return f"n/a ({c.get('status', 'not collected').replace('_', ' ')}: {c.get('reason', 'not in this export')})"

    def count(n: object, source: str) -> str:
        return absent(source) if n is None else f"{n:,}"

    def moved(key: str) -> str:
        n, b = r.get(f"{key}_count"), r.get(f"{key}_bytes")
        return absent("migrations") if n is None else f"{n:,} ({format_bytes(b or 0)})"

    def size(key: str, source: str) -> str:
        return absent(source) if r.get(key) is None else format_bytes(r[key])

    causes = nsys.get("migrations_by_cause") or {}
    by_cause = ", ".join(f"{k} {v['count']:,} ({format_bytes(v['bytes'])})" for k, v in causes.items() if v["count"])
    its = r.get("iterations")
    total = r.get("total_time_ns")
    faults = r.get("fault_count")
    return [
        ("source", f"{nsys.get('source')} (nsys {nsys.get('nsys_version')}, schema {nsys.get('schema_version')})"),
        ("GPU", r.get("gpu") or "n/a (not in this export)"),
        ("iterations (NVTX ranges)", f"{its:,}" if its else "none (no NVTX ranges match the iteration pattern)"),
        ("iteration time", "n/a" if r.get("iteration_time_ns") is None else f"{r['iteration_time_ns'] / 1e6:,.2f} ms"),
        (
            "time span" + (" (the iterations)" if its else " (first to last GPU activity)"),
            "n/a" if total is None else f"{total / 1e9:,.3f} s",
        ),
        (
            "GPU page faults (read / write)",
            count(faults, "gpu_faults")
            if faults is None
            else f"{faults:,} ({r.get('read_fault_count') or 0:,} / {r.get('write_fault_count') or 0:,})",
        ),
        ("CPU page faults", count(nsys.get("cpu_fault_count"), "cpu_faults")),
        ("HtoD migrations", moved("htod")),
        ("DtoH migrations", moved("dtoh")),
        ("migrations by cause", by_cause or ("none" if causes else absent("migrations"))),
        ("footprint (peak managed)", size("footprint_bytes", "memory_usage")),
        ("peak device-side memory (live allocations)", size("peak_reserved_bytes", "memory_usage")),
    ]


@click.command("compare")
@click.argument("run_a", type=PathParam("input", folder=True, path_type=Path))
@click.argument("run_b", type=PathParam("input", folder=True, path_type=Path))
@out_option("Folder for tables and figures.", type=PathParam("output", folder=True, path_type=Path), default=None)
@click.option("--force", is_flag=True, help="Replace an earlier comparison in -o.")
@format_option(
    "table; json; csv: one row per figure, iteration or kernel (a first column `table`: totals, footprint, "
    "per_iteration, per_kernel)."
)
@figure_format_option()
def compare_cmd(run_a: Path, run_b: Path, out: Path | None, force: bool, fmt: str, figure_format: str) -> None:
    """Compare two run directories side by side (RUN_A is the reference): totals, per iteration, per kernel.

    Works for measured vs simulated and for two simulated runs (e.g. PCA on vs off). Relative error is
    (B - A) / |A|; n/a where either side lacks the figure. With -o, writes comparison.json, tables and figures.
    """
    from uvmlab.measure.compare import compare_runs
    from uvmlab.report.compare_figures import ComparisonDir, write_comparison

    folder = None
    if out is not None:  # before anything is computed: a run directory, a second writer are refused (an input
        # as -o was refused with the command's other paths: uvmlab.cli.options.check_command_paths)
        folder = ComparisonDir(out, figure_format=figure_format)
        folder.prepare(force=force)
    try:
        cmp = compare_runs(run_a, run_b)
        if folder is not None:
            written = write_comparison(cmp, folder)
            note(f"Wrote {out} ({len(written)} files)")
    finally:
        if folder is not None:
            folder.release()
    if fmt == "json":
        click.echo(json.dumps(cmp.to_dict(), indent=2, default=str))
        return
    if fmt == "csv":
        print_csv(cmp.tables())
        return
    from uvmlab.console import table_key

    for title, cols, rows in cmp.tables():
        print_table(title, cols, rows, max_rows=KERNEL_ROWS_SHOWN if table_key(title) == "per_kernel" else None)
    for n in cmp.notes:
        note(n)


@click.command("calibrate")
@click.argument("report", type=PathParam("input", folder=False, path_type=Path), required=False)
@out_option("Parameter file to write (JSON).", type=PathParam("output", folder=False, path_type=Path), required=True)
@click.option(
    "--sim-run",
    type=PathParam("input", folder=True, path_type=Path),
    default=None,
    help="A simulated run of the same job: fits the kernel time scale from matched kernels.",
)
@click.option(
    "--base",
    type=PathParam("input", folder=False, path_type=Path),
    default=None,
    help="Start from this parameter file instead of the built-in defaults.",
)
@click.option(
    "--kernels",
    "kernel_exports",
    multiple=True,
    type=PathParam("input", folder=False, path_type=Path, dir_okay=False),
    help="Fit the native kernel-time classes on this export's kernel table instead (repeatable; each kernel's work "
    "from --work; docs/uvm-sim.md 'Native kernel time by class').",
)
@click.option(
    "--work",
    "work_file",
    type=PathParam("input", folder=False, path_type=Path, dir_okay=False),
    default=None,
    help="Kernel work file of --kernels (CSV: export, kernel, grid, class, flops, bytes, dtype, split, uvm, note) "
    "[default: the shipped one, for the exports in real-data/nsys].",
)
@click.option("--microbench", is_flag=True, help="Measure the parameters on this machine's GPU instead (GPU only).")
@click.option(
    "--microbench-timings",
    type=PathParam("input", folder=False, path_type=Path, dir_okay=False),
    default=None,
    help="Fit to recorded microbenchmark timings instead (a CSV: link/uvmlab_collect/timings.csv of uvmlab collect).",
)
@click.option("--force", is_flag=True, help="Replace an existing parameter file -o.")
@click.option(
    "--memory",
    "memory_csv",
    type=PathParam("input", folder=False, path_type=Path, dir_okay=False),
    default=None,
    help="Fit a software stack's fixed memory costs from measured peaks instead (CSV: workload, batch, measured_mib; "
    "one row is enough); -o is then the stack file uvmlab estimate --stack reads.",
)
@click.option(
    "--gpu",
    "gpu_name",
    default=None,
    help="GPU of the measurements: of --memory [default: A100-40GB]; of REPORT: the profile whose costs the fits are "
    "made against, and which a run keeps for every cost not fitted [default: uvmlab run's, A100-80GB].",
)
@click.option("--module-loading", type=click.Choice(["lazy", "eager"]), default="lazy", show_default=True,
              help="CUDA module loading of the --memory measurements' stack.")  # fmt: skip
@click.option(
    "--uvm-timings",
    type=PathParam("input", folder=True, path_type=Path, file_okay=False),
    default=None,
    help="Fit the RTX 5090 profile from workload timings (real-data/uvm: GCN epochs, uvmbench CSV) instead.",
)
@format_option()
def calibrate_cmd(
    report: Path | None,
    out: Path,
    sim_run: Path | None,
    base: Path | None,
    microbench: bool,
    microbench_timings: Path | None,
    uvm_timings: Path | None,
    force: bool,
    fmt: str,
    memory_csv: Path | None = None,
    gpu_name: str | None = None,
    module_loading: str = "lazy",
    kernel_exports: tuple[Path, ...] = (),
    work_file: Path | None = None,
) -> None:
    """Fit the simulator's cost parameters (uvmlab.sim.uvm.timing.CostParams) from REPORT.sqlite and write them.

    Fits only what the export supports (link bandwidth from UM migrations, per-batch fault cost from GPU fault
    records, per-CPU-fault cost from the gaps between CPU faults, the per-CPU-chunk unmapping and DMA mapping from a
    one-thread kernel's back-to-back faults, kernel time scale with --sim-run) and keeps the defaults for the rest;
    the file says which is which.
    With --microbench-timings CSV it fits the microbenchmark model to timings recorded earlier (e.g. by
    `uvmlab collect`). With --kernels REPORT.sqlite (repeatable) it fits the native kernel-time classes on the
    exports' kernel tables instead (each kernel's FLOPs and bytes from --work), on the work file's declared fit rows,
    and prints every row's measured vs predicted time.
    With --uvm-timings DIR it fits a UVM cost profile from workload timings instead (uvmlab.measure.profile_fit: GCN
    native, UVM and with-user-prefetch epochs at 5M nodes, uvmbench seq_stream in device mode at 0.5x and at 1.25x;
    docs/uvm-sim.md "Cost profiles"). With --memory MEASURED.csv it fits a software stack's fixed memory costs
    (context, library modules, per-handle workspaces; uvmlab.memory.stack) for uvmlab estimate --stack instead.
    """
    from uvmlab.errors import InputError
    from uvmlab.files.outputs import check_output_file
    from uvmlab.measure.calibrate import calibrate, calibrate_from_timings, calibrate_microbench

    check_output_file(out, [report, sim_run, base, microbench_timings, memory_csv, *kernel_exports, work_file], force)
    if kernel_exports:
        from uvmlab.measure.kernel_fit import calibrate_kernels

        doc = calibrate_kernels(list(kernel_exports), out, work_file=work_file, base=base)
        if fmt == "json":
            click.echo(json.dumps(doc, indent=2, default=str))
            return
        cols = ["export", "kernel", "grid", "class", "split", "launches", "measured_us", "predicted_us", "ratio"]
        rows = [[r[c] for c in cols] for r in doc["details"]["kernels"]]
        if fmt == "csv":
            print_csv(("kernels", cols, rows))
            return
        print_table("Native kernel time by class: measured vs predicted", cols, rows)
        for k, v in doc["details"]["fitted_values"].items():
            note(f"fitted {k} = {v:.6g}")
        for n in doc["notes"]:
            note(n)
        note(f"Wrote {out}")
        return

    if memory_csv is not None:
        from uvmlab.memory.stack import calibrate_memory

        fit = calibrate_memory(memory_csv, gpu_name or "A100-40GB", module_loading, progress=note)
        fit.write(out)
        if fmt == "json":
            click.echo(json.dumps(fit.to_json(), indent=2))
            return
        print_table(
            f"Stack fixed costs ({fit.gpu}, {fit.module_loading} module loading)",
            ["row", "workload", "batch", "measured MiB", "predicted MiB", "residual MiB", "own error band MiB",
             "used", "residual after fit MiB"],
            [
                [r["line"], r["workload"], r["batch"], r["measured_bytes"] // MiB, r["predicted_bytes"] // MiB,
                 r["residual_bytes"] // MiB, f"+-{r.get('band_bytes', 0) // MiB}", "yes" if r.get("used") else "no",
                 r.get("residual_after_fit_bytes", 0) // MiB]
                for r in fit.rows
            ],
        )  # fmt: skip
        for n in [*fit.notes, f"stack term (fixed_bytes) {fit.fixed_bytes / MiB:+,.0f} MiB"]:
            note(n)
        note(f"Wrote {out}")
        return
    if uvm_timings is not None:
        from uvmlab.measure.profile_fit import FAULT_PATH, fit_rtx5090, write_profile
        from uvmlab.sim.uvm.timing import CostParams

        costs, details = fit_rtx5090(uvm_timings, CostParams.from_file(base) if base else None)
        write_profile(out, costs, details)
        doc = json.loads(out.read_text())
        doc["fitted"] = dict.fromkeys(
            [
                *FAULT_PATH,
                "link_bytes_per_s",
                "index_memory_efficiency",
                "sector_memory_efficiency",
                "prefetch_first_block_ns",
                "collapse_page_ns",
                *details["serial_refault_costs"],
            ],
            True,
        )
        doc["notes"] = [f"fitted on: {x}" for x in doc["fitted_on"]]
    elif microbench:
        doc = calibrate_microbench(out)
    elif microbench_timings is not None:
        doc = calibrate_from_timings(microbench_timings, out)
    else:
        if report is None:
            raise InputError("give REPORT.sqlite to calibrate from, or --microbench to measure on this GPU")
        doc = calibrate(report, out, sim_run=sim_run, base=base, gpu=gpu_name)
    if fmt == "json":
        click.echo(json.dumps(doc, indent=2, default=str))
        return
    rows = _param_rows(doc)
    if fmt == "csv":
        print_csv(("params", ["parameter", "value", "source"], rows))
        return
    print_table(
        "Cost parameters", ["parameter", "value", "source"], [[k, "per GPU" if v is None else v, s] for k, v, s in rows]
    )
    if doc.get("fitted_against"):
        note(f"Fitted against (and kept at run time for every cost not in the file): {doc['fitted_against']}")
    for n in doc.get("notes", []):
        note(n)
    note(f"Wrote {out}")


PER_GPU = {
    "link_bytes_per_s": "the GPU's link bandwidth (uvmlab.gpus GpuSpec.link_bytes_per_s)",
    "zero_fill_bytes_per_s": "the GPU's HBM bandwidth (uvmlab.gpus GpuSpec.hbm_bytes_per_s)",
}
"""Parameters a file leaves null: CostParams.for_gpu fills them from the run's GPU (uvmlab.sim.uvm.timing)."""


def _param_rows(doc: dict[str, Any]) -> list[list[Any]]:
    """(parameter, value in the file, where a run takes it from) for every cost: fitted, set by the file (--base),
    or, for a cost the file does not set, the run GPU's profile (uvmlab.uvm.simulate.costs_and_source)."""
    from uvmlab.sim.uvm.timing import CostParams

    fitted, params = set(doc.get("fitted", ())), doc.get("params", {})
    rows = []
    for name in (f.name for f in fields(CostParams)):
        if name not in params:
            rows.append([name, "", "the run GPU's profile (not in the file)"])
        elif params[name] is None and name in PER_GPU:
            rows.append([name, None, f"the file: {PER_GPU[name]}"])
        else:
            rows.append([name, params[name], "fitted" if name in fitted else "set by the file"])
    return rows


nsys.add_command(summarize_cmd)
nsys.add_command(import_cmd)

COMMANDS = [nsys, compare_cmd, calibrate_cmd]
