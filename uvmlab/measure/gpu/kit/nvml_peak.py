"""The NVML whole-process memory peak, sampled by a thread (what nvidia-smi shows for this process).

``PeakSampler(pynvml, handle, pid)`` polls every ``interval_s`` (default 5 ms) while it runs:
``nvmlDeviceGetComputeRunningProcesses(handle)`` (nvidia-ml-py; entries with ``pid`` and ``usedGpuMemory``, None
where the driver cannot say, e.g. WDDM) for this process's memory, and ``nvmlDeviceGetMemoryInfo(handle).used``
for the device's. It keeps the peak of both. The handle is the one ``uvmlab.measure.gpu.detect.nvml_handle`` finds from
the CUDA device's UUID, so on MIG it is the MIG device's (its processes and memory). Inside a container the
driver reports host PIDs, so this process may not be listed: ``process_peak_bytes`` is then None and the device's
peak minus its used memory before CUDA started (``used_before_bytes``) is the figure to use (``source`` says
which). [approximation] A peak shorter than the interval can be missed; NVML itself updates the process figure
when the driver's allocation changes (cudaMalloc/cudaFree and context growth), not per kernel.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

SAMPLE_INTERVAL_S = 0.005
"""5 ms between samples [I]: PyTorch's caching allocator grows by cudaMalloc calls that each take far longer."""


class PeakSampler:
    """Samples this process's and the device's used GPU memory from a background thread (module docstring)."""

    def __init__(self, pynvml: Any, handle: Any, pid: int, interval_s: float = SAMPLE_INTERVAL_S) -> None:
        self.nvml, self.handle, self.pid, self.interval_s = pynvml, handle, pid, interval_s
        self.process_peak_bytes: int | None = None
        self.used_peak_bytes: int | None = None
        self.used_before_bytes: int | None = None
        self.samples = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="uvmlab-nvml-peak", daemon=True)

    def sample(self) -> None:
        """One sample (also called by the thread)."""
        try:
            used = int(self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used)
            self.used_peak_bytes = used if self.used_peak_bytes is None else max(self.used_peak_bytes, used)
            for p in self.nvml.nvmlDeviceGetComputeRunningProcesses(self.handle):
                if int(p.pid) == self.pid and p.usedGpuMemory is not None:
                    mine = int(p.usedGpuMemory)
                    self.process_peak_bytes = (
                        mine if self.process_peak_bytes is None else max(self.process_peak_bytes, mine)
                    )
            self.samples += 1
        except self.nvml.NVMLError as exc:  # e.g. NVML_ERROR_NOT_SUPPORTED for the process list: keep the rest
            if len(self.errors) < 5:
                self.errors.append(str(exc))

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def start(self, used_before_bytes: int | None = None) -> PeakSampler:
        """Start sampling; ``used_before_bytes`` is the device's used memory before this process initialised CUDA
        (:func:`device_used_bytes`), else it is read now."""
        self.used_before_bytes = used_before_bytes
        if used_before_bytes is None:
            with contextlib.suppress(self.nvml.NVMLError):
                self.used_before_bytes = int(self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used)
        self._thread.start()
        return self

    def stop(self) -> dict[str, Any]:
        """Stop, take a last sample, and return the peaks (keys of :meth:`result`)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.sample()
        return self.result()

    def result(self) -> dict[str, Any]:
        source = "process" if self.process_peak_bytes is not None else "device used - used before"
        if self.used_peak_bytes is None:
            source = "none"
        return {
            "nvml_process_peak_bytes": self.process_peak_bytes,
            "nvml_used_peak_bytes": self.used_peak_bytes,
            "nvml_used_before_bytes": self.used_before_bytes,
            "nvml_source": source,
            "nvml_samples": self.samples,
            "nvml_errors": list(self.errors),
        }


def _nvml() -> Any:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    return pynvml


def device_used_bytes(env: Any) -> int | None:
    """The used memory of the GPU a CUDA process with ``env`` would use (before it initialises CUDA); None if
    NVML cannot say. Never raises."""
    from uvmlab.measure.gpu.detect import nvml_handle

    pynvml = _nvml()
    if pynvml is None:
        return None
    try:
        handle, _why = nvml_handle(pynvml, dict(env))
        return None if handle is None else int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
    except (pynvml.NVMLError, ValueError):
        return None


def open_sampler(
    uuid: str | None, pid: int, used_before_bytes: int | None = None, interval_s: float = SAMPLE_INTERVAL_S
) -> PeakSampler | None:
    """A started sampler of the CUDA device with ``uuid`` (None: NVML or the device not found; never raises)."""
    from uvmlab.measure.gpu.detect import nvml_handle

    pynvml = _nvml()
    if pynvml is None or not uuid:
        return None
    try:
        handle, _why = nvml_handle(pynvml, {}, uuid=uuid)
    except (pynvml.NVMLError, ValueError):
        return None
    if handle is None:
        return None
    return PeakSampler(pynvml, handle, pid, interval_s).start(used_before_bytes)
