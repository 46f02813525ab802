"""How much does the shim add per cudaMalloc + cudaFree pair? (stub runtime; no GPU needed)

Builds the shim, the stub CUDA runtime and the test client (tests/stubs), then times N pairs of
cudaMalloc(4096) + cudaFree through the client library: without the shim, with the shim (managed, no log), and
with the shim and its allocation log. The stub's own cost (calloc/free, no call log) is the floor. Prints a table.

    python benchmarks/gpu_shim_overhead.py [N]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from uvmlab.console import print_table
from uvmlab.measure.gpu.shim import build_shim, read_alloc_log

STUBS = Path(__file__).resolve().parents[1] / "tests" / "stubs"


def _build(d: Path) -> tuple[Path, Path]:
    lib = build_shim(cache_dir=d / "cache")
    cc = ["gcc", "-O2"]
    subprocess.run(
        [
            *cc,
            "-shared",
            "-fPIC",
            f"-Wl,--version-script={STUBS / 'libcudart.map'}",
            "-Wl,-soname,libcudart.so.13",
            "-o",
            str(d / "libcudart.so.13"),
            str(STUBS / "fake_cudart.c"),
            "-lpthread",
        ],
        check=True,
    )
    subprocess.run(
        [
            *cc,
            "-shared",
            "-fPIC",
            "-o",
            str(d / "libfake_client.so"),
            str(STUBS / "fake_client.c"),
            f"-L{d}",
            "-l:libcudart.so.13",
            "-Wl,-rpath,$ORIGIN",
        ],
        check=True,
    )
    subprocess.run(
        [
            *cc,
            "-o",
            str(d / "client_main"),
            str(STUBS / "client_main.c"),
            f"-L{d}",
            "-lfake_client",
            "-Wl,-rpath,$ORIGIN",
        ],
        check=True,
    )
    return lib, d / "client_main"


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        lib, client = _build(d)
        base = {k: v for k, v in os.environ.items() if not k.startswith(("UVMLAB_", "FAKE_CUDART_", "LD_"))}
        cases = {
            "no shim (stub runtime only)": {},
            "shim, managed, no log": {"LD_PRELOAD": str(lib)},
            "shim, managed, allocation log": {"LD_PRELOAD": str(lib), "UVMLAB_ALLOC_LOG": str(d / "a.bin")},
        }
        rows = []
        for name, extra in cases.items():
            best = min(
                float(
                    subprocess.run(
                        [str(client), f"l{n}"], env={**base, **extra}, capture_output=True, text=True, check=True
                    ).stdout.split()[1]
                )
                for _ in range(3)
            )
            rows.append((name, n, best))
        records = len(read_alloc_log(d / "a.bin"))
    print_table("cudaMalloc(4096) + cudaFree pair through the shim (best of 3)", ["case", "pairs", "ns per pair"], rows)
    print(f"allocation log records written in the logged case (3 runs): {records}")


if __name__ == "__main__":
    main()
