"""Is there a usable NVIDIA GPU here? ``gpu_status()`` answers cheaply (NVML, no CUDA context, no torch) and never
raises: ``uvmlab run --mode auto`` uses it to choose between the GPU and the simulator, and ``--mode gpu`` prints
its ``reason`` (one sentence naming what is missing) when there is none.

Which GPU: the first entry of ``CUDA_VISIBLE_DEVICES`` (none: CUDA device 0). A ``GPU-``/``MIG-`` UUID (or a unique
prefix of one, as CUDA accepts) is looked up by UUID. A number is a position in CUDA's order, and every GPU step
runs with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (uvmlab.measure.gpu.plan.DEVICE_ORDER), so it is the position among the GPUs
sorted by PCI bus id, as nvidia-smi numbers them; NVML's own index order carries no such guarantee (NVML API
reference, nvmlDeviceGetHandleByIndex), so it is not used for the mapping.
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
    """NVML index of the GPU (the first one CUDA_VISIBLE_DEVICES names, in PCI bus order; see the module doc)."""
    device_count: int = 0
    source: str = "nvml"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def require(self) -> GpuStatus:
        """Return self if a GPU is available, else raise UnavailableError with the reason."""
        if not self.available:
            raise UnavailableError(f"--mode gpu needs an NVIDIA GPU: {self.reason}")
        return self


def _visible_first(env: dict[str, str]) -> tuple[str | None, str]:
    """The device CUDA_VISIBLE_DEVICES names first ("0" when unset); reason text when it hides every GPU."""
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is None:
        return "0", ""
    first = cvd.split(",")[0].strip()
    if first == "" or first.startswith("-"):
        return None, f"CUDA_VISIBLE_DEVICES={cvd!r} hides every GPU; unset it or name a GPU index"
    return first, ""


def _pci_key(pynvml: Any, handle: Any) -> str:
    return _text(pynvml.nvmlDeviceGetPciInfo(handle).busId).lower()


def nvml_handle(pynvml: Any, env: dict[str, str], uuid: str | None = None) -> tuple[Any, str]:
    """(NVML handle, '') of the GPU a CUDA process with ``env`` uses as device 0, or (None, reason).

    ``uuid`` (e.g. from torch.cuda.get_device_properties().uuid, 'GPU-...') wins when given: it is exact.
    """
    if uuid:
        return pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"), ""
    first, hidden = _visible_first(env)
    if first is None:
        return None, hidden
    count = int(pynvml.nvmlDeviceGetCount())
    if count == 0:
        return None, "the NVIDIA driver is loaded but reports no GPU"
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    if first.startswith(("GPU-", "MIG-")):
        if first.startswith("MIG-"):
            return pynvml.nvmlDeviceGetHandleByUUID(first), ""
        matches = [h for h in handles if _text(pynvml.nvmlDeviceGetUUID(h)).startswith(first)]
        if len(matches) != 1:
            return None, f"CUDA_VISIBLE_DEVICES names {first}, which matches {len(matches)} of the {count} GPU(s)"
        return matches[0], ""
    if not first.isdigit():
        return None, f"CUDA_VISIBLE_DEVICES={first!r} is neither a GPU index nor a GPU-/MIG- UUID"
    k = int(first)
    if k >= count:
        return None, f"CUDA_VISIBLE_DEVICES names GPU {k} but NVML sees only {count} GPU(s)"
    return sorted(handles, key=lambda h: _pci_key(pynvml, h))[k], ""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def gpu_status(env: dict[str, str] | None = None) -> GpuStatus:
    """Probe the GPU through NVML (nvidia-ml-py). Cheap, no CUDA context, never raises."""
    env = dict(os.environ if env is None else env)
    first, hidden = _visible_first(env)
    if first is None:
        return GpuStatus(False, hidden, source="env")
    try:
        import pynvml
    except ImportError:
        bindings = "the NVML Python bindings are not installed: pip install 'uvmlab[gpu]' (nvidia-ml-py)"
        if not Path("/proc/driver/nvidia/version").exists():
            bindings = f"no NVIDIA driver is loaded on this machine, and {bindings}"
        return GpuStatus(False, bindings, source="none")
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
        handle, why = nvml_handle(pynvml, env)
        if handle is None:
            return GpuStatus(False, why, device_count=count)
        index = int(pynvml.nvmlDeviceGetIndex(handle))
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
