"""What a GPU result depends on beyond the GPU: the host's kernel, its virtualisation, its free memory, and the device
attributes that change what a CPU touch of managed memory does. Recorded with every worker result and by the kit's
facts step, so that each number says which machine and runtime it came from. Reads only; never raises.

Device attributes (CUDA 13.0 driver_types.h ``enum cudaDeviceAttr``): ``cudaDevAttrManagedMemory`` (83),
``cudaDevAttrPageableMemoryAccess`` (88: HMM or ATS, the GPU may access plain host memory),
``cudaDevAttrConcurrentManagedAccess`` (89: the condition for managed memory larger than the device's),
``cudaDevAttrPageableMemoryAccessUsesHostPageTables`` (100: ATS, a coherent host such as Grace) and
``cudaDevAttrDirectManagedMemAccessFromHost`` (101: the host reads managed memory on the device without migrating
it). On a coherent host (100 or 101 non-zero) a CPU touch of a GPU-resident page need not migrate it, which changes
what the host-access rows of the kit measure.

Virtualisation: some sandboxed kernels have known UVM bugs, and the machine this project may be lent runs under
gVisor (kernel release 4.4.0, gVisor's fixed ``/proc/version`` text) or Firecracker (a guest kernel; the one seen
was ``6.18.44-fc-v236-gpu``, KINDS.md) [approximation: recognised by those marks, each kept as ``evidence``; an
unrecognised hypervisor is ``vm`` when ``/proc/cpuinfo`` has the ``hypervisor`` flag, else ``none detected``].
Host memory: ``MemAvailable`` (what a new allocation can get without swapping), with ``MemTotal`` beside it.
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

DEVICE_ATTRIBUTES = {
    "managed_memory": 83,
    "pageable_memory_access": 88,
    "concurrent_managed_access": 89,
    "pageable_memory_access_uses_host_page_tables": 100,
    "direct_managed_mem_access_from_host": 101,
}
"""Name -> ``enum cudaDeviceAttr`` value (CUDA 13.0 driver_types.h)."""
GVISOR_VERSION_MARK = "#1 SMP Sun Jan 10 15:06:54 PST 2016"
"""gVisor's ``/proc/version`` (it reports Linux 4.4.0 with this build string) [I: gVisor's sentry, pkg/sentry/fsimpl/
proc; seen on the lent machine as kernel 4.4.0, KINDS.md 2026-10-27]."""


def _read(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def meminfo() -> dict[str, int | None]:
    """``MemAvailable`` and ``MemTotal`` of /proc/meminfo in bytes (None where absent)."""
    out: dict[str, int | None] = {"MemAvailable": None, "MemTotal": None}
    for line in _read("/proc/meminfo").splitlines():
        key, _, rest = line.partition(":")
        if key in out:
            try:
                out[key] = int(rest.split()[0]) * 1024
            except (IndexError, ValueError):
                continue
    return out


def virtualization(
    release: str | None = None, version_text: str | None = None, cmdline: str | None = None, cpuinfo: str | None = None
) -> dict[str, Any]:
    """``{"runtime": gvisor|firecracker|vm|none detected, "evidence": [...]}`` (module docstring); the arguments
    default to this machine's files (tests pass their own)."""
    release = platform.release() if release is None else release
    version_text = _read("/proc/version") if version_text is None else version_text
    cmdline = _read("/proc/cmdline") if cmdline is None else cmdline
    cpuinfo = _read("/proc/cpuinfo") if cpuinfo is None else cpuinfo
    evidence: list[str] = []
    if GVISOR_VERSION_MARK in version_text or "gvisor" in version_text.lower():
        evidence.append(f"/proc/version: {version_text.strip()[:120]}")
        return {"runtime": "gvisor", "evidence": evidence}
    if "-fc" in release or "firecracker" in cmdline.lower():
        evidence.append(f"kernel release {release}" if "-fc" in release else "/proc/cmdline names firecracker")
        return {"runtime": "firecracker", "evidence": evidence}
    flags = next((ln for ln in cpuinfo.splitlines() if ln.startswith("flags")), "")
    if " hypervisor" in flags:
        return {"runtime": "vm", "evidence": ["/proc/cpuinfo flags: hypervisor"]}
    return {"runtime": "none detected", "evidence": []}


def device_attributes(lib: Any, device: int) -> dict[str, int | None]:
    """The attributes of :data:`DEVICE_ATTRIBUTES` through the CUDA runtime ``lib`` (None for one the runtime
    refuses, or without a runtime)."""
    from uvmlab.measure.gpu.cudart import device_attribute

    out: dict[str, int | None] = {}
    for name, attr in DEVICE_ATTRIBUTES.items():
        try:
            out[name] = None if lib is None else device_attribute(lib, attr, device)
        except (RuntimeError, AttributeError, OSError):
            out[name] = None
    return out


def machine_facts(lib: Any = None, device: int = 0) -> dict[str, Any]:
    """Kernel release, virtualisation, host memory and (with a runtime) the device attributes, now."""
    mem = meminfo()
    return {
        "kernel_release": platform.release(),
        "virtualization": virtualization(),
        "host_mem_available_bytes": mem["MemAvailable"],
        "host_mem_total_bytes": mem["MemTotal"],
        "device_attributes": device_attributes(lib, device) if lib is not None else None,
    }
