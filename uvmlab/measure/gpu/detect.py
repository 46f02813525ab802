"""Is there a usable NVIDIA GPU here? ``gpu_status()`` answers cheaply (NVML, no CUDA context, no torch) and never
raises: ``uvmlab run --mode auto`` uses it to choose between the GPU and the simulator, and ``--mode gpu`` prints
its ``reason`` (one sentence naming what is missing) when there is none.

Which GPU: the first entry of ``CUDA_VISIBLE_DEVICES`` (none: CUDA device 0). A ``GPU-``/``MIG-`` UUID (or a unique
prefix of one, as CUDA accepts) is looked up by UUID. A number is a position in CUDA's order, and every GPU step
runs with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (uvmlab.measure.gpu.plan.DEVICE_ORDER), so it is the position among the GPUs
sorted by PCI bus id, as nvidia-smi numbers them; NVML's own index order carries no such guarantee (NVML API
reference, nvmlDeviceGetHandleByIndex), so it is not used for the mapping.

MIG: a MIG device is an NVML device of its own (``nvmlDeviceGetMigDeviceHandleByIndex`` under its parent GPU), with
its own ``MIG-<uuid>`` and memory. CUDA reports a MIG device's own UUID (cudaDeviceProp.uuid), which torch prints
without a prefix, so a UUID without prefix is tried as ``GPU-<uuid>`` and then as ``MIG-<uuid>``. A number in
CUDA_VISIBLE_DEVICES (or none) on a GPU whose MIG mode is on is taken as that GPU's first MIG device
[approximation: CUDA enumerates MIG devices, not the GPU; name a ``MIG-<uuid>`` (``nvidia-smi -L``) to be exact].
The old ``MIG-GPU-<uuid>/<gi>/<ci>`` form is refused with a sentence saying so.
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
    free_bytes: int | None = None
    """Free memory NVML reported when probed (None: not read)."""

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
        return handle_by_uuid(pynvml, uuid), ""
    first, hidden = _visible_first(env)
    if first is None:
        return None, hidden
    count = int(pynvml.nvmlDeviceGetCount())
    if count == 0:
        return None, "the NVIDIA driver is loaded but reports no GPU"
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    if first.startswith(("GPU-", "MIG-")):
        if first.startswith("MIG-GPU-"):
            return None, (
                f"CUDA_VISIBLE_DEVICES names {first} in the old MIG-GPU-<uuid>/<gi>/<ci> form; name the MIG device "
                "by its MIG-<uuid> (nvidia-smi -L)"
            )
        if first.startswith("MIG-"):
            return pynvml.nvmlDeviceGetHandleByUUID(first), ""
        matches = [h for h in handles if _text(pynvml.nvmlDeviceGetUUID(h)).startswith(first)]
        if len(matches) != 1:
            return None, f"CUDA_VISIBLE_DEVICES names {first}, which matches {len(matches)} of the {count} GPU(s)"
        return first_mig_device(pynvml, matches[0]), ""
    if not first.isdigit():
        return None, f"CUDA_VISIBLE_DEVICES={first!r} is neither a GPU index nor a GPU-/MIG- UUID"
    k = int(first)
    if k >= count:
        return None, f"CUDA_VISIBLE_DEVICES names GPU {k} but NVML sees only {count} GPU(s)"
    return first_mig_device(pynvml, sorted(handles, key=lambda h: _pci_key(pynvml, h))[k]), ""


def handle_by_uuid(pynvml: Any, uuid: str) -> Any:
    """The NVML handle of a CUDA device UUID: as given when it has a ``GPU-``/``MIG-`` prefix, else ``GPU-<uuid>``
    and then ``MIG-<uuid>`` (a MIG device's UUID, as CUDA reports it). Raises the last NVMLError."""
    names = [uuid] if uuid.startswith(("GPU-", "MIG-")) else [f"GPU-{uuid}", f"MIG-{uuid}"]
    error: Exception | None = None
    for name in names:
        try:
            return pynvml.nvmlDeviceGetHandleByUUID(name)
        except pynvml.NVMLError as exc:
            error = exc
    assert error is not None
    raise error


def is_mig_device(pynvml: Any, handle: Any) -> bool:
    """Whether ``handle`` is a MIG device (nvmlDeviceIsMigDeviceHandle returns a c_uint)."""
    try:
        flag = pynvml.nvmlDeviceIsMigDeviceHandle(handle)
    except (pynvml.NVMLError, AttributeError):
        return False
    return bool(int(getattr(flag, "value", flag)))


def first_mig_device(pynvml: Any, handle: Any) -> Any:
    """``handle`` itself, or its first MIG device when the GPU's MIG mode is on (module docstring)."""
    try:
        current = pynvml.nvmlDeviceGetMigMode(handle)[0]
    except (pynvml.NVMLError, AttributeError):  # not MIG-capable (NVML_ERROR_NOT_SUPPORTED) or an old binding
        return handle
    if current != getattr(pynvml, "NVML_DEVICE_MIG_ENABLE", 1):
        return handle
    for i in range(int(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
        try:
            return pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
        except pynvml.NVMLError:  # no MIG device at this index
            continue
    return handle


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
        parent = (
            pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle) if is_mig_device(pynvml, handle) else handle
        )
        index = int(pynvml.nvmlDeviceGetIndex(parent))
        name = _text(pynvml.nvmlDeviceGetName(handle))
        info = pynvml.nvmlDeviceGetMemoryInfo(handle)
        memory = int(info.total)
        free = getattr(info, "free", None)
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        cuda_int = int(pynvml.nvmlSystemGetCudaDriverVersion())
        cuda = f"{cuda_int // 1000}.{(cuda_int % 1000) // 10}"
        return GpuStatus(
            True, "", name, memory, driver, cuda, index, count, free_bytes=None if free is None else int(free)
        )
    except pynvml.NVMLError as exc:
        return GpuStatus(False, f"NVML could not describe the GPU ({exc})")
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()
