"""The stub CUDA runtime (tests/stubs/fake_cudart.c) refuses what CUDA 13 refuses, with the code the CUDA 13.0 headers
give (each cited in the stub's header comment), and counts resident managed pages in cudaMemGetInfo. Before, it
answered cudaSuccess to each call below (or crashed: cudaFree of an unknown pointer, a double free), aborted past
4,096 live allocations, and ignored managed memory in free, so tests passed that would fail on hardware.

Each case runs in a child process (a crash is a failure of that case, not of the suite)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cuda_stub import build_cudart

INVALID_VALUE, INVALID_DEVICE, INVALID_HANDLE = 1, 101, 400  # driver_types.h enum cudaError

PRELUDE = """
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
class Loc(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]
lib.cudaMemAdvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, Loc]
lib.cudaMemPrefetchAsync.argtypes = [ctypes.c_void_p, ctypes.c_size_t, Loc, ctypes.c_uint, ctypes.c_void_p]
lib.cudaMallocManaged.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_uint]
lib.cudaFree.argtypes = [ctypes.c_void_p]
m = ctypes.c_void_p()
assert lib.cudaMallocManaged(ctypes.byref(m), 1 << 20, 1) == 0
"""


@pytest.fixture(scope="module")
def stub(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_cudart(tmp_path_factory.mktemp("cudart"))


def _run(stub: Path, code: str, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_CUDART")}
    proc = subprocess.run(
        [sys.executable, "-c", PRELUDE + code, str(stub)], env={**clean, **env}, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


CASES = [
    # (what, expression printed, expected code, extra environment)
    ("cudaMallocManaged flags 0", "lib.cudaMallocManaged(ctypes.byref(ctypes.c_void_p()), 4096, 0)", INVALID_VALUE, {}),
    ("cudaMallocManaged flags 4", "lib.cudaMallocManaged(ctypes.byref(ctypes.c_void_p()), 4096, 4)", INVALID_VALUE, {}),
    ("cudaMallocManaged attach host", "lib.cudaMallocManaged(ctypes.byref(ctypes.c_void_p()), 4096, 2)", 0, {}),
    ("cudaMemAdvise unknown advice 99", "lib.cudaMemAdvise(m, 4096, 99, Loc(1, 0))", INVALID_VALUE, {}),
    ("cudaMemAdvise advice 0", "lib.cudaMemAdvise(m, 4096, 0, Loc(1, 0))", INVALID_VALUE, {}),
    ("preferred location on device 7", "lib.cudaMemAdvise(m, 4096, 3, Loc(1, 7))", INVALID_DEVICE, {}),
    ("preferred location, location type 0", "lib.cudaMemAdvise(m, 4096, 3, Loc(0, 0))", INVALID_VALUE, {}),
    ("accessed by, location type 9", "lib.cudaMemAdvise(m, 4096, 5, Loc(9, 0))", INVALID_VALUE, {}),
    ("read mostly ignores the location", "lib.cudaMemAdvise(m, 4096, 1, Loc(0, 0))", 0, {}),
    ("preferred location on the host", "lib.cudaMemAdvise(m, 4096, 3, Loc(2, 0))", 0, {}),
    (
        "preferred location, no concurrent managed access",
        "lib.cudaMemAdvise(m, 4096, 3, Loc(1, 0))",
        INVALID_DEVICE,
        {"FAKE_CUDART_CONCURRENT_MANAGED": "0"},
    ),
    ("prefetch flags 1", "lib.cudaMemPrefetchAsync(m, 4096, Loc(1, 0), 1, None)", INVALID_VALUE, {}),
    ("prefetch to device 3", "lib.cudaMemPrefetchAsync(m, 4096, Loc(1, 3), 0, None)", INVALID_DEVICE, {}),
    ("prefetch to location type 0", "lib.cudaMemPrefetchAsync(m, 4096, Loc(0, 0), 0, None)", INVALID_VALUE, {}),
    (
        "prefetch, no concurrent managed access",
        "lib.cudaMemPrefetchAsync(m, 4096, Loc(1, 0), 0, None)",
        INVALID_DEVICE,
        {"FAKE_CUDART_CONCURRENT_MANAGED": "0"},
    ),
    ("prefetch to the host", "lib.cudaMemPrefetchAsync(m, 4096, Loc(2, 0), 0, None)", 0, {}),
    ("cudaFree of an unknown pointer", "lib.cudaFree(0x123456000)", INVALID_VALUE, {}),
    ("cudaFree twice", "[lib.cudaFree(m), lib.cudaFree(m)][1]", INVALID_VALUE, {}),
    ("cudaFree(NULL) is a no-op", "lib.cudaFree(None)", 0, {}),
    ("cudaEventRecord of an unknown event", "lib.cudaEventRecord(ctypes.c_void_p(0x10), None)", INVALID_HANDLE, {}),
]


@pytest.mark.parametrize(("what", "expr", "code", "env"), CASES, ids=[c[0] for c in CASES])
def test_the_stub_refuses_what_cuda_13_refuses(stub: Path, what: str, expr: str, code: int, env: dict) -> None:
    assert int(_run(stub, f"print({expr})", **env)) == code, what


def test_cuda_12_prefetch_checks_the_device_ordinal(stub: Path) -> None:
    code = """
