"""Per-tensor UVM hints on a real GPU: what ``uvmlab run --policy NAME --mode gpu`` adds to the training loop.

The advisor's uvm-hint policies that need tensor knowledge (the shim sees only the caching allocator's segments)
are applied by the GPU worker when ``UVMLAB_HINTS`` names them (comma-separated; set by the GPU plan from the
policy's ``gpu_env``). They are the lines each policy's ``needs_code_change`` shows a user:

* ``read-mostly-parameters``: ``cudaMemAdvise(SetReadMostly)`` on every parameter once the model is built;
* ``remote-optimizer-state``: ``cudaMemAdvise(SetPreferredLocation, CPU)`` + ``(SetAccessedBy, GPU)`` on every
  optimizer state tensor after the first step (the step creates the state);
* ``prefetch-next-kernel``: forward pre-hooks that ``cudaMemPrefetchAsync`` the next module's parameters, and
  backward pre-hooks the previous module's (one module ahead: the simulator prefetches one kernel ahead), and an
  optimizer step pre-hook prefetching the optimizer state. The prefetches go on a side stream (non-blocking), as a
  user would issue them: the side stream first waits for an event recorded on the compute stream (so a prefetch
  starts after the work already queued, e.g. the optimizer step that wrote the parameters), and the module's own
  pre-hook makes the compute stream wait for the event recorded after its prefetch. On the compute stream itself
  the next kernel would wait for the prefetch and nothing would overlap, while the simulator
  (uvmlab.sim.uvm.hints, "Prefetch the next kernel's tensors") hides the prefetch behind the current kernel.

Spans: each advice or prefetch covers the tensor's own bytes, ``data_ptr()`` to the last element its strides reach
(:func:`view_span`), not its whole storage (a view with an offset would run past the storage's end, and a slice
would advise its neighbours). CUDA rounds an advised range out to CPU pages ("range will be rounded down and
rounded up respectively to be aligned to CPU page size before the advice is applied", CUDA 13.0
cuda_runtime_api.h, cudaMemAdvise), so advice still reaches the other tensors that share the first and last page:
:func:`page_span` gives the pages each call really covers, recorded in ``Hints.advised_pages``; the simulator
models the same rounding (uvmlab.sim.uvm.hints, read duplicates on every page of an advised tensor).

``discard-freed-blocks`` needs a C++ allocator hook (docs/advise.md) and is not applied here.

Signatures: CUDA 13 ``cuda_runtime_api.h`` ``cudaMemAdvise(const void*, size_t, cudaMemoryAdvise, cudaMemLocation)``
and ``cudaMemPrefetchAsync(const void*, size_t, cudaMemLocation, unsigned int, cudaStream_t)``; CUDA 12 takes an
int device instead of the location (``cudaCpuDeviceId`` = -1). Enum values from ``driver_types.h`` (also in
``csrc/uvmlab_cuda_abi.h``, checked against the headers by tests/test_gpu_shim_headers.py).
"""

from __future__ import annotations

import ctypes
import itertools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from uvmlab.errors import InputError

HINTS_ENV = "UVMLAB_HINTS"
WORKER_HINTS = ("read-mostly-parameters", "remote-optimizer-state", "prefetch-next-kernel")
"""The hint policies the GPU worker applies."""

ADVISE_READ_MOSTLY, ADVISE_PREFERRED_LOCATION, ADVISE_ACCESSED_BY = 1, 3, 5  # driver_types.h cudaMemoryAdvise
LOCATION_DEVICE, LOCATION_HOST = 1, 2  # driver_types.h cudaMemLocationType
CPU_DEVICE_ID = -1  # CUDA 12 cudaCpuDeviceId
STREAM_NON_BLOCKING = 0x01  # driver_types.h cudaStreamNonBlocking
EVENT_DISABLE_TIMING = 0x02  # driver_types.h cudaEventDisableTiming
CPU_PAGE_BYTES = 4096
"""The CPU page size CUDA rounds advice to (x86-64 PAGE_SIZE; uvmlab.gpus.GpuSpec.host_page_bytes on other hosts)."""


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]  # struct cudaMemLocation (CUDA 13)


