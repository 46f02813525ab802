"""PYTORCH_CUDA_ALLOC_CONF parsing into a frozen :class:`AllocatorSettings`.

Follows ``c10/core/AllocatorConfig.cpp`` (CFG-2.8cpp, CFG-main26 in reference/allocator.md section 2.2):
``key:value`` pairs separated by commas; ``roundup_power2_divisions`` takes a single number or a list
``[64:8,256:4,>:1]``. Options that only exist as Python calls (``set_per_process_memory_fraction``) or that pick a
behaviour of a PyTorch version (``tie_break``, ``version``) are fields too, settable through :meth:`replace`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any, Literal

from uvmlab.errors import InputError
from uvmlab.sim.allocator.constants import (
    K_LARGE_BUFFER_BYTES,
    K_MIN_LARGE_ALLOC_BYTES,
    MIN_MAX_SPLIT_SIZE_MB,
    ROUNDUP_POWER2_INTERVALS,
    SIZE_MAX,
)
from uvmlab.units import MiB

TieBreak = Literal["address", "block_counter", "segment_counter"]
TIE_BREAKS = ("address", "block_counter", "segment_counter")
"""Order of equal-size free blocks (allocator.md 2.14): ``address`` (<= 2.12, PCA-2.5), ``block_counter``
(PR #178362: per-Block creation counter), ``segment_counter`` (PR #183591: owning segment's counter, then address)."""
VERSIONS = ("2.5", "main26")
"""Parser/allocator behaviour to follow: PCA-2.5 or the 2026 main branch (allocator.md 2.14 and 2.19)."""

_IGNORED_KEYS = frozenset(
    {
        "release_lock_on_cudamalloc",
        "pinned_use_cuda_host_register",
        "pinned_num_register_threads",
        "pinned_use_background_threads",
        "pinned_reserve_segment_size_mb",
        "expandable_segments_handle_type",
        "graph_capture_record_stream_reuse",
        "throw_on_cudamalloc_oom",
    }
)
"""Keys accepted but without effect on the model (threading, pinned host memory, IPC handles, graphs)."""


@dataclass(frozen=True)
class AllocatorSettings:
    """Allocator knobs; sizes in bytes. Defaults are PyTorch's (PCA-2.5)."""

    max_split_size_bytes: int = SIZE_MAX
    max_non_split_rounding_bytes: int = K_LARGE_BUFFER_BYTES
    roundup_power2_divisions: tuple[int, ...] = (0,) * ROUNDUP_POWER2_INTERVALS
    garbage_collection_threshold: float = 0.0
    expandable_segments: bool = False
    large_segment_size_bytes: int = K_LARGE_BUFFER_BYTES
    memory_fraction: float | None = None
    roundup_bypass_threshold_bytes: int | None = None
    tie_break: TieBreak = "address"
    version: str = "2.5"
    backend: str = "native"
    raw: str = ""

    @property
    def max_split_set(self) -> bool:
        """True when ``max_split_size_mb`` was given (enables release_available_cached_blocks)."""
        return self.max_split_size_bytes != SIZE_MAX

    def replace(self, **changes: Any) -> AllocatorSettings:
        """A copy with some fields changed (validated)."""
        new = dataclasses.replace(self, **changes)
        new.validate()
        return new

    def validate(self) -> None:
        """Raise InputError on impossible values."""
        if self.tie_break not in TIE_BREAKS:
            raise InputError(f"allocator setting tie_break={self.tie_break!r} is unknown; use one of {TIE_BREAKS}")
        if self.version not in VERSIONS:
            raise InputError(f"allocator setting version={self.version!r} is unknown; use one of {VERSIONS}")
        if len(self.roundup_power2_divisions) != ROUNDUP_POWER2_INTERVALS:
            raise InputError(f"roundup_power2_divisions needs {ROUNDUP_POWER2_INTERVALS} entries")
        if self.memory_fraction is not None and not 0.0 < self.memory_fraction <= 1.0:
            raise InputError(f"memory fraction {self.memory_fraction} must be in (0, 1]")
        if not 0.0 <= self.garbage_collection_threshold < 1.0:
            raise InputError(
                f"garbage_collection_threshold={self.garbage_collection_threshold} must be in (0, 1) (0 = off)"
            )
        if self.large_segment_size_bytes <= K_MIN_LARGE_ALLOC_BYTES:
            raise InputError("large_segment_size_mb must be greater than 10")

    @classmethod
    def parse(cls, conf: str | None, version: str = "2.5", **extra: Any) -> AllocatorSettings:
        """Parse a PYTORCH_CUDA_ALLOC_CONF string ("" or None = defaults); ``extra`` sets non-conf fields."""
        conf = (conf or "").strip()
        if version not in VERSIONS:
            raise InputError(f"allocator version {version!r} is unknown; use one of {VERSIONS}")
        values: dict[str, Any] = {"raw": conf, "version": version}
        large_seg = K_LARGE_BUFFER_BYTES
        max_non_split: int | None = None
        for key, val in _split_pairs(conf):
            if key == "max_split_size_mb":
                mb = _number(key, val, conf)
                if mb < MIN_MAX_SPLIT_SIZE_MB:
                    raise InputError(
                        f"PYTORCH_CUDA_ALLOC_CONF {conf!r}: max_split_size_mb={val} is too small; PyTorch requires"
                        f" at least {MIN_MAX_SPLIT_SIZE_MB}"
                    )
                values["max_split_size_bytes"] = int(mb * MiB)
            elif key == "max_non_split_rounding_mb":
                max_non_split = int(_number(key, val, conf) * MiB)
            elif key == "roundup_power2_divisions":
                values["roundup_power2_divisions"] = _parse_divisions(val, conf, version)
            elif key == "garbage_collection_threshold":
                values["garbage_collection_threshold"] = float(_number(key, val, conf))
            elif key == "expandable_segments":
                values["expandable_segments"] = _bool(key, val, conf)
            elif key == "large_segment_size_mb":
                large_seg = int(_number(key, val, conf) * MiB)
                values["large_segment_size_bytes"] = large_seg
            elif key == "per_process_memory_fraction":
                values["memory_fraction"] = float(_number(key, val, conf))
            elif key == "backend":
                if val not in ("native", "cudaMallocAsync"):
                    raise InputError(f"PYTORCH_CUDA_ALLOC_CONF {conf!r}: backend must be native or cudaMallocAsync")
                values["backend"] = val
            elif key == "roundup_bypass_threshold_mb":  # PyTorch 1.13/2.0 only (PR #85940)
                values["roundup_bypass_threshold_bytes"] = int(_number(key, val, conf) * MiB)
            elif key in _IGNORED_KEYS:
                continue
            else:
                raise InputError(
                    f"PYTORCH_CUDA_ALLOC_CONF {conf!r}: unrecognized key {key!r}; known keys include"
                    " max_split_size_mb, roundup_power2_divisions, garbage_collection_threshold, expandable_segments"
                )
        if max_non_split is None:  # main26 ties the default to large_segment_size (allocator.md 2.2)
            max_non_split = large_seg if version == "main26" else K_LARGE_BUFFER_BYTES
        values["max_non_split_rounding_bytes"] = max_non_split
        values.update(extra)
        settings = cls(**values)
        settings.validate()
        return settings

    def to_snapshot(self) -> dict[str, Any]:
        """The ``allocator_settings`` dict PyTorch writes into a snapshot (allocator.md 3.2)."""
        return {
            "PYTORCH_CUDA_ALLOC_CONF": self.raw,
            "max_split_size": self.max_split_size_bytes if self.max_split_set else -1,
            "garbage_collection_threshold": self.garbage_collection_threshold,
            "expandable_segments": self.expandable_segments,
            "release_lock_on_cudamalloc": False,
            "roundup_power2_divisions": {str(1 << i): d for i, d in enumerate(self.roundup_power2_divisions)},
        }

    @classmethod
    def from_snapshot(cls, allocator_settings: dict[str, Any] | None, **extra: Any) -> AllocatorSettings:
        """Settings from a snapshot's ``allocator_settings`` dict (allocator.md 3.2); None = defaults.

        The structured fields win; knobs only present in the raw PYTORCH_CUDA_ALLOC_CONF string (e.g.
        ``max_non_split_rounding_mb``, ``large_segment_size_mb``) are taken from it when it parses.
        """
        if not allocator_settings:
            return cls.parse("", **extra)
        raw = str(allocator_settings.get("PYTORCH_CUDA_ALLOC_CONF") or "")
        try:
            base = cls.parse(raw)
        except InputError:  # a knob of a newer PyTorch than this parser knows: keep the structured fields only
            base = cls()
        values: dict[str, Any] = {
            "raw": raw,
            "max_non_split_rounding_bytes": base.max_non_split_rounding_bytes,
            "large_segment_size_bytes": base.large_segment_size_bytes,
            "roundup_bypass_threshold_bytes": base.roundup_bypass_threshold_bytes,
            "memory_fraction": base.memory_fraction,
        }
        mss = allocator_settings.get("max_split_size")
        if isinstance(mss, int) and mss > 0 and mss < SIZE_MAX:
            values["max_split_size_bytes"] = mss
        gc = allocator_settings.get("garbage_collection_threshold")
        if isinstance(gc, int | float):
            values["garbage_collection_threshold"] = float(gc)
        if "expandable_segments" in allocator_settings:
            values["expandable_segments"] = bool(allocator_settings["expandable_segments"])
        div = allocator_settings.get("roundup_power2_divisions")
        if isinstance(div, dict) and len(div) == ROUNDUP_POWER2_INTERVALS:
            ordered = sorted(div.items(), key=lambda kv: int(kv[0]))
            values["roundup_power2_divisions"] = tuple(int(v) for _, v in ordered)
        values.update(extra)
        settings = cls(**values)
        settings.validate()
        return settings


def _split_pairs(conf: str) -> list[tuple[str, str]]:
    """Split ``a:1,b:[x:1,y:2],c:True`` into pairs (commas inside brackets do not split)."""
    if not conf:
        return []
    parts: list[str] = []
    depth, start = 0, 0
    for i, ch in enumerate(conf):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise InputError(f"PYTORCH_CUDA_ALLOC_CONF {conf!r}: unbalanced ']'")
        elif ch == "," and depth == 0:
            parts.append(conf[start:i])
            start = i + 1
    if depth != 0:
        raise InputError(f"PYTORCH_CUDA_ALLOC_CONF {conf!r}: unbalanced '['")
    parts.append(conf[start:])
    pairs = []
    for part in parts:
        part = part.strip()
        if not part:
            continue
        key, sep, val = part.partition(":")
        if not sep or not val.strip():
            raise InputError(f"PYTORCH_CUDA_ALLOC_CONF {conf!r}: {part!r} is not key:value")
        pairs.append((key.strip(), val.strip()))
    return pairs


def _number(key: str, val: str, conf: str) -> float:
    """A finite, non-negative number; a size in MB must also fit size_t once multiplied by 1 MiB (PyTorch keeps
    these settings as size_t bytes, c10/cuda/CUDAAllocatorConfig.h)."""
    try:
        x = float(val)
    except ValueError:
        raise InputError(f"PYTORCH_CUDA_ALLOC_CONF {conf!r}: {key} needs a number, got {val!r}") from None
    if not math.isfinite(x):
        raise InputError(f"PYTORCH_CUDA_ALLOC_CONF {conf!r}: {key} needs a finite number, got {val!r}")
    if x < 0:
        raise InputError(f"PYTORCH_CUDA_ALLOC_CONF {conf!r}: {key} cannot be negative")
    if key.endswith("_mb") and x * MiB > SIZE_MAX:
        raise InputError(f"PYTORCH_CUDA_ALLOC_CONF {conf!r}: {key}={val} MB is more than size_t can hold in bytes")
    return x


def _bool(key: str, val: str, conf: str) -> bool:
    if val in ("True", "true", "1"):
        return True
    if val in ("False", "false", "0"):
        return False
    raise InputError(f"PYTORCH_CUDA_ALLOC_CONF {conf!r}: {key} needs True or False, got {val!r}")


def _pow2_or_zero(n: int) -> bool:
    return n == 0 or (n & (n - 1)) == 0


def _parse_divisions(val: str, conf: str, version: str) -> tuple[int, ...]:
    """Single value -> every interval; list ``[N:d,...,>:d]`` per CFG-2.8cpp / CFG-main26 (allocator.md 2.2)."""
    out = [0] * ROUNDUP_POWER2_INTERVALS
    if not val.startswith("["):
        d = int(_number("roundup_power2_divisions", val, conf))
        if not _pow2_or_zero(d):
            raise InputError(f"PYTORCH_CUDA_ALLOC_CONF {conf!r}: roundup_power2_divisions must be a power of 2")
        return (d,) * ROUNDUP_POWER2_INTERVALS
    if not val.endswith("]"):
        raise InputError(f"PYTORCH_CUDA_ALLOC_CONF {conf!r}: roundup_power2_divisions list lacks ']'")
    first, last_index = True, 0
    for item in filter(None, (s.strip() for s in val[1:-1].split(","))):
        k, sep, v = item.partition(":")
        if not sep or not re.fullmatch(r"\d+", v.strip()):
            raise InputError(f"PYTORCH_CUDA_ALLOC_CONF {conf!r}: {item!r} in roundup_power2_divisions is not N:d")
        d = int(v)
        if not _pow2_or_zero(d):
            raise InputError(f"PYTORCH_CUDA_ALLOC_CONF {conf!r}: divisions {d} must be a power of 2")
        k = k.strip()
        if k == ">":
            start = last_index + 1 if version == "main26" else last_index
            for i in range(start, ROUNDUP_POWER2_INTERVALS):
                out[i] = d
        else:
            if not re.fullmatch(r"\d+", k) or not _pow2_or_zero(int(k)) or int(k) == 0:
                raise InputError(f"PYTORCH_CUDA_ALLOC_CONF {conf!r}: {k!r} must be a power-of-2 size in MB")
            index = min(int(k).bit_length() - 1, ROUNDUP_POWER2_INTERVALS - 1)
            if first:
                for i in range(index):
                    out[i] = d
            out[index] = d
            first, last_index = False, index
    return tuple(out)