f = lib.cudaMemPrefetchAsync
f.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
print([f(m, 4096, 0, None), f(m, 4096, -1, None), f(m, 4096, 5, None)])
"""
    assert _run(stub, code, FAKE_CUDART_VERSION="12080") == f"[0, 0, {INVALID_DEVICE}]"


def test_more_than_4096_live_allocations(stub: Path) -> None:
    """The old table held 4,096 entries: the 4,097th allocation was never recorded and its free crashed."""
    code = """
ptrs = []
for i in range(5000):
    p = ctypes.c_void_p()
    assert lib.cudaMallocManaged(ctypes.byref(p), 64, 1) == 0
    ptrs.append(p.value)
print(sum(lib.cudaFree(p) for p in ptrs))
"""
    assert _run(stub, code) == "0"


def test_free_memory_counts_resident_managed_pages(stub: Path) -> None:
    """cudaMemGetInfo's free is "the amount of memory on the device that is free according to the OS" (CUDA 13.0
    cuda_runtime_api.h): managed pages on the GPU take it. They get there by a prefetch to the device or a kernel's
    touch; a prefetch to the host gives it back; so does cudaFree; a device allocation evicts them."""
    code = """
def free():
    f, t = ctypes.c_size_t(), ctypes.c_size_t()
    assert lib.cudaMemGetInfo(ctypes.byref(f), ctypes.byref(t)) == 0
    return f.value
MiB = 1 << 20
big = ctypes.c_void_p()
assert lib.cudaMallocManaged(ctypes.byref(big), 600 * MiB, 1) == 0
out = [free()]
out.append(lib.cudaMemPrefetchAsync(big, 400 * MiB, Loc(1, 0), 0, None)); out.append(free())
out.append(lib.fake_cudart_gpu_touch(big, 600 * MiB)); out.append(free())
out.append(lib.cudaMemPrefetchAsync(big, 600 * MiB, Loc(2, 0), 0, None)); out.append(free())
lib.fake_cudart_gpu_touch(big, 600 * MiB)
d = ctypes.c_void_p()
out.append(lib.cudaMalloc(ctypes.byref(d), ctypes.c_size_t(900 * MiB))); out.append(free())
out.append(lib.cudaFree(big)); out.append(free())
print([x // MiB for x in out])
"""
    total, context = 2048, 1024  # MiB: 1 GiB free
    got = _run(stub, code, FAKE_CUDART_TOTAL_BYTES=str(total << 20), FAKE_CUDART_CONTEXT_BYTES=str(context << 20))
    # free 1024; 400 resident -> 624; all 600 -> 424; to the host -> 1024; touch 600 again, then a 900 MiB
    # cudaMalloc evicts 476 of them -> 0 free; freeing the managed range gives its 124 resident MiB back
    assert got == "[1024, 0, 624, 0, 424, 0, 1024, 0, 0, 0, 124]"