class CudaRuntime:
    """``cudaMemAdvise`` / ``cudaMemPrefetchAsync`` of the process's CUDA runtime, CUDA 12 or 13 form."""

    def __init__(self, lib: Any = None) -> None:
        if lib is None:
            for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
                try:
                    lib = ctypes.CDLL(name)
                    break
                except OSError:
                    continue
            else:
                raise InputError("no CUDA runtime (libcudart.so.13 or .12) to apply the UVM hints with")
        self.lib = lib
        version = ctypes.c_int(0)
        lib.cudaRuntimeGetVersion(ctypes.byref(version))
        self.version = int(version.value)

    def _loc(self, device: int) -> Any:
        if self.version >= 13000:
            return _Location(LOCATION_HOST, 0) if device == CPU_DEVICE_ID else _Location(LOCATION_DEVICE, device)
        return ctypes.c_int(device)

    def advise(self, ptr: int, nbytes: int, advice: int, device: int) -> None:
        err = self.lib.cudaMemAdvise(ctypes.c_void_p(ptr), ctypes.c_size_t(nbytes), advice, self._loc(device))
        if err:
            raise RuntimeError(f"cudaMemAdvise(advice={advice}) returned cudaError {err}")

    def prefetch(self, ptr: int, nbytes: int, device: int, stream: int) -> None:
        p, n, s = ctypes.c_void_p(ptr), ctypes.c_size_t(nbytes), ctypes.c_void_p(stream)
        if self.version >= 13000:
            err = self.lib.cudaMemPrefetchAsync(p, n, self._loc(device), 0, s)
        else:
            err = self.lib.cudaMemPrefetchAsync(p, n, self._loc(device), s)
        if err:
            raise RuntimeError(f"cudaMemPrefetchAsync returned cudaError {err}")

    def _handle(self, fn: str, flags: int) -> int:
        h = ctypes.c_void_p()
        err = getattr(self.lib, fn)(ctypes.byref(h), ctypes.c_uint(flags))
        if err:
            raise RuntimeError(f"{fn} returned cudaError {err}")
        return int(h.value or 0)

    def stream_create(self) -> int:
        """``cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)``: a side stream."""
        return self._handle("cudaStreamCreateWithFlags", STREAM_NON_BLOCKING)

    def event_create(self) -> int:
        """``cudaEventCreateWithFlags(&e, cudaEventDisableTiming)``."""
        return self._handle("cudaEventCreateWithFlags", EVENT_DISABLE_TIMING)

    def event_record(self, event: int, stream: int) -> None:
        err = self.lib.cudaEventRecord(ctypes.c_void_p(event), ctypes.c_void_p(stream))
        if err:
            raise RuntimeError(f"cudaEventRecord returned cudaError {err}")

    def stream_wait_event(self, stream: int, event: int) -> None:
        err = self.lib.cudaStreamWaitEvent(ctypes.c_void_p(stream), ctypes.c_void_p(event), ctypes.c_uint(0))
        if err:
            raise RuntimeError(f"cudaStreamWaitEvent returned cudaError {err}")


def hints_from_env(env: Mapping[str, str]) -> list[str]:
    """The hint policies ``UVMLAB_HINTS`` names (an unknown one is an InputError)."""
    names = [n.strip() for n in env.get(HINTS_ENV, "").split(",") if n.strip()]
    bad = [n for n in names if n not in WORKER_HINTS]
    if bad:
        raise InputError(f"{HINTS_ENV}: unknown hint {bad[0]!r}; the worker applies {', '.join(WORKER_HINTS)}")
    return names


def view_span(t: Any) -> tuple[int, int]:
    """(address, bytes) of the memory a tensor view itself covers: from ``data_ptr()`` (its storage offset included)
    to the end of the last element its sizes and strides reach (0 bytes for an empty tensor)."""
    if t.numel() == 0:
        return int(t.data_ptr()), 0
    last = sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride(), strict=True) if n > 1)
    return int(t.data_ptr()), (last + 1) * int(t.element_size())


