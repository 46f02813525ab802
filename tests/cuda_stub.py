"""Building the stub CUDA runtime (tests/stubs/fake_cudart.c) for a test: one helper for the tests that load it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

STUBS = Path(__file__).parent / "stubs"


def build_cudart(folder: Path, soname: str = "libcudart.so.13") -> Path:
    """Compile the stub as ``folder/<soname>`` with that soname. ``libcudart.so.13`` gets the runtime's own symbol
    version node (tests/stubs/libcudart.map); any other soname gets a node of its own name, so that a process which
    also loads torch's libcudart.so.13 keeps torch's bindings while the shim (preloaded before it) finds the stub.
    Skips the test without gcc."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc not found: the stub CUDA runtime is C")
    version_map = STUBS / "libcudart.map"
    if soname != "libcudart.so.13":
        version_map = folder / f"{soname}.map"
        version_map.write_text(f"{soname} {{\n  global: cuda*; fake_cudart_*;\n  local: *;\n}};\n")
    out = folder / soname
    subprocess.run(
        ["gcc", "-shared", "-fPIC", f"-Wl,--version-script={version_map}", f"-Wl,-soname,{soname}", "-o", str(out),
         str(STUBS / "fake_cudart.c"), "-lpthread"],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return out
