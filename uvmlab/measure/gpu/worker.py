"""The child process of a GPU run: ``python -m uvmlab.measure.gpu.worker RUNDIR --role run|baseline|calibrate``.

A program file (one defining ``program(uvm, cfg, options)``, IFACE.md B) runs its own loop instead, through
``workloads.program.run_program`` with :class:`uvmlab.measure.gpu.program_backend.CudaProgramBackend` (hints, host
accesses and kernels done for real; :func:`run_program_job`); the rest of this paragraph is about training workloads.

It reads ``RUNDIR/config.json`` (the RunConfig the parent wrote), builds the workload on the device, and runs
``workloads.train.train_step`` (the same loop trace capture uses) with NVTX ranges ``iteration N`` around each
iteration and one range per phase (data, forward, backward, optimizer, zero_grad), so an nsys export lines up
with the trace. Each iteration ends with a device synchronisation; its wall time is measured with
``time.monotonic_ns`` (the clock of the shim's allocation log). At every phase boundary it samples
``torch.cuda.memory_allocated`` / ``memory_reserved`` and NVML's used memory.

With the caching allocator off (``PYTORCH_NO_CUDA_MEMORY_CACHING=1``: c10 ``forceUncachedAllocator`` tests
``check_env(...) == true``, and ``c10::utils::check_env`` is true for "1" only, false for "0", and warns and
ignores any other value), PyTorch's uncached path bypasses the allocator statistics, so
``memory_allocated/reserved`` and their peaks would read 0: they are recorded as null (unknown) and the collector
takes them from the shim's allocation log.

Before building the job the worker checks, for the ``run`` step of an oversubscribed plan
(``UVMLAB_REQUIRE_CONCURRENT_MANAGED=1``), ``cudaDevAttrConcurrentManagedAccess``: without it the GPU cannot hold
managed memory larger than its own (CUDA Programming Guide, unified memory on devices without full support), so
the step stops with one sentence; the value is recorded either way. With ``UVMLAB_MEMORY_FRACTION`` (a plan whose
allocator config has ``garbage_collection_threshold``, uvmlab.measure.gpu.plan.MEMORY_FRACTION_ENV) it calls
``torch.cuda.set_per_process_memory_fraction`` first.

The capacity UVM really has (``capacity_probe``, one probe): after the last timed iteration the worker frees the
job's memory (model, optimizer, the caching allocator's cache, cuBLAS workspaces), so that no managed page
occupies the GPU, and records cudaMemGetInfo and the shim's live managed and balloon bytes: ``free + live
managed`` is then what UVM can use plus the reserve the balloon left on purpose
(uvmlab.measure.gpu.collect.effective_factor). Measuring at the end keeps the timed iterations undisturbed (no
synchronize between them).

Imports: everything the worker needs is imported by :func:`import_check` first (:data:`WORKER_IMPORTS`), which
``uvmlab doctor`` runs too (``python -m uvmlab.measure.gpu.worker --check-imports``), so a machine that lacks a
module is told before a run and the run stops with one sentence naming it. NVTX ranges come from the ``nvtx``
package, else ``torch.cuda.nvtx`` (the lent machine has ``nvidia-nvtx``, not ``nvtx``), else there are none, said
once on stderr (:class:`NvtxRanges`; ``nvtx_ranges`` in the JSON says which).

Warm-up and the balloon: with ``UVMLAB_WARMUP_ITERATIONS=N`` (the plan sets 1 for the baseline and run steps) the
worker first runs N untimed iterations, so that lazily loaded modules, cuBLAS/cuDNN handles and workspaces and
local-memory reservations exist; with ``UVMLAB_BALLOON_DEFER=1`` (the run step) it then asks the shim for the
balloon (``uvmlab_balloon_take``: every live managed range is prefetched to the host first, so the free memory the
balloon is computed from holds no managed page) and records the free memory before and after it
(``balloon_after_warmup``). Before, the shim took the balloon at the first cudaMalloc, before any of that existed,
and what they took later came out of UVM's capacity. With ``UVMLAB_CUDNN_LOG_WARMUP_ONLY=1`` the cuDNN API log the
step's environment turned on is switched off after the warm-up (``cudnnSetCallback(0, NULL, NULL)``, cuDNN 9
cudnn_graph.h), so it holds the engine choices (made on each convolution's first call) without slowing the timed
iterations.

The capacity probe reads the real ``cudaMemGetInfo`` (looked up in the runtime library itself, which the shim's
interposer does not shadow when it reports a fixed free figure to PyTorch) until two reads agree (at most
:data:`SETTLE_READS`, :data:`SETTLE_INTERVAL_S` apart: freed memory returns to the driver asynchronously), and
records every read.

``--device cpu --cudart LIB`` runs the loop on the CPU while the runtime side (device attributes, the balloon, the
probes, the hints' calls) goes to the CUDA runtime LIB: how CI runs this real worker against the stub runtime.

Outputs (under RUNDIR/logs/): ``<role>.worker.json`` (outcome, iteration times, peaks, capacity probe, versions)
and ``<role>.samples.parquet``. Exit code 0 also for an out-of-memory outcome (it is a result), 2 for a bad setup.
``--device cpu`` runs the same code on the CPU (tests; no NVTX tool attached, no NVML).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from uvmlab.config import RunConfig
from uvmlab.errors import UvmlabError
from uvmlab.files.atomic import atomic_write_json
from uvmlab.measure.gpu.plan import (
    CUDNN_LOG_WARMUP_ONLY_ENV,
    EMPTY_CACHE_ENV,
    MEMORY_FRACTION_ENV,
    REQUIRE_CONCURRENT_MANAGED_ENV,
    WARMUP_ENV,
)

WORKER_IMPORTS = (
    "numpy",
    "pandas",
    "pyarrow",
    "torch",
    "workloads.registry",
    "workloads.train",
    "uvmlab.measure.gpu.cudart",
    "uvmlab.measure.gpu.hints",
    "uvmlab.measure.gpu.machine",
)
"""Every module a worker step imports (the NVTX source is looked up separately: it has fallbacks)."""
BALLOON_DEFER_ENV = "UVMLAB_BALLOON_DEFER"
"""Set by the plan on the run step (the shim reads it too): the worker takes the balloon after the warm-up."""
SETTLE_READS = 5
SETTLE_INTERVAL_S = 0.2
"""The capacity probe reads free memory up to 5 times, 0.2 s apart, until two reads agree [I]: the driver returns
freed root chunks to its allocator asynchronously (uvm_pmm_gpu.c ``free_next_available_root_chunk``)."""


def import_check(modules: tuple[str, ...] = WORKER_IMPORTS) -> dict[str, Any]:
    """Import what the worker needs; ``{"ok", "failed": {module: "Error: message"}, "nvtx_ranges": source}``."""
    import importlib

    failed: dict[str, str] = {}
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # any import failure is the answer (one line per module)
            failed[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    source = None
    if "torch" not in failed:
        source = NvtxRanges(say=False).source
    return {"ok": not failed, "failed": failed, "nvtx_ranges": source, "python": sys.executable}


class NvtxRanges:
    """NVTX push/pop with the open depth counted: the ``nvtx`` package, else ``torch.cuda.nvtx`` (checked by one
    push and pop: a CPU-only torch raises there), else none, said once on stderr (``say``)."""

    def __init__(self, say: bool = True) -> None:
        self.depth = 0
        self.source: str | None = None
        self._push: Callable[[str], Any] = lambda _name: None
        self._pop: Callable[[], Any] = lambda: None
        try:
            import nvtx

            self._push, self._pop, self.source = nvtx.push_range, nvtx.pop_range, "nvtx"
            return
        except ImportError:
            pass
        try:
            import torch

            ranges = torch.cuda.nvtx
            ranges.range_push("uvmlab nvtx probe")
            ranges.range_pop()
            self._push, self._pop, self.source = ranges.range_push, ranges.range_pop, "torch.cuda.nvtx"
        except (ImportError, AttributeError, RuntimeError):
            if say:
                print(
                    "uvmlab worker: no NVTX ranges (neither the nvtx package nor torch.cuda.nvtx works here): an "
                    "nsys timeline of this run has no iteration or phase ranges",
                    file=sys.stderr,
                )

    def push(self, name: str) -> None:
        self._push(name)
        self.depth += 1

    def pop(self) -> None:
        if self.depth > 0:
            self._pop()
            self.depth -= 1


class _Nvml:
    """NVML used-memory sampler of the run's GPU (None values where NVML is absent).

    The GPU is found by the UUID CUDA reports for the device in use (exact whatever CUDA_DEVICE_ORDER and
    CUDA_VISIBLE_DEVICES say), else by uvmlab.measure.gpu.detect.nvml_handle's mapping."""

    def __init__(self, enabled: bool, uuid: str | None = None) -> None:
        self.handle = None
        self.mod: Any = None
        if not enabled:
            return
        try:
            import pynvml
        except ImportError:
            return
        from uvmlab.measure.gpu.detect import nvml_handle

        try:
            pynvml.nvmlInit()
            handle, _why = nvml_handle(pynvml, dict(os.environ), uuid=uuid)
            if handle is not None:
                self.handle, self.mod = handle, pynvml
        except (pynvml.NVMLError, ValueError):
            return

    def used(self) -> int | None:
        if self.handle is None:
            return None
        return int(self.mod.nvmlDeviceGetMemoryInfo(self.handle).used)


