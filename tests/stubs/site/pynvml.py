"""A fake ``pynvml`` (NVIDIA's nvidia-ml-py) for tests without a GPU: the functions uvmlab calls, with the names,
arguments, return values and errors of nvidia-ml-py 13.615.71 (``pynvml.py``): ``NVMLError(value)`` maps the
value to a subclass (``NVMLError_NotFound`` for ``NVML_ERROR_NOT_FOUND`` = 6, ``NVMLError_NotSupported`` for 3,
``NVMLError_InvalidArgument`` for 2), ``nvmlDeviceGetHandleByUUID`` takes str or bytes, ``nvmlDeviceGetMigMode``
returns ``[current, pending]``, ``nvmlDeviceIsMigDeviceHandle`` a ``c_uint``,
``nvmlDeviceGetComputeRunningProcesses`` objects with ``pid``, ``usedGpuMemory``, ``gpuInstanceId``,
``computeInstanceId``, ``nvmlDeviceGetMemoryInfo`` an object with ``total``, ``free``, ``used``.

The machine is the JSON file ``$FAKE_NVML_CONFIG`` (read at each call; absent: one 80 GiB GPU, no process)::

    {"driver": "580.95.05", "cuda": 13000,
     "gpus": [{"name": ..., "uuid": "GPU-...", "bus_id": "00000000:01:00.0", "total": N, "used": N,
               "mig": [{"name": ..., "uuid": "MIG-...", "total": N, "used": N}, ...],   (MIG mode on: listed)
               "processes": [{"pid": P, "used": N} | {"pid": P, "used_file": PATH}, ...]}]}

``used_file`` holds a number of bytes that the test (or another process) rewrites: a process whose memory grows.
"""

from __future__ import annotations

import ctypes
import json
import os
import types
from pathlib import Path
from typing import Any, ClassVar

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_DEVICE_MIG_DISABLE = 0x0
NVML_DEVICE_MIG_ENABLE = 0x1
_NAMES = {1: "Uninitialized", 2: "Invalid Argument", 3: "Not Supported", 6: "Not Found"}


class NVMLError(Exception):
    _valClassMapping: ClassVar[dict[int, type]] = {}

    def __new__(cls, value: int) -> NVMLError:
        if cls is NVMLError:
            cls = NVMLError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)

    def __str__(self) -> str:
        return _NAMES.get(self.value, f"NVML Error with code {self.value}")


def _subclass(name: str, value: int) -> type:
    cls = type(name, (NVMLError,), {"__new__": lambda c, *a: NVMLError.__new__(c, value)})
    NVMLError._valClassMapping[value] = cls
    return cls


NVMLError_Uninitialized = _subclass("NVMLError_Uninitialized", NVML_ERROR_UNINITIALIZED)
NVMLError_InvalidArgument = _subclass("NVMLError_InvalidArgument", NVML_ERROR_INVALID_ARGUMENT)
NVMLError_NotSupported = _subclass("NVMLError_NotSupported", NVML_ERROR_NOT_SUPPORTED)
NVMLError_NotFound = _subclass("NVMLError_NotFound", NVML_ERROR_NOT_FOUND)

_INIT = [0]
CALLS: list[tuple[Any, ...]] = []


def _config() -> dict[str, Any]:
    path = os.environ.get("FAKE_NVML_CONFIG")
    if path:
        return dict(json.loads(Path(path).read_text()))
    return {"gpus": [{"name": "NVIDIA A100 80GB PCIe", "uuid": "GPU-00000000-0000-0000-0000-000000000001",
                      "bus_id": "00000000:01:00.0", "total": 80 << 30, "used": 1 << 30}]}  # fmt: skip


class _Handle:
    """c_nvmlDevice_t stand-in: a GPU (mig None) or a MIG device of it."""

    def __init__(self, gpu: int, mig: int | None = None) -> None:
        self.gpu, self.mig = gpu, mig

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Handle) and (self.gpu, self.mig) == (other.gpu, other.mig)

    def __hash__(self) -> int:
        return hash((self.gpu, self.mig))


