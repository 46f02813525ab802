"""``uvmlab advise``: which memory policy makes this job fastest under oversubscription, predicted and ranked."""

from __future__ import annotations

import json
from typing import Any

import click

from uvmlab.cli.options import format_option, workload_config, workload_options


@click.command("advise")
@click.argument("workload")
@click.option(
    "--gpu",
    "gpu_name",
    default="A100-80GB",
    show_default=True,
    help="GPU model, optionally NAME@DRIVER (the driver version sets the fault-path costs; see uvmlab gpus).",
)
@click.option("--gpu-memory", default=None, metavar="SIZE", help="Override the GPU's memory, e.g. 24GiB.")
@click.option(
    "--oversub",
    "-f",
    default=None,
    metavar="F",
    help="Give the job footprint / F of GPU memory [default: the GPU's usable memory].",
)
@click.option("--pca", "pca", default="on", show_default=True, metavar="on|off", help="The job as given: PCA on/off.")
@click.option("--policy", "policies", multiple=True, metavar="NAME", help="Only these policies (repeatable).")
@click.option("--no-combine", is_flag=True, help="Do not simulate combinations of the best policies.")
@workload_options(iterations_default=3)
@format_option("json: one entry per policy (docs/advise.md); csv: one row per policy.")
def advise_command(
    workload: str,
    gpu_name: str,
    gpu_memory: str | None,
    oversub: str | None,
    pca: str,
    policies: tuple[str, ...],
    no_combine: bool,
    fmt: str,
    **wl: Any,
) -> None:
    """Simulate WORKLOAD under each memory policy on one GPU and rank them by predicted iteration time.

    Policies: PCA on/off, PYTORCH_CUDA_ALLOC_CONF settings, releasing cached blocks each iteration, UVM driver
    prefetch settings, the largest batch that fits with gradient accumulation, and combinations of the best.
    Each row says how to apply the policy on a real GPU; `uvmlab run --policy NAME` runs one.
    Job shape also: activation checkpointing (re-traced) and CPU offload of the optimizer state (docs/advise.md).

    Example: uvmlab advise gpt2 --oversub 4
    """
    from uvmlab.advise.advisor import advise
    from uvmlab.config import RunConfig, parse_on_off
    from uvmlab.console import note, print_table
    from uvmlab.stats.schema import RESULT_LABELS
    from uvmlab.units import format_bytes, parse_bytes

    cfg = RunConfig(
        workload=workload_config(workload, **wl),
        oversub=oversub if oversub is not None else 1.0,
        pca=parse_on_off("--pca", pca),
        mode="sim",
        gpu=gpu_name,
        gpu_memory_bytes=parse_bytes(gpu_memory) if gpu_memory else None,
    )
    available = None
    if oversub is None:
        from uvmlab.gpus import get_gpu

        available = get_gpu(gpu_name, cfg.gpu_memory_bytes).usable_bytes
    adv = advise(
        cfg,
        available_bytes=available,
        policies=list(policies) or None,
        combine=not no_combine,
        progress=lambda name: note(f"simulating: {name}"),
    )
    if fmt == "json":
        click.echo(json.dumps(adv.to_dict(), default=str))
        return
    if fmt == "csv":
        from uvmlab.console import print_csv

        cols = list(adv.rows.columns)
        print_csv(("advise", cols, adv.rows.astype(object).to_numpy().tolist()))
        return
    rows = []
    for r in adv.rows.to_dict(orient="records"):
        ok = r["outcome"] == "ok"
        rows.append(
            (
                "" if r["rank"] is None or r["rank"] != r["rank"] else int(r["rank"]),
                r["policy"],
                f"{r['iteration_time_ns'] / 1e6:,.1f} ms" if ok else r["outcome"],
                f"{r['slowdown_vs_native_pca']:.2f}x" if ok else "",
                format_bytes(r["peak_resident_bytes"]) if ok else "",
                f"{int(r['fault_count']):,} / {format_bytes(r['migrated_bytes'])}" if ok else "",
                r["apply_how"] + (f" ({r['note']})" if r["note"] else ""),
            )
        )
    factor = adv.given_footprint_bytes / adv.available_bytes
    title = (
        f"uvmlab advise: {adv.workload} on {adv.gpu}, {format_bytes(adv.available_bytes)} for UVM, "
        f"job as given needs {format_bytes(adv.given_footprint_bytes)} (x{factor:.2f})"
    )
    print_table(
        title,
        (
            "#",
            "policy",
            "iteration",
            RESULT_LABELS["slowdown_vs_native_pca"],
            "peak on GPU",
            "faults / migrated",
            "how to apply",
        ),
        rows,
    )
    for n in adv.notes:
        note(n)


COMMANDS = [advise_command]
