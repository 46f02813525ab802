"""``uvmlab doctor``: what this machine has (GPU, driver, CUDA runtime, torch, nsys, g++, the shim) and which modes
it can run. Every probe is cheap, reads only, and never raises: a missing piece is a row that says so.

``worker imports`` imports what the GPU worker imports, by running the worker's own check in a child process
(:func:`worker_imports`): a module the worker cannot import makes ``fatal`` a sentence and ``uvmlab doctor`` exit 1
(the lent machine lacks the ``nvtx`` package; before, doctor said "ready" and every GPU run died at the import).
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from uvmlab.measure.gpu import collect, shim
from uvmlab.measure.gpu.cudart import installed_cudart
from uvmlab.measure.gpu.detect import gpu_status
from uvmlab.units import format_bytes


@dataclass(frozen=True)
class Check:
    """One row of the doctor's table."""

    item: str
    ok: bool
    detail: str


def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def torch_cuda_version() -> str | None:
    """The CUDA version torch was built with, read from torch/version.py without importing torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return None
    try:
        text = (Path(spec.origin).parent / "version.py").read_text()
    except OSError:
        return None
    m = re.search(r"^cuda\s*(?::\s*[^=]+)?=\s*['\"]([^'\"]+)['\"]", text, re.M)
    return m.group(1) if m else None


def cudart_version(path: Path) -> int | None:
    """cudaRuntimeGetVersion of the library at ``path`` (works without a GPU); None if it cannot be loaded."""
    try:
        lib = ctypes.CDLL(str(path))
        v = ctypes.c_int(0)
        rc = lib.cudaRuntimeGetVersion(ctypes.byref(v))
    except (OSError, AttributeError):
        return None
    return int(v.value) if rc == 0 else None


def worker_imports(python: str | None = None, timeout_s: float = 180.0) -> Check:
    """Import what the GPU worker imports, in a child process of ``python`` (default: this one) with this
    environment: ``python -m uvmlab.measure.gpu.worker --check-imports`` (uvmlab.measure.gpu.worker.import_check)."""
    import json
    import subprocess
    import sys

    argv = [python or sys.executable, "-m", "uvmlab.measure.gpu.worker", "--check-imports"]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
        doc = json.loads(proc.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return Check("worker imports", False, f"the import check did not answer ({' '.join(argv)})")
    if doc.get("ok"):
        ranges = doc.get("nvtx_ranges") or "none (neither the nvtx package nor torch.cuda.nvtx works)"
        return Check("worker imports", True, f"all import; NVTX ranges: {ranges}")
    name, why = next(iter(doc["failed"].items()))
    return Check("worker imports", False, f"cannot import {name} ({why})")


def checks() -> list[Check]:
    """Every probe, in display order."""
    rows: list[Check] = []
    st = gpu_status()
    if st.available:
        rows.append(Check("GPU", True, f"{st.name}, {format_bytes(st.memory_bytes)} (NVML index {st.index})"))
        rows.append(Check("NVIDIA driver", True, f"{st.driver} (CUDA {st.cuda})"))
    else:
        rows.append(Check("GPU", False, st.reason))
        rows.append(Check("NVIDIA driver", False, "not loaded" if "driver" in st.reason else st.reason))
    cudart = installed_cudart()
    if cudart is None:
        rows.append(Check("CUDA runtime", False, "no libcudart from the nvidia-cuda-runtime wheel"))
    else:
        v = cudart_version(cudart)
        ver = f"{v // 1000}.{(v % 1000) // 10}" if v else "version unknown"
        rows.append(Check("CUDA runtime", v is not None, f"{ver} at {cudart}"))
    tv, tc = _package_version("torch"), torch_cuda_version()
    rows.append(
        Check("torch", tv is not None and tc is not None, f"{tv or 'not installed'}, CUDA build {tc or 'none'}")
    )
    rows.append(worker_imports())
    nsys_version = collect.tool_version(["nsys", "--version"])
    rows.append(Check("nsys", nsys_version is not None, nsys_version or "not on PATH (needed for --nsys)"))
    cxx = shim.find_compiler()
    rows.append(Check("g++", cxx is not None, collect.tool_version([cxx, "--version"]) or cxx if cxx else "not found"))
    status = shim.shim_status()
    rows.append(
        Check("shim", status.built, f"built: {status.path}" if status.built else "not built: run `uvmlab shim build`")
    )
    nvml = _package_version("nvidia-ml-py")
    rows.append(Check("nvidia-ml-py", nvml is not None, nvml or "not installed: pip install 'uvmlab[gpu]'"))
    cupy = next((v for v in (_package_version("cupy-cuda13x"), _package_version("cupy-cuda12x")) if v), None)
    rows.append(Check("cupy", cupy is not None, cupy or "not installed (microbenchmarks): pip install 'uvmlab[gpu]'"))
    return rows


def modes(rows: list[Check]) -> list[Check]:
    """Which modes this machine can run, from the probes."""
    ok = {r.item: r.ok for r in rows}
    gpu_needs = ["GPU", "torch", "worker imports", "g++"]
    gpu_missing = [k for k in gpu_needs if not ok.get(k)]
    nsys_missing = [*gpu_missing, *(["nsys"] if not ok.get("nsys") else [])]
    mb_missing = [k for k in ("GPU", "cupy") if not ok.get(k)]
    return [
        Check("run --mode sim", True, "needs nothing beyond this package"),
        Check("run --mode gpu", not gpu_missing, "ready" if not gpu_missing else f"missing: {', '.join(gpu_missing)}"),
        Check(
            "run --mode gpu --nsys",
            not nsys_missing,
            "ready" if not nsys_missing else f"missing: {', '.join(nsys_missing)}",
        ),
        Check(
            "calibrate --microbench",
            not mb_missing,
            "ready" if not mb_missing else f"missing: {', '.join(mb_missing)}",
        ),
        Check("run --mode auto", True, "gpu" if not gpu_missing else "falls back to the simulator"),
    ]


def doctor_report() -> dict[str, Any]:
    """The doctor's findings as a JSON-ready dict; ``fatal``: one sentence when this install is broken (the GPU
    worker cannot import what it needs), else None."""
    rows = checks()
    bad = next((r for r in rows if r.item == "worker imports" and not r.ok), None)
    fatal = None if bad is None else f"the GPU worker {bad.detail}: every --mode gpu run would stop there; install it"
    return {"checks": [asdict(r) for r in rows], "modes": [asdict(m) for m in modes(rows)], "fatal": fatal}
