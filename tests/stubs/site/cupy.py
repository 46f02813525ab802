"""A fake ``cupy`` for tests without a GPU (``import cupy`` with tests/stubs/site on the path): the few classes and
functions uvmlab.measure.gpu.microbench and the evidence kit use, each with the signature of CuPy's source (cupy/cupy
main,
Aug 2026: cupy/cuda/memory.pyx, cupy/cuda/stream.pyx, cupy/_core/raw.pyx, cupy_backends/cuda/api/runtime.pyx).
Calls are recorded in ``CALLS``; managed memory is host memory (ctypes buffers), device memory (``runtime.malloc``)
a 4 KiB stand-in counted against the card, kernels do nothing but make the managed allocations they are passed
resident (taking ``size / $FAKE_CUPY_MIGRATE_BYTES_PER_S`` seconds for a range not yet resident, when that is set).
An event pair measures the real time between the two ``record`` calls (``time.perf_counter_ns``): what
runs in between on the host (there is no device) is what a test sees, so host work inside a timed region shows.
``runtime.memGetInfo`` answers ``(FREE - device bytes allocated - resident managed bytes, TOTAL)`` with
``FREE``/``TOTAL`` from ``$FAKE_CUPY_FREE_BYTES`` / ``$FAKE_CUPY_TOTAL_BYTES`` (default 64 MiB / 80 GiB): managed pages
on the GPU take device memory (CUDA 13.0 cuda_runtime_api.h, cudaMemGetInfo: free "according to the OS"); a kernel's
touch or a prefetch to the device makes a managed allocation resident, a prefetch to the host (``memPrefetchAsync``
with ``cudaCpuDeviceId``) or its release gives the memory back. ``$FAKE_CUPY_LOG`` names a file that gets one line
per managed allocation (``malloc_managed <bytes> free=<free bytes before>``), for tests of the sizing rules.

Linking: CuPy links the CUDA runtime statically (no library of the cupy-cuda13x wheel depends on libcudart.so),
so importing this module loads no libcudart either.

``ManagedMemory.prefetch(self, stream, *, device_id=cudaInvalidDeviceId)``: CuPy 13+ (older releases had
``prefetch(self, stream)``); ``OldManagedMemory`` has that older signature.
"""

from __future__ import annotations

import ctypes
import os
import time
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
    if devPtr in _managed:
        _managed[devPtr][1] = dstDevice >= 0


def memAdvise(devPtr: int, count: int, advice: int, device: int) -> None:
    CALLS.append(("memAdvise", devPtr, count, advice, device))


def runtimeGetVersion() -> int:
    return RUNTIME_VERSION[0]


_device: dict[int, int] = {}
_managed: dict[int, list[Any]] = {}
"""Live managed allocations: pointer -> [bytes, resident on the GPU]."""


def memGetInfo() -> tuple[int, int]:
    free0 = int(os.environ.get("FAKE_CUPY_FREE_BYTES", 64 << 20))
    resident = sum(size for size, on_gpu in _managed.values() if on_gpu)
    return max(0, free0 - sum(_device.values()) - resident), int(os.environ.get("FAKE_CUPY_TOTAL_BYTES", 80 << 30))


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
        self.t_ns: int | None = None

    def record(self, stream: Any = None) -> None:
        CALLS.append(("event_record",))
        self.t_ns = time.perf_counter_ns()

    def synchronize(self) -> None:
        return None


def get_elapsed_time(start_event: Event, end_event: Event) -> float:
    """Milliseconds between the two records (cupy/cuda/stream.pyx ``get_elapsed_time``: cudaEventElapsedTime)."""
    if start_event.t_ns is None or end_event.t_ns is None:
        raise RuntimeError("cudaErrorInvalidResourceHandle: an event was not recorded")
    return (end_event.t_ns - start_event.t_ns) / 1e6


# ---- cupy.cuda.memory ------------------------------------------------------------------------------------------
class ManagedMemory:
    def __init__(self, size: int) -> None:
        self.size = size
        self.device_id = 0
        log = os.environ.get("FAKE_CUPY_LOG")
        if log:
            with open(log, "a") as fh:
                fh.write(f"malloc_managed {size} free={memGetInfo()[0]}\n")
        self.ptr = _alloc(size)
        _managed[self.ptr] = [size, False]

    def __del__(self) -> None:  # CuPy frees a managed allocation when its last reference goes
        _buffers.pop(self.ptr, None)
        _managed.pop(self.ptr, None)

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
        rate = float(os.environ.get("FAKE_CUPY_MIGRATE_BYTES_PER_S", 0) or 0)
        for a in args:  # the managed allocations a kernel is passed fault in (become resident)
            try:
                key = int(a)
            except (TypeError, ValueError):
                continue
            if key in _managed and not _managed[key][1]:
                if rate:  # $FAKE_CUPY_MIGRATE_BYTES_PER_S: the first touch takes time (a migration), real time
                    time.sleep(_managed[key][0] / rate)
                _managed[key][1] = True


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
