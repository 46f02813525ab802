"""``uvmlab shim build|path|status``, ``uvmlab doctor``, ``uvmlab gpus`` and ``uvmlab collect``: the GPU path's tools
(logic in uvmlab.measure.gpu, uvmlab.measure.gpu.kit and uvmlab.gpus)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from uvmlab.cli.options import PathParam, format_option, out_option
from uvmlab.numbers import parse_float

FORMAT = format_option()


@click.group("shim")
def shim_group() -> None:
    """The LD_PRELOAD shim that turns cudaMalloc into cudaMallocManaged (see docs/gpu.md)."""


@shim_group.command("build")
@click.option("--force", is_flag=True, help="Rebuild even if the current source is already built.")
@click.option("--cache-dir", type=PathParam("output", folder=True, file_okay=False, path_type=Path), default=None,
              help="Build cache folder.")  # fmt: skip
def shim_build(force: bool, cache_dir: Path | None) -> None:
    """Compile the shim with g++ (no CUDA needed) into the per-user cache and print its path."""
    from uvmlab.measure.gpu.shim import build_shim

    click.echo(str(build_shim(cache_dir=cache_dir, force=force)))


@shim_group.command("path")
@click.option("--cache-dir", type=PathParam("input", folder=True, file_okay=False, path_type=Path), default=None,
              help="Build cache folder.")  # fmt: skip
def shim_path_cmd(cache_dir: Path | None) -> None:
    """Print where the shim for the current source is built (exit 1 if it is not built yet)."""
    from uvmlab.errors import UvmlabError
    from uvmlab.measure.gpu.shim import shim_status

    status = shim_status(cache_dir)
    if not status.built:
        raise UvmlabError(f"the shim is not built yet (it would be at {status.path}); run: uvmlab shim build")
    click.echo(str(status.path))


@shim_group.command("status")
@click.option("--cache-dir", type=PathParam("input", folder=True, file_okay=False, path_type=Path), default=None,
              help="Build cache folder.")  # fmt: skip
@FORMAT
def shim_status_cmd(cache_dir: Path | None, fmt: str) -> None:
    """Whether the shim is built for the current source, where, and with which compiler."""
    from uvmlab.console import print_csv, print_table
    from uvmlab.measure.gpu.shim import shim_status

    s = shim_status(cache_dir)
    doc = {"built": s.built, "path": str(s.path), "compiler": s.compiler, "source": str(s.source)}
    if fmt == "json":
        click.echo(json.dumps(doc, indent=2))
        return
    table = ("uvmlab shim", ["item", "value"], [(k, v) for k, v in doc.items()])
    if fmt == "csv":
        print_csv(table)
    else:
        print_table(*table)


@click.command("doctor")
@FORMAT
def doctor(fmt: str) -> None:
    """What this machine has (GPU, driver, CUDA runtime, torch, nsys, g++, shim), which modes it can run, and which
    memory policies of uvmlab advise it can apply (nvidia_uvm parameters, root, concurrent managed access).

    Exits 1 when the GPU worker cannot import what it needs (a broken install), else 0."""
    from uvmlab.advise.environment import env_rows, policy_marks, probe_env
    from uvmlab.console import print_csv, print_table
    from uvmlab.errors import UvmlabError
    from uvmlab.measure.gpu.doctor import doctor_report

    report = doctor_report()
    env = probe_env()  # uvmlab advise --check-env
    marks = policy_marks(env)
    if fmt == "json":
        report["uvm_environment"] = env.to_dict()
        report["policies"] = [{"policy": p, "here": s, "why": w} for p, s, w in marks]
        click.echo(json.dumps(report, indent=2, default=str))
        if report["fatal"]:
            raise UvmlabError(report["fatal"])
        return
    tables = [
        (
            "This machine",
            ["item", "status", "detail"],
            [(r["item"], "ok" if r["ok"] else "missing", r["detail"]) for r in report["checks"]],
        ),
        (
            "Modes",
            ["item", "status", "detail"],
            [(r["item"], "ok" if r["ok"] else "unavailable", r["detail"]) for r in report["modes"]],
        ),
        ("UVM policies: this machine", ["item", "value"], env_rows(env)),
        ("UVM policies: which this machine can apply (uvmlab advise --check-env)", ["policy", "here", "why"], marks),
    ]
    if fmt == "csv":
        print_csv(tables)
    else:
        for table in tables:
            print_table(*table)
    if report["fatal"]:
        raise UvmlabError(report["fatal"])


@click.command("gpus")
@FORMAT
def gpus_cmd(fmt: str) -> None:
    """List the GPU models uvmlab knows (for --gpu) and the GPU this machine has, if any.

    Figures are vendor datasheet peaks; every number's source is listed (uvmlab/gpus.py). "link" is the sustained
    2 MiB host<->device bandwidth UVM migrations get and "link peak" the link's own limit per direction; "host page"
    the host kernel's page size (64 KiB on POWER9 and Grace); "context" the memory a job cannot use (CUDA context).
    --gpu NAME@DRIVER sets the driver a run describes (default driver: the fault-path generation it selects is in
    the last column).
    """
    from uvmlab.console import note, print_csv, print_table, say
    from uvmlab.gpus import DEFAULT_GPU, GPUS, known_gpu
    from uvmlab.measure.gpu.detect import gpu_status
    from uvmlab.sim.uvm.generations import generation
    from uvmlab.units import format_bytes

    status = gpu_status()
    detected = status.to_dict() | {"known_as": known_gpu(status.name)}
    keys = ["name", "arch", "memory_bytes", "context_bytes", "fp32_flops", "tensor_flops", "hbm_bytes_per_s"]
    keys += ["link_bytes_per_s", "link_peak_bytes_per_s", "link", "coherent", "host_page_bytes", "driver"]
    known = [
        {k: getattr(g, k) for k in keys}
        | {"default": g.name == DEFAULT_GPU, "fault_path": generation(g.driver).name, "sources": dict(g.sources)}
        for g in GPUS.values()
    ]
    if fmt == "json":
        click.echo(json.dumps({"known": known, "detected": detected}, indent=2))
        return
    if fmt == "csv":
        cols = [*keys, "default", "fault_path"]
        print_csv(("known", cols, [[r[k] for k in cols] for r in known]))
        return
    print_table(
        "GPU models uvmlab knows (--gpu NAME[@DRIVER]; --gpu-memory SIZE overrides the memory)",
        [
            *("GPU", "arch", "memory", "FP32 TFLOP/s", "tensor TFLOP/s", "HBM GB/s", "link GB/s", "link peak GB/s"),
            *("link", "host page", "driver", "fault path"),
        ],
        [
            [
                g.name + (" (default)" if g.name == DEFAULT_GPU else ""),
                g.arch,
                format_bytes(g.memory_bytes),
                g.fp32_flops / 1e12,
                g.tensor_flops / 1e12,
                g.hbm_bytes_per_s / 1e9,
                g.link_bytes_per_s / 1e9,
                g.link_limit_bytes_per_s / 1e9,
                g.link,
                format_bytes(g.host_page_bytes),
                g.driver,
                generation(g.driver).name,
            ]
            for g in GPUS.values()
        ],
    )
    print_table(
        "Sources of the figures above",
        ["GPU", "what", "source"],
        [[g.name, w, src] for g in GPUS.values() for w, src in g.sources],
    )
    if status.available:
        match = detected["known_as"]
        say(
            f"This machine: {status.name} ({format_bytes(status.memory_bytes or 0)}), driver {status.driver}, "
            f"CUDA {status.cuda}, {status.device_count} GPU(s); "
            + (f"runs as --gpu {match}" if match else "not a known model: give --gpu and --gpu-memory")
        )
    else:
        note(f"This machine: no GPU detected ({status.reason})")


def _floats(value: str) -> tuple[float, ...]:
    """A comma list of finite positive numbers (``--factors``), each through the one number parser."""
    return tuple(parse_float(x, "--factors", lo=0.0) for x in value.split(",") if x.strip())


@click.command("collect")
@out_option("Folder to write the data sets into (the layout `uvmlab validate DIR` reads).", required=True,
            type=PathParam("output", folder=True, path_type=Path))  # fmt: skip
@click.option(
    "--what",
    default="facts,probe,memory,cudnn,link,run,uvm",
    show_default=True,
    help="Comma list of the sets to record: facts, probe, memory, cudnn, link, run, uvm.",
)
@click.option(
    "--factors",
    default="0.1,0.25",
    show_default=True,
    help="UVM working sets as fractions of the GPU's free memory (streams and GCN).",
)
@click.option(
    "--budget",
    "budget",
    default="540",
    show_default=True,
    help="Seconds the collection may take: the most valuable steps that fit, each stopped at its cap; 'none': all.",
)
@click.option("--resume", is_flag=True, help="Continue a collection in DIR: keep its finished steps, run the rest.")
@click.option(
    "--allow-oversubscription",
    is_flag=True,
    help="Allow factors above 0.9 of the free memory and the oversubscribed microbenchmark rows (a GPU to yourself).",
)
@click.option(
    "--workload",
    "workloads",
    multiple=True,
    help="A training case set NAME or NAME@B1,B2 (repeatable) instead of resnet50, vgg16, convnext_tiny and gpt2.",
)
@click.option("--no-gcn", is_flag=True, help="Leave out the GCN runs of the uvm set.")
@click.option("--gpu", default="A100-80GB", show_default=True, help="GPU a dry run assumes where none is detected.")
@click.option("--dry-run", is_flag=True, help="Print the plan (every step, shell-quoted) and run nothing.")
@click.option("--force", is_flag=True, help="Rerun every step (each output is replaced only when its step succeeds).")
@format_option(csv=False)
def collect_cmd(
    out: Path,
    what: str,
    factors: str,
    budget: str,
    resume: bool,
    allow_oversubscription: bool,
    workloads: tuple[str, ...],
    no_gcn: bool,
    gpu: str,
    dry_run: bool,
    force: bool,
    fmt: str,
) -> None:
    """Record the evidence kit on this machine's GPU: machine facts, the shim and balloon probe, memory snapshots and
    peaks, cuDNN logs, the host-device link, one end-to-end run, UVM streams and the GCN (docs/gpu.md "The first GPU
    run").

    Steps run in value order while their estimates fit --budget (default 540 s), each stopped at its time cap; each
    data set is written as soon as its steps finish, and --resume continues. Every step sizes its managed memory from
    the free memory it measures, minus a margin. The result is read by `uvmlab validate DIR`; `--dry-run` works
    without a GPU.
    """
    from uvmlab.console import note, say
    from uvmlab.errors import UvmlabError
    from uvmlab.measure.gpu.kit.plan import DEFAULT_CASES, CollectOptions, parse_workloads
    from uvmlab.measure.gpu.kit.runner import collect_evidence

    budget_s = (
        None if budget.strip().lower() == "none" else parse_float(budget, "--budget (seconds, or 'none')", lo=1.0)
    )
    opts = CollectOptions(
        budget_s=budget_s,
        resume=resume,
        what=tuple(w.strip() for w in what.split(",") if w.strip()),
        cases=parse_workloads(workloads) if workloads else DEFAULT_CASES,
        factors=_floats(factors),
        allow_oversubscription=allow_oversubscription,
        gcn=not no_gcn,
        gpu=gpu,
        dry_run=dry_run,
        force=force,
    )
    res = collect_evidence(opts, out, progress=lambda name, i, n: say(f"[{i}/{n}] {name}"))
    if fmt == "json":
        click.echo(json.dumps(res, indent=2, default=str))
    elif dry_run:
        click.echo(res["plan"], nl=False)
    else:
        note(f"Wrote {out} (validate it with: uvmlab validate {out})")
    if not dry_run and res.get("failed_steps"):
        failed = res["failed_steps"]
        raise UvmlabError(
            f"{len(failed)} of {len(res['steps'])} steps failed ({', '.join(failed[:3])}); see {out}/collect.json"
        )


COMMANDS = [shim_group, doctor, gpus_cmd, collect_cmd]
