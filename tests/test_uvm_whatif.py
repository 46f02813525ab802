"""The footprint what-if (uvmlab.sim.uvm.whatif): the cold pad, the working sets, and default runs unchanged."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest

from uvmlab.config import RunConfig, WorkloadConfig
from uvmlab.sim.uvm.replay import managed_chunk_bytes, translate_accesses
from uvmlab.sim.uvm.whatif import knee, pad_cold, pad_pieces, study_target_bytes, working_sets
from uvmlab.uvm.simulate import prepare, simulate_prepared

SMALL = WorkloadConfig("alexnet", batch_size=16, options={"image_size": 64, "num_classes": 10}, iterations=2)
COUNTS = ("fault_count", "read_fault_count", "htod_count", "htod_bytes", "dtoh_count", "dtoh_bytes", "eviction_count")


@pytest.fixture(scope="module", params=[True, False], ids=["pca_on", "pca_off"])
def prep(request: pytest.FixtureRequest):
    return prepare(RunConfig(SMALL, oversub=1.0, pca=request.param, mode="sim"))


def test_pad_brings_the_footprint_to_the_target(prep) -> None:
    target = prep.footprint_bytes + study_target_bytes(300)
    padded, pad = pad_cold(prep, target, oversub=4.0)
    assert padded.footprint_bytes == target
    assert pad == target - prep.footprint_bytes
    assert padded.available_bytes == int(target / 4.0)
    n_new = len(pad_pieces(pad))
    assert len(padded.placement.ranges) == len(prep.placement.ranges) + n_new
    assert len(prep.placement.ranges) == len(padded.placement.ranges) - n_new  # the input is not modified
    new = padded.placement.ranges.iloc[-n_new:]
    assert int(managed_chunk_bytes(new["size_bytes"].to_numpy()).sum()) == pad  # chunk-rounded sizes: the pad
    cached = pad if prep.placement.allocator == "pca" else 0  # PCA on: a cached segment; off: a live tensor
    assert padded.placement.peak_reserved_bytes == prep.placement.peak_reserved_bytes + cached


def test_pad_is_never_touched(prep) -> None:
    """At the same GPU memory the padded run faults and migrates exactly as the unpadded one: nothing on the pad."""
    padded, pad = pad_cold(prep, prep.footprint_bytes + study_target_bytes(512))
    n_new = len(pad_pieces(pad))
    pad_ids = set(padded.placement.ranges["range_id"].iloc[-n_new:].astype(int))
    acc = translate_accesses(padded.trace, padded.placement, padded.trace.kernels["kernel_id"].to_numpy())
    assert not pad_ids & {r[0] for r in acc.rows}
    cfg = RunConfig(SMALL, oversub=3.0, pca=prep.placement.allocator == "pca", mode="sim")
    tight = int(prep.footprint_bytes / 3.0)  # oversubscribed: evictions happen, and none may touch the pad
    a, _ = simulate_prepared(cfg, dataclasses.replace(prep, available_bytes=tight))
    b, _ = simulate_prepared(cfg, dataclasses.replace(padded, available_bytes=tight))
    assert a.totals.eviction_count > 0
    for c in COUNTS:
        assert getattr(a.totals, c) == getattr(b.totals, c), c
    assert b.api_calls["cudaMallocManaged"] == a.api_calls["cudaMallocManaged"] + n_new
    assert b.peak_resident_bytes == a.peak_resident_bytes


def test_pad_widens_the_memory_at_a_factor(prep) -> None:
    """The pad enters the factor as the study's extra memory would: more GPU memory at the same factor."""
    cfg = RunConfig(SMALL, oversub=3.0, pca=prep.placement.allocator == "pca", mode="sim")
    plain = dataclasses.replace(prep, available_bytes=int(prep.footprint_bytes / 3.0))
    padded, _ = pad_cold(prep, 3 * prep.footprint_bytes // 65536 * 65536, oversub=3.0)
    assert padded.available_bytes > plain.available_bytes
    a, _ = simulate_prepared(cfg, plain)
    b, _ = simulate_prepared(cfg, padded)
    assert b.totals.eviction_count < a.totals.eviction_count


def test_no_pad_when_the_footprint_is_already_larger(prep) -> None:
    same, pad = pad_cold(prep, prep.footprint_bytes - 2**21)
    assert pad == 0 and same is prep


def test_working_sets_are_bounded_and_ordered(prep) -> None:
    ws = working_sets(prep)
    assert ws["iteration"] == 1
    assert 0 < ws["kernel_max"] <= ws["iteration_union"]
    for ph in ("forward", "backward", "optimizer"):
        assert 0 < ws[f"{ph}_kernel_max"] <= ws[f"{ph}_union"] <= ws["iteration_union"]
    if prep.placement.allocator == "pca":  # segments persist: a union is a set of live blocks
        assert ws["iteration_union"] <= prep.footprint_bytes
    assert knee(prep.footprint_bytes, ws["iteration_union"]) >= 1.0 or prep.placement.allocator != "pca"
    assert knee(prep.footprint_bytes, 0) == float("inf")  # nothing touched: fits at any factor


def test_default_grid_rows_are_unpadded(monkeypatch: pytest.MonkeyPatch) -> None:
    """benchmarks/uvm_grid.py without --pad-to-study: no pad columns, the footprint prepare() gives."""
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "uvm_grid.py"
    spec = importlib.util.spec_from_file_location("uvm_grid_t", path)
    assert spec is not None and spec.loader is not None
    grid = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(grid)
    monkeypatch.setattr(grid, "FACTORS", (1.0, 4.0))
    monkeypatch.setitem(grid.STUDY_FOOTPRINT_MB, "alexnet", 4096)  # the shared uvmlab.uvm.study dict: restored after
    base = prepare(RunConfig(WorkloadConfig("alexnet", iterations=2), oversub=1.0, pca=True, mode="sim"))
    rows = grid.run_pair("alexnet", True, 2)
    assert all("pad_mb" not in r for r in rows)
    assert rows[0]["footprint_mb"] == base.footprint_bytes / 2**20
    padded = grid.run_pair("alexnet", True, 2, pad_to_study=True)
    assert padded[0]["footprint_mb"] == 4096 and padded[0]["own_footprint_mb"] == base.footprint_bytes / 2**20
