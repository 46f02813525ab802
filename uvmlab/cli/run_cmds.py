"""``uvmlab run``: the main command (simulator on any machine, real GPU where one exists)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from uvmlab.cli.options import (
    PathParam,
    figure_format_option,
    format_option,
    out_option,
    simulated_gpu_option,
    workload_config,
    workload_options,
)
from uvmlab.files.inputs import parse_options


def _summary_rows(r: dict[str, Any], policy: str | None = None) -> list[tuple[str, Any]]:
    """The run's summary table; ``policy``: the --policy it ran with (named on its own row)."""
    from uvmlab.stats.schema import RESULT_LABELS
    from uvmlab.units import format_bytes

    def b(key: str) -> str:
        v = r.get(key)
        return "n/a" if v is None else format_bytes(int(v))

    def ms(key: str) -> str:
        v = r.get(key)
        return "n/a" if v is None or v != v else f"{v / 1e6:,.2f} ms"

    def x(key: str) -> str:
        v = r.get(key)
        return "n/a" if v is None or v != v else f"{v:,.2f}x"

    applied = [("policy", f"{policy} (uvmlab advise; its settings as applied: config.json)")] if policy else []
    return [
        ("workload", r.get("workload")),
        *applied,
        ("mode", r.get("mode")),
        ("PCA", "on" if r.get("pca") else "off"),
        ("oversubscription", _oversub_label(r)),
        ("GPU", r.get("gpu")),
        ("footprint (peak managed)", b("footprint_bytes")),
        ("available to UVM", b("available_bytes")),
        ("iterations", r.get("iterations")),
        ("iteration time", ms("iteration_time_ns")),
        (RESULT_LABELS["native_time_ns"], ms("native_time_ns")),
        (RESULT_LABELS["slowdown_vs_native"], x("slowdown_vs_native")),
        (RESULT_LABELS["native_pca_time_ns"], ms("native_pca_time_ns")),
        (RESULT_LABELS["slowdown_vs_native_pca"], x("slowdown_vs_native_pca")),
        (
            "page faults (read / write)",
            f"{r.get('fault_count', 0):,} ({r.get('read_fault_count', 0):,} / {r.get('write_fault_count', 0):,})",
        ),
        ("fault batches", r.get("fault_batch_count")),
        ("HtoD migrations", f"{r.get('htod_count', 0):,} ({b('htod_bytes')})"),
        ("DtoH migrations", f"{r.get('dtoh_count', 0):,} ({b('dtoh_bytes')})"),
        ("evicted chunks", r.get("eviction_count")),
        ("zero-filled (no transfer)", b("zero_fill_bytes")),
        ("retained cudaMemcpy HtoD", b("memcpy_htod_bytes")),
        *_breakdown_rows(r),
        *_regime_rows(r),
    ]


def _regime_rows(r: dict[str, Any]) -> list[tuple[str, Any]]:
    """The regime (result.json ``regime``: fits, paging or thrashing, and why), when the run has one."""
    reg = r.get("regime") or {}
    if not reg.get("verdict"):
        return []
    return [("regime", f"{reg['verdict']}: {reg['why']}")]


def _breakdown_rows(r: dict[str, Any]) -> list[tuple[str, Any]]:
    """The time breakdown (result.json ``time_breakdown_ns``, per iteration) as one row, when the run has one."""
    bd = r.get("time_breakdown_ns") or {}
    if not bd:
        return []
    label = {"other_ns": "other (allocator calls less stream overlap)"}
    parts = [
        f"{label.get(k, k.removesuffix('_ns').replace('_', ' '))} {v / 1e6:,.2f}"
        for k, v in bd.items()
        if v == v and round(v / 1e6, 2) != 0
    ]
    return [("time per iteration (ms)", ", ".join(parts) or "n/a")]


def _oversub_label(r: dict[str, Any]) -> str:
    """The oversubscription factor the run had: footprint / GPU memory (``effective_oversub``), and the factor asked
    for when they differ (a policy runs on the GPU memory of the job as given; a job that does not fit)."""
    asked, achieved = r.get("oversub"), r.get("effective_oversub")
    if achieved is None or asked is None or abs(achieved - asked) <= 0.005 * asked:
        return f"x{asked:g}"
    return f"x{achieved:.3g} (footprint / GPU memory; x{asked:g} asked for the job as given)"


