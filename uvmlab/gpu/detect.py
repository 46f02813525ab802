"""Is there a usable NVIDIA GPU here? ``gpu_status()`` answers cheaply (NVML, no CUDA context, no torch) and never
raises: ``uvmlab run --mode auto`` uses it to choose between the GPU and the simulator, and ``--mode gpu`` prints
its ``reason`` (one sentence naming what is missing) when there is none.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from uvmlab.errors import UnavailableError


@dataclass(frozen=True)
class GpuStatus:
    """What NVML reports about the GPU a run would use (CUDA_VISIBLE_DEVICES respected)."""

    available: bool
    reason: str
    """'' when available; otherwise one sentence: what is missing and what to do."""
    name: str | None = None
    memory_bytes: int | None = None
    driver: str | None = None
    """NVIDIA driver version, e.g. '580.95.05'."""
    cuda: str | None = None
    """Highest CUDA version the driver supports, e.g. '13.0'."""
    index: int | None = None
    """NVML index of the GPU (the first one CUDA_VISIBLE_DEVICES names)."""
    device_count: int = 0
    source: str = "nvml"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def require(self) -> GpuStatus:
        """Return self if a GPU is available, else raise UnavailableError with the reason."""
        if not self.available:
            raise UnavailableError(f"--mode gpu needs an NVIDIA GPU: {self.reason}")
        return self


def _visible_index(env: dict[str, str]) -> tuple[int | None, str]:
    """The NVML index CUDA_VISIBLE_DEVICES selects first (0 when unset); reason text when it hides every GPU."""
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is None:
        return 0, ""
    first = cvd.split(",")[0].strip()
    if first == "" or first.startswith("-"):
        return None, f"CUDA_VISIBLE_DEVICES={cvd!r} hides every GPU; unset it or name a GPU index"
    if first.isdigit():
        return int(first), ""
    return 0, ""  # a UUID or MIG name: NVML index unknown, take the first GPU for the report [approximation]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def gpu_status(env: dict[str, str] | None = None) -> GpuStatus:
    """Probe the GPU through NVML (nvidia-ml-py). Cheap, no CUDA context, never raises."""
    env = dict(os.environ if env is None else env)
    index, hidden = _visible_index(env)
    if index is None:
        return GpuStatus(False, hidden, source="env")
    try:
        import pynvml
    except ImportError:
        return GpuStatus(
            False,
            "the NVML Python bindings are not installed: pip install 'uvmlab[gpu]' (nvidia-ml-py)",
            source="none",
        )
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        driver_files = Path("/proc/driver/nvidia/version").exists()
        if driver_files:
            why = f"the NVIDIA driver is loaded but NVML failed to start ({exc})"
        else:
            why = f"no NVIDIA driver is loaded on this machine (NVML: {exc}); install the NVIDIA driver on a GPU host"
        return GpuStatus(False, why)
    try:
        count = int(pynvml.nvmlDeviceGetCount())
        if count == 0:
            return GpuStatus(False, "the NVIDIA driver is loaded but reports no GPU", device_count=0)
        if index >= count:
            return GpuStatus(
                False,
                f"CUDA_VISIBLE_DEVICES names GPU {index} but NVML sees only {count} GPU(s)",
                device_count=count,
            )
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        name = _text(pynvml.nvmlDeviceGetName(handle))
        memory = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        cuda_int = int(pynvml.nvmlSystemGetCudaDriverVersion())
        cuda = f"{cuda_int // 1000}.{(cuda_int % 1000) // 10}"
        return GpuStatus(True, "", name, memory, driver, cuda, index, count)
    except pynvml.NVMLError as exc:
        return GpuStatus(False, f"NVML could not describe the GPU ({exc})")
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()
