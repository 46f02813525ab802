"""Compile-time check of the shim's CUDA declarations (uvmlab/measure/gpu/csrc/uvmlab_cuda_abi.h) against the real CUDA
runtime headers: tests/stubs/check_cuda_abi.cpp static_asserts every intercepted or called signature and every
constant. Runs for each CUDA 13 and CUDA 12 installation under /usr/local/cuda* (skipped, with the reason, where
none is installed; CI and the project's machines have CUDA 13)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from uvmlab.measure.gpu import shim

CHECK = Path(__file__).parent / "stubs" / "check_cuda_abi.cpp"


def _cuda_includes() -> dict[int, list[Path]]:
    """Include folders of the CUDA toolkits under /usr/local, by major version (read from CUDART_VERSION)."""
    found: dict[int, list[Path]] = {}
    seen: set[Path] = set()
    for header in sorted(Path("/usr/local").glob("cuda*/include/cuda_runtime_api.h")):
        inc = header.parent.resolve()
        if inc in seen:
            continue
        seen.add(inc)
        m = re.search(r"#define\s+CUDART_VERSION\s+(\d+)", header.read_text(errors="replace"))
        if m:
            found.setdefault(int(m.group(1)) // 1000, []).append(inc)
    return found


def _compile(include: Path, abi_dir: Path) -> subprocess.CompletedProcess[str]:
    cxx = shim.find_compiler()
    if cxx is None:
        pytest.skip("no C++ compiler (g++ or $CXX): the header check compiles a translation unit")
    return subprocess.run(
        [cxx, "-std=c++17", "-fsyntax-only", f"-I{include}", f"-I{abi_dir}", str(CHECK)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.parametrize("major", [13, 12])
def test_shim_declarations_match_the_cuda_headers(major: int) -> None:
    includes = _cuda_includes().get(major)
    if not includes:
        pytest.skip(f"no CUDA {major} toolkit headers under /usr/local/cuda*/include (CI has CUDA 13)")
    for inc in includes:
        proc = _compile(inc, shim.ABI_HEADER.parent)
        assert proc.returncode == 0, f"{inc}: {proc.stderr[-2000:]}"


@pytest.mark.parametrize(
    ("good", "bad", "message"),
    [
        (
            "X(cudaMallocManaged, ERR, (void**, size_t, unsigned int))",
            "X(cudaMallocManaged, ERR, (void**, size_t, int))",
            "cudaMallocManaged: the shim's signature differs",
        ),
        (
            "X(cudaMemPrefetchAsync, ERR, (const void*, size_t, LOC, unsigned int, STREAM))",
            "X(cudaMemPrefetchAsync, ERR, (const void*, size_t, int, STREAM))",
            "cudaMemPrefetchAsync: the shim's signature differs",
        ),
        ("kCudaMemAttachGlobal = 0x01;", "kCudaMemAttachGlobal = 0x02;", "kCudaMemAttachGlobal differs"),
        ("kCudaMemLocationTypeHost = 2;", "kCudaMemLocationTypeHost = 3;", "kCudaMemLocationTypeHost differs"),
        (
            "X(cudaDeviceGetAttribute, ERR, (int*, ATTR, int))",
            "X(cudaDeviceGetAttribute, ERR, (int*, int, int))",
            "cudaDeviceGetAttribute: the shim's signature differs",
        ),
        (
            "X(cudaPointerGetAttributes, ERR, (PATTR*, const void*))",
            "X(cudaPointerGetAttributes, ERR, (PATTR*, void*))",
            "cudaPointerGetAttributes: the shim's signature differs",
        ),
        (
            "kCudaMemAdviseUnsetAccessedBy = 6;",
            "kCudaMemAdviseUnsetAccessedBy = 5;",
            "kCudaMemAdviseUnsetAccessedBy differs",
        ),
        ("kCudaPointerAttributesBufferBytes = 128;", "kCudaPointerAttributesBufferBytes = 24;", "fits the buffer"),
        (
            "kCudaDevAttrConcurrentManagedAccess = 89;",
            "kCudaDevAttrConcurrentManagedAccess = 90;",
            "kCudaDevAttrConcurrentManagedAccess differs",
        ),
    ],
)
def test_a_deliberate_mismatch_fails_the_check(tmp_path: Path, good: str, bad: str, message: str) -> None:
    """The check can fail: a scratch copy of the header with one wrong signature or constant does not compile."""
    includes = _cuda_includes().get(13)
    if not includes:
        pytest.skip("no CUDA 13 toolkit headers under /usr/local/cuda*/include")
    text = shim.ABI_HEADER.read_text()
    assert text.count(good) == 1, f"{good!r} is no longer in {shim.ABI_HEADER.name}: update this test"
    (tmp_path / shim.ABI_HEADER.name).write_text(text.replace(good, bad))
    proc = _compile(includes[0], tmp_path)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr[-2000:]


def test_the_shim_uses_only_the_checked_declarations() -> None:
    """Every runtime function the shim resolves is in the checked lists (a new one must be added there)."""
    src = shim.SOURCE.read_text()
    header = shim.ABI_HEADER.read_text()
    resolved = set(re.findall(r'lookup\(handle, "(cuda\w+)"\)', src))
    listed = set(re.findall(r"X\((cuda\w+),", header))
    assert resolved and resolved <= listed, sorted(resolved - listed)


def test_the_python_side_uses_the_checked_constants() -> None:
    """uvmlab.measure.gpu.cudart (ctypes) and uvmlab.measure.gpu.hints use the values the header check verifies."""
    from uvmlab.measure.gpu import cudart, hints

    header = shim.ABI_HEADER.read_text()
    value = {m[0]: int(m[1]) for m in re.findall(r"constexpr int (k\w+) = (-?\d+);", header)}
    assert value["kCudaDevAttrPageableMemoryAccess"] == cudart.DEV_ATTR_PAGEABLE_MEMORY_ACCESS
    assert value["kCudaDevAttrConcurrentManagedAccess"] == cudart.DEV_ATTR_CONCURRENT_MANAGED_ACCESS
    assert value["kCudaMemAdviseSetReadMostly"] == hints.ADVISE_READ_MOSTLY
    assert value["kCudaMemLocationTypeHost"] == hints.LOCATION_HOST
