"""Re-reads within one GEMM-like kernel (uvmlab.sim.uvm.reread) and nsys-style migration records."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.uvm_synth import run_one_gemm
from uvmlab.gpus import GPUS
from uvmlab.sim.uvm.driver import UvmSim
from uvmlab.sim.uvm.knobs import UvmKnobs
from uvmlab.sim.uvm.reread import TILE_M, TILE_N, gemm_passes, sm_count, sweep_passes
from uvmlab.sim.uvm.timing import CostParams
from uvmlab.units import MiB

GPU = GPUS["A100-80GB"]


def _mm_rows(m: int, n: int, k: int, e: int = 4) -> list[tuple[int, int, int, bool]]:
    """aten::mm(a[m, k], b[k, n]) -> out[m, n], each tensor its own range (ids 0, 1, 2)."""
    return [(0, 0, m * k * e, False), (1, 0, k * n * e, False), (2, 0, m * n * e, True)]


def test_sweep_passes_rule() -> None:
    # one wave holds every tile: the operand is read once
    assert sweep_passes(4, 8, 108) == 1
    # more tiles than CTAs in flight: one sweep per wave, at most one per tile column
    assert sweep_passes(32, 8, 108) == 3  # ceil(256 / 108)
    assert sweep_passes(729, 2, 108) == 2  # a column has more tiles than W: once per column
    assert sweep_passes(0, 5, 108) == 1


def test_sm_count_keeps_the_base_gpu() -> None:
    assert sm_count("A100-80GB") == 108
    assert sm_count("A100-80GB (40.0 GiB)") == 108
    assert sm_count("RTX5090") == 170


def test_mm_sweeps_the_second_operand() -> None:
    """PyTorch mm is cuBLAS out^T = b^T a^T: b spans cuBLAS's M and is swept once per tile column of a's rows."""
    m, n, k = 4096, 4096, 1024
    rows = _mm_rows(m, n, k)
    passes = gemm_passes("aten::mm", rows, 2.0 * m * n * k, "fp32", "A100-80GB")
    p = sweep_passes(-(-n // TILE_M), -(-m // TILE_N), 108)
    assert passes is not None and len(passes) == p == 10  # 32 x 32 tiles, 108 CTAs: min(32, ceil(1024/108))
    assert all(ps[0] == rows[1] for ps in passes)  # b whole in every pass
    for rid in (0, 2):  # a and out cut into p contiguous slices covering them exactly
        parts = [r for ps in passes for r in ps if r[0] == rid]
        assert sum(r[2] for r in parts) == rows[rid][2]
        assert [r[1] for r in parts] == sorted(r[1] for r in parts)


def test_inconsistent_sizes_are_left_alone() -> None:
    rows = _mm_rows(1000, 1000, 1000)
    assert gemm_passes("aten::mm", rows, 1.2345e9, "fp32", "A100-80GB") is None  # FLOPs do not match the sizes
    assert gemm_passes("aten::relu_", rows, 2e9, "fp32", "A100-80GB") is None  # not a GEMM
    assert gemm_passes("aten::bmm", rows, 2e9, "fp32", "A100-80GB") is None  # batched: left as one pass


def test_convolution_forward_and_backward_shapes() -> None:
    """Implicit GEMM: forward sweeps the input once per 128 output channels, dgrad sweeps grad_out per 128 inputs."""
    n, c, h, kout, r = 64, 256, 28, 384, 3  # stride 1, padding 1: P = Q = H
    e = 4
    x, w, out = n * c * h * h * e, kout * c * r * r * e, n * kout * h * h * e
    fwd_flops = 2.0 * n * kout * h * h * c * r * r
    rows = [(0, 0, x, False), (1, 0, w, False), (2, 0, out, True)]
    fp = gemm_passes("aten::convolution", rows, fwd_flops, "fp32", "A100-80GB")
    assert fp is not None and len(fp) == 3 and all(p[0] == rows[0] for p in fp)  # ceil(384 / 128)
    brow = [(2, 0, out, False), (0, 0, x, False), (1, 0, w, False), (3, 0, x, True), (4, 0, w, True)]
    bp = gemm_passes("aten::convolution_backward", brow, 2 * fwd_flops, "fp32", "A100-80GB")
    assert bp is not None and len(bp) == 2 + 1  # dgrad: ceil(256 / 128) sweeps of grad_out, then wgrad
    assert all(p[0] == brow[0] for p in bp[:2])
    assert sum(r[2] for p in bp[:2] for r in p if r[0] == 3) == x  # grad_input written once
    # first layer: no grad_input, nothing to sweep
    assert gemm_passes("aten::convolution_backward", brow[:3] + brow[4:], fwd_flops, "fp32", "A100-80GB") is None


@settings(max_examples=60, deadline=None)
@given(
    m=st.integers(1, 5000),
    n=st.integers(1, 5000),
    k=st.integers(1, 3000),
    bias=st.booleans(),
)
def test_passes_conserve_bytes(m: int, n: int, k: int, bias: bool) -> None:
    """Property: the swept operand is whole in each pass; every other access is cut into slices covering it once."""
    rows = _mm_rows(m, n, k)
    if bias:
        rows = [(9, 0, n * 4, False), *rows]
    passes = gemm_passes("aten::addmm" if bias else "aten::mm", rows, 2.0 * m * n * k, "fp32", "A100-80GB")
    if passes is None:
        assert sweep_passes(-(-n // TILE_M), -(-m // TILE_N), 108) == 1
        return
    swept = rows[-2]
    assert all(p[0] == swept for p in passes)
    for r in rows:
        if r is swept:
            continue
        got = sum(x[2] for p in passes for x in p[1:] if x[0] == r[0])
        assert got == r[2]


def _gemm_run(cap: int, rereads: bool) -> tuple[int, int]:
    """A 64 MiB x 64 MiB -> 64 MiB fp32 mm on a GPU of ``cap`` bytes: (HtoD bytes, faults) of the kernel."""
    m = n = 4096
    k = 4096
    rows = _mm_rows(m, n, k)
    sim = UvmSim(cap, UvmKnobs(gemm_rereads=rereads), CostParams(), GPU)
    for rid, _, size, _ in rows:
        sim.map_range(rid, size)
        if rid < 2:
            sim.host_write(rid, 0, size)  # operands start on the host
    rp = run_one_gemm(sim, GPU, rows, 2.0 * m * n * k)
    return int(rp.sim.totals.htod_bytes), int(rp.sim.totals.fault_count)


def test_a_gemm_larger_than_memory_refaults_its_swept_operand() -> None:
    """b (64 MiB) plus the slices between two sweeps do not fit in 48 MiB: every sweep migrates b again."""
    p = sweep_passes(32, 32, 108)  # 10
    h_on, f_on = _gemm_run(48 * MiB, True)
    h_off, f_off = _gemm_run(48 * MiB, False)
    assert h_off == 128 * MiB  # a and b once
    assert h_on >= 64 * MiB + p * 64 * MiB * 0.9  # a once, b about p times
    assert f_on > 3 * f_off  # fewer than p times: the prefetcher brings whole regions per fault


def test_a_gemm_that_fits_is_unchanged() -> None:
    assert _gemm_run(256 * MiB, True) == _gemm_run(256 * MiB, False)


# ---- nsys-style records: the counting rule against the driver's record structure -------------------------------


@pytest.mark.real_data
def test_htod_records_match_the_exports(real_data: Path) -> None:
    """A sequential one-fault-per-batch sweep of the export's blocks gives exactly its HtoD record count and bytes.

    Records are contiguous runs of one cause per block copy (uvm_va_block.c block_copy_resident_pages_between
    notifies one migration event per run of adjacent pages with the same cause; 595.45.04), not 64 KiB pieces.
    csc746 (A100) is the export the rule was read from; easycuda (RTX 4060, nsys 2023.4) validates it.
    """
    from uvmlab.validate.record_checks import SWEEP_EXPORTS, check_nsys_records, export_htod

    if not all((real_data / "nsys" / n).exists() for n in SWEEP_EXPORTS):
        pytest.skip("the csc746 / easycuda nsys exports are not in real-data/nsys")
    points = check_nsys_records(real_data)
    assert len(points) == 4
    for p in points:
        assert p.predicted == p.measured, p
    assert [p.fitted for p in points] == [True, True, False, False]
    assert all(p.band == 1.0 for p in points if not p.fitted)
    n, nbytes = export_htod(real_data / "nsys" / "csc746_a100_um_migrations_nsys2022.2.1.sqlite")
    assert (n, nbytes) == (12288, 2 * 1024**3)  # 1024 blocks x 12 records (independent of the simulator)


# ---- end to end through the CLI ----------------------------------------------------------------------------------


def test_cli_gemm_rereads_knob_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:  # type: ignore[no-untyped-def]
    """A 4096 x 2048 MLP at x10: its 80 MiB matmuls exceed the 30-odd MiB left, so the sweeps migrate more (1.18x the
    HtoD bytes since the trace has its bias gradients' 64 MiB reduction staging buffers, which enlarge the footprint
    and so the x10 capacity; above 1.2x before)."""
    from uvmlab.cli import main
    from uvmlab.files.rundir import RunDir

    monkeypatch.setenv("UVMLAB_CACHE", str(tmp_path / "cache"))
    tiny = str(Path(__file__).resolve().parents[1] / "docs" / "examples" / "tiny_mlp.py")
    args = [tiny, "--option", "hidden=2048", "--batch-size", "4096", "--iterations", "2", "--mode", "sim"]
    args += ["--oversub", "10", "--pca", "on", "--sim-option", "concurrent_ops=0"]  # the sweeps alone (not foreach)
    args += ["--sim-option", "gemm_tile_order=0"]  # nor the tile order of the GEMMs that fit (test_uvm_tile_order)
    assert main(["run", *args, "-o", str(tmp_path / "on")]) == 0
    assert main(["run", *args, "--sim-option", "gemm_rereads=0", "-o", str(tmp_path / "off")]) == 0
    on, off = RunDir(tmp_path / "on").read_result(), RunDir(tmp_path / "off").read_result()
    assert on["htod_bytes"] > 1.15 * off["htod_bytes"]
    assert on["iteration_time_ns"] > off["iteration_time_ns"]
    capsys.readouterr()
    assert main(["run", *args, "--sim-option", "gemm_rereads=2", "-o", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err
    assert "gemm_rereads must be 0 or 1" in err and err.count("\n") == 1
