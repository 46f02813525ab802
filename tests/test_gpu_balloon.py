"""Balloon arithmetic: capacity = footprint / factor, the balloon takes the rest; edge cases refuse in one sentence."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from uvmlab.errors import InputError
from uvmlab.measure.gpu.balloon import (
    DEFAULT_RESERVE_BYTES,
    MIN_AVAILABLE_BYTES,
    ROOT_CHUNK_BYTES,
    plan_balloon,
)
from uvmlab.units import GiB, MiB

A100 = 80 * GiB
CTX = 512 * MiB


def test_factor_four_on_an_a100() -> None:
    b = plan_balloon(32 * GiB, 4.0, A100, CTX, host_memory_bytes=512 * GiB)
    assert b.available_bytes == 8 * GiB
    assert b.leave_bytes == 8 * GiB + DEFAULT_RESERVE_BYTES
    assert b.balloon_bytes == A100 - CTX - DEFAULT_RESERVE_BYTES - 8 * GiB
    assert b.achieved_oversub == 4.0 and b.oversub_total == 0.4
    assert b.notes == ()


def test_context_overhead_is_taken_from_the_balloon_not_from_uvm() -> None:
    small, big = (plan_balloon(16 * GiB, 2, A100, ctx, host_memory_bytes=512 * GiB) for ctx in (0, 2 * GiB))
    assert small.available_bytes == big.available_bytes == 8 * GiB
    assert small.balloon_bytes - big.balloon_bytes == 2 * GiB


def test_capacity_is_rounded_down_to_root_chunks() -> None:
    b = plan_balloon(10 * GiB + 3, 3.0, A100, CTX, host_memory_bytes=512 * GiB)
    assert b.available_bytes % ROOT_CHUNK_BYTES == 0
    assert b.available_bytes <= (10 * GiB + 3) / 3 < b.available_bytes + ROOT_CHUNK_BYTES
    assert b.achieved_oversub >= 3.0


def test_factor_one_leaves_exactly_the_footprint() -> None:
    b = plan_balloon(40 * GiB, 1.0, A100, CTX, host_memory_bytes=512 * GiB)
    assert b.available_bytes == 40 * GiB and b.achieved_oversub == 1.0


def test_factor_below_one_that_the_card_cannot_give_clamps_with_a_note() -> None:
    b = plan_balloon(60 * GiB, 0.5, A100, CTX, host_memory_bytes=512 * GiB)
    assert b.balloon_bytes == 0
    assert b.available_bytes == (A100 - CTX - DEFAULT_RESERVE_BYTES)
    assert 0.5 < b.achieved_oversub < 1.0
    assert "no balloon" in b.notes[0]


def test_factor_below_one_that_fits_keeps_a_balloon() -> None:
    b = plan_balloon(10 * GiB, 0.5, A100, CTX, host_memory_bytes=512 * GiB)
    assert b.available_bytes == 20 * GiB and b.balloon_bytes > 0


@pytest.mark.parametrize("factor", [0, -1, float("nan"), float("inf"), 5000])
def test_impossible_factors_refused(factor: float) -> None:
    with pytest.raises(InputError, match="oversubscription factor"):
        plan_balloon(10 * GiB, factor, A100, CTX)


def test_footprint_larger_than_the_card_names_the_smallest_factor() -> None:
    with pytest.raises(InputError, match=r"use a factor of at least 2\.5"):
        plan_balloon(200 * GiB, 1.25, A100, CTX, host_memory_bytes=1024 * GiB)


def test_footprint_larger_than_the_card_at_factor_one_refused() -> None:
    with pytest.raises(InputError, match="needs"):
        plan_balloon(100 * GiB, 1.0, A100, CTX, host_memory_bytes=1024 * GiB)


def test_capacity_below_the_safe_minimum_refused() -> None:
    with pytest.raises(InputError, match="safe minimum"):
        plan_balloon(1 * GiB, 4.0, A100, CTX)


def test_host_memory_must_hold_the_spill() -> None:
    with pytest.raises(InputError, match="would live on the host"):
        plan_balloon(64 * GiB, 8.0, A100, CTX, host_memory_bytes=32 * GiB)
    ok = plan_balloon(64 * GiB, 8.0, A100, CTX, host_memory_bytes=128 * GiB)
    assert ok.available_bytes == 8 * GiB


def test_unknown_host_memory_is_noted() -> None:
    assert "host memory not checked" in plan_balloon(8 * GiB, 2, A100, CTX).notes[-1]


def test_a_card_smaller_than_context_plus_reserve_refused() -> None:
    with pytest.raises(InputError, match="use a larger GPU"):
        plan_balloon(8 * GiB, 2, 1 * GiB, 512 * MiB)


@pytest.mark.parametrize(
    ("field", "kwargs"), [("footprint", {"footprint_bytes": 0}), ("footprint", {"footprint_bytes": 1.5})]
)
def test_bad_byte_counts_refused(field: str, kwargs: dict) -> None:
    args = {"footprint_bytes": 8 * GiB, "oversub": 2.0, "total_bytes": A100, "context_bytes": CTX, **kwargs}
    with pytest.raises(InputError, match=field):
        plan_balloon(**args)


@settings(max_examples=150, deadline=None)
@given(
    footprint=st.integers(min_value=1 * GiB, max_value=400 * GiB),
    factor=st.floats(min_value=0.2, max_value=20.0),
    total=st.sampled_from([16 * GiB, 24 * GiB, 40 * GiB, 80 * GiB, 141 * GiB]),
    context=st.integers(min_value=0, max_value=1 * GiB),
)
def test_invariants(footprint: int, factor: float, total: int, context: int) -> None:
    try:
        b = plan_balloon(footprint, factor, total, context, host_memory_bytes=2048 * GiB)
    except InputError:
        return
    assert b.balloon_bytes >= 0 and b.balloon_bytes % ROOT_CHUNK_BYTES == 0
    assert b.available_bytes % ROOT_CHUNK_BYTES == 0 and b.available_bytes >= MIN_AVAILABLE_BYTES
    assert b.balloon_bytes + b.leave_bytes + b.context_bytes <= total
    assert total - (b.balloon_bytes + b.leave_bytes + b.context_bytes) < ROOT_CHUNK_BYTES + (
        0 if b.balloon_bytes else total
    )
    if factor > 1:
        assert b.achieved_oversub >= factor - 1e-9  # never less oversubscribed than asked
    assert b.available_bytes <= total - context - b.reserve_bytes
