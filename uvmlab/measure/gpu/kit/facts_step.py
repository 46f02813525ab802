"""Child step of ``uvmlab collect``: the machine a collection ran on, first, so every data set says where it came from.

``python -m uvmlab.measure.gpu.kit.facts_step OUT``

Writes ``OUT/facts.json``: ``uvmlab doctor``'s report (the GPU, driver, CUDA runtime, torch, the worker's import check,
the tools), :func:`uvmlab.measure.gpu.machine.machine_facts` with the CUDA runtime of the nvidia-cuda-runtime wheel
(kernel release, gVisor or Firecracker, MemAvailable, the HMM/ATS device attributes), the NVIDIA driver's
``/proc/driver/nvidia/version``, the ``nvidia_uvm`` module parameters (``/sys/module/nvidia_uvm/parameters``), the
lines of ``nvidia-smi -q`` that name the addressing mode, MIG, virtualisation, persistence, compute mode, BAR1 and
the PCIe link, and which profilers and debuggers are on PATH (nsys, ncu, compute-sanitizer, cuda-gdb). Every probe
reads only and is recorded even when it fails.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

TOOLS = ("nsys", "ncu", "compute-sanitizer", "cuda-gdb", "nvidia-smi", "g++")
SMI_LINES = re.compile(r"addressing|mig mode|virtualization|persistence|compute mode|bar1|link (gen|width)", re.I)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return None


def uvm_parameters(root: Path = Path("/sys/module/nvidia_uvm/parameters")) -> dict[str, str | None]:
    """The nvidia_uvm module's parameters ({} where the module is not loaded or not visible)."""
    if not root.is_dir():
        return {}
    return {p.name: _read(p) for p in sorted(root.iterdir())}


def smi_lines(timeout_s: float = 30.0) -> list[str]:
    """The lines of ``nvidia-smi -q`` that say how the GPU is set up (module docstring); [] without nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        proc = subprocess.run(["nvidia-smi", "-q"], capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ["nvidia-smi -q did not answer"]
    return [ln.strip() for ln in proc.stdout.splitlines() if SMI_LINES.search(ln)]


def collect_facts() -> dict[str, Any]:
    """Everything the module docstring lists."""
    from uvmlab.measure.gpu.cudart import load_cudart
    from uvmlab.measure.gpu.doctor import doctor_report
    from uvmlab.measure.gpu.machine import machine_facts

    try:
        lib: Any = load_cudart()
    except Exception:  # no runtime to load: the attributes are unknown, said by None
        lib = None
    try:
        facts = machine_facts(lib)
    except Exception as exc:  # a runtime without a device: the machine facts without the attributes
        facts = {**machine_facts(None), "device_attributes_error": f"{type(exc).__name__}: {exc}"}
    return {
        "machine": facts,
        "doctor": doctor_report(),
        "driver_version_file": _read(Path("/proc/driver/nvidia/version")),
        "nvidia_uvm_parameters": uvm_parameters(),
        "nvidia_smi": smi_lines(),
        "tools": {t: shutil.which(t) for t in TOOLS},
        "python": sys.version.split()[0],
    }


def main(argv: list[str] | None = None) -> int:
    from uvmlab.files.atomic import atomic_write_json

    parser = argparse.ArgumentParser(
        prog="python -m uvmlab.measure.gpu.kit.facts_step", description=__doc__.splitlines()[0]
    )
    parser.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out / "facts.json", collect_facts())
    return 0


if __name__ == "__main__":
    sys.exit(main())