@click.command("run")
@click.argument("workload", type=PathParam("input", maybe_name=True, path_type=str))
@click.option(
    "--oversub",
    "-f",
    default="1",
    show_default=True,
    metavar="F",
    help="Oversubscription factor: footprint / GPU memory available to UVM (<= 1: none).",
)
@click.option(
    "--pca",
    default="on",
    show_default=True,
    metavar="on|off",
    help="PyTorch caching allocator on, or off (PYTORCH_NO_CUDA_MEMORY_CACHING=1: one range per tensor).",
)
@click.option(
    "--mode",
    type=click.Choice(("sim", "gpu", "auto")),
    default="auto",
    show_default=True,
    help="auto: the GPU where a CUDA device and the shim exist, else the simulator.",
)
@simulated_gpu_option()
@click.option("--gpu-memory", default=None, metavar="SIZE", help="Override the GPU's memory, e.g. 40GiB.")
@click.option(
    "--gpu-set",
    "gpu_sets",
    multiple=True,
    metavar="KEY=VALUE",
    help="Change one number of the GPU, e.g. --gpu-set sm_count=34 --gpu-set hbm_bytes_per_s=288GB/s (repeatable; "
    "keys: uvmlab.gpus.SPEC_KEYS, docs/uvm-sim.md 'GPUs not in the list').",
)
@workload_options(iterations_default=3)
@click.option(
    "--prefetch/--no-prefetch",
    default=True,
    show_default=True,
    help="The driver's tree prefetcher (uvm_perf_prefetch_enable).",
)
@click.option(
    "--sim-option",
    "sim_options",
    multiple=True,
    metavar="KEY=VALUE",
    help="Simulator knob, e.g. --sim-option prefetch_threshold=75 (see docs/uvm-sim.md).",
)
@click.option(
    "--params",
    "params_file",
    type=PathParam("input", folder=False, path_type=str),
    default=None,
    metavar="FILE",
    help="Simulator cost parameters (JSON written by uvmlab calibrate).",
)
@out_option(
    "Run directory [default: runs/<workload>-x<F>-pca<on|off>[-<policy>]-<hash>, <hash> = the first 8 hex digits of "
    "the configuration's SHA-256 (uvmlab.config.RunConfig.config_hash), so distinct settings never share a folder; "
    "run again, the stored result of the same simulation is shown, or the run goes to <dir>-2, -3, ...].",
    default=None,
    metavar="DIR",
)
@click.option(
    "--force",
    is_flag=True,
    help="Overwrite a complete run directory (-o, or the default one), and an existing --snapshot or --timeline file.",
)
@format_option("json: print result.json on stdout only; csv: its scalar keys as key,value rows.")
@click.option("--dry-run", is_flag=True, help="GPU mode: print the plan, run nothing.")
@click.option(
    "--footprint",
    default=None,
    metavar="measure|estimate|BYTES",
    help="GPU mode: how to size the balloon (measure a warm-up, the simulator's estimate, or bytes).",
)
@click.option("--baseline", is_flag=True, help="GPU mode: also run without UVM for the slowdown baseline.")
@click.option("--nsys", is_flag=True, help="GPU mode: profile with Nsight Systems (UM faults and migrations).")
@click.option("--alloc-conf", default=None, metavar="CONF", help="GPU mode: PYTORCH_CUDA_ALLOC_CONF to set.")
@click.option(
    "--strict-factor",
    is_flag=True,
    help="GPU mode: fail when the measured oversubscription factor is more than 5% from the requested one.",
)
@click.option(
    "--policy",
    default=None,
    metavar="NAME",
    help="A memory policy of uvmlab advise (e.g. release-each-iteration; combine with +), on the GPU memory the "
    "job as given has at --oversub.",
)
@click.option(
    "--snapshot",
    "snapshot_out",
    type=PathParam("output", folder=False, path_type=str),
    default=None,
    metavar="FILE.pickle",
    help="Also write a PyTorch memory snapshot (simulated runs; open at pytorch.org/memory_viz).",
)
@click.option(
    "--timeline",
    "timeline_out",
    type=PathParam("output", folder=False, path_type=str),
    default=None,
    metavar="FILE.json",
    help="Also write a Chrome trace-event timeline (open in ui.perfetto.dev or chrome://tracing).",
)
@figure_format_option()
def run_command(
    workload: str,
    oversub: str,
    pca: str,
    mode: str,
    gpu_name: str,
    gpu_memory: str | None,
    gpu_sets: tuple[str, ...],
    prefetch: bool,
    sim_options: tuple[str, ...],
    params_file: str | None,
    out: str | None,
    force: bool,
    fmt: str,
    dry_run: bool,
    footprint: str | None,
    baseline: bool,
    nsys: bool,
    alloc_conf: str | None,
    strict_factor: bool,
    policy: str | None,
    snapshot_out: str | None,
    timeline_out: str | None,
    figure_format: str,
    **wl: Any,
) -> None:
    """Run WORKLOAD under CUDA Unified Memory at an oversubscription factor, with PCA on or off.

    Simulates the UVM driver on this machine (--mode sim), or runs on a real GPU through the shim (--mode gpu).
    Writes a run directory (config.json, env.json, result.json, tables/*.parquet, figures/*.png) and prints a
    summary.

    Example: uvmlab run gpt2 --oversub 4 --pca off
    """
    from uvmlab.config import RunConfig, parse_on_off
    from uvmlab.console import note, print_csv, print_table, say, scalar_rows
    from uvmlab.files.gpu_file import resolve_gpu
    from uvmlab.run import run
    from uvmlab.units import parse_bytes

    gpu_base, gpu_spec = resolve_gpu(gpu_name, gpu_sets)
    cfg = RunConfig(
        workload=workload_config(workload, **wl),
        oversub=oversub,  # validated by check_oversub
        pca=parse_on_off("--pca", pca),
        mode=mode,
        gpu=gpu_base,
        gpu_memory_bytes=parse_bytes(gpu_memory) if gpu_memory else None,
        gpu_spec=gpu_spec,
        prefetch=prefetch,
        params_file=params_file,
        sim_options=parse_options(sim_options, "--sim-option"),
        policy=policy,
    )
    gpu_flags = {
        "dry_run": dry_run,
        "footprint": footprint,
        "baseline": baseline,
        "nsys": nsys,
        "alloc_conf": alloc_conf,
        "strict_factor": strict_factor,
    }
    res = run(
        cfg,
        out=out,
        force=force,
        gpu_options=gpu_flags,
        progress=_progress("simulating kernels"),
        capture_progress=_progress("capturing the trace (cached afterwards)"),
        snapshot=snapshot_out,
        timeline=timeline_out,
        figure_format=figure_format,
    )
    for what, file in (("snapshot", snapshot_out), ("timeline", timeline_out)):
        if file is not None and not res.result.get("dry_run") and Path(file).is_file():
            note(f"Wrote {what} {file}")
    from uvmlab.files.rundir import RunDir

    where = f"Stored in {res.path} (shown again)" if res.reused else RunDir(res.path).summary_line()
    if fmt == "json":
        click.echo(json.dumps(res.result, default=str))
        if not res.result.get("dry_run"):
            note(where)
        return
    if res.result.get("dry_run"):
        click.echo(res.result["plan"], nl=False)
        return
    if fmt == "csv":
        print_csv(("result", ("key", "value"), scalar_rows(res.result)))
        note(where)
        return
    print_table("uvmlab run", ("", "value"), _summary_rows(res.result, policy))
    say(where)


def _progress(label: str) -> Any:
    """A progress callback drawing a rich bar on stderr (transient)."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    from uvmlab.console import progress_bar

    state: dict[str, Any] = {}

    def update(done: int, total: int) -> None:
        if "p" not in state:
            p = progress_bar(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
            p.start()
            state["p"], state["t"] = p, p.add_task(label, total=total)
        state["p"].update(state["t"], completed=done, total=total)
        if done >= total:
            state["p"].stop()

    return update


COMMANDS = [run_command]
