"""Child step of ``uvmlab collect``: the shim and Unified Memory on this machine's real runtime, one check at a time.

``python -m uvmlab.measure.gpu.kit.probe_step OUT [--device cpu --cudart LIB]``

Run under the shim (the plan preloads it with ``UVMLAB_BALLOON_DEFER=1``). Each check is recorded in
``OUT/probe.json`` whatever the others do (an exception is the check's answer, the next one runs):

1. ``interposed``: with torch on the GPU, a tensor's pointer is ``cudaMemoryTypeManaged`` (3) under the shim: PyTorch's
   cudaMalloc reaches the shim (else 2: it bypassed it);
2. ``balloon``: ``uvmlab_balloon_take`` leaving half the managed limit (uvmlab.measure.gpu.kit.sizing) free: the free
   memory before and after, the balloon the shim holds (does it hold what was asked);
3. ``residency``: a managed range of at most a quarter of the free memory's managed limit: free memory untouched,
   after a prefetch to the GPU (does resident managed memory lower cudaMemGetInfo's free, as the stub models), after a
   prefetch back to the host, after cudaFree and 1 s later (is freed memory given back);
4. ``non_uvm_growth``: with torch, a convolution, a linear layer and an Adam step after the balloon, then every cache
   emptied: the device memory the process took outside UVM after the balloon (the reserve R's guess);
5. ``codes``: cudaMemAdvise / cudaMemPrefetchAsync on managed memory and on device memory, and the argument errors
   the stub runtime refuses (tests/stubs/fake_cudart.c, each code cited from the CUDA 13.0 headers), each with the
   code the stub answers (``stub``) and whether this runtime agrees.

Every managed allocation is sized from the free memory measured here (sizing.managed_limit). With ``--device cpu``
the torch checks are recorded as not run and the runtime checks go to ``--cudart`` (tests, against the stub).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from uvmlab.units import GiB, MiB

STUB_CODES = {
    "cudaMallocManaged flags 0": 1,
    "cudaMallocManaged flags 4": 1,
    "cudaMemAdvise advice 99": 1,
    "cudaMemAdvise preferred location on device 7": 101,
    "cudaMemAdvise preferred location, location type 0": 1,
    "cudaMemPrefetchAsync flags 1": 1,
    "cudaMemPrefetchAsync location type 0": 1,
    "cudaFree of a pointer never allocated": 1,
    "cudaMemAdvise on device memory": 1,
    "cudaMemPrefetchAsync of device memory": 1,
    "cudaMemAdvise read mostly on managed memory": 0,
    "cudaMemPrefetchAsync of managed memory to the GPU": 0,
}
"""What the stub runtime answers for each call (tests/test_gpu_stub_runtime.py checks the stub; here the real
runtime's answer is recorded beside it)."""


class _Loc(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]  # struct cudaMemLocation (CUDA >= 12.2)


def _record(out: dict[str, Any], key: str, fn: Callable[[], Any]) -> None:
    try:
        out[key] = fn()
    except Exception as exc:  # a probe records every failure and goes on
        out[key] = f"ERROR {type(exc).__name__}: {exc}"


def _free(lib: Any) -> int:
    from uvmlab.measure.gpu.worker import real_mem_get_info

    return real_mem_get_info(lib)[0]


def _sync(lib: Any) -> None:
    lib.cudaDeviceSynchronize()


def residency(lib: Any, size: int) -> dict[str, Any]:
    """Check 3 (module docstring)."""
    mm = lib.cudaMallocManaged
    mm.restype, mm.argtypes = ctypes.c_int, [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_uint]
    pf = lib.cudaMemPrefetchAsync
    pf.restype, pf.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t, _Loc, ctypes.c_uint, ctypes.c_void_p]
    p = ctypes.c_void_p()
    out: dict[str, Any] = {"size_bytes": size, "free_before": _free(lib)}
    out["malloc_managed"] = mm(ctypes.byref(p), size, 1)
    out["free_untouched"] = _free(lib)
    out["prefetch_gpu"] = pf(p, size, _Loc(1, 0), 0, None)
    _sync(lib)
    out["free_resident"] = _free(lib)
    out["prefetch_host"] = pf(p, size, _Loc(2, 0), 0, None)
    _sync(lib)
    out["free_back_on_host"] = _free(lib)
    out["cuda_free"] = lib.cudaFree(p)
    out["free_after_free"] = _free(lib)
    time.sleep(1.0)
    out["free_after_free_1s"] = _free(lib)
    out["resident_lowers_free"] = out["free_untouched"] - out["free_resident"]
    return out


