"""Byte units: one parser and one formatter for human sizes."""

from __future__ import annotations

import math
import re

from uvmlab.errors import InputError
from uvmlab.numbers import prefix

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
TiB = 1024 * GiB
MAX_BYTES = 2**63 - 1
"""Largest byte count parsed: tables store sizes as int64 (and PyTorch as int64/size_t)."""

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": KiB,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": MiB,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": GiB,
    "t": 1000**4,
    "tb": 1000**4,
    "tib": TiB,
}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str | int | float) -> int:
    """Parse ``"80GiB"``, ``"1.5 GB"``, ``"4096"`` or a number into a byte count.

    Decimal suffixes (kB, MB, GB) are powers of 1000, binary ones (KiB, MiB, GiB) powers of 1024.
    """
    if isinstance(text, bool):
        raise InputError(f"not a byte size: {prefix(text)}")
    if isinstance(text, int | float):
        value, unit = float(text), ""
    else:
        m = _SIZE_RE.match(text)
        if not m:
            raise InputError(f"not a byte size: {prefix(text)} (examples: 4096, 512MiB, 80GiB, 1.5GB)")
        value, unit = float(m.group(1)), m.group(2).lower()
    if unit not in _UNITS:
        raise InputError(
            f"unknown byte unit {prefix(unit)} in {prefix(text)}; use B, KiB, MiB, GiB, TiB, kB, MB, GB or TB"
        )
    result = value * _UNITS[unit]
    if result < 0:
        raise InputError(f"a byte size cannot be negative: {prefix(text)}")
    if not math.isfinite(result) or result > MAX_BYTES:
        raise InputError(f"byte size {prefix(text)} is larger than {MAX_BYTES:,} bytes (2**63 - 1, the int64 limit)")
    return round(result)


def format_bytes(n: int | float | None, precision: int = 2) -> str:
    """Format a byte count with binary units (``"1.50 GiB"``); ``None`` prints as ``"n/a"``."""
    if n is None or n != n:  # None or NaN: not collected
        return "n/a"
    sign = "-" if n < 0 else ""
    n = abs(float(n))
    for unit, size in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size:
            return f"{sign}{n / size:.{precision}f} {unit}"
    return f"{sign}{int(n)} B"