def page_span(ptr: int, nbytes: int, page: int = CPU_PAGE_BYTES) -> tuple[int, int]:
    """The (address, bytes) CUDA applies advice to: ``[ptr, ptr + nbytes)`` rounded out to whole CPU pages."""
    if nbytes <= 0:
        return ptr, 0
    lo = ptr // page * page
    hi = -(-(ptr + nbytes) // page) * page
    return lo, hi - lo


class Hints:
    """Applies the named hints to one model and optimizer (see the module docstring)."""

    def __init__(
        self,
        names: Iterable[str],
        rt: Any,
        device: int,
        stream: Callable[[], int],
        select: Callable[[Any], bool] = lambda t: bool(t.is_cuda),
    ) -> None:
        self.names = set(names)
        self.rt, self.device, self.stream, self.select = rt, device, stream, select
        self.calls = {"cudaMemAdvise": 0, "cudaMemPrefetchAsync": 0}
        self.advised_pages: dict[int, int] = {}
        """Page address -> bytes of the CPU pages advice reached (page_span of every call)."""
        self._side: int | None = None
        self._mark: dict[int, int] = {}
        self._done: dict[int, int] = {}
        self._pending: set[int] = set()

    def _advise(self, t: Any, advice: int, device: int) -> None:
        ptr, n = view_span(t)
        if n == 0:
            return
        self.rt.advise(ptr, n, advice, device)
        lo, size = page_span(ptr, n)
        for page in range(lo, lo + size, CPU_PAGE_BYTES):
            self.advised_pages[page] = CPU_PAGE_BYTES
        self.calls["cudaMemAdvise"] += 1

    def _events(self, key: int) -> tuple[int, int]:
        if key not in self._mark:
            self._mark[key], self._done[key] = self.rt.event_create(), self.rt.event_create()
        return self._mark[key], self._done[key]

    def _prefetch_ahead(self, key: int, tensors: Iterable[Any]) -> None:
        """Prefetch ``tensors`` on the side stream after the work queued so far; record ``key``'s done event."""
        spans = [view_span(t) for t in tensors if self.select(t)]
        spans = [s for s in spans if s[1] > 0]
        if not spans:
            return
        if self._side is None:
            self._side = self.rt.stream_create()
        mark, done = self._events(key)
        self.rt.event_record(mark, self.stream())
        self.rt.stream_wait_event(self._side, mark)
        for ptr, n in spans:
            self.rt.prefetch(ptr, n, self.device, self._side)
            self.calls["cudaMemPrefetchAsync"] += 1
        self.rt.event_record(done, self._side)
        self._pending.add(key)

    def _wait_for(self, key: int) -> None:
        """Before ``key``'s kernels: the compute stream waits for its prefetch, if one is pending."""
        if key in self._pending:
            self._pending.discard(key)
            self.rt.stream_wait_event(self.stream(), self._done[key])

    def _prefetch(self, module: Any) -> None:
        self._prefetch_ahead(id(module), module.parameters(recurse=False))

    def on_built(self, model: Any) -> None:
        """After the model is built: read-mostly parameters, prefetch hooks."""
        if "read-mostly-parameters" in self.names:
            for p in model.parameters():
                if self.select(p):
                    self._advise(p, ADVISE_READ_MOSTLY, self.device)
        if "prefetch-next-kernel" in self.names:
            mods = [m for m in model.modules() if any(True for _ in m.parameters(recurse=False))]
            for m in mods:  # first: a module's kernels wait for its own prefetch
                m.register_forward_pre_hook(lambda m_, _x: self._wait_for(id(m_)))
                m.register_full_backward_pre_hook(lambda m_, _g: self._wait_for(id(m_)))
            for a, b in itertools.pairwise(mods):
                a.register_forward_pre_hook(lambda _m, _x, b=b: self._prefetch(b))
                b.register_full_backward_pre_hook(lambda _m, _g, a=a: self._prefetch(a))

    def on_optimizer(self, optimizer: Any) -> None:
        """prefetch-next-kernel: a step pre-hook prefetching the optimizer state (the step touches it next)."""
        if "prefetch-next-kernel" in self.names:
            optimizer.register_step_pre_hook(lambda opt, _args, _kwargs: self._prefetch_state(opt))

    def _prefetch_state(self, optimizer: Any) -> None:
        tensors = [
            t for state in optimizer.state.values() for t in state.values() if hasattr(t, "data_ptr") and t.numel() > 1
        ]
        self._prefetch_ahead(id(optimizer), tensors)
        self._wait_for(id(optimizer))  # the step follows at once: it overlaps only what is still queued

    def after_step(self, optimizer: Any, iteration: int) -> None:
        """After an optimizer step: the first one created the state, which is advised to live on the CPU."""
        if iteration != 0 or "remote-optimizer-state" not in self.names:
            return
        for state in optimizer.state.values():
            for t in state.values():
                if hasattr(t, "data_ptr") and self.select(t) and t.numel() > 1:
                    self._advise(t, ADVISE_PREFERRED_LOCATION, CPU_DEVICE_ID)
                    self._advise(t, ADVISE_ACCESSED_BY, self.device)
