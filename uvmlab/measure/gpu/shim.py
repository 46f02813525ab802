"""The LD_PRELOAD shim: build it, find it, give it its environment, and read its allocation log.

The C++ source ships inside the package (``uvmlab/measure/gpu/csrc/uvmlab_shim.cpp``, package data; the top-level
``csrc/`` holds a symlink to it and a Makefile for hand builds), so an editable and a regular install both
build the same file. ``build_shim()`` compiles it with g++ (no CUDA headers or libraries) into a per-user cache
``$UVMLAB_CACHE/shim/<hash>/libuvmlab_shim.so`` (default ``~/.cache/uvmlab/shim/<hash>/``), where the hash
covers the source, the compiler command and the compiler's version: a changed source gets a fresh build.

The allocation log (``UVMLAB_ALLOC_LOG``) is binary, little endian, version 1 (documented in the source and in
docs/gpu.md): a 64-byte header (magic ``UVMLBLOG``, version, record size, monotonic and realtime clocks at shim
load) followed by 56-byte records (t_ns, dur_ns, ptr, size, arg, pid, op, result).
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from uvmlab.errors import InputError, UnavailableError
from uvmlab.files.inputs import read_input_bytes

SOURCE = Path(__file__).resolve().parent / "csrc" / "uvmlab_shim.cpp"
ABI_HEADER = SOURCE.with_name("uvmlab_cuda_abi.h")
"""The CUDA signatures and constants the shim relies on (included by SOURCE; checked against the real headers)."""
LIBRARY_NAME = "libuvmlab_shim.so"
CXX_FLAGS = ("-O2", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden", "-Wall", "-Wextra")
LINK_FLAGS = ("-ldl", "-lpthread")
"""The build command (csrc/Makefile mirrors it): no CUDA header, no CUDA library at link time."""

ADVISE_POLICIES = ("preferred_location_gpu", "preferred_location_cpu", "accessed_by", "read_mostly")
PREFETCH_POLICIES = ("off", "on_alloc")
SHIM_MODES = ("managed", "passthrough")

LOG_MAGIC = b"UVMLBLOG"
LOG_VERSION = 1
LOG_HEADER_BYTES = 64
LOG_RECORD_DTYPE = np.dtype(
    [
        ("t_ns", "<i8"),
        ("dur_ns", "<i8"),
        ("ptr", "<u8"),
        ("size", "<u8"),
        ("arg", "<i8"),
        ("pid", "<i4"),
        ("op", "<u2"),
        ("reserved0", "<u2"),
        ("result", "<i4"),
        ("reserved1", "<u4"),
    ]
)
LOG_OPS: dict[int, str] = {
    1: "malloc",  # intercepted cudaMalloc served by cudaMallocManaged (arg: flags)
    2: "free",  # cudaFree passed through
    3: "malloc_device",  # intercepted cudaMalloc served by the real cudaMalloc (passthrough mode, or size 0)
    4: "balloon_alloc",  # real cudaMalloc of the balloon (arg: free bytes measured before, -1 if not measured)
    5: "balloon_free",  # balloon released at exit
    6: "advise",  # cudaMemAdvise (arg: advice * 1000 + device, device -1 = CPU)
    7: "prefetch",  # cudaMemPrefetchAsync (arg: device)
    8: "pluggable_malloc",  # uvmlab_malloc, CUDAPluggableAllocator route (arg: device)
    9: "pluggable_free",  # uvmlab_free (arg: device)
}


def cache_root() -> Path:
    """``$UVMLAB_CACHE/shim`` or ``~/.cache/uvmlab/shim``."""
    base = os.environ.get("UVMLAB_CACHE")
    return (Path(base) if base else Path.home() / ".cache" / "uvmlab") / "shim"


def find_compiler() -> str | None:
    """The C++ compiler: ``$CXX`` or g++ on PATH (None if neither exists)."""
    cxx = os.environ.get("CXX") or "g++"
    return shutil.which(cxx)


@functools.lru_cache(maxsize=8)
def _compiler_version(cxx: str) -> str:
    try:
        proc = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30, check=False)
    except OSError:
        return ""
    return proc.stdout.splitlines()[0] if proc.stdout else ""


def source_hash(cxx: str | None = None) -> str:
    """16 hex digits over the shim source and its header, the build flags and the compiler version."""
    h = hashlib.sha256(SOURCE.read_bytes())
    h.update(ABI_HEADER.read_bytes())
    h.update(" ".join(CXX_FLAGS + LINK_FLAGS).encode())
    if cxx:
        h.update(_compiler_version(cxx).encode())
    return h.hexdigest()[:16]


def shim_path(cache_dir: Path | None = None) -> Path:
    """Where the shim for the current source is (or would be) built."""
    cxx = find_compiler()
    return (cache_dir or cache_root()) / source_hash(cxx) / LIBRARY_NAME


@dataclass(frozen=True)
class ShimStatus:
    """Whether the shim is built for the current source, and where."""

    built: bool
    path: Path
    compiler: str | None
    source: Path


def shim_status(cache_dir: Path | None = None) -> ShimStatus:
    """Cheap: no build, never raises for a missing compiler."""
    path = shim_path(cache_dir)
    return ShimStatus(built=path.is_file(), path=path, compiler=find_compiler(), source=SOURCE)


def build_shim(cache_dir: Path | None = None, force: bool = False) -> Path:
    """Compile the shim if the current source is not built yet; return the library's path.

    The compiler writes a temporary file that is renamed into place, so concurrent builds are safe.
    """
    cxx = find_compiler()
    if cxx is None:
        raise UnavailableError(
            "no C++ compiler found (g++ or $CXX): install g++ (e.g. apt-get install g++) to build the uvmlab shim"
        )
    if not SOURCE.is_file():
        raise UnavailableError(f"the shim source {SOURCE} is missing from this installation; reinstall uvmlab")
    out = (cache_dir or cache_root()) / source_hash(cxx) / LIBRARY_NAME
    if out.is_file() and not force:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{LIBRARY_NAME}.{os.getpid()}.tmp")
    cmd = [cxx, *CXX_FLAGS, "-o", str(tmp), str(SOURCE), *LINK_FLAGS]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        first = next((ln for ln in proc.stderr.splitlines() if "error" in ln), proc.stderr.strip()[:300])
        raise UnavailableError(f"building the uvmlab shim with {cxx} failed: {first}")
    os.replace(tmp, out)
    return out


def shim_env(
    library: Path | str,
    *,
    mode: str = "managed",
    advise: tuple[str, ...] = (),
    prefetch: str = "off",
    balloon_bytes: int | None = None,
    balloon_leave_bytes: int | None = None,
    balloon_claim: Path | str | None = None,
    alloc_log: Path | str | None = None,
    existing_preload: str = "",
    balloon_defer: bool = False,
    report_free_bytes: int | None = None,
) -> dict[str, str]:
    """The environment variables that load and configure the shim (validated here, not in the child).

    ``balloon_defer``: the balloon is taken by the program (``uvmlab_balloon_take()``, the worker after its warm-up
    iteration), not at the first intercepted call. ``report_free_bytes``: the interposed ``cudaMemGetInfo`` answers
    this free figure (the runs a comparison pairs see the same cuDNN workspace limit)."""
    if mode not in SHIM_MODES:
        raise InputError(f"shim mode must be one of {', '.join(SHIM_MODES)}, not {mode!r}")
    bad = [a for a in advise if a not in ADVISE_POLICIES]
    if bad:
        raise InputError(f"unknown advise policy {bad[0]!r}; known: {', '.join(ADVISE_POLICIES)}")
    if "preferred_location_gpu" in advise and "preferred_location_cpu" in advise:
        raise InputError("give at most one preferred location (preferred_location_gpu or preferred_location_cpu)")
    if prefetch not in PREFETCH_POLICIES:
        raise InputError(f"prefetch policy must be one of {', '.join(PREFETCH_POLICIES)}, not {prefetch!r}")
    if balloon_bytes is not None and balloon_leave_bytes is not None:
        raise InputError("give either a balloon size or the bytes to leave free, not both")
    for name, value in (("balloon size", balloon_bytes), ("bytes to leave free", balloon_leave_bytes)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise InputError(f"{name} must be a whole number of bytes >= 0, not {value!r}")
    preload = str(library) if not existing_preload else f"{library}:{existing_preload}"
    env = {"LD_PRELOAD": preload, "UVMLAB_SHIM_MODE": mode}
    if advise:
        env["UVMLAB_ADVISE"] = ",".join(advise)
    if prefetch != "off":
        env["UVMLAB_PREFETCH"] = prefetch
    if balloon_bytes is not None:
        env["UVMLAB_BALLOON_BYTES"] = str(balloon_bytes)
    if balloon_leave_bytes is not None:
        env["UVMLAB_BALLOON_LEAVE_BYTES"] = str(balloon_leave_bytes)
    if balloon_claim is not None:
        env["UVMLAB_BALLOON_CLAIM"] = str(balloon_claim)
    if balloon_defer:
        env["UVMLAB_BALLOON_DEFER"] = "1"
    if report_free_bytes is not None:
        if isinstance(report_free_bytes, bool) or not isinstance(report_free_bytes, int) or report_free_bytes < 0:
            raise InputError(f"reported free bytes must be a whole number >= 0, not {report_free_bytes!r}")
        env["UVMLAB_REPORT_FREE_BYTES"] = str(report_free_bytes)
    if alloc_log is not None:
        env["UVMLAB_ALLOC_LOG"] = str(alloc_log)
    return env


MAX_ALLOC_LOG_BYTES = 256 << 20
"""Largest shim allocation log read (256 MiB; a record is 48 bytes: 5 million allocator calls)."""


def read_alloc_log(path: Path | str) -> pd.DataFrame:
    """Parse a shim allocation log into a DataFrame (one row per call, in file order).

    Columns: time_ns (CLOCK_MONOTONIC), duration_ns, op (name, see LOG_OPS), ptr, size_bytes, arg, pid, result
    (cudaError_t, 0 = success). A log whose last record is cut short (process killed mid-write) keeps its whole
    records; a file that is not a shim log is an InputError.
    """
    p = Path(path)
    if not (p.exists() or p.is_symlink()):
        raise InputError(f"allocation log {p} not found (was UVMLAB_ALLOC_LOG set and did the program allocate?)")
    data = read_input_bytes(p, MAX_ALLOC_LOG_BYTES, "a uvmlab shim allocation log")
    if len(data) < LOG_HEADER_BYTES or data[:8] != LOG_MAGIC:
        raise InputError(f"{p} is not a uvmlab shim allocation log (no UVMLBLOG header)")
    version = int.from_bytes(data[8:12], "little")
    record_bytes = int.from_bytes(data[12:16], "little")
    if version != LOG_VERSION or record_bytes != LOG_RECORD_DTYPE.itemsize:
        raise InputError(
            f"{p} is allocation log version {version} with {record_bytes}-byte records; this uvmlab reads version "
            f"{LOG_VERSION} ({LOG_RECORD_DTYPE.itemsize}-byte records): rebuild the shim with `uvmlab shim build`"
        )
    body = data[LOG_HEADER_BYTES:]
    whole = len(body) // record_bytes * record_bytes
    rec = np.frombuffer(body[:whole], dtype=LOG_RECORD_DTYPE)
    unknown = sorted(set(np.unique(rec["op"]).tolist()) - set(LOG_OPS))
    if unknown:
        raise InputError(f"{p} has records with unknown op codes {unknown}: is it a shim log of this version?")
    return pd.DataFrame(
        {
            "time_ns": rec["t_ns"].astype("int64"),
            "duration_ns": rec["dur_ns"].astype("int64"),
            "op": pd.Series([LOG_OPS[int(o)] for o in rec["op"]], dtype="string"),
            "ptr": rec["ptr"].astype("uint64"),
            "size_bytes": rec["size"].astype("uint64"),
            "arg": rec["arg"].astype("int64"),
            "pid": rec["pid"].astype("int32"),
            "result": rec["result"].astype("int32"),
        }
    )


def log_header_clocks(path: Path | str) -> tuple[int, int]:
    """(monotonic_ns, realtime_ns) when the shim was loaded: maps log times to wall-clock times."""
    data = Path(path).read_bytes()[:LOG_HEADER_BYTES]
    if len(data) < LOG_HEADER_BYTES or data[:8] != LOG_MAGIC:
        raise InputError(f"{path} is not a uvmlab shim allocation log (no UVMLBLOG header)")
    return int.from_bytes(data[16:24], "little", signed=True), int.from_bytes(data[24:32], "little", signed=True)


def managed_footprint_bytes(log: pd.DataFrame) -> int:
    """Peak of live managed bytes in a log (cudaMalloc-as-managed and pluggable allocations minus their frees).

    With the caching allocator on, this is the peak reserved memory; with it off, the peak of live tensors: the
    footprint definition of reference/uvm.md 3.1. Frees of pointers not allocated in the log are ignored.
    """
    live: dict[int, int] = {}
    current = peak = 0
    ok = log[log["result"] == 0]
    for op, ptr, size in zip(ok["op"], ok["ptr"], ok["size_bytes"], strict=True):
        if op in ("malloc", "pluggable_malloc") and size > 0:
            live[int(ptr)] = int(size)
            current += int(size)
            peak = max(peak, current)
        elif op in ("free", "pluggable_free"):
            current -= live.pop(int(ptr), 0)
    return peak
