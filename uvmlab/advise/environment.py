"""``uvmlab advise --check-env`` (also in ``uvmlab doctor``): can this machine apply each memory policy?

It reads, without changing anything:

- the CUDA runtime's and the driver's versions (``cudaRuntimeGetVersion``, ``cudaDriverGetVersion`` of the
  libcudart torch uses, ``uvmlab.measure.gpu.cudart.installed_cudart``);
- ``/sys/module/nvidia_uvm/parameters`` (the UVM driver's module parameters, e.g. ``uvm_perf_prefetch_threshold``);
- whether this process runs as root (a module reload needs it);
- ``cudaDevAttrConcurrentManagedAccess`` (89) and the compute capability (75, 76) of the run's device, CUDA device 0
  (``cudaDeviceGetAttribute``): without concurrent managed access the GPU cannot page-fault managed memory, so
  there is no oversubscription and ``cudaMemPrefetchAsync`` to the GPU fails (CUDA runtime API reference; it is 0
  on Windows and WSL2);
- the uvmlab shim (built, or g++ to build it) and whether bitsandbytes is installed.

Signatures and enum values: CUDA 13.0 ``cuda_runtime_api.h`` (``cudaError_t cudaRuntimeGetVersion(int*)``,
``cudaDriverGetVersion(int*)``, ``cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr, int device)``) and
``driver_types.h`` (cudaDevAttrComputeCapabilityMajor 75, Minor 76, ConcurrentManagedAccess 89). Every probe
returns None with the reason instead of raising.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from uvmlab.advise.evidence import APPLY, BF16_GPU, BNB, CMA, CODE, CUDA13, RELOAD, ROOT, SHIM, applicability_of

UVM_PARAMETERS = Path("/sys/module/nvidia_uvm/parameters")
"""Where the loaded nvidia_uvm module lists its parameters (one file per parameter; Linux sysfs)."""
ATTR_CC_MAJOR, ATTR_CC_MINOR, ATTR_CONCURRENT_MANAGED = 75, 76, 89
"""``enum cudaDeviceAttr`` values (driver_types.h)."""
ERROR_NAMES = {
    1: "cudaErrorInvalidValue",
    3: "cudaErrorInitializationError",
    35: "cudaErrorInsufficientDriver",
    100: "cudaErrorNoDevice",
    101: "cudaErrorInvalidDevice",
}
"""``cudaError_t`` values the probes may meet (driver_types.h)."""
DRIVER_SETTINGS = {
    "driver-prefetch-off": ("uvm_perf_prefetch_enable", "0"),
    "driver-prefetch-aggressive": ("uvm_perf_prefetch_threshold", "1"),
}
"""The module parameter each driver policy sets, and its value."""


@dataclass(frozen=True)
class MachineEnv:
    """What this machine offers the policies (module docstring)."""

    cudart: str | None
    runtime_version: int | None
    driver_version: int | None
    """``cudaDriverGetVersion``: the newest CUDA the driver supports (0: no driver)."""
    concurrent_managed_access: bool | None
    compute_capability: tuple[int, int] | None
    device_reason: str
    """Why the device attributes are unknown ('' when they are known)."""
    uvm_parameters: dict[str, str] = field(default_factory=dict)
    uvm_loaded: bool = False
    root: bool = False
    shim: str = ""
    """'built: PATH', 'buildable (g++)' or ''."""
    bitsandbytes: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _version(v: int | None) -> str:
    return "unknown" if v is None else ("none" if v == 0 else f"{v // 1000}.{(v % 1000) // 10}")


def _call_int(lib: Any, name: str, *args: int) -> tuple[int | None, str]:
    """(value, '') of a ``cudaError_t f(int* out, ...)`` runtime call, or (None, the error)."""
    try:
        fn = getattr(lib, name)
    except AttributeError:
        return None, f"the runtime has no {name}"
    out = ctypes.c_int(0)
    rc = fn(ctypes.byref(out), *(ctypes.c_int(a) for a in args))
    if rc != 0:
        return None, f"{name} returned {ERROR_NAMES.get(rc, 'error')} ({rc})"
    return int(out.value), ""


def probe_device(cudart: Path | str) -> tuple[int | None, int | None, bool | None, tuple[int, int] | None, str]:
    """(runtime version, driver version, concurrent managed access, compute capability, reason) from ``cudart``."""
    try:
        lib = ctypes.CDLL(str(cudart))
    except OSError as exc:
        return None, None, None, None, f"cannot load {cudart}: {exc}"
    runtime, _ = _call_int(lib, "cudaRuntimeGetVersion")
    driver, _ = _call_int(lib, "cudaDriverGetVersion")
    cma, why = _call_int(lib, "cudaDeviceGetAttribute", ATTR_CONCURRENT_MANAGED, 0)
    major, why_cc = _call_int(lib, "cudaDeviceGetAttribute", ATTR_CC_MAJOR, 0)
    minor, _ = _call_int(lib, "cudaDeviceGetAttribute", ATTR_CC_MINOR, 0)
    cc = (major, minor) if major is not None and minor is not None else None
    return runtime, driver, (None if cma is None else bool(cma)), cc, why or why_cc


def read_uvm_parameters(folder: Path = UVM_PARAMETERS) -> dict[str, str] | None:
    """The nvidia_uvm module's parameters (name -> value as written), or None when the module is not loaded."""
    if not folder.is_dir():
        return None
    out = {}
    for p in sorted(folder.iterdir()):
        try:
            out[p.name] = p.read_text().strip()
        except OSError as exc:  # some parameters are readable by root only
            out[p.name] = f"unreadable ({exc.strerror})"
    return out


