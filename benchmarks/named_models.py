"""CPU time of ``uvmlab estimate`` for named models and a user workload file, cold (empty trace cache) and warm.

Each row runs ``python -m uvmlab estimate WORKLOAD ... --format json`` in a fresh process, first with an empty
``UVMLAB_CACHE`` (cold: imports torch and the model, captures on meta, simulates) then again (warm: reads the
cached trace), and reports the child's CPU time (user + system, from ``resource.getrusage(RUSAGE_CHILDREN)``)
and wall time. The user file is also run warm under another path (a symlink) to show it hits the same entry.
Goals (issue 12): warm <= 1 s CPU, cold <= 10 s CPU. Run ``uptime`` alongside: wall times depend on the load.

With ``--dropout``, also prints the dropout bytes per training iteration of GPT-2 and BERT (seed batch sizes)
before (the unfused meta path: an fp32 noise tensor per dropout) and after (CUDA's fused ``native_dropout``
with a 1-byte mask), from two meta captures.

Usage: ``python benchmarks/named_models.py [--dropout] [--workloads torchvision:vgg16:64,...]``. Prints tables.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click

REPO = Path(__file__).resolve().parents[1]
DEFAULT = "torchvision:vgg16:64,timm:vit_base_patch16_224:32,hf:llama-3.2-1b:8,FILE:64"


def _timed(argv: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        print(proc.stderr, file=sys.stderr)
    return cpu, wall, proc.returncode


def _speed(workloads: str) -> None:
    from uvmlab.console import print_table

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        user_file = Path(tmp) / "tiny_mlp.py"
        user_file.write_text((REPO / "docs" / "examples" / "tiny_mlp.py").read_text())
        link = Path(tmp) / "same_file_other_path.py"
        link.symlink_to(user_file)
        env = {**os.environ, "UVMLAB_CACHE": str(Path(tmp) / "cache"), "PYTHONPATH": str(REPO)}
        for item in workloads.split(","):
            name, _, batch = item.rpartition(":")
            name = str(user_file) if name == "FILE" else name
            base = [sys.executable, "-m", "uvmlab", "estimate", "-b", batch, "--format", "json"]
            cold = _timed([*base, name], env)
            warm = _timed([*base, name], env)
            rows.append([item, "cold", f"{cold[0]:.2f}", f"{cold[1]:.2f}", cold[2]])
            rows.append([item, "warm", f"{warm[0]:.2f}", f"{warm[1]:.2f}", warm[2]])
            if name == str(user_file):
                other = _timed([*base, str(link)], env)
                rows.append([f"{item} (by a symlink)", "warm", f"{other[0]:.2f}", f"{other[1]:.2f}", other[2]])
    print_table(
        f"uvmlab estimate, fresh process (load {os.getloadavg()[0]:.1f})",
        ["workload:batch", "cache", "CPU s", "wall s", "exit"],
        rows,
    )


def _dropout() -> None:
    import uvmlab.trace.capture as capture_mod
    from uvmlab.config import WorkloadConfig
    from uvmlab.console import print_table
    from uvmlab.gpus import get_gpu
    from uvmlab.memory.estimate import estimate
    from uvmlab.trace.emulate import DropoutEmulation

    gpu = get_gpu("A100-80GB")

    class Unfused(DropoutEmulation):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            return func(*args, **(kwargs or {}))

    def dropout_bytes(trace) -> int:  # type: ignore[no-untyped-def]
        """Bytes per iteration of the tensors dropout keeps for backward: the mask (fused) or the noise."""
        a = trace.allocations
        a = a[(a.iteration == 0) & (a.category == "activation")]
        return int(a.size_bytes.sum())

    rows = []
    real = capture_mod.DropoutEmulation
    for name, batch in (("gpt2", 8), ("bert", 16)):
        cfg = WorkloadConfig(name, batch_size=batch, iterations=1)
        after = capture_mod.capture_trace(cfg)
        capture_mod.DropoutEmulation = Unfused  # type: ignore[misc]
        try:
            before = capture_mod.capture_trace(cfg)
        finally:
            capture_mod.DropoutEmulation = real  # type: ignore[misc]
        fused = int(after.allocations[after.allocations.op == "aten::native_dropout"].shape[0] // 2)
        diff = dropout_bytes(before) - dropout_bytes(after)
        peaks = [estimate(cfg, gpu, trace=t).peak_reserved_bytes / 2**20 for t in (before, after)]
        rows.append([name, batch, fused, f"{dropout_bytes(before) / 2**20:.1f}", f"{dropout_bytes(after) / 2**20:.1f}",
                     f"{diff / 2**20:.1f}", f"{peaks[0]:.0f} -> {peaks[1]:.0f}"])  # fmt: skip
    print_table(
        "Dropout on meta: activations kept for backward per iteration (iteration 0), MiB",
        ["workload", "batch", "fused dropouts", "before (fp32 noise)", "after (1-byte mask)", "difference",
         "peak reserved (A100-80GB)"],
        rows,
    )  # fmt: skip


@click.command()
@click.option("--workloads", default=DEFAULT, show_default=True, help="NAME:BATCH,...; FILE = a user file copy.")
@click.option("--dropout", is_flag=True, help="Also print the dropout mask bytes before/after.")
@click.option("--no-speed", is_flag=True, help="Skip the speed table.")
def main(workloads: str, dropout: bool, no_speed: bool) -> None:
    """Print the tables."""
    if not no_speed:
        _speed(workloads)
    if dropout:
        _dropout()


if __name__ == "__main__":
    main()
