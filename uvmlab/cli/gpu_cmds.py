"""``uvmlab shim build|path|status``, ``uvmlab doctor`` and ``uvmlab gpus``: the GPU path's tools (logic in
uvmlab.measure.gpu and uvmlab.gpus)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from uvmlab.cli.options import format_option

FORMAT = format_option()


@click.group("shim")
def shim_group() -> None:
    """The LD_PRELOAD shim that turns cudaMalloc into cudaMallocManaged (see docs/gpu.md)."""


@shim_group.command("build")
@click.option("--force", is_flag=True, help="Rebuild even if the current source is already built.")
@click.option("--cache-dir", type=click.Path(file_okay=False, path_type=Path), default=None, help="Build cache folder.")
def shim_build(force: bool, cache_dir: Path | None) -> None:
    """Compile the shim with g++ (no CUDA needed) into the per-user cache and print its path."""
    from uvmlab.measure.gpu.shim import build_shim

    click.echo(str(build_shim(cache_dir=cache_dir, force=force)))


@shim_group.command("path")
@click.option("--cache-dir", type=click.Path(file_okay=False, path_type=Path), default=None, help="Build cache folder.")
def shim_path_cmd(cache_dir: Path | None) -> None:
    """Print where the shim for the current source is built (exit 1 if it is not built yet)."""
    from uvmlab.errors import UvmlabError
    from uvmlab.measure.gpu.shim import shim_status

    status = shim_status(cache_dir)
    if not status.built:
        raise UvmlabError(f"the shim is not built yet (it would be at {status.path}); run: uvmlab shim build")
    click.echo(str(status.path))


@shim_group.command("status")
@click.option("--cache-dir", type=click.Path(file_okay=False, path_type=Path), default=None, help="Build cache folder.")
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
    memory policies of uvmlab advise it can apply (nvidia_uvm parameters, root, concurrent managed access)."""
    from uvmlab.advise.environment import env_rows, policy_marks, probe_env
    from uvmlab.console import print_csv, print_table
    from uvmlab.measure.gpu.doctor import doctor_report

    report = doctor_report()
    env = probe_env()  # uvmlab advise --check-env
    marks = policy_marks(env)
    if fmt == "json":
        report["uvm_environment"] = env.to_dict()
        report["policies"] = [{"policy": p, "here": s, "why": w} for p, s, w in marks]
        click.echo(json.dumps(report, indent=2, default=str))
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
        return
    for table in tables:
        print_table(*table)


def _known_match(detected: str | None) -> str | None:
    """The known GPU whose name's parts all appear in the detected name ('A100-80GB' in 'NVIDIA A100 80GB PCIe');
    a heuristic: None when no known name fits."""
    from uvmlab.gpus import GPUS

    if not detected:
        return None
    words = detected.upper().replace("-", " ").split()
    fits = [k for k in GPUS if all(part in words for part in k.upper().split("-"))]
    return max(fits, key=len) if fits else None


@click.command("gpus")
@FORMAT
def gpus_cmd(fmt: str) -> None:
    """List the GPU models uvmlab knows (for --gpu) and the GPU this machine has, if any.

    Figures are vendor datasheet peaks (uvmlab/gpus.py names the sources); "link" is the sustained 2 MiB
    host<->device bandwidth UVM migrations get, "context" the memory a job cannot use (CUDA context).
    """
    from uvmlab.console import note, print_csv, print_table, say
    from uvmlab.gpus import DEFAULT_GPU, GPUS
    from uvmlab.measure.gpu.detect import gpu_status
    from uvmlab.units import format_bytes

    status = gpu_status()
    detected = status.to_dict() | {"known_as": _known_match(status.name)}
    keys = ["name", "memory_bytes", "context_bytes", "fp32_flops", "tensor_flops", "hbm_bytes_per_s"]
    keys += ["link_bytes_per_s", "link"]
    known = [{k: getattr(g, k) for k in keys} | {"default": g.name == DEFAULT_GPU} for g in GPUS.values()]
    if fmt == "json":
        click.echo(json.dumps({"known": known, "detected": detected}, indent=2))
        return
    if fmt == "csv":
        print_csv(("known", [*keys, "default"], [[r[k] for k in [*keys, "default"]] for r in known]))
        return
    print_table(
        "GPU models uvmlab knows (--gpu NAME; --gpu-memory SIZE overrides the memory)",
        ["GPU", "memory", "CUDA context", "FP32 TFLOP/s", "tensor TFLOP/s", "HBM GB/s", "link GB/s", "link"],
        [
            [
                g.name + (" (default)" if g.name == DEFAULT_GPU else ""),
                format_bytes(g.memory_bytes),
                format_bytes(g.context_bytes),
                g.fp32_flops / 1e12,
                g.tensor_flops / 1e12,
                g.hbm_bytes_per_s / 1e9,
                g.link_bytes_per_s / 1e9,
                g.link,
            ]
            for g in GPUS.values()
        ],
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


COMMANDS = [shim_group, doctor, gpus_cmd]
