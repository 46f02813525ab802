"""Issue 42 section 4: `uvmlab validate` gives its verdict per family, weakest first, so that 4,799 MLP memory rows
within 1.5x cannot hide 23/34 UVM timing points (the old headline: "5,086/5,102 within 1.5x")."""

from __future__ import annotations

from uvmlab.validate.points import FAMILIES, Point, family_of
from uvmlab.validate.scorecard import Scorecard, family_lines, overall_line

MLP = "memory/gpumemnet_mlp_a100"
BENCH = "uvm/gpu_ext_rtx5090_microbench"


def _card() -> Scorecard:
    """The issue's shape: 4,799 memory rows all within 1.5x, 34 UVM timing points of which 23 within."""
    card = Scorecard(data_dir="x", fast=False)
    card.points += [("mlp", Point(MLP, f"row {i}", "device_peak_bytes", "bytes", 1e9, 1.01e9)) for i in range(4799)]
    card.points += [
        ("bench", Point(BENCH, f"case {i}", "kernel_time", "ms", 1.0, 1.2 if i < 23 else 3.0)) for i in range(34)
    ]
    card.points += [("abc", Point("uvm/uvm-eval_titanv_460.27.04", "a", "GPU faults", "count", 10, 10))]
    card.points += [("snap", Point("snapshots", "s", "peak reserved", "bytes", 5, 5))]
    card.points += [("nsys", Point("nsys", "n", "HtoD migrations (parser vs raw SQL)", "count", 3, 3))]
    return card


def test_the_weakest_family_comes_first() -> None:
    s = _card().summary()
    assert next(iter(s["by_family"])) == "UVM timing"
    family, verdict = family_lines(s)[0]
    assert family == "UVM timing" and verdict.startswith("23/34 within 1.5x (68 %)")
    assert s["validation_within_1.5x"] == 4799 + 23 + 3  # the old headline: 4,825/4,836 looks fine
    assert f"4799 of the {s['validation_points']} validation points are {MLP}'s" in overall_line(s)


def test_every_family_is_listed_even_without_points() -> None:
    card = Scorecard(data_dir="x", fast=True)
    card.points.append(("abc", Point("uvm/uvm-eval_titanv_460.27.04", "a", "GPU faults", "count", 10, 10)))
    s = card.summary()
    assert set(s["by_family"]) == set(FAMILIES)
    lines = dict(family_lines(s))
    assert lines["memory"].startswith("no points") and lines["UVM structure"].startswith("1/1 within 1.5x")


def test_family_of_the_real_checks_quantities() -> None:
    cases = {
        ("nsys", "DtoH median bandwidth, 4 KiB transfers", "B/s"): "nsys",
        ("nsys", "GPU page faults (parser vs raw SQL)", "count"): "nsys",
        ("snapshots", "peak reserved", "bytes"): "allocator",
        (MLP, "device_peak_bytes", "bytes"): "memory",
        ("memory/xmem_rtx3060_sample", "after_context_bytes", "bytes"): "memory",
        ("uvm/noob512-uvm_rtx5090_pytorch_gcn", "peak_allocated", "bytes"): "memory",
        ("uvm/noob512-uvm_rtx5090_pytorch_gcn", "uvm_epoch_time", "s"): "UVM timing",
        ("uvm/noob512-uvm_rtx5090_pytorch_gcn", "user_prefetch_speedup", "x"): "UVM timing",
        (BENCH, "kernel_time", "ms"): "UVM timing",
        ("uvm/uvm-eval_titanv_460.27.04", "fault batches (same-kind batches merged)", "count"): "UVM structure",
        ("uvm/uvm-eval_titanv_460.27.04", "VA blocks faulted by reads", "count"): "UVM structure",
    }
    for (ds, q, unit), want in cases.items():
        assert family_of(Point(ds, "c", q, unit, 1.0, 1.0)) == want, (ds, q)


def test_the_points_table_names_each_point_family() -> None:
    df = _card().frame()
    assert set(df["family"]) == set(FAMILIES)
