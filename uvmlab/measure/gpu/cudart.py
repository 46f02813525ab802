"""The CUDA runtime library for the few runtime calls uvmlab makes itself, through ctypes.

Which library: the one this process has already loaded (torch loads ``libcudart.so.13`` from its wheel; the calls
then reach the same runtime instance as the job's), else the file ``$UVMLAB_CUDART`` names (the variable the shim
reads for the same purpose), else the one the ``nvidia-cuda-runtime`` wheel installed (``nvidia/cu*/lib``, the copy
torch uses). A process that only uses CuPy has no runtime loaded at all: CuPy links the CUDA runtime statically (no
library in the ``cupy-cuda13x`` 14.2.0 wheel depends on ``libcudart.so``), so such a process loads one by path here.
A second runtime instance in a process is valid: it works in the device's primary context, like CuPy's, and a
stream CuPy created is a driver ``CUstream`` that any runtime instance accepts (CUDA Runtime API, "Interactions
with the CUDA Driver API": runtime and driver streams are interchangeable) [unverified on a GPU here].

Device attributes read here (values: CUDA 13.0 ``driver_types.h`` ``enum cudaDeviceAttr``; also in
``uvmlab/measure/gpu/csrc/uvmlab_cuda_abi.h``, whose values tests/test_gpu_shim_headers.py checks against the headers):
``cudaDevAttrConcurrentManagedAccess`` (89) is the condition the CUDA Programming Guide sets for managed memory
larger than the device memory (oversubscription; "Unified Memory on devices with full CUDA Unified Memory
support"); ``cudaDevAttrPageableMemoryAccess`` (88) says whether plain host memory may be advised or prefetched.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import re
from pathlib import Path
from typing import Any

from uvmlab.errors import UnavailableError

CUDART_ENV = "UVMLAB_CUDART"
"""Path of the CUDA runtime to load when this process has none (the shim reads the same variable)."""
DEV_ATTR_PAGEABLE_MEMORY_ACCESS = 88
"""cudaDevAttrPageableMemoryAccess (driver_types.h)."""
DEV_ATTR_CONCURRENT_MANAGED_ACCESS = 89
"""cudaDevAttrConcurrentManagedAccess (driver_types.h)."""


def is_library(path: str, stem: str) -> bool:
    """``path``'s file name is ``stem`` (e.g. ``libcudart.so``) or ``stem.<digits>[.<digits>...]``: that library,
    not any file whose name merely contains the stem (``libcudart.so.bak``, ``mylibcudart.so.13``)."""
    return re.fullmatch(re.escape(stem) + r"(\.\d+)*", Path(path).name) is not None


def loaded_library(stems: tuple[str, ...], maps: str | None = None) -> str | None:
    """Path of the first mapped library (``/proc/self/maps``, or ``maps``) whose file name is one of ``stems``
    (:func:`is_library`), tried in the order given; None when none is loaded."""
    if maps is None:
        try:
            maps = Path("/proc/self/maps").read_text()
        except OSError:
            return None
    paths = [parts[-1] for parts in (line.split() for line in maps.splitlines()) if len(parts) >= 6]
    for stem in stems:
        for path in paths:
            if is_library(path, stem):
                return path
    return None


def loaded_cudart(maps: str | None = None) -> str | None:
    """Path of the libcudart this process has loaded, from /proc/self/maps (None: none is loaded)."""
    return loaded_library(("libcudart.so",), maps)


def installed_cudart(major: int | None = None) -> Path | None:
    """The runtime of the ``nvidia-cuda-runtime`` wheel (``nvidia/cu*/lib/libcudart.so.*``), of CUDA ``major``
    when given; None when the wheel is not installed."""
    spec = importlib.util.find_spec("nvidia")
    roots = list(spec.submodule_search_locations or []) if spec else []
    pattern = f"*/lib/libcudart.so.{major}*" if major else "*/lib/libcudart.so.*"
    for root in roots:
        for lib in sorted(Path(root).glob(pattern)):
            return lib
    return None


def cudart_path(major: int | None = None, env: Any = None) -> str | None:
    """The runtime to call: the loaded one, else ``$UVMLAB_CUDART``, else the installed wheel's (see module)."""
    env = os.environ if env is None else env
    loaded = loaded_cudart()
    if loaded:
        return loaded
    named = env.get(CUDART_ENV)
    if named:
        return named
    wheel = installed_cudart(major)
    return str(wheel) if wheel else None


def load_cudart(major: int | None = None) -> ctypes.CDLL:
    """The CUDA runtime as a ctypes library (see :func:`cudart_path`); UnavailableError, one sentence, if none."""
    path = cudart_path(major)
    if path is None:
        raise UnavailableError(
            "no CUDA runtime library to call: this process loaded none (CuPy links it statically), "
            f"${CUDART_ENV} is unset and the nvidia-cuda-runtime wheel is not installed"
        )
    try:
        return ctypes.CDLL(path)
    except OSError as exc:
        raise UnavailableError(f"cannot load the CUDA runtime {path}: {exc}") from None


def device_attribute(lib: Any, attr: int, device: int) -> int:
    """``cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr, int device)``; RuntimeError on a CUDA error."""
    value = ctypes.c_int(0)
    fn = lib.cudaDeviceGetAttribute
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int]
    rc = fn(ctypes.byref(value), attr, device)
    if rc != 0:
        raise RuntimeError(f"cudaDeviceGetAttribute({attr}) returned cudaError {rc}")
    return int(value.value)
