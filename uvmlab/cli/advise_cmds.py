"""``uvmlab advise``: which memory policy makes this job fastest under oversubscription, predicted and ranked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from uvmlab.cli.options import (
    PathParam,
    format_option,
    out_option,
    simulated_gpu_option,
    workload_config,
    workload_options,
)


@click.command("advise")
@click.argument("workload", required=False, type=PathParam("input", maybe_name=True, path_type=str))
@simulated_gpu_option()
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
@click.option(
    "--check-env",
    is_flag=True,
    help="Only report this machine (CUDA runtime and driver, nvidia_uvm parameters, root, concurrent managed "
    "access, the shim) and which policies it can apply; no WORKLOAD needed.",
)
@click.option(
    "--confirm-on-gpu",
    "confirm_n",
    type=int,
    default=None,
    metavar="N",
    help="Then run the job as given and the top N policies uvmlab applies on this machine's GPU (with nsys when on "
    "PATH) and print predicted against measured.",
)
@click.option("--dry-run", is_flag=True, help="With --confirm-on-gpu: print the GPU runs' plans, run nothing.")
@out_option(
    "With --confirm-on-gpu: folder of the run directories [default: runs/confirm-WORKLOAD-xF].",
    default=None,
    metavar="DIR",
)
@workload_options(iterations_default=3)
@format_option("json: one entry per policy (docs/advise.md); csv: one row per policy.")
def advise_command(
    workload: str | None,
    gpu_name: str,
    gpu_memory: str | None,
    oversub: str | None,
    pca: str,
    policies: tuple[str, ...],
    no_combine: bool,
    check_env: bool,
    confirm_n: int | None,
    dry_run: bool,
    out: str | None,
    fmt: str,
    **wl: Any,
) -> None:
    """Simulate WORKLOAD under each memory policy on one GPU and rank them by predicted iteration time.

    Policies: PCA on/off, PYTORCH_CUDA_ALLOC_CONF settings, releasing cached blocks each iteration, UVM driver
    prefetch settings, per-tensor UVM hints, and job shapes (the largest micro-batch that fits with gradient
    accumulation, activation checkpointing, bf16 autocast, activations or optimizer on the CPU, 8-bit optimizer
    state), and combinations of the best. Each row says what its prediction rests on (validated, modelled, upper
    bound), its caveats, whether uvmlab applies it on a GPU and what applying it needs (root, a module reload, a
    code change, CUDA 13); the headline names the best you can apply now and the best validated.

    Example: uvmlab advise gpt2 --oversub 4
    """
    from uvmlab.errors import InputError

    if check_env:
        _print_env(fmt)
        return
    if not workload:
        raise InputError("uvmlab advise needs a WORKLOAD (or --check-env)")
    if dry_run and confirm_n is None:
        raise InputError("--dry-run goes with --confirm-on-gpu N")
    if confirm_n is not None and confirm_n < 1:
        raise InputError(f"--confirm-on-gpu takes a number of policies >= 1, not {confirm_n}")
    if confirm_n is not None and not dry_run:  # before minutes of simulation: is there a GPU to confirm on?
        from uvmlab.errors import UnavailableError
        from uvmlab.run import gpu_availability

        avail = gpu_availability()
        if not avail.available:
            raise UnavailableError(
                f"--confirm-on-gpu needs a CUDA device: {avail.reason or 'none found'} (--dry-run prints the plans)"
            )
    adv, cfg = _advise(workload, gpu_name, gpu_memory, oversub, pca, policies, no_combine, wl)
    if fmt == "json":
        doc = adv.to_dict()
        if confirm_n is not None:
            doc["confirm"] = _confirm(adv, cfg, confirm_n, dry_run, out).to_dict()
        click.echo(json.dumps(doc, default=str))
        return
    if fmt == "csv":
        from uvmlab.console import print_csv

        recs = adv.records()
        cols = list(adv.rows.columns)
        tables = [("advise", cols, [[_csv_cell(r[c]) for c in cols] for r in recs])]
        if confirm_n is not None:  # a second table: predicted against measured
            runs = _confirm(adv, cfg, confirm_n, dry_run, out).rows
            ccols = [c for c in (runs[0] if runs else {}) if c != "plan"]
            tables.append(("confirm", ccols, [[r[c] for c in ccols] for r in runs]))
        print_csv(tables)
        return
    _print_advice(adv)
    if confirm_n is not None:
        _print_confirmation(_confirm(adv, cfg, confirm_n, dry_run, out), adv)


def _advise(
    workload: str,
    gpu_name: str,
    gpu_memory: str | None,
    oversub: str | None,
    pca: str,
    policies: tuple[str, ...],
    no_combine: bool,
    wl: dict[str, Any],
) -> tuple[Any, Any]:
    from uvmlab.advise.advisor import advise
    from uvmlab.config import RunConfig, parse_on_off
    from uvmlab.console import note
    from uvmlab.files.gpu_file import resolve_gpu
    from uvmlab.units import parse_bytes

    gpu_base, gpu_spec = resolve_gpu(gpu_name)
    cfg = RunConfig(
        workload=workload_config(workload, **wl),
        oversub=oversub if oversub is not None else 1.0,
        pca=parse_on_off("--pca", pca),
        mode="sim",
        gpu=gpu_base,
        gpu_memory_bytes=parse_bytes(gpu_memory) if gpu_memory else None,
        gpu_spec=gpu_spec,
    )
    available = None
    if oversub is None:
        from uvmlab.gpus import get_gpu

        available = get_gpu(gpu_base, cfg.gpu_memory_bytes, gpu_spec).usable_bytes
    adv = advise(
        cfg,
        available_bytes=available,
        policies=list(policies) or None,
        combine=not no_combine,
        progress=lambda name: note(f"simulating: {name}"),
    )
    return adv, cfg


def _csv_cell(v: Any) -> Any:
    return " | ".join(str(x) for x in v) if isinstance(v, list) else v


def _needs(r: dict[str, Any]) -> str:
    needs = ", ".join(r["needs"]) or "nothing"
    return needs + ("" if r["uvmlab_gpu"] else "; uvmlab cannot apply it on a GPU")


def _print_advice(adv: Any) -> None:
    from uvmlab.advise.advisor import headline_lines
    from uvmlab.console import note, print_table, say
    from uvmlab.stats.schema import RESULT_LABELS
    from uvmlab.units import format_bytes

    rows = []
    for r in adv.records():
        ok = r["outcome"] == "ok"
        how = r["apply_how"]
        if r["note"]:
            how += f" ({r['note']})"
        for c in r["caveats"]:
            how += f" [caveat: {c}]"
        rows.append(
            (
                "" if r["rank"] is None else r["rank"],
                r["policy"],
                f"{r['iteration_time_ns'] / 1e6:,.1f} ms" if ok else r["outcome"],
                f"{r['time_per_sample_ns'] / 1e6:,.2f} ms" if ok and r["time_per_sample_ns"] else "",
                f"{r['slowdown_vs_native_pca']:.2f}x" if ok else "",
                r["regime"] or "" if ok else "",
                r["evidence"],
                _needs(r),
                format_bytes(r["peak_resident_bytes"]) if ok else "",
                f"{r['fault_count']:,} / {format_bytes(r['migrated_bytes'])}" if ok else "",
                how,
            )
        )
    factor = adv.given_footprint_bytes / adv.available_bytes
    title = (
        f"uvmlab advise: {adv.workload} on {adv.gpu}, {format_bytes(adv.available_bytes)} for UVM, "
        f"job as given needs {format_bytes(adv.given_footprint_bytes)} (x{factor:.2f})"
    )
    for line in headline_lines(adv.headline):
        say(line)
    print_table(
        title,
        (
            "#",
            "policy",
            "iteration",
            "per sample",
            RESULT_LABELS["slowdown_vs_native_pca"],
            "regime",
            "evidence",
            "needs",
            "peak on GPU",
            "faults / migrated",
            "how to apply",
        ),
        rows,
    )
    for n in adv.notes:
        note(n)


def _confirm(adv: Any, cfg: Any, n: int, dry_run: bool, out: str | None) -> Any:
    import shutil
    from dataclasses import replace

    from uvmlab.advise.confirm import confirm
    from uvmlab.console import note
    from uvmlab.run import default_run_dir, run

    nsys = shutil.which("nsys") is not None
    folder = Path(out) if out else default_run_dir(cfg).with_name("confirm-" + default_run_dir(cfg).name)

    def runner(c: Any, where: Path) -> dict[str, Any]:
        note(f"{'planning' if dry_run else 'running'} on the GPU: {c.policy or 'the job as given'} -> {where}")
        opts = {"nsys": nsys, "dry_run": dry_run}
        result = run(replace(c, mode="gpu"), out=where, gpu_options=opts, quiet=True).result
        return {**result, "nsys": nsys and not dry_run}

    return confirm(adv, cfg, n, runner, folder)


def _print_confirmation(conf: Any, adv: Any) -> None:
    from uvmlab.console import note, print_table, say

    for row in conf.rows:
        if row["plan"]:
            say(f"plan of {row['policy']}:")
            say(row["plan"])

    def ms(v: Any) -> str:
        return "" if v is None else f"{v / 1e6:,.1f} ms"

    def x(v: Any) -> str:
        return "" if v is None else f"{v:.2f}x"

    print_table(
        f"predicted ({adv.gpu}) against measured (this GPU)",
        ("policy", "evidence", "predicted", "measured", "predicted / measured", "speedup predicted",
         "speedup measured", "speedup ratio", "nsys"),
        [
            (
                r["policy"], r["evidence"], ms(r["predicted_ns"]), ms(r["measured_ns"]), x(r["time_ratio"]),
                x(r["predicted_speedup"]), x(r["measured_speedup"]), x(r["speedup_ratio"]),
                "yes" if r["nsys"] else "no",
            )
            for r in conf.rows
        ],
    )  # fmt: skip
    for name, why in conf.skipped:
        note(f"not run: {name}: {why}")


def _print_env(fmt: str) -> None:
    from uvmlab.advise.environment import env_rows, policy_marks, probe_env
    from uvmlab.console import print_csv, print_table

    env = probe_env()
    marks = policy_marks(env)
    if fmt == "json":
        doc = {"environment": env.to_dict(), "policies": [{"policy": p, "here": s, "why": w} for p, s, w in marks]}
        click.echo(json.dumps(doc, default=str))
        return
    tables = [
        ("This machine for UVM policies", ["item", "value"], env_rows(env)),
        ("Which policies this machine can apply", ["policy", "here", "why"], marks),
    ]
    if fmt == "csv":
        print_csv(tables)
        return
    for t in tables:
        print_table(*t)


COMMANDS = [advise_command]
