"""Per-architecture size of the CUDA kernel images in the CUDA libraries a PyTorch install ships.

What eager module loading (``CUDA_MODULE_LOADING=EAGER``, or any library built before CUDA 11.7) puts in device
memory is the library's kernel images for the GPU's architecture: the CUDA runtime loads every module of a library
when the library registers its fat binary (CUDA C Programming Guide, "Lazy Loading": without it "CUDA Runtime ...
load[s] all modules during program initialization"). This tool reads the ``.nv_fatbin`` ELF section of each shared
library (the fat binaries ``nvcc`` embeds), walks its entries (a 16-byte fat binary header with magic
``0xBA55ED50``, then per entry a header giving its kind, 1 = PTX, 2 = ELF cubin, its payload size, its SM version
and, for a compressed entry, its uncompressed size) and sums the uncompressed cubin bytes per SM version.

A cubin's size is an upper estimate of what the driver keeps resident for it (it also holds symbol and relocation
tables); uvmlab.memory.devicemem compares the sum for libtorch_cuda + cuBLAS + cuBLASLt with the eager module size
calibrated on the GPUMemNet A100 stack (docs/estimate.md "Fixed costs by library").

Usage: ``python tools/module_images.py [SITE_PACKAGES] [--arch 80]`` prints a table (MiB per library and SM
version) of torch/lib and the nvidia/* wheels found under SITE_PACKAGES (default: torch's own).
"""

from __future__ import annotations

import argparse
import struct
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

FATBIN_MAGIC = 0xBA55ED50
ELF_CUBIN = 2


def _section(path: Path, name: str) -> bytes | None:
    """The bytes of ELF64 section ``name`` of ``path`` (None when absent)."""
    with path.open("rb") as fh:
        head = fh.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2:
            return None
        (shoff,) = struct.unpack_from("<Q", head, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", head, 0x3A)
        fh.seek(shoff)
        table = fh.read(shentsize * shnum)
        secs = [struct.unpack_from("<IIQQQQIIQQ", table, i * shentsize) for i in range(shnum)]
        fh.seek(secs[shstrndx][4])
        names = fh.read(secs[shstrndx][5])
        for sec in secs:
            end = names.index(b"\0", sec[0])
            if names[sec[0] : end].decode() == name:
                fh.seek(sec[4])
                return fh.read(sec[5])
    return None


def cubins(blob: bytes) -> Iterator[tuple[int, int]]:
    """(SM version, uncompressed bytes) of every ELF cubin in a ``.nv_fatbin`` section."""
    pos = 0
    while pos + 16 <= len(blob):
        magic, _version, header, size = struct.unpack_from("<IHHQ", blob, pos)
        if magic != FATBIN_MAGIC:
            pos += 8  # fat binaries are 8-byte aligned in the section
            continue
        entry, end = pos + header, pos + header + size
        while entry < end:
            kind, _ver, ehead, payload = struct.unpack_from("<HHIQ", blob, entry)
            words = struct.unpack_from(f"<{(ehead - 16) // 4}I", blob, entry + 16)
            if kind == ELF_CUBIN:
                yield words[3], (words[10] if len(words) > 10 and words[10] else payload)
            entry += ehead + payload
        pos = end


def library_images(path: Path) -> Counter[int]:
    """Uncompressed cubin bytes per SM version of one shared library (empty without a ``.nv_fatbin``)."""
    blob = _section(path, ".nv_fatbin")
    sizes: Counter[int] = Counter()
    for sm, nbytes in cubins(blob or b""):
        sizes[sm] += nbytes
    return sizes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("site", nargs="?", type=Path, default=None, help="site-packages folder [default: torch's]")
    ap.add_argument("--arch", type=int, action="append", help="SM versions to show (repeatable) [default: all]")
    args = ap.parse_args()
    site = args.site
    if site is None:
        import torch

        site = Path(torch.__file__).resolve().parents[1]
    libs = sorted((site / "torch" / "lib").glob("libtorch_cuda*.so")) + sorted((site / "nvidia").glob("*/lib/lib*.so*"))
    rows = [(lib, library_images(lib)) for lib in libs]
    rows = [(lib, s) for lib, s in rows if s]
    arches = args.arch or sorted({sm for _, s in rows for sm in s})
    print("| library | " + " | ".join(f"sm_{a} MiB" for a in arches) + " |")
    print("|---|" + "---|" * len(arches))
    for lib, sizes in rows:
        print(f"| {lib.name} | " + " | ".join(f"{sizes.get(a, 0) / 2**20:.1f}" for a in arches) + " |")


if __name__ == "__main__":
    main()
