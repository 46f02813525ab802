"""``uvmlab shim build|path|status`` and ``uvmlab doctor``: the GPU path's tools (logic in uvmlab.gpu)."""

from __future__ import annotations

import json
from pathlib import Path

import click

FORMAT = click.option(
    "--format", "fmt", type=click.Choice(("table", "json")), default="table", show_default=True, help="Output format."
)


@click.group("shim")
def shim_group() -> None:
    """The LD_PRELOAD shim that turns cudaMalloc into cudaMallocManaged (see docs/gpu.md)."""


@shim_group.command("build")
@click.option("--force", is_flag=True, help="Rebuild even if the current source is already built.")
@click.option("--cache-dir", type=click.Path(file_okay=False, path_type=Path), default=None, help="Build cache folder.")
def shim_build(force: bool, cache_dir: Path | None) -> None:
    """Compile the shim with g++ (no CUDA needed) into the per-user cache and print its path."""
    from uvmlab.gpu.shim import build_shim

    click.echo(str(build_shim(cache_dir=cache_dir, force=force)))


@shim_group.command("path")
@click.option("--cache-dir", type=click.Path(file_okay=False, path_type=Path), default=None, help="Build cache folder.")
def shim_path_cmd(cache_dir: Path | None) -> None:
    """Print where the shim for the current source is built (exit 1 if it is not built yet)."""
    from uvmlab.errors import UvmlabError
    from uvmlab.gpu.shim import shim_status

    status = shim_status(cache_dir)
    if not status.built:
        raise UvmlabError(f"the shim is not built yet (it would be at {status.path}); run: uvmlab shim build")
    click.echo(str(status.path))


@shim_group.command("status")
@click.option("--cache-dir", type=click.Path(file_okay=False, path_type=Path), default=None, help="Build cache folder.")
@FORMAT
def shim_status_cmd(cache_dir: Path | None, fmt: str) -> None:
    """Whether the shim is built for the current source, where, and with which compiler."""
    from uvmlab.console import print_table
    from uvmlab.gpu.shim import shim_status

    s = shim_status(cache_dir)
    doc = {"built": s.built, "path": str(s.path), "compiler": s.compiler, "source": str(s.source)}
    if fmt == "json":
        click.echo(json.dumps(doc, indent=2))
        return
    from rich.markup import escape

    print_table("uvmlab shim", ["item", "value"], [(k, escape("n/a" if v is None else str(v))) for k, v in doc.items()])


@click.command("doctor")
@FORMAT
def doctor(fmt: str) -> None:
    """What this machine has (GPU, driver, CUDA runtime, torch, nsys, g++, shim) and which modes it can run."""
    from uvmlab.console import print_table
    from uvmlab.gpu.doctor import doctor_report

    report = doctor_report()
    if fmt == "json":
        click.echo(json.dumps(report, indent=2))
        return
    from rich.markup import escape

    print_table(
        "This machine",
        ["item", "status", "detail"],
        [(r["item"], "ok" if r["ok"] else "missing", escape(r["detail"])) for r in report["checks"]],
    )
    print_table(
        "Modes",
        ["mode", "status", "detail"],
        [(r["item"], "ok" if r["ok"] else "unavailable", escape(r["detail"])) for r in report["modes"]],
    )


COMMANDS = [shim_group, doctor]