def codes(lib: Any, device_ptr: int) -> dict[str, Any]:
    """Check 5 (module docstring): each call's code beside the stub's."""
    adv, pf, mm = lib.cudaMemAdvise, lib.cudaMemPrefetchAsync, lib.cudaMallocManaged
    adv.restype, adv.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, _Loc]
    pf.restype, pf.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t, _Loc, ctypes.c_uint, ctypes.c_void_p]
    mm.restype, mm.argtypes = ctypes.c_int, [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_uint]
    lib.cudaFree.argtypes = [ctypes.c_void_p]
    m = ctypes.c_void_p()
    if mm(ctypes.byref(m), 2 * MiB, 1) != 0:
        return {"error": "cudaMallocManaged of 2 MiB failed"}
    q = ctypes.c_void_p()
    calls = {
        "cudaMallocManaged flags 0": lambda: mm(ctypes.byref(q), 4096, 0),
        "cudaMallocManaged flags 4": lambda: mm(ctypes.byref(q), 4096, 4),
        "cudaMemAdvise advice 99": lambda: adv(m, 4096, 99, _Loc(1, 0)),
        "cudaMemAdvise preferred location on device 7": lambda: adv(m, 4096, 3, _Loc(1, 7)),
        "cudaMemAdvise preferred location, location type 0": lambda: adv(m, 4096, 3, _Loc(0, 0)),
        "cudaMemPrefetchAsync flags 1": lambda: pf(m, 4096, _Loc(1, 0), 1, None),
        "cudaMemPrefetchAsync location type 0": lambda: pf(m, 4096, _Loc(0, 0), 0, None),
        "cudaFree of a pointer never allocated": lambda: lib.cudaFree(0x7F0000001000),
        "cudaMemAdvise on device memory": lambda: adv(device_ptr, 4096, 1, _Loc(1, 0)),
        "cudaMemPrefetchAsync of device memory": lambda: pf(device_ptr, 4096, _Loc(1, 0), 0, None),
        "cudaMemAdvise read mostly on managed memory": lambda: adv(m, 4096, 1, _Loc(1, 0)),
        "cudaMemPrefetchAsync of managed memory to the GPU": lambda: pf(m, 4096, _Loc(1, 0), 0, None),
    }
    out: dict[str, Any] = {}
    for name, call in calls.items():
        _record(out, name, lambda call=call, name=name: {"code": int(call()), "stub": STUB_CODES[name]})
        if isinstance(out[name], dict):
            out[name]["agrees"] = out[name]["code"] == out[name]["stub"]
    _sync(lib)
    lib.cudaFree(m)
    return out


def run_probe(device: str = "cuda", cudart: str | None = None) -> dict[str, Any]:
    """Every check of the module docstring, in order; the JSON-ready record."""
    from uvmlab.measure.gpu.kit.sizing import managed_limit
    from uvmlab.measure.gpu.worker import shim_counter

    out: dict[str, Any] = {"device": device}
    torch: Any = None
    if device.startswith("cuda"):
        import torch as _torch

        from uvmlab.measure.gpu.cudart import load_cudart

        torch = _torch
        torch.cuda.init()
        lib = load_cudart()
    else:
        lib = ctypes.CDLL(str(cudart))
    glob = ctypes.CDLL(None)
    out["free_at_start"] = _free(lib)
    limit = managed_limit(out["free_at_start"])
    out["managed_limit_bytes"] = limit
    if torch is not None:

        def interposed() -> dict[str, Any]:
            from uvmlab.measure.gpu.program_backend import CudaProgramBackend

            x = torch.empty(2 * MiB, dtype=torch.uint8, device="cuda")
            kind = CudaProgramBackend(lib=lib).memory_type(int(x.data_ptr()))
            return {"pointer_type": kind, "managed": kind == 3, "live_managed_bytes": shim_counter(
                "uvmlab_live_managed_bytes")}  # fmt: skip

        _record(out, "interposed", interposed)
    else:
        out["interposed"] = "not run: no torch device (--device cpu)"

    def balloon() -> dict[str, Any]:
        leave = min(16 * GiB, limit // 2)
        fn = glob.uvmlab_balloon_leave
        fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_size_t]
        before = _free(lib)
        rc = fn(leave)
        return {"leave_bytes": leave, "free_before": before, "cuda_result": rc, "free_after": _free(lib),
                "balloon_bytes": shim_counter("uvmlab_balloon_bytes")}  # fmt: skip

    _record(out, "balloon", balloon)
    size = min(4 * GiB, managed_limit(_free(lib)) // 4) // (2 * MiB) * (2 * MiB)
    _record(out, "residency", lambda: residency(lib, size) if size > 0 else "not run: no room under the limit")
    if torch is not None:

        def growth() -> dict[str, Any]:
            before = _free(lib)
            a = torch.randn(64, 64, 56, 56, device="cuda", requires_grad=True)
            conv = torch.nn.Conv2d(64, 64, 3, padding=1).cuda()
            lin = torch.nn.Linear(4096, 4096).cuda()
            loss = conv(a).relu().mean() + lin(torch.randn(256, 4096, device="cuda")).softmax(-1).log().mean()
            loss.backward()
            torch.optim.Adam([*conv.parameters(), *lin.parameters()]).step()
            del a, conv, lin, loss
            from uvmlab.measure.gpu.worker import release_job_memory

            release_job_memory(torch)
            after = _free(lib)
            return {"free_before": before, "free_after": after, "non_uvm_growth_bytes": before - after}

        _record(out, "non_uvm_growth", growth)
    else:
        out["non_uvm_growth"] = "not run: no torch device (--device cpu)"

    def device_memory_codes() -> dict[str, Any]:
        d = ctypes.c_void_p()
        lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        rc = lib.cudaMalloc(ctypes.byref(d), 4096)  # the runtime's own: device memory, not the shim's managed
        result = codes(lib, int(d.value or 0)) if rc == 0 else {"error": f"cudaMalloc of 4 KiB failed ({rc})"}
        lib.cudaFree(d)
        return result

    _record(out, "codes", device_memory_codes)
    return out


def main(argv: list[str] | None = None) -> int:
    from uvmlab.files.atomic import atomic_write_json

    parser = argparse.ArgumentParser(
        prog="python -m uvmlab.measure.gpu.kit.probe_step", description=__doc__.splitlines()[0]
    )
    parser.add_argument("out", type=Path)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--cudart", default=None)
    args = parser.parse_args(argv)
    record = run_probe(args.device, args.cudart)
    with contextlib.suppress(AttributeError, OSError):
        ctypes.CDLL(None).uvmlab_flush_log()
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out / "probe.json", record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
