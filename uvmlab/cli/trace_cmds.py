"""CLI: ``uvmlab trace WORKLOAD -o DIR`` (capture), ``uvmlab trace show DIR`` and ``uvmlab workloads``."""

from __future__ import annotations

from typing import Any

import click

from uvmlab.cli.options import PathParam, format_option, out_option, workload_config, workload_options
from uvmlab.config import CAPTURE_DEVICES
from uvmlab.console import err, note, out, plain, print_csv, print_table, say
from uvmlab.files.atomic import to_json
from uvmlab.units import format_bytes

TRACE_TERMS = """\b
Terms:
  event N        the Nth entry of the trace's one global sequence of allocations, frees and kernels
                 (the trace's `seq` column): where in the run something happened
  allocations    tensor storages allocated (requested bytes, before the allocator's rounding)
  accesses       (kernel, storage) pairs: which tensors each kernel reads or writes
  live at peak   requested bytes of storages alive at the peak, by category
  FLOP           floating-point operations of the kernels (shape formulas, see docs/trace.md)"""


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


def _summary_tables(s: dict[str, Any]) -> list[Any]:
    """The trace summary's two tables with raw numbers (for CSV)."""
    cats = ["category", "allocations", "allocated_bytes", "live_at_peak_bytes"]
    phases = ["phase", "allocations", "allocated_bytes", "kernels", "flops"]
    return [
        ("Bytes per category", cats, [[c[k] for k in cats] for c in s["categories"]]),
        ("Per phase", phases, [[p[k] for k in phases] for p in s["phases"]]),
    ]


def _print_summary(s: dict[str, Any], fmt: str = "table") -> None:
    if fmt == "csv":
        print_csv(_summary_tables(s))
        return
    say(
        f"{s['workload']} on {s['capture_device']}: batch {s['batch_size']}, {s['iterations']} iterations; "
        f"{s['allocations']:,} allocations, {s['frees']:,} frees, {s['kernels']:,} kernels "
        f"({s['total_flops']:.4g} FLOP), {s['accesses']:,} accesses (kernel reads/writes of a tensor)"
    )
    when = (
        f"trace event {s['peak_seq']} (of its alloc/free/kernel sequence), "
        f"{s['peak_phase']} of iteration {s['peak_iteration']}"
    )
    say(f"peak live tensor bytes: {format_bytes(s['peak_live_bytes'])} at {when}")
    if s.get("parameter_bytes") is not None:
        say(f"model parameters: {format_bytes(s['parameter_bytes'])}")
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
        say(f"note: {n}")


@trace_group.command("capture")
@click.argument("workload", type=PathParam("input", maybe_name=True, path_type=str))
@out_option(
    "Trace folder to write.", dest="out_dir", required=True, type=PathParam("output", folder=True, file_okay=False)
)
@click.option("--device", type=click.Choice(CAPTURE_DEVICES), default="meta", show_default=True)
@click.option(
    "--no-emulate-cuda",
    is_flag=True,
    help="Do not route SDPA to CUDA's flash/efficient kernels (for comparing meta with cpu captures).",
)
@click.option("--force", is_flag=True, help="Replace a trace already in -o.")
@format_option()
@workload_options()
def trace_capture(
    workload: str, out_dir: str, device: str, no_emulate_cuda: bool, force: bool, fmt: str, **kw: Any
) -> None:
    """Capture N training iterations of WORKLOAD into the trace folder -o DIR and print its summary."""
    # (terms: see uvmlab trace show --help)

    cfg = workload_config(workload, **kw)  # the settings are checked before torch is imported

    from uvmlab.console import progress_bar
    from uvmlab.trace.schema import TraceFolder, write_trace

    TraceFolder(out_dir).check(force)  # a folder uvmlab may not write is refused before torch is loaded

    from workloads.registry import load_workload, workload_identity

    workload_identity(cfg.workload)  # a workload file is read (and refused) before torch is loaded
    from uvmlab.trace.capture import capture_trace
    from uvmlab.trace.summary import summarize

    load_workload(cfg.workload).resolve_options(cfg)  # a bad name or option is refused before -o DIR is made
    with TraceFolder.for_writing(out_dir, force) as folder:  # the writer's lock, held until the header is written
        with progress_bar(disable=fmt != "table") as bar:
            task = bar.add_task(plain(f"capturing {workload} on {device}"), total=cfg.iterations)

            def progress(done: int, total: int) -> None:
                bar.update(task, completed=done)

            trace = capture_trace(cfg, device=device, progress=progress, emulate_cuda=not no_emulate_cuda)
        write_trace(trace, folder)
    summary = summarize(trace)
    if fmt == "json":
        click.echo(to_json({"trace": str(out_dir), **summary}), nl=False)
        return
    note(f"wrote {out_dir} in {trace.header['capture_seconds']:.1f} s")
    _print_summary(summary, fmt)


