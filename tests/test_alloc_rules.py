"""Unit tests of the allocator size rules and PYTORCH_CUDA_ALLOC_CONF parsing (reference/allocator.md 2.2-2.5)."""

from __future__ import annotations

import pytest

from uvmlab.errors import InputError
from uvmlab.sim.allocator.allocconf import AllocatorSettings
from uvmlab.sim.allocator.constants import SIZE_MAX
from uvmlab.sim.allocator.rounding import allocation_size, divisions_for, round_size, roundup_power2_next_division

MiB = 1 << 20
D4 = (4,) * 16


@pytest.mark.parametrize(
    ("size", "divisions", "expected"),
    [
        (1, None, 512),
        (511, None, 512),
        (512, None, 512),
        (513, None, 1024),
        (1_000_000, None, 1_000_448),
        (MiB, None, MiB),
        (MiB + 1, None, MiB + 512),
        (1200, D4, 1536),  # 1200 <= 512*4: the n > 512*d guard keeps plain 512 rounding
        (5000, D4, 5120),  # 4096 + 1024
        (8192, D4, 8192),  # powers of two stay
        (9000, (8,) * 16, 9216),  # 8192 + 1024
        (314_572_800, D4, 320 * MiB),  # 300 MB with 4 divisions -> 320 MiB (allocator.md 2.4)
        (3000, (8,) * 16, 3072),  # n > 512*d guard: 3000 <= 4096 -> plain 512 rounding
        (5000, (16,) * 16, 5120),  # 5000 <= 8192 -> 512 rounding
        (300 * MiB, (1,) * 16, 300 * MiB),  # 1 division = off (PR #92109)
    ],
)
def test_round_size_table(size: int, divisions: tuple[int, ...] | None, expected: int) -> None:
    assert round_size(size, divisions) == expected


@pytest.mark.parametrize(
    ("size", "expected"),
    [
        (512, 2 * MiB),
        (MiB, 2 * MiB),  # exactly 1 MiB is small
        (MiB + 512, 20 * MiB),
        (10 * MiB - 512, 20 * MiB),
        (10 * MiB, 10 * MiB),  # the boundary xMem gets wrong
        (10 * MiB + 512, 12 * MiB),
        (300 * MiB + 1, 302 * MiB),
    ],
)
def test_allocation_size(size: int, expected: int) -> None:
    assert allocation_size(size) == expected


def test_next_division_source_example() -> None:
    assert roundup_power2_next_division(1200, 4) == 1280  # the PCA-2.5 source comment: 1024, 1280, 1536, 1792
    assert roundup_power2_next_division(1280, 4) == 1280
    assert roundup_power2_next_division(1024, 4) == 1024
    assert roundup_power2_next_division(5, 8) == 8  # step 0 -> next power of two


def test_roundup_bypass_threshold_20() -> None:
    s = AllocatorSettings.parse("roundup_power2_divisions:4,roundup_bypass_threshold_mb:100")
    assert s.roundup_bypass_threshold_bytes == 100 * MiB
    assert round_size(300 * MiB + 1, s.roundup_power2_divisions, s.roundup_bypass_threshold_bytes) == 300 * MiB + 512
    assert round_size(5000, s.roundup_power2_divisions, s.roundup_bypass_threshold_bytes) == 5120


def test_divisions_index_by_power_of_two() -> None:
    div = tuple(range(16))
    assert divisions_for(512, div) == 0  # below 1 MiB -> entry 0
    assert divisions_for(MiB, div) == 0
    assert divisions_for(2 * MiB, div) == 1
    assert divisions_for(3 * MiB, div) == 1
    assert divisions_for(1 << 40, div) == 15  # clamped


def test_parse_defaults_and_knobs() -> None:
    s = AllocatorSettings.parse("")
    assert s.max_split_size_bytes == SIZE_MAX and not s.max_split_set and not s.expandable_segments
    s = AllocatorSettings.parse("max_split_size_mb:128, expandable_segments:True,garbage_collection_threshold:0.6")
    assert s.max_split_size_bytes == 128 * MiB and s.max_split_set
    assert s.expandable_segments and s.garbage_collection_threshold == 0.6
    assert AllocatorSettings.parse("roundup_power2_divisions:4").roundup_power2_divisions == (4,) * 16


def test_parse_divisions_list_25_vs_main26() -> None:
    conf = "roundup_power2_divisions:[64:8,256:4,>:1]"
    s25 = AllocatorSettings.parse(conf).roundup_power2_divisions
    assert s25[:7] == (8,) * 7  # first key fills every lower entry
    assert s25[8] == 1  # '>' starts at the last index itself in 2.8cpp: overwrites 256 -> 1
    assert s25[15] == 1
    s26 = AllocatorSettings.parse(conf, version="main26").roundup_power2_divisions
    assert s26[8] == 4 and s26[9] == 1  # main26 starts after the last index


def test_parse_main26_max_non_split_follows_large_segment() -> None:
    assert AllocatorSettings.parse("large_segment_size_mb:40").max_non_split_rounding_bytes == 20 * MiB
    s = AllocatorSettings.parse("large_segment_size_mb:40", version="main26")
    assert s.max_non_split_rounding_bytes == 40 * MiB and s.large_segment_size_bytes == 40 * MiB


@pytest.mark.parametrize(
    "conf",
    [
        "max_split_size_mb:10",  # below the 20 MB minimum
        "bogus_key:1",
        "max_split_size_mb",
        "expandable_segments:maybe",
        "roundup_power2_divisions:3",
        "roundup_power2_divisions:[64:3]",
        "roundup_power2_divisions:[64:4",
        "garbage_collection_threshold:1.5",
        "backend:magic",
    ],
)
def test_parse_rejects_bad_conf(conf: str) -> None:
    with pytest.raises(InputError):
        AllocatorSettings.parse(conf)


def test_from_snapshot_settings() -> None:
    snap = {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,max_split_size_mb:128",
        "max_split_size": 128 * MiB,
        "garbage_collection_threshold": 0.0,
        "expandable_segments": True,
        "roundup_power2_divisions": {str(1 << i): (4 if i == 3 else 0) for i in range(16)},
    }
    s = AllocatorSettings.from_snapshot(snap)
    assert s.expandable_segments and s.max_split_size_bytes == 128 * MiB
    assert s.roundup_power2_divisions[3] == 4 and sum(s.roundup_power2_divisions) == 4
    assert AllocatorSettings.from_snapshot({"max_split_size": -1}).max_split_size_bytes == SIZE_MAX
    raw_only = AllocatorSettings.from_snapshot({"PYTORCH_CUDA_ALLOC_CONF": "max_non_split_rounding_mb:64"})
    assert raw_only.max_non_split_rounding_bytes == 64 * MiB
    newer = AllocatorSettings.from_snapshot(
        {"PYTORCH_CUDA_ALLOC_CONF": "some_future_knob:1", "expandable_segments": True}
    )
    assert newer.expandable_segments and newer.raw == "some_future_knob:1"
