"""A fake ``cupy`` for tests without a GPU (``import cupy`` with tests/stubs/site on the path): the few classes and
functions uvmlab.measure.gpu.microbench and the evidence kit use, each with the signature of CuPy's source (cupy/cupy
main,
Aug 2026: cupy/cuda/memory.pyx, cupy/cuda/stream.pyx, cupy/_core/raw.pyx, cupy_backends/cuda/api/runtime.pyx).
Calls are recorded in ``CALLS``; managed memory is host memory (ctypes buffers), device memory (``runtime.malloc``)
a 4 KiB stand-in counted against the card, kernels do nothing, every event pair measures 1 ms.
``runtime.memGetInfo`` answers ``(FREE - device bytes allocated, TOTAL)`` with ``FREE``/``TOTAL`` from
``$FAKE_CUPY_FREE_BYTES`` / ``$FAKE_CUPY_TOTAL_BYTES`` (default 64 MiB / 80 GiB).

Linking: CuPy links the CUDA runtime statically (no library of the cupy-cuda13x wheel depends on libcudart.so),
so importing this module loads no libcudart either.

``ManagedMemory.prefetch(self, stream, *, device_id=cudaInvalidDeviceId)``: CuPy 13+ (older releases had
``prefetch(self, stream)``); ``OldManagedMemory`` has that older signature.
"""

from __future__ import annotations

import ctypes
import os
import types
from typing import Any

CALLS: list[tuple[Any, ...]] = []
RUNTIME_VERSION = [int(os.environ.get("FAKE_CUPY_RUNTIME_VERSION", 13000))]
CUDA_INVALID_DEVICE_ID = -2  # cupy_backends/cuda/api/_runtime_enum.pxd cudaInvalidDeviceId
_buffers: dict[int, Any] = {}


def _alloc(size: int) -> int:
    buf = ctypes.create_string_buffer(max(size, 1))
    ptr = ctypes.addressof(buf)
    _buffers[ptr] = buf
    return ptr


# ---- cupy_backends.cuda.api.runtime (exposed as cupy.cuda.runtime) ------------------------------------------
def memPrefetchAsync(devPtr: int, count: int, dstDevice: int, stream: int) -> None:
    CALLS.append(("memPrefetchAsync", devPtr, count, dstDevice, stream))


def memAdvise(devPtr: int, count: int, advice: int, device: int) -> None:
    CALLS.append(("memAdvise", devPtr, count, advice, device))


def runtimeGetVersion() -> int:
    return RUNTIME_VERSION[0]


_device: dict[int, int] = {}


def memGetInfo() -> tuple[int, int]:
    free0 = int(os.environ.get("FAKE_CUPY_FREE_BYTES", 64 << 20))
    return free0 - sum(_device.values()), int(os.environ.get("FAKE_CUPY_TOTAL_BYTES", 80 << 30))


def malloc(size: int) -> int:
    CALLS.append(("malloc", size))
    ptr = _alloc(min(size, 4096))
    _device[ptr] = size
    return ptr


def free(ptr: int) -> None:
    CALLS.append(("free", ptr))
    _device.pop(ptr, None)


runtime = types.SimpleNamespace(
    memPrefetchAsync=memPrefetchAsync,
    memAdvise=memAdvise,
    runtimeGetVersion=runtimeGetVersion,
    memGetInfo=memGetInfo,
    malloc=malloc,
    free=free,
    cudaCpuDeviceId=-1,
    cudaInvalidDeviceId=CUDA_INVALID_DEVICE_ID,
)


# ---- cupy.cuda.device / stream -------------------------------------------------------------------------------
class Device:
    def __init__(self, device: Any = None) -> None:
        self.id = 0 if device is None else int(device)


class Stream:
    def __init__(self, null: bool = False, non_blocking: bool = False, ptds: bool = False, priority: Any = None):
        self.ptr = 0xABC0

    def synchronize(self) -> None:
        CALLS.append(("synchronize",))

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class Event:
    def __init__(self, block: bool = False, disable_timing: bool = False, interprocess: bool = False) -> None:
        self.t = 0.0

    def record(self, stream: Any = None) -> None:
        self.t = float(len(CALLS))

    def synchronize(self) -> None:
        return None


def get_elapsed_time(start_event: Event, end_event: Event) -> float:
    return 1.0


# ---- cupy.cuda.memory ------------------------------------------------------------------------------------------
class ManagedMemory:
    def __init__(self, size: int) -> None:
        self.size = size
        self.device_id = 0
        self.ptr = _alloc(size)

    def __del__(self) -> None:  # CuPy frees a managed allocation when its last reference goes
        _buffers.pop(self.ptr, None)

    def prefetch(self, stream: Any, *, device_id: int = CUDA_INVALID_DEVICE_ID) -> None:
        if device_id == CUDA_INVALID_DEVICE_ID:
            device_id = self.device_id
        memPrefetchAsync(self.ptr, self.size, device_id, stream.ptr)

    def advise(self, advise: int, dev: Device) -> None:
        memAdvise(self.ptr, self.size, advise, dev.id)


class OldManagedMemory(ManagedMemory):
    def prefetch(self, stream: Any) -> None:  # type: ignore[override]
        memPrefetchAsync(self.ptr, self.size, self.device_id, stream.ptr)


MANAGED_CLASS = [ManagedMemory]


class MemoryPointer:
    def __init__(self, mem: Any, offset: int) -> None:
        self.mem = mem
        self.ptr = mem.ptr + offset


def malloc_managed(size: int) -> MemoryPointer:
    return MemoryPointer(MANAGED_CLASS[0](size), 0)


# ---- cupy._core.raw / cupy.asarray ------------------------------------------------------------------------------
class RawKernel:
    def __init__(
        self,
        code: str,
        name: str,
        options: tuple[str, ...] = (),
        backend: str = "nvrtc",
        translate_cucomplex: bool = False,
        *,
        enable_cooperative_groups: bool = False,
        jitify: bool = False,
    ) -> None:
        self.name = name

    def __call__(self, grid: tuple[int, ...], block: tuple[int, ...], args: tuple[Any, ...], **kw: Any) -> None:
        CALLS.append(("kernel", self.name, grid, block))


class _DeviceArray:
    def __init__(self, a: Any) -> None:
        self.data = types.SimpleNamespace(ptr=_alloc(int(a.nbytes)))


def asarray(a: Any, dtype: Any = None, order: Any = None, *, blocking: bool = False) -> _DeviceArray:
    return _DeviceArray(a)


cuda = types.SimpleNamespace(
    runtime=runtime,
    Device=Device,
    Stream=Stream,
    Event=Event,
    get_elapsed_time=get_elapsed_time,
    malloc_managed=malloc_managed,
    ManagedMemory=ManagedMemory,
    MemoryPointer=MemoryPointer,
)