@trace_group.command("show", epilog=TRACE_TERMS)
@click.argument("directory", type=PathParam("input", folder=True, file_okay=False))
@format_option()
def trace_show(directory: str, fmt: str) -> None:
    """Summarize the trace folder DIRECTORY: counts, bytes per category, peak live bytes, phases, FLOPs."""
    from uvmlab.trace.schema import read_trace
    from uvmlab.trace.summary import summarize

    summary = summarize(read_trace(directory))
    if fmt == "json":
        click.echo(to_json(summary), nl=False)
        return
    _print_summary(summary, fmt)


@click.command("workloads")
@click.option(
    "--parameters",
    "-p",
    is_flag=True,
    help="Also count each model's parameters (builds it on the meta device: imports torch, a few seconds).",
)
@click.option("--all", "show_all", is_flag=True, help="Also list every torchvision:, timm: and hf: model name.")
@format_option()
def workloads_cmd(parameters: bool, show_all: bool, fmt: str) -> None:
    """List the built-in workloads: default (seed study) batch size, options (and, with -p, parameter counts).

    Listing is instant (no torch import). With --all, also the named models: torchvision:NAME, timm:NAME (listed
    from the installed packages) and hf:ARCH (built-in configs, or any transformers config.json). Give a Python
    workload file instead of a name anywhere a WORKLOAD is taken (docs/workloads.md).
    """
    from workloads.info import describe_workloads, named_models

    with err.status("listing workloads") as status:
        rows = describe_workloads(parameters, progress=lambda n: status.update(plain(f"counting parameters of {n}")))
        named = named_models() if show_all else []
    if fmt == "json":
        click.echo(to_json({"builtin": rows, "named": named} if show_all else rows), nl=False)
        return
    cols = ["workload", "default batch", "parameters", "options", "description"]
    if fmt == "csv":
        keys = ["name", "default_batch_size", "parameters", "options", "description"]
        body = [[r[k] if k != "options" else " ".join(r[k]) for k in keys] for r in rows]
        tables = [("workloads", keys, body)]
        if show_all:  # every named model, one row each (the table lists them as one line per family)
            named_rows = [[f"{f['prefix']}:{n}", f["package"], f["note"]] for f in named for n in f["names"]]
            tables.append(("named models", ["name", "package", "note"], named_rows))
        print_csv(tables)
        return
    print_table(
        "Built-in workloads (or give a Python workload file: docs/workloads.md)",
        cols,
        [
            [
                r["name"],
                r["default_batch_size"],
                None if r["parameters"] is None else f"{r['parameters'] / 1e6:.1f} M",
                ", ".join(r["options"]),
                r["description"],
            ]
            for r in rows
        ],
    )
    if not parameters:
        note("parameters: n/a until counted; add --parameters (-p) to build each model on the meta device")
    for fam in named:
        out.print(f"\n{fam['prefix']}:NAME ({fam['package']}; {len(fam['names'])} models; {fam['note']})")
        out.print(", ".join(fam["names"]), soft_wrap=False, highlight=False)


COMMANDS = [trace_group, workloads_cmd]