def probe_env(
    cudart: Path | str | None = None, uvm_parameters: Path = UVM_PARAMETERS, euid: int | None = None
) -> MachineEnv:
    """Probe this machine (each argument replaces one probe's input: tests pass a stub runtime and a folder)."""
    from uvmlab.measure.gpu import shim
    from uvmlab.measure.gpu.cudart import installed_cudart

    lib = cudart if cudart is not None else installed_cudart()
    if lib is None:
        dev: tuple[Any, ...] = (None, None, None, None, "no CUDA runtime (the nvidia-cuda-runtime wheel torch uses)")
    else:
        dev = probe_device(lib)
    params = read_uvm_parameters(uvm_parameters)
    status = shim.shim_status()
    built = f"built: {status.path}" if status.built else ("buildable (g++)" if shim.find_compiler() else "")
    return MachineEnv(
        cudart=None if lib is None else str(lib),
        runtime_version=dev[0],
        driver_version=dev[1],
        concurrent_managed_access=dev[2],
        compute_capability=dev[3],
        device_reason=dev[4],
        uvm_parameters=params or {},
        uvm_loaded=params is not None,
        root=(os.geteuid() if euid is None else euid) == 0,
        shim=built,
        bitsandbytes=importlib.util.find_spec("bitsandbytes") is not None,
    )


def env_rows(env: MachineEnv) -> list[tuple[str, str]]:
    """(item, value) lines of the environment report."""
    cc = env.compute_capability
    cma = env.concurrent_managed_access
    params = env.uvm_parameters
    shown = ", ".join(f"{k}={v}" for k, v in params.items() if "prefetch" in k or "fault" in k) or "-"
    return [
        ("CUDA runtime", f"{_version(env.runtime_version)} ({env.cudart or 'not found'})"),
        (
            "CUDA driver",
            "none installed (cudaDriverGetVersion gives 0)"
            if env.driver_version == 0
            else f"supports up to CUDA {_version(env.driver_version)}",
        ),
        ("concurrent managed access", "unknown: " + env.device_reason if cma is None else ("yes" if cma else "no")),
        ("compute capability", "unknown" if cc is None else f"{cc[0]}.{cc[1]}"),
        ("nvidia_uvm module", f"loaded, {len(params)} parameters" if env.uvm_loaded else "not loaded"),
        ("nvidia_uvm prefetch and fault parameters", shown),
        ("root", "yes" if env.root else "no"),
        ("uvmlab shim", env.shim or "not built and no g++ to build it"),
        ("bitsandbytes", "installed" if env.bitsandbytes else "not installed"),
    ]


def can_apply(name: str, env: MachineEnv) -> tuple[str, str]:
    """("yes" | "no" | "unknown" | "already set", why) for policy ``name`` on this machine."""
    ap = applicability_of(name)
    if env.concurrent_managed_access is None:
        return "no", f"no usable CUDA device here ({env.device_reason}): simulate it (uvmlab run --mode sim)"
    missing, unknown = [], []
    if name in DRIVER_SETTINGS:
        param, value = DRIVER_SETTINGS[name]
        if env.uvm_parameters.get(param) == value:
            return "already set", f"{param}={value} in {UVM_PARAMETERS}"
    for need in ap.needs:
        if need == ROOT and not env.root:
            missing.append("root")
        elif need == RELOAD and not env.uvm_loaded:
            missing.append("the nvidia_uvm module (not loaded)")
        elif need == CUDA13:
            if env.runtime_version is None or env.driver_version is None:
                unknown.append("the CUDA versions")
            elif min(env.runtime_version, env.driver_version) < 13000:
                missing.append(
                    f"CUDA 13 (runtime {_version(env.runtime_version)}, driver {_version(env.driver_version)})"
                )
        elif need == CMA:
            if env.concurrent_managed_access is None:
                unknown.append("concurrent managed access")
            elif not env.concurrent_managed_access:
                missing.append("concurrent managed access (0 on this device)")
        elif need == BF16_GPU:
            if env.compute_capability is None:
                unknown.append("the compute capability")
            elif env.compute_capability[0] < 8:
                missing.append(f"bf16 tensor cores (compute capability {env.compute_capability[0]}.x)")
        elif need == BNB and not env.bitsandbytes:
            missing.append("bitsandbytes (pip install bitsandbytes)")
        elif need == SHIM and not env.shim:
            missing.append("the uvmlab shim (g++ to build it)")
    if missing:
        return "no", "needs " + "; ".join(missing)
    if unknown:
        return "unknown", "cannot tell " + ", ".join(unknown) + f" here ({env.device_reason or 'no device'})"
    how = "with a code change" if CODE in ap.needs else "as it is"
    where = "uvmlab run --policy applies it" if ap.uvmlab_gpu else "uvmlab cannot apply it: " + ap.how_else
    return "yes", f"{how}; {where}"


def policy_marks(env: MachineEnv, names: list[str] | None = None) -> list[tuple[str, str, str]]:
    """(policy, can apply here, why) for every single policy (or ``names``)."""
    return [(n, *can_apply(n, env)) for n in (names or list(APPLY))]


__all__ = ["MachineEnv", "can_apply", "env_rows", "policy_marks", "probe_env", "read_uvm_parameters"]