def _flush_shim_log() -> None:
    """Ask a preloaded shim to write its buffered allocation records now (it also does at exit)."""
    try:
        fn = ctypes.CDLL(None).uvmlab_flush_log
    except (AttributeError, OSError):
        return
    fn()


def shim_counter(name: str) -> int | None:
    """A size_t counter of the preloaded shim (``uvmlab_live_managed_bytes``, ``uvmlab_balloon_bytes``); None
    without the shim."""
    try:
        fn = ctypes.CDLL(None)[name]
    except (AttributeError, OSError):
        return None
    fn.restype = ctypes.c_size_t
    fn.argtypes = []
    return int(fn())


def caching_disabled(env: Any = None) -> bool:
    """PyTorch's caching allocator is off: PYTORCH_NO_CUDA_MEMORY_CACHING is "1" (c10 check_env; module doc)."""
    return (os.environ if env is None else env).get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1"


def apply_memory_fraction(torch: Any, env: Any = None) -> float | None:
    """``torch.cuda.set_per_process_memory_fraction(F)`` with F from ``UVMLAB_MEMORY_FRACTION``; returns F (None
    when the variable is unset). PyTorch's garbage_collection_threshold acts only with a fraction set."""
    value = (os.environ if env is None else env).get(MEMORY_FRACTION_ENV)
    if not value:
        return None
    fraction = float(value)
    torch.cuda.set_per_process_memory_fraction(fraction)
    return fraction


