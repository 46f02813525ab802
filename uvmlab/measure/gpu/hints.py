"""Per-tensor UVM hints on a real GPU: what ``uvmlab run --policy NAME --mode gpu`` adds to the training loop.

The advisor's uvm-hint policies that need tensor knowledge (the shim sees only the caching allocator's segments)
are applied by the GPU worker when ``UVMLAB_HINTS`` names them (comma-separated; set by the GPU plan from the
policy's ``gpu_env``). They are the lines each policy's ``needs_code_change`` shows a user:

* ``read-mostly-parameters``: ``cudaMemAdvise(SetReadMostly)`` on every parameter once the model is built;
* ``remote-optimizer-state``: ``cudaMemAdvise(SetPreferredLocation, CPU)`` + ``(SetAccessedBy, GPU)`` on every
  optimizer state tensor after the first step (the step creates the state);
* ``prefetch-next-kernel``: forward pre-hooks that ``cudaMemPrefetchAsync`` the next module's parameters, and
  backward pre-hooks the previous module's (one module ahead: the simulator prefetches one kernel ahead), and an
  optimizer step pre-hook prefetching the optimizer state.

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


def hints_from_env(env: Mapping[str, str]) -> list[str]:
    """The hint policies ``UVMLAB_HINTS`` names (an unknown one is an InputError)."""
    names = [n.strip() for n in env.get(HINTS_ENV, "").split(",") if n.strip()]
    bad = [n for n in names if n not in WORKER_HINTS]
    if bad:
        raise InputError(f"{HINTS_ENV}: unknown hint {bad[0]!r}; the worker applies {', '.join(WORKER_HINTS)}")
    return names


def _span(t: Any) -> tuple[int, int]:
    return int(t.data_ptr()), int(t.untyped_storage().nbytes())


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

    def _advise(self, t: Any, advice: int, device: int) -> None:
        self.rt.advise(*_span(t), advice, device)
        self.calls["cudaMemAdvise"] += 1

    def _prefetch(self, module: Any) -> None:
        for p in module.parameters(recurse=False):
            if self.select(p):
                self.rt.prefetch(*_span(p), self.device, self.stream())
                self.calls["cudaMemPrefetchAsync"] += 1

    def on_built(self, model: Any) -> None:
        """After the model is built: read-mostly parameters, prefetch hooks."""
        if "read-mostly-parameters" in self.names:
            for p in model.parameters():
                if self.select(p):
                    self._advise(p, ADVISE_READ_MOSTLY, self.device)
        if "prefetch-next-kernel" in self.names:
            mods = [m for m in model.modules() if any(True for _ in m.parameters(recurse=False))]
            for a, b in itertools.pairwise(mods):
                a.register_forward_pre_hook(lambda _m, _x, b=b: self._prefetch(b))
                b.register_full_backward_pre_hook(lambda _m, _g, a=a: self._prefetch(a))

    def on_optimizer(self, optimizer: Any) -> None:
        """prefetch-next-kernel: a step pre-hook prefetching the optimizer state (the step touches it next)."""
        if "prefetch-next-kernel" in self.names:
            optimizer.register_step_pre_hook(lambda opt, _args, _kwargs: self._prefetch_state(opt))

    def _prefetch_state(self, optimizer: Any) -> None:
        for state in optimizer.state.values():
            for t in state.values():
                if hasattr(t, "data_ptr") and self.select(t) and t.numel() > 1:
                    self.rt.prefetch(*_span(t), self.device, self.stream())
                    self.calls["cudaMemPrefetchAsync"] += 1

    def after_step(self, optimizer: Any, iteration: int) -> None:
        """After an optimizer step: the first one created the state, which is advised to live on the CPU."""
        if iteration != 0 or "remote-optimizer-state" not in self.names:
            return
        for state in optimizer.state.values():
            for t in state.values():
                if hasattr(t, "data_ptr") and self.select(t) and t.numel() > 1:
                    self._advise(t, ADVISE_PREFERRED_LOCATION, CPU_DEVICE_ID)
                    self._advise(t, ADVISE_ACCESSED_BY, self.device)
