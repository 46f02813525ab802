"""CLI: ``uvmlab trace WORKLOAD -o DIR`` (capture), ``uvmlab trace show DIR`` and ``uvmlab workloads``."""

from __future__ import annotations

from typing import Any

import click

from uvmlab.atomic import to_json
from uvmlab.cli.options import workload_config, workload_options
from uvmlab.config import CAPTURE_DEVICES
from uvmlab.console import err, out, print_table
from uvmlab.units import format_bytes

FORMATS = click.Choice(["table", "json"])


class _TraceGroup(click.Group):
    """A group whose first word falls back to ``capture`` when it is not a subcommand (``trace gpt2 -o D``)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("-h", "--help"):
            args = ["capture", *args]
        return super().parse_args(ctx, args)


@click.group("trace", cls=_TraceGroup)
def trace_group() -> None:
    """Capture a workload's trace, or summarize a trace folder.

    \b
    uvmlab trace WORKLOAD -o DIR [options]   capture (same as: uvmlab trace capture WORKLOAD -o DIR)
    uvmlab trace show DIR                    summarize a trace folder

    WORKLOAD is a built-in name (uvmlab workloads) or a Python workload file (docs/workloads.md).
    Capture runs on the meta device by default (no memory needed, CUDA's choices emulated).
    """


def _print_summary(s: dict[str, Any]) -> None:
    out.print(
        f"{s['workload']} on {s['capture_device']}: batch {s['batch_size']}, {s['iterations']} iterations; "
        f"{s['allocations']:,} allocations, {s['frees']:,} frees, {s['kernels']:,} kernels "
        f"({s['total_flops']:.4g} FLOP), {s['accesses']:,} accesses"
    )
    when = f"seq {s['peak_seq']}, {s['peak_phase']} of iteration {s['peak_iteration']}"
    out.print(f"peak live tensor bytes: {format_bytes(s['peak_live_bytes'])} ({when})")
    if s.get("parameter_bytes") is not None:
        out.print(f"model parameters: {format_bytes(s['parameter_bytes'])}")
    print_table(
        "Bytes per category",
        ["category", "allocations", "allocated", "live at peak"],
        [
            [c["category"], c["allocations"], format_bytes(c["allocated_bytes"]), format_bytes(c["live_at_peak_bytes"])]
            for c in s["categories"]
        ],
    )
    print_table(
        "Per phase",
        ["phase", "allocations", "allocated", "kernels", "FLOP"],
        [
            [p["phase"], p["allocations"], format_bytes(p["allocated_bytes"]), p["kernels"], p["flops"]]
            for p in s["phases"]
        ],
    )
    for n in s["notes"]:
        out.print(f"note: {n}")


@trace_group.command("capture")
@click.argument("workload")
@click.option("--out", "-o", "out_dir", required=True, type=click.Path(file_okay=False), help="Trace folder to write.")
@click.option("--device", type=click.Choice(CAPTURE_DEVICES), default="meta", show_default=True)
@click.option(
    "--no-emulate-cuda",
    is_flag=True,
    help="Do not route SDPA to CUDA's flash/efficient kernels (for comparing meta with cpu captures).",
)
@click.option("--force", is_flag=True, help="Replace a trace already in -o.")
@click.option("--format", "fmt", type=FORMATS, default="table", show_default=True)
@workload_options()
def trace_capture(
    workload: str, out_dir: str, device: str, no_emulate_cuda: bool, force: bool, fmt: str, **kw: Any
) -> None:
    """Capture N training iterations of WORKLOAD into the trace folder -o DIR and print its summary."""
    from pathlib import Path

    from rich.progress import Progress

    from uvmlab.outputs import check_output_folder
    from uvmlab.trace.capture import capture_trace
    from uvmlab.trace.schema import SCHEMAS, write_trace
    from uvmlab.trace.summary import summarize

    cfg = workload_config(workload, **kw)
    names = ["trace.json", *(f"{n}.parquet" for n in SCHEMAS)]
    check_output_folder(out_dir, names, [workload] if Path(workload).exists() else [], force)
    with Progress(console=err, transient=True, disable=fmt == "json") as bar:
        task = bar.add_task(f"capturing {workload} on {device}", total=cfg.iterations)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done)

        trace = capture_trace(cfg, device=device, progress=progress, emulate_cuda=not no_emulate_cuda)
    write_trace(trace, out_dir)
    summary = summarize(trace)
    if fmt == "json":
        click.echo(to_json({"trace": str(out_dir), **summary}), nl=False)
        return
    err.print(f"wrote {out_dir} in {trace.header['capture_seconds']:.1f} s")
    _print_summary(summary)


@trace_group.command("show")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--format", "fmt", type=FORMATS, default="table", show_default=True)
def trace_show(directory: str, fmt: str) -> None:
    """Summarize the trace folder DIRECTORY: counts, bytes per category, peak live bytes, phases, FLOPs."""
    from uvmlab.trace.schema import read_trace
    from uvmlab.trace.summary import summarize

    summary = summarize(read_trace(directory))
    if fmt == "json":
        click.echo(to_json(summary), nl=False)
        return
    _print_summary(summary)


@click.command("workloads")
@click.option("--format", "fmt", type=FORMATS, default="table", show_default=True)
def workloads_cmd(fmt: str) -> None:
    """List the built-in workloads: default (seed study) batch size, parameter count, options."""
    from workloads.info import describe_workloads

    rows = describe_workloads()
    if fmt == "json":
        click.echo(to_json(rows), nl=False)
        return
    print_table(
        "Built-in workloads (or give a Python workload file: docs/workloads.md)",
        ["workload", "default batch", "parameters", "options"],
        [[r["name"], r["default_batch_size"], f"{r['parameters'] / 1e6:.1f} M", ", ".join(r["options"])] for r in rows],
    )


COMMANDS = [trace_group, workloads_cmd]