def check_concurrent_managed_access(lib: Any, device: int, required: bool) -> int:
    """``cudaDevAttrConcurrentManagedAccess`` of ``device`` through the CUDA runtime ``lib``; a UvmlabError (one
    sentence) when it is 0 and the step oversubscribes (``required``)."""
    from uvmlab.measure.gpu.cudart import DEV_ATTR_CONCURRENT_MANAGED_ACCESS, device_attribute

    value = device_attribute(lib, DEV_ATTR_CONCURRENT_MANAGED_ACCESS, device)
    if required and value == 0:
        raise UvmlabError(
            f"GPU {device} reports cudaDevAttrConcurrentManagedAccess = 0: its managed memory cannot exceed its own "
            "memory (CUDA Programming Guide, unified memory without full support), so this run cannot "
            "oversubscribe; use a GPU with full unified memory support (Pascal or newer, Linux) or a factor <= 1"
        )
    return value


def real_mem_get_info(lib: Any) -> tuple[int, int]:
    """(free, total) from the real ``cudaMemGetInfo``: the runtime ``lib``'s own, looked up in that library (a
    ctypes handle's dlsym searches the library itself, so the shim's interposer, which may report a fixed free
    figure to PyTorch, does not shadow it); without a runtime handle, the preloaded shim's
    ``uvmlab_real_mem_get_info``."""
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    fn = lib.cudaMemGetInfo if lib is not None else ctypes.CDLL(None).uvmlab_real_mem_get_info
    rc = fn(ctypes.byref(free), ctypes.byref(total))
    if rc != 0:
        raise UvmlabError(f"cudaMemGetInfo failed with CUDA error {rc}")
    return int(free.value), int(total.value)


