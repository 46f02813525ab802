"""The CUDA program backend: what a program workload file's ``uvm.*`` calls really do on a GPU (IFACE.md B2).

``workloads.program.Program`` records every call of a program file (``program(uvm, cfg, options)``) and hands what
must really happen on the GPU to a backend; ``uvmlab run FILE --mode gpu`` (the GPU worker,
``uvmlab.measure.gpu.worker``) gives it :class:`CudaProgramBackend`:

* ``prefetch(t, offset, nbytes, to)``: ``cudaMemPrefetchAsync`` of the tensor's byte range to the current device
  (``to="gpu"``) or the CPU (``to="cpu"``), on torch's current stream, flags 0;
* ``advise(t, offset, nbytes, advice)``: ``cudaMemAdvise`` with the advice of an ``advice`` string of
  ``uvmlab.sim.uvm.advice.ADVICE`` ("set_accessed_by:cpu" ...); the location is the current device for ":gpu" and
  the CPU for ":cpu"; advice without a location (read-mostly, unset preferred location) passes the current device,
  which the runtime ignores for them (CUDA 13.0 cuda_runtime_api.h, cudaMemAdvise: "the location argument is
  ignored" for cudaMemAdviseSetReadMostly / UnsetReadMostly / UnsetPreferredLocation);
* ``host_access(t, offset, nbytes, write)``: the CPU really reads (``write=False``) or writes the range through the
  managed pointer (see "Host accesses" below); only managed memory can be touched so:
  ``cudaPointerGetAttributes`` must say ``cudaMemoryTypeManaged``, else one InputError sentence says that the program
  must run under uvmlab's managed-memory shim;
* ``kernel(name, reads, writes, gpu)``: ``gpu()`` when the file gives one (e.g. a CuPy RawKernel launch); else a torch
  stand-in touching the same bytes (see "Kernel stand-in");
* ``prefetch_new_allocations(on)``: switches the shim's prefetch after every managed allocation
  (``uvmlab_prefetch_on_alloc`` in uvmlab_shim.cpp; ``UVMLAB_PREFETCH=on_alloc`` at load is the same setting) for both
  of its routes, the interposed ``cudaMalloc`` and the CUDAPluggableAllocator entry ``uvmlab_malloc``.

Signatures (CUDA 13.0 ``cuda_runtime_api.h``; checked against the installed headers by tests/test_gpu_shim_headers.py
through ``csrc/uvmlab_cuda_abi.h``): ``cudaMemPrefetchAsync(const void*, size_t, struct cudaMemLocation, unsigned
int flags, cudaStream_t)`` and ``cudaMemAdvise(const void*, size_t, enum cudaMemoryAdvise, struct cudaMemLocation)``;
CUDA 12 takes an ``int`` device instead of the location (``cudaCpuDeviceId`` = -1, ``driver_types.h``) and no flags.
The form is chosen by ``cudaRuntimeGetVersion`` (>= 13000: the location form), as ``uvmlab.measure.gpu.hints`` and the
shim do. ``cudaPointerGetAttributes(struct cudaPointerAttributes*, const void*)`` and ``cudaGetErrorName`` are the
same in both. Every CUDA error is one UvmlabError sentence naming the call and the ``cudaError`` name.

Host accesses. Before the CPU touches managed memory the device is synchronised (the CPU may not access managed
memory while a kernel may use it on a device without ``cudaDevAttrConcurrentManagedAccess``, CUDA Programming Guide,
"Data Migration and Coherency"; with it, a program would synchronise anyway to see the kernel's results). A read copies
the range to a private host buffer with ``memmove`` (the CPU loads every byte). A write keeps the tensor's values: each
chunk is first copied out and then stored back by the CPU (``memmove`` both ways), so a program may declare a host
write of data it built with torch on the device (an index for a gather, a pointer chain) without the write destroying
it. Approximation: the CPU loads each page before it stores to it, where a program that only stores would not; the
driver migrates a GPU-resident page to the CPU on the first CPU fault of either kind (uvm_va_block.c, CPU faults
service the whole page), so the pages that move are the same; a read-mostly page is first duplicated and then, at the
store, its GPU copy is dropped, the state a pure store leaves too.

Kernel stand-in (no ``gpu`` callable given): each read tensor is reduced (a ``sum`` over its bytes, result dropped)
and each written tensor is filled with zeros, in the order reads then writes, on the current stream, asynchronously.
Approximation: it touches exactly the declared bytes, but in the order of PyTorch's reduction and fill kernels
(elementwise, all warps of a grid streaming), not the access order the file declares (``pattern``, ``threads``,
``stride_bytes``); a file that needs the declared order on a GPU gives ``gpu=``.

Baseline runs (``--baseline``: the shim in passthrough mode, plain device memory, no UVM) use
``CudaProgramBackend(managed=False)``: a host read is a device-to-host copy of the range, a host write a copy out and
back in (the explicit ``cudaMemcpy`` a program without unified memory makes), and prefetch, advice and
``prefetch_new_allocations`` do nothing (they exist only for managed memory).
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable, Sequence
from typing import Any

from uvmlab.errors import InputError, UnavailableError, UvmlabError
from uvmlab.sim.uvm.advice import ADVICE

ADVICE_CODES: dict[str, int] = {
    "set_read_mostly": 1,  # cudaMemAdviseSetReadMostly (driver_types.h enum cudaMemoryAdvise)
    "unset_read_mostly": 2,  # cudaMemAdviseUnsetReadMostly
    "set_preferred_location": 3,  # cudaMemAdviseSetPreferredLocation
    "unset_preferred_location": 4,  # cudaMemAdviseUnsetPreferredLocation
    "set_accessed_by": 5,  # cudaMemAdviseSetAccessedBy
    "unset_accessed_by": 6,  # cudaMemAdviseUnsetAccessedBy
}
"""Advice name (the part of an ADVICE string before ":") -> ``enum cudaMemoryAdvise`` value (CUDA 13.0
``driver_types.h``; the same values in ``csrc/uvmlab_cuda_abi.h``, checked against the headers)."""
ADVICE_ENUM_NAMES = {
    1: "cudaMemAdviseSetReadMostly",
    2: "cudaMemAdviseUnsetReadMostly",
    3: "cudaMemAdviseSetPreferredLocation",
    4: "cudaMemAdviseUnsetPreferredLocation",
    5: "cudaMemAdviseSetAccessedBy",
    6: "cudaMemAdviseUnsetAccessedBy",
}
CPU_DEVICE_ID = -1
"""``cudaCpuDeviceId`` (driver_types.h ``#define cudaCpuDeviceId ((int)-1)``): the CUDA 12 form's CPU."""
LOCATION_DEVICE, LOCATION_HOST = 1, 2
"""``cudaMemLocationTypeDevice`` / ``cudaMemLocationTypeHost`` (driver_types.h ``enum cudaMemLocationType``)."""
MEMORY_TYPE_UNREGISTERED, MEMORY_TYPE_HOST, MEMORY_TYPE_DEVICE, MEMORY_TYPE_MANAGED = 0, 1, 2, 3
"""``enum cudaMemoryType`` (driver_types.h)."""
MEMORY_TYPE_NAMES = {0: "unregistered host", 1: "pinned host", 2: "device", 3: "managed"}
CUDA13_VERSION = 13000
"""``cudaRuntimeGetVersion`` of CUDA 13.0: from it on cudaMemAdvise / cudaMemPrefetchAsync take a cudaMemLocation."""
POINTER_ATTRIBUTES_BUFFER_BYTES = 128
"""Bytes passed for ``struct cudaPointerAttributes``: CUDA 13's is 88 (four members and ``long reserved[8]``), CUDA
12's 24; a test static_asserts that the header's struct fits (csrc/uvmlab_cuda_abi.h)."""
HOST_CHUNK_BYTES = 64 << 20
"""Host accesses go through a private buffer of at most this many bytes (64 MiB), chunk by chunk."""
SHIM_PREFETCH_SWITCH = "uvmlab_prefetch_on_alloc"
"""The shim's exported switch of its prefetch after every managed allocation (uvmlab_shim.cpp)."""


class _Location(ctypes.Structure):
    """``struct cudaMemLocation {enum cudaMemLocationType type; int id;}`` (CUDA >= 12.2 driver_types.h); passed by
    value (one 8-byte register on x86-64)."""

    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _PointerAttributes(ctypes.Structure):
    """``struct cudaPointerAttributes``: the four members of CUDA 12 and 13, padded to the buffer size."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("device", ctypes.c_int),
        ("devicePointer", ctypes.c_void_p),
        ("hostPointer", ctypes.c_void_p),
        ("_reserved", ctypes.c_char * (POINTER_ATTRIBUTES_BUFFER_BYTES - 24)),
    ]


def parse_advice(advice: str) -> tuple[int, str | None]:
    """An ADVICE string ("set_accessed_by:cpu") -> (``enum cudaMemoryAdvise`` value, "gpu" / "cpu" / None)."""
    if advice not in ADVICE:
        raise InputError(f"unknown cudaMemAdvise advice {advice!r}; known: {', '.join(ADVICE)}")
    name, _, where = advice.partition(":")
    return ADVICE_CODES[name], where or None


class CudaProgramBackend:
    """The ProgramBackend of IFACE.md B2 on a real GPU (see the module docstring).

    ``lib``: the CUDA runtime (ctypes; default :func:`uvmlab.measure.gpu.cudart.load_cudart`, the runtime torch
    loaded); ``device``: the device ordinal (default torch's current device); ``stream``: the current stream as an
    integer handle (default ``torch.cuda.current_stream().cuda_stream``); ``sync``: waits for the device (default
    ``torch.cuda.synchronize``); ``shim``: the library exporting ``uvmlab_prefetch_on_alloc`` (default the process's
    global scope, where LD_PRELOAD put the shim); ``managed``: False for a baseline run without unified memory.
    Tests inject all of them (a stub runtime, CPU tensors).
    """

    def __init__(
        self,
        lib: Any = None,
        device: int | None = None,
        stream: Callable[[], int] | None = None,
        sync: Callable[[], None] | None = None,
        shim: Any = None,
        managed: bool = True,
    ) -> None:
        if lib is None or device is None or stream is None or sync is None:
            import torch

            if not torch.cuda.is_available():
                raise UnavailableError(
                    "the CUDA program backend needs a CUDA device, and torch.cuda.is_available() is False here"
                )
            device = torch.cuda.current_device() if device is None else device
            stream = stream or (lambda: int(torch.cuda.current_stream().cuda_stream))
            sync = sync or torch.cuda.synchronize
        if lib is None:
            from uvmlab.measure.gpu.cudart import load_cudart

            lib = load_cudart()
        self.lib, self.device, self.stream, self.sync = lib, int(device), stream, sync
        self.shim, self.managed = shim, managed
        self.calls: dict[str, int] = {}
        self._marks: list[tuple[int, int]] = []
        version = ctypes.c_int(0)
        fn = lib.cudaRuntimeGetVersion
        fn.restype, fn.argtypes = ctypes.c_int, [ctypes.POINTER(ctypes.c_int)]
        self._check(fn(ctypes.byref(version)), "cudaRuntimeGetVersion")
        self.version = int(version.value)

    # ---- CUDA calls ---------------------------------------------------------------------------------------------
    def error_name(self, rc: int) -> str:
        """``cudaGetErrorName(rc)`` ("cudaErrorInvalidValue"), or "cudaError <rc>" when the runtime has no name."""
        try:
            fn = self.lib.cudaGetErrorName
        except AttributeError:
            return f"cudaError {rc}"
        fn.restype, fn.argtypes = ctypes.c_char_p, [ctypes.c_int]
        name = fn(rc)
        return name.decode(errors="replace") if name else f"cudaError {rc}"

    def _check(self, rc: int, call: str) -> None:
        if rc != 0:
            raise UvmlabError(f"{call} failed with {self.error_name(rc)} (error {rc})")

    def _count(self, call: str) -> None:
        self.calls[call] = self.calls.get(call, 0) + 1

    def _location(self, where: str) -> Any:
        """The location argument: CUDA 13 a cudaMemLocation, CUDA 12 an int device (cudaCpuDeviceId for the CPU)."""
        cpu = where == "cpu"
        if self.version >= CUDA13_VERSION:
            return _Location(LOCATION_HOST, 0) if cpu else _Location(LOCATION_DEVICE, self.device)
        return ctypes.c_int(CPU_DEVICE_ID if cpu else self.device)

    @staticmethod
    def _range(t: Any, offset: int, nbytes: int) -> tuple[int, int]:
        if offset < 0 or nbytes < 0:
            raise InputError(f"a tensor byte range needs offset >= 0 and nbytes >= 0, not {offset} and {nbytes}")
        return int(t.data_ptr()) + int(offset), int(nbytes)

    def memory_type(self, ptr: int) -> int:
        """``cudaPointerGetAttributes(&attr, ptr).type`` (``enum cudaMemoryType``)."""
        attr = _PointerAttributes()
        fn = self.lib.cudaPointerGetAttributes
        fn.restype, fn.argtypes = ctypes.c_int, [ctypes.POINTER(_PointerAttributes), ctypes.c_void_p]
        self._check(fn(ctypes.byref(attr), ctypes.c_void_p(ptr)), f"cudaPointerGetAttributes(0x{ptr:x})")
        self._count("cudaPointerGetAttributes")
        return int(attr.type)

    # ---- ProgramBackend -----------------------------------------------------------------------------------------
    def prefetch(self, t: Any, offset: int, nbytes: int, to: str) -> None:
        """``cudaMemPrefetchAsync(ptr + offset, nbytes, <to>, 0, current stream)``."""
        if to not in ("gpu", "cpu"):
            raise InputError(f"prefetch destination must be 'gpu' or 'cpu', not {to!r}")
        ptr, n = self._range(t, offset, nbytes)
        if not self.managed or n == 0:
            return
        fn = self.lib.cudaMemPrefetchAsync
        fn.restype = ctypes.c_int
        loc, stream = self._location(to), ctypes.c_void_p(self.stream())
        if self.version >= CUDA13_VERSION:
            fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, _Location, ctypes.c_uint, ctypes.c_void_p]
            rc = fn(ctypes.c_void_p(ptr), ctypes.c_size_t(n), loc, ctypes.c_uint(0), stream)
        else:
            fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
            rc = fn(ctypes.c_void_p(ptr), ctypes.c_size_t(n), loc, stream)
        self._check(rc, f"cudaMemPrefetchAsync of {n} bytes at 0x{ptr:x} to the {to.upper()}")
        self._count("cudaMemPrefetchAsync")

    def advise(self, t: Any, offset: int, nbytes: int, advice: str) -> None:
        """``cudaMemAdvise(ptr + offset, nbytes, <advice>, <location>)`` (see the module docstring)."""
        code, where = parse_advice(advice)
        ptr, n = self._range(t, offset, nbytes)
        if not self.managed or n == 0:
            return
        fn = self.lib.cudaMemAdvise
        fn.restype = ctypes.c_int
        loc = self._location(where or "gpu")
        if self.version >= CUDA13_VERSION:
            fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, _Location]
        else:
            fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int]
        rc = fn(ctypes.c_void_p(ptr), ctypes.c_size_t(n), code, loc)
        target = f", {where.upper()}" if where else ""
        self._check(rc, f"cudaMemAdvise({ADVICE_ENUM_NAMES[code]}{target}) of {n} bytes at 0x{ptr:x}")
        self._count("cudaMemAdvise")

    def host_access(self, t: Any, offset: int, nbytes: int, write: bool) -> None:
        """The CPU reads or writes the range through the managed pointer (module docstring, "Host accesses")."""
        ptr, n = self._range(t, offset, nbytes)
        if n == 0:
            return
        what = "host_write" if write else "host_read"
        if not self.managed:
            self._copy_access(t, offset, n, write)
            return
        kind = self.memory_type(ptr)
        if kind != MEMORY_TYPE_MANAGED:
            raise InputError(
                f"uvm.{what} needs managed memory, but the tensor at 0x{ptr:x} is "
                f"{MEMORY_TYPE_NAMES.get(kind, f'type {kind}')} memory (cudaPointerGetAttributes), so the program "
                "must run under uvmlab's managed-memory shim (uvmlab run FILE --mode gpu preloads it)"
            )
        self.sync()
        buf = ctypes.create_string_buffer(min(n, HOST_CHUNK_BYTES))
        done = 0
        while done < n:
            step = min(HOST_CHUNK_BYTES, n - done)
            ctypes.memmove(buf, ptr + done, step)  # the CPU loads every byte of the chunk
            if write:
                ctypes.memmove(ptr + done, buf, step)  # ... and stores the same values back
            done += step
        self._count(what)

    def _copy_access(self, t: Any, offset: int, n: int, write: bool) -> None:
        """Baseline (no unified memory): the explicit copies a program without it makes (module docstring)."""
        import torch

        flat = t.detach()
        if not flat.is_contiguous():
            raise InputError("a host access to a non-contiguous tensor needs managed memory (a baseline run has none)")
        part = flat.reshape(-1).view(torch.uint8)[int(offset) : int(offset) + n]
        host = part.cpu()  # device -> host
        if write:
            part.copy_(host)  # host -> device
        self._count("host_write" if write else "host_read")

    def kernel(
        self, name: str, reads: Sequence[Any], writes: Sequence[Any], gpu: Callable[[], None] | None = None
    ) -> None:
        """``gpu()`` when given; else the torch stand-in (module docstring, "Kernel stand-in")."""
        if gpu is not None:
            gpu()
            self._count("kernel gpu()")
            return
        import torch

        with torch.no_grad():
            for t in reads:
                _bytes(t, torch).sum()
            for t in writes:
                _bytes(t, torch).zero_()
        self._count("kernel stand-in")

    def mark_iteration(self, iteration: int) -> None:
        """Not in the protocol: called (when present) by ``Program.iterations()`` as each iteration starts and with
        -1 after the last; waits for the device and records ``time.monotonic_ns()`` (the shim log's clock), so the
        GPU worker can report iteration times (:meth:`iteration_times`)."""
        self.sync()
        self._marks.append((int(iteration), time.monotonic_ns()))

    def iteration_times(self) -> list[dict[str, int]]:
        """``[{iteration, start_ns, end_ns, duration_ns}]`` from the marks (empty without any)."""
        out = []
        for (it, start), (_next, end) in zip(self._marks, self._marks[1:], strict=False):
            if it >= 0:
                out.append({"iteration": it, "start_ns": start, "end_ns": end, "duration_ns": end - start})
        return out

    def prefetch_new_allocations(self, on: bool) -> None:
        """Switch the shim's prefetch after every managed allocation (``uvmlab_prefetch_on_alloc``).

        Approximation: with PyTorch's caching allocator on, only allocations that reach ``cudaMalloc`` (new
        segments) are prefetched, not a tensor served from a cached block; with it off
        (``PYTORCH_NO_CUDA_MEMORY_CACHING=1``, the plan's pca-off) or through the CUDAPluggableAllocator route
        (``uvmlab_malloc``) every tensor allocation is."""
        if not self.managed:
            return
        lib = self.shim if self.shim is not None else ctypes.CDLL(None)
        try:
            fn = lib[SHIM_PREFETCH_SWITCH]
        except AttributeError:
            if not on:
                return
            raise InputError(
                "uvm.prefetch_new_allocations(True) needs uvmlab's managed-memory shim in this process (its "
                f"{SHIM_PREFETCH_SWITCH} is not loaded), so the program must run under uvmlab run FILE --mode gpu"
            ) from None
        fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_int]
        fn(1 if on else 0)
        self._count(SHIM_PREFETCH_SWITCH)


def _bytes(t: Any, torch: Any) -> Any:
    """The tensor's bytes as a flat uint8 view when it is contiguous (any dtype reduces and fills), else itself."""
    d = t.detach()
    if d.is_contiguous():
        return d.reshape(-1).view(torch.uint8)
    return d