def _check() -> None:
    if not _INIT[0]:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)


def _gpu(h: _Handle) -> dict[str, Any]:
    _check()
    if not isinstance(h, _Handle):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return _config()["gpus"][h.gpu]


def _entity(h: _Handle) -> dict[str, Any]:
    g = _gpu(h)
    return g if h.mig is None else g["mig"][h.mig]


def _used(p: dict[str, Any]) -> int:
    return int(Path(p["used_file"]).read_text()) if "used_file" in p else int(p["used"])


def nvmlInit() -> None:
    _INIT[0] += 1


def nvmlShutdown() -> None:
    _check()
    _INIT[0] -= 1


def nvmlSystemGetDriverVersion() -> str:
    _check()
    return str(_config().get("driver", "580.95.05"))


def nvmlSystemGetCudaDriverVersion() -> int:
    _check()
    return int(_config().get("cuda", 13000))


def nvmlDeviceGetCount() -> int:
    _check()
    return len(_config()["gpus"])


def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
    _check()
    if not 0 <= index < len(_config()["gpus"]):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return _Handle(index)


def nvmlDeviceGetHandleByUUID(uuid: str | bytes) -> _Handle:
    _check()
    text = uuid.decode() if isinstance(uuid, bytes) else uuid
    CALLS.append(("nvmlDeviceGetHandleByUUID", text))
    for i, g in enumerate(_config()["gpus"]):
        if g["uuid"] == text:
            return _Handle(i)
        for j, m in enumerate(g.get("mig", [])):
            if m["uuid"] == text:
                return _Handle(i, j)
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def nvmlDeviceGetUUID(h: _Handle) -> str:
    return str(_entity(h)["uuid"])


def nvmlDeviceGetName(h: _Handle) -> str:
    return str(_entity(h)["name"])


def nvmlDeviceGetIndex(h: _Handle) -> int:
    _gpu(h)
    if h.mig is not None:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return h.gpu


def nvmlDeviceGetPciInfo(h: _Handle) -> Any:
    return types.SimpleNamespace(busId=str(_gpu(h)["bus_id"]).encode())


def nvmlDeviceGetMemoryInfo(h: _Handle, version: Any = None) -> Any:
    e = _entity(h)
    used = int(e.get("used", 0)) + sum(_used(p) for p in e.get("processes", []))
    return types.SimpleNamespace(total=int(e["total"]), used=used, free=int(e["total"]) - used)


def nvmlDeviceGetComputeRunningProcesses(h: _Handle) -> list[Any]:
    e = _entity(h)
    gi = -1 if h.mig is None else h.mig
    return [
        types.SimpleNamespace(pid=int(p["pid"]), usedGpuMemory=_used(p), gpuInstanceId=gi, computeInstanceId=0)
        for p in e.get("processes", [])
    ]


def nvmlDeviceGetMigMode(h: _Handle) -> list[int]:
    g = _gpu(h)
    if "mig" not in g or h.mig is not None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    mode = NVML_DEVICE_MIG_ENABLE if g["mig"] else NVML_DEVICE_MIG_DISABLE
    return [mode, mode]


def nvmlDeviceGetMaxMigDeviceCount(h: _Handle) -> int:
    g = _gpu(h)
    return 7 if g.get("mig") else 0


def nvmlDeviceGetMigDeviceHandleByIndex(h: _Handle, index: int) -> _Handle:
    g = _gpu(h)
    if not 0 <= index < len(g.get("mig", [])):
        raise NVMLError(NVML_ERROR_NOT_FOUND)
    return _Handle(h.gpu, index)


def nvmlDeviceIsMigDeviceHandle(h: _Handle) -> ctypes.c_uint:
    _gpu(h)
    return ctypes.c_uint(1 if h.mig is not None else 0)


def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(h: _Handle) -> _Handle:
    _gpu(h)
    if h.mig is None:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return _Handle(h.gpu)