def settled_free(read: Callable[[], tuple[int, int]], reads: int = SETTLE_READS, interval_s: float = SETTLE_INTERVAL_S,
                 sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:  # fmt: skip
    """Read free memory until two consecutive reads agree (at most ``reads``): the last read, every read, and
    whether it settled."""
    seen: list[int] = []
    total = 0
    for i in range(reads):
        if i:
            sleep(interval_s)
        free, total = read()
        seen.append(free)
        if len(seen) >= 2 and seen[-1] == seen[-2]:
            break
    return {
        "free_bytes": seen[-1],
        "total_bytes": total,
        "free_reads": seen,
        "settled": len(seen) >= 2 and seen[-1] == seen[-2],
    }


def memory_probe(lib: Any, when: str, sync: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """The real free memory (settled, :func:`settled_free`) and the shim's live managed and balloon bytes, now."""
    sync()
    return {
        "when": when,
        **settled_free(lambda: real_mem_get_info(lib)),
        "live_managed_bytes": shim_counter("uvmlab_live_managed_bytes"),
        "balloon_bytes": shim_counter("uvmlab_balloon_bytes"),
    }


def take_balloon(lib: Any, sync: Callable[[], None]) -> dict[str, Any]:
    """After the warm-up: the shim's deferred balloon (``uvmlab_balloon_take``), with the real free memory before
    and after it; ``{"taken": False}`` without a shim that exports it."""
    try:
        fn = ctypes.CDLL(None).uvmlab_balloon_take
    except (AttributeError, OSError):
        return {"taken": False, "why": "no preloaded shim exports uvmlab_balloon_take"}
    fn.restype, fn.argtypes = ctypes.c_int, [ctypes.POINTER(ctypes.c_size_t)]
    sync()
    before = real_mem_get_info(lib)[0]
    evicted = ctypes.c_size_t(0)
    rc = int(fn(ctypes.byref(evicted)))
    after = real_mem_get_info(lib)[0]
    return {
        "taken": rc == 0,
        "cuda_result": rc,
        "evicted_managed_bytes": int(evicted.value),
        "free_before_bytes": before,
        "free_after_bytes": after,
        "balloon_bytes": shim_counter("uvmlab_balloon_bytes"),
    }


def stop_cudnn_log() -> bool | None:
    """Switch cuDNN's API log off (``cudnnSetCallback(0, NULL, NULL)``, cuDNN >= 9 cudnn_graph.h) in the loaded
    libcudnn; None when no libcudnn is loaded, False when the call is missing or fails."""
    from uvmlab.measure.gpu.cudart import loaded_library

    path = loaded_library(("libcudnn_graph.so", "libcudnn.so"))
    if path is None:
        return None
    try:
        fn = ctypes.CDLL(path).cudnnSetCallback
    except (AttributeError, OSError):
        return False
    fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p]
    return int(fn(0, None, None)) == 0


def release_job_memory(torch: Any) -> None:
    """Give back every managed byte the job holds: the caller dropped its references; collect, empty the cache and
    the cuBLAS workspaces (held by PyTorch outside the cache: torch._C._cuda_clearCublasWorkspaces)."""
    import gc

    gc.collect()
    torch.cuda.synchronize()
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()
    torch.cuda.empty_cache()


def run_worker(
    rundir: Path, role: str, iterations: int | None = None, device: str = "cuda", cudart: str | None = None
) -> dict[str, Any]:
    """Run the configured job in this process; write ``logs/<role>.worker.json`` and return its content.

    ``cudart``: with ``device="cpu"``, the CUDA runtime the runtime side talks to (module docstring)."""
    check = import_check()
    if not check["ok"]:
        name, why = next(iter(check["failed"].items()))
        raise UvmlabError(f"the GPU worker cannot import {name} ({why}); install it on this machine (uvmlab doctor)")
    import pandas as pd
    import torch

    from uvmlab.measure.gpu.machine import machine_facts
    from workloads.registry import load_workload
    from workloads.train import PHASE_END, make_optimizer, train_step

    doc = json.loads((rundir / "config.json").read_text())
    doc.pop("gpu_options", None)
    cfg = RunConfig.from_dict(doc)
    wcfg = cfg.workload
    n_iter = iterations or wcfg.iterations
    is_cuda = device.startswith("cuda")
    if is_cuda and not torch.cuda.is_available():
        raise UvmlabError("the worker found no CUDA device (torch.cuda.is_available() is False)")
    env = os.environ
    lib = None
    if is_cuda:
        from uvmlab.measure.gpu.cudart import load_cudart

        lib = load_cudart()
    elif cudart:
        lib = ctypes.CDLL(cudart)
    sync = torch.cuda.synchronize if is_cuda else (lambda: None)

    def device_sync() -> None:  # the runtime side's synchronisation (the stub's, with --device cpu --cudart)
        sync()
        if lib is not None and not is_cuda:
            lib.cudaDeviceSynchronize()

    nvtx = NvtxRanges()
    dev_index = torch.cuda.current_device() if is_cuda else 0
    uuid = str(getattr(torch.cuda.get_device_properties(dev_index), "uuid", "")) if is_cuda else ""
    nvml = _Nvml(is_cuda, uuid or None)
    uncached = is_cuda and caching_disabled()
    release_each_iteration = is_cuda and env.get(EMPTY_CACHE_ENV) == "1"
    warmup = int(env.get(WARMUP_ENV, "0") or 0)
    defer_balloon = env.get(BALLOON_DEFER_ENV) == "1"
    probes: list[dict[str, Any]] = []
    samples: list[dict[str, Any]] = []
    its: list[dict[str, Any]] = []
    warmups: list[dict[str, Any]] = []
    balloon: dict[str, Any] | None = None
    cudnn_log_stopped = None
    outcome, error = "ok", None

    def sample(phase: str, iteration: int) -> None:
        samples.append(
            {
                "time_ns": time.monotonic_ns(),
                "iteration": iteration,
                "phase": phase,
                "allocated_bytes": torch.cuda.memory_allocated() if is_cuda and not uncached else None,
                "reserved_bytes": torch.cuda.memory_reserved() if is_cuda and not uncached else None,
                "nvml_used_bytes": nvml.used(),
            }
        )

    def hook(phase: str, iteration: int) -> None:
        if nvtx.depth > 1:  # close the previous phase (depth 1 is the iteration range)
            nvtx.pop()
        sample(phase, iteration)
        if phase != PHASE_END:
            nvtx.push(phase)

    def after_warmup() -> None:
        nonlocal balloon, cudnn_log_stopped
        if env.get(CUDNN_LOG_WARMUP_ONLY_ENV) == "1":
            cudnn_log_stopped = stop_cudnn_log()
        if defer_balloon and lib is not None:
            balloon = take_balloon(lib, device_sync)

    concurrent_managed = None
    fraction = None
    facts = machine_facts(lib, dev_index)
    if lib is not None:
        required = env.get(REQUIRE_CONCURRENT_MANAGED_ENV) == "1"
        concurrent_managed = check_concurrent_managed_access(lib, dev_index, required)
    if is_cuda:
        fraction = apply_memory_fraction(torch)
    t_build = time.monotonic_ns()
    try:
        spec = load_workload(wcfg.workload)
        runner = program_runner(spec)
        if runner is not None:  # a program file (IFACE.md B): its own loop, no model and no optimizer
            after_warmup()  # no warm-up iteration to run: the balloon is taken before the program
            its = run_program_job(runner, spec, replace(wcfg, iterations=n_iter), device, sync, sample)
        else:  # a training workload: build, optimizer, hints, the training loop
            workload = spec.build(wcfg, device)
            if wcfg.checkpoint:  # policy checkpoint-activations (workloads.checkpointing)
                from workloads.checkpointing import apply_checkpointing

                apply_checkpointing(workload, wcfg.checkpoint)
            optimizer = make_optimizer(workload.model, wcfg)
            hints = _hints(is_cuda, torch, lib)
            if hints is not None:  # per-tensor UVM hint policies (uvmlab.measure.gpu.hints)
                hints.on_built(workload.model)
                hints.on_optimizer(optimizer)
            sync()
            sample("built", -1)
            for w in range(warmup):  # untimed: modules, handles and workspaces come to exist
                start = time.monotonic_ns()
                train_step(workload, optimizer, wcfg, None, w)
                device_sync()
                warmups.append({"iteration": w, "duration_ns": time.monotonic_ns() - start})
            if warmup or defer_balloon:
                after_warmup()
            for it in range(n_iter):
                start = time.monotonic_ns()
                nvtx.push(f"iteration {it}")
                train_step(workload, optimizer, wcfg, hook, it)
                if hints is not None:
                    hints.after_step(optimizer, it)
                if release_each_iteration:  # policy release-each-iteration (uvmlab.advise.policies)
                    torch.cuda.empty_cache()
                sync()
                while nvtx.depth:
                    nvtx.pop()
                end = time.monotonic_ns()
                its.append({"iteration": it, "start_ns": start, "end_ns": end, "duration_ns": end - start})
    except torch.OutOfMemoryError as exc:
        outcome, error = "oom", str(exc).splitlines()[0]
    while nvtx.depth:
        nvtx.pop()
    peaks = {
        "peak_allocated_bytes": torch.cuda.max_memory_allocated() if is_cuda and not uncached else None,
        "peak_reserved_bytes": torch.cuda.max_memory_reserved() if is_cuda and not uncached else None,
    }
    if lib is not None:
        workload = optimizer = hints = None  # drop the job's tensors before measuring
        if is_cuda:
            release_job_memory(torch)
        probes.append(memory_probe(lib, "after the job's memory was released", device_sync))
    _flush_shim_log()
    logs = rundir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(samples).to_parquet(logs / f"{role}.samples.parquet", index=False)
    result = {
        "role": role,
        "device": device,
        "outcome": outcome,
        "error": error,
        "iterations": its,
        "warmup_iterations": warmups,
        "build_ns": (its[0]["start_ns"] if its else time.monotonic_ns()) - t_build,
        **peaks,
        "caching_allocator": None if not is_cuda else not uncached,
        "capacity_probe": probes,
        "balloon_after_warmup": balloon,
        "cudnn_log_stopped_after_warmup": cudnn_log_stopped,
        "nvtx_ranges": nvtx.source,
        "machine": facts,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "device_name": torch.cuda.get_device_name() if is_cuda else None,
        "env": {k: env.get(k) for k in _RECORDED_ENV},
        "concurrent_managed_access": concurrent_managed,
        "memory_fraction": fraction,
    }
    atomic_write_json(logs / f"{role}.worker.json", result)
    return result


_RECORDED_ENV = (
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_NO_CUDA_MEMORY_CACHING",
    "LD_PRELOAD",
    "UVMLAB_SHIM_MODE",
    "UVMLAB_ADVISE",
    "UVMLAB_PREFETCH",
    "UVMLAB_HINTS",
    "UVMLAB_BALLOON_BYTES",
    "UVMLAB_BALLOON_LEAVE_BYTES",
    "UVMLAB_ALLOC_LOG",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_MODULE_LOADING",
    "CUBLAS_WORKSPACE_CONFIG",
    "CUBLASLT_WORKSPACE_SIZE",
    "CUDA_LAUNCH_BLOCKING",
    MEMORY_FRACTION_ENV,
    REQUIRE_CONCURRENT_MANAGED_ENV,
    WARMUP_ENV,
    BALLOON_DEFER_ENV,
    CUDNN_LOG_WARMUP_ONLY_ENV,
    "UVMLAB_REPORT_FREE_BYTES",
    "CUDNN_LOGDEST_DBG",
    "TORCH_SYMBOLIZE_MODE",
)


def program_runner(spec: Any) -> Callable[..., Any] | None:
    """``workloads.program.run_program`` when ``spec`` is a program file's (a file defining ``program(uvm, cfg,
    options)``: ``WorkloadSpec.is_program``), else None."""
    if not getattr(spec, "is_program", False):
        return None
    from workloads.program import run_program

    return run_program


def program_backend(is_cuda: bool, env: Any = None) -> Any:
    """The backend a program runs with: on a GPU :class:`uvmlab.measure.gpu.program_backend.CudaProgramBackend`
    (``managed=False`` in a baseline step, whose shim is in passthrough mode: no unified memory), else
    ``workloads.program.NullBackend`` (``--device cpu``: nothing happens for real)."""
    env = os.environ if env is None else env
    if is_cuda:
        from uvmlab.measure.gpu.program_backend import CudaProgramBackend

        return CudaProgramBackend(managed=env.get("UVMLAB_SHIM_MODE") != "passthrough")
    from workloads.program import NullBackend

    return NullBackend()


def run_program_job(
    runner: Callable[..., Any],
    spec: Any,
    wcfg: Any,
    device: str,
    sync: Callable[[], None],
    sample: Callable[[str, int], None],
    backend: Any = None,
) -> list[dict[str, Any]]:
    """Run a program file on ``device`` with its backend; returns the iteration times.

    They come from the backend's marks (``CudaProgramBackend.mark_iteration``, called by ``Program.iterations()``
    as each iteration starts); when the program made none, the whole program is one iteration 0 (its setup
    included: an approximation, said by the iteration count of 1)."""
    backend = program_backend(device.startswith("cuda")) if backend is None else backend
    sync()
    sample("built", -1)
    start = time.monotonic_ns()
    runner(spec, wcfg, device, backend)
    sync()
    end = time.monotonic_ns()
    its = backend.iteration_times() if hasattr(backend, "iteration_times") else []
    sample("end", its[-1]["iteration"] if its else 0)
    return its or [{"iteration": 0, "start_ns": start, "end_ns": end, "duration_ns": end - start}]


def _hints(is_cuda: bool, torch: Any, lib: Any = None) -> Any:
    """The per-tensor UVM hints ``UVMLAB_HINTS`` names (uvmlab.measure.gpu.hints), or None. On the CPU with a
    runtime (``--cudart``, tests) the hints go to that runtime on the null stream, for every tensor."""
    from uvmlab.measure.gpu.hints import CudaRuntime, Hints, hints_from_env

    names = hints_from_env(os.environ)
    if not names or (not is_cuda and lib is None):
        return None
    if not is_cuda:
        return Hints(names, CudaRuntime(lib), 0, lambda: 0, select=lambda t: True)
    device = torch.cuda.current_device()
    return Hints(names, CudaRuntime(lib), device, lambda: int(torch.cuda.current_stream().cuda_stream))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m uvmlab.measure.gpu.worker", description=__doc__.splitlines()[0])
    parser.add_argument("rundir", type=Path, nargs="?")
    parser.add_argument("--role", choices=("run", "baseline", "calibrate"), default="run")
    parser.add_argument("--iterations", type=int, default=None)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--cudart", default=None, help="with --device cpu: the CUDA runtime of the runtime side")
    parser.add_argument("--check-imports", action="store_true", help="import what the worker needs; print JSON")
    args = parser.parse_args(argv)
    if args.check_imports:
        result = import_check()
        print(json.dumps(result))
        return 0 if result["ok"] else 1
    if args.rundir is None:
        parser.error("RUNDIR is required")
    try:
        run_worker(args.rundir, args.role, args.iterations, args.device, args.cudart)
    except UvmlabError as exc:
        print(f"uvmlab worker: error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
