"""GEMM faults in tile order (uvmlab.sim.uvm.tile_order, FaultService.access_in_order; issue 41 section 3)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.uvm_synth import run_one_gemm
from uvmlab.gpus import GPUS
from uvmlab.sim.uvm.driver import UvmSim
from uvmlab.sim.uvm.knobs import PAGE_BYTES, PAGES_PER_BLOCK, UvmKnobs
from uvmlab.sim.uvm.reread import TILE_M, TILE_N, mm_operands
from uvmlab.sim.uvm.tile_order import TILE_K, TileOrders, mm_tile_orders
from uvmlab.sim.uvm.timing import CostParams
from uvmlab.trace.recorder import Recorder
from uvmlab.trace.strides import gemm_operand_layout, matrix_layout

GPU = GPUS["A100-80GB"]


def _mm_rows(m: int, n: int, k: int, e: int = 4, offsets: tuple[int, int, int] = (0, 0, 0)) -> list:
    """aten::mm(a[m, k], b[k, n]) -> out[m, n], each tensor its own range (ids 0, 1, 2) at the given offsets."""
    return [
        (0, offsets[0], m * k * e, False),
        (1, offsets[1], k * n * e, False),
        (2, offsets[2], m * n * e, True),
    ]


# -- the trace column ------------------------------------------------------------------------------------------


def test_matrix_layout_of_views() -> None:
    w = torch.empty(64, 32, device="meta")
    assert matrix_layout(tuple(w.shape), w.stride()) == "n"
    assert matrix_layout(tuple(w.t().shape), w.t().stride()) == "t"
    assert matrix_layout(tuple(w[:, ::2].shape), w[:, ::2].stride()) == ""  # strided along both: neither
    assert matrix_layout((1, 32), (999, 1)) == "n" == matrix_layout((32, 1), (1, 999))  # a vector: both hold
    assert matrix_layout((4, 4, 4), (16, 4, 1)) == ""  # not 2-D


def test_recorder_writes_the_layout_of_2d_gemms() -> None:
    """``x @ w.t()`` (a linear layer) is ``nt``; ``w.t() @ x`` ``tn``; a plain ``x @ y`` ``nn``; others none."""
    rec = Recorder("meta")
    with rec:
        rec.set_phase("forward", 0)
        x, w = torch.empty(16, 32, device="meta"), torch.empty(8, 32, device="meta")
        torch.nn.functional.linear(x, w, torch.empty(8, device="meta"))  # addmm(bias, x, w.t())
        _ = w.t().mm(torch.empty(8, 4, device="meta").t().contiguous().t())  # (32x8) @ (8x4 transposed storage)
        _ = x @ torch.empty(32, 4, device="meta")
        _ = x.relu()
    rec.close()
    layouts = rec.k_extra.get("layout", {})
    named = {rec.k_name[k]: v for k, v in layouts.items()}
    assert [rec.k_name[k] for k in sorted(layouts)] == ["aten::addmm", "aten::mm", "aten::mm"]
    assert [layouts[k] for k in sorted(layouts)] == ["nt", "tt", "nn"]
    assert "aten::relu" not in named


def test_gemm_operand_layout_of_batches() -> None:
    """A bmm operand stored batch after batch has its matrices' layout; a broadcast or padded batch has none."""
    q = torch.empty(6, 10, 16, device="meta")
    assert gemm_operand_layout(tuple(q.shape), q.stride()) == "n"
    assert gemm_operand_layout(tuple(q.transpose(1, 2).shape), q.transpose(1, 2).stride()) == "t"
    w = torch.empty(10, 16, device="meta").expand(6, 10, 16)  # batch stride 0
    assert gemm_operand_layout(tuple(w.shape), w.stride()) == ""
    assert gemm_operand_layout(tuple(q[:, :5].shape), q[:, :5].stride()) == ""  # batch stride 160, matrix 80
    assert gemm_operand_layout((1, 10, 16), (999, 16, 1)) == "n"  # one batch: its stride does not matter
    assert gemm_operand_layout((10, 16), (16, 1)) == "n" and gemm_operand_layout((2, 2, 2, 2), (8, 4, 2, 1)) == ""


def test_recorder_writes_the_layout_of_batched_gemms() -> None:
    """``q @ k.transpose(1, 2)`` through ``bmm`` is ``nt``, ``baddbmm`` of contiguous batches ``nn``; a bmm over an
    expanded (broadcast) weight has no layout."""
    rec = Recorder("meta")
    with rec:
        rec.set_phase("forward", 0)
        q, k = torch.empty(6, 10, 16, device="meta"), torch.empty(6, 12, 16, device="meta")
        _ = torch.bmm(q, k.transpose(1, 2))
        _ = torch.baddbmm(torch.empty(6, 10, 12, device="meta"), q, k.transpose(1, 2).contiguous())
        _ = torch.bmm(q, torch.empty(16, 12, device="meta").expand(6, 16, 12))
    rec.close()
    layouts = rec.k_extra.get("layout", {})
    assert [rec.k_name[k] for k in sorted(layouts)] == ["aten::bmm", "aten::baddbmm"]
    assert [layouts[k] for k in sorted(layouts)] == ["nt", "nn"]


def test_mm_operands_of_a_batched_gemm() -> None:
    """``|a| = B m K e``, ``|b| = B K n e``, ``|out| = B m n e`` and the FLOPs give B, m, n, K; a 2-D GEMM whose
    sizes only fit a batch is refused (its sizes are not those of an mm)."""
    rows = [(0, 0, 6 * 10 * 16 * 4, False), (1, 0, 6 * 16 * 12 * 4, False), (2, 0, 6 * 10 * 12 * 4, True)]
    mm = mm_operands(rows, 2.0 * 6 * 10 * 12 * 16, 4, batched=True)
    assert mm is not None and (mm.batch, mm.m, mm.n, mm.k) == (6, 10, 12, 16)
    assert mm_operands(rows, 2.0 * 6 * 10 * 12 * 16, 4) is None
    flat = mm_operands(_mm_rows(10, 12, 16), 2.0 * 10 * 12 * 16, 4, batched=True)
    assert flat is not None and flat.batch == 1


# -- the order ---------------------------------------------------------------------------------------------------


def _brute_keys(
    m: int, n: int, k: int, layouts: str, e: int, ctas: int, offs: tuple[int, int, int], batch: int = 1
) -> list:
    """First-request rank of every page of a, b and out, element by element (the rule of the module docstring):
    ``batch`` GEMMs stored one after another, batch ``bt``'s CTAs after those of the batches before it."""
    mt, tiles, slabs = -(-n // TILE_M), -(-n // TILE_M) * -(-m // TILE_N), -(-k // TILE_K)
    n_ctas = tiles * batch

    def rank(cta: np.ndarray, slab: np.ndarray) -> np.ndarray:
        return ((cta // ctas) * (slabs + 1) + slab) * n_ctas + cta

    def smallest(off: int, flat: np.ndarray, r: np.ndarray) -> dict[int, int]:
        pages = (off + flat * e) // PAGE_BYTES
        out = np.full(pages.max() + 1, np.iinfo(np.int64).max)
        np.minimum.at(out, pages, r)
        return {int(p): int(out[p]) for p in np.unique(pages)}

    def grid(x: int, y: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return tuple(v.ravel() for v in np.meshgrid(np.arange(batch), np.arange(x), np.arange(y), indexing="ij"))

    bt, mi, ki = grid(m, k)  # a[bt, m, k]
    flat = bt * m * k + (mi * k + ki if layouts[0] == "n" else ki * m + mi)
    a = smallest(offs[0], flat, rank(bt * tiles + (mi // TILE_N) * mt, ki // TILE_K))
    bt, ki, ni = grid(k, n)  # b[bt, k, n]
    flat = bt * k * n + (ki * n + ni if layouts[1] == "n" else ni * k + ki)
    b = smallest(offs[1], flat, rank(bt * tiles + ni // TILE_M, ki // TILE_K))
    bt, mi, ni = grid(m, n)  # out, after the last slab
    cta = bt * tiles + (mi // TILE_N) * mt + ni // TILE_M
    o = smallest(offs[2], bt * m * n + mi * n + ni, rank(cta, np.full(mi.size, slabs)))
    return [a, b, o]


def _check_keys(m: int, n: int, k: int, layouts: str, e: int, ctas: int, offs: tuple, batch: int = 1) -> None:
    rows = _mm_rows(batch * m, n, k, e, offs)
    rows[1] = (1, offs[1], batch * k * n * e, False)
    rows[2] = (2, offs[2], batch * m * n * e, True)
    mm = mm_operands(rows, 2.0 * batch * m * n * k, e, batched=batch > 1)
    assert mm is not None and (mm.m, mm.n, mm.k, mm.batch) == (m, n, k, batch)
    orders = mm_tile_orders(mm, layouts, e, ctas)
    assert orders is not None
    for got, want in zip(orders, _brute_keys(m, n, k, layouts, e, ctas, offs, batch), strict=True):
        pages = (got.page_offsets // PAGE_BYTES).tolist()
        assert pages == sorted(want)
        assert got.keys.tolist() == [want[p] for p in pages]


@settings(max_examples=60, deadline=None)
@given(
    batch=st.integers(1, 9),
    m=st.integers(1, 400),
    n=st.integers(1, 400),
    k=st.integers(1, 400),
    layouts=st.sampled_from(["nn", "nt", "tn", "tt"]),
    e=st.sampled_from([2, 4]),
    ctas=st.integers(1, 6),
    offs=st.tuples(*[st.integers(0, 4095).map(lambda x: x // 4 * 4)] * 3),
)
def test_page_keys_are_the_smallest_element_rank(batch, m, n, k, layouts, e, ctas, offs) -> None:  # type: ignore[no-untyped-def]
    """The page-level shortcut (first element, the next storage row's first, or the next batch's first) equals the
    element-wise minimum, for an mm (batch 1) and a bmm whose batches may share a page."""
    _check_keys(m, n, k, layouts, e, ctas, offs, batch)


def test_batched_page_keys_take_the_next_batch_start_inside_a_page() -> None:
    """``a`` stored transposed ([batch, k, m]), 8 batches of a 4 x 64 fp32 matrix (1 KiB each) from byte 512: the
    second page starts in row 32 of batch 3 (slab 4) and holds batch 4's first element, asked for in slab 0 of the
    same wave (8 CTAs, one per batch): that is the page's first request."""
    _check_keys(4, 16, 64, "tn", 4, 8, (512, 0, 0), batch=8)


def test_unknown_layouts_give_no_order() -> None:
    mm = mm_operands(_mm_rows(256, 256, 256), 2.0 * 256**3, 4)
    assert mm is not None
    assert mm_tile_orders(mm, "", 4, 108) is None and mm_tile_orders(mm, "nx", 4, 108) is None


def test_a_row_major_first_wave_reads_one_page_per_row_before_the_next_slab_of_any_row() -> None:
    """a[m, k] stored [m, k] (layout n) with 64 KiB rows: the first wave asks for the first page of each of its
    rows before the second page of any: a batch's faults lie a row apart, not side by side."""
    m, n, k = 1024, 256, 16384  # a's rows: 64 KiB = 16 pages; 2 tiles along n, 8 along m: 16 CTAs, one wave
    rows = _mm_rows(m, n, k)
    sim = UvmSim(80 << 30, UvmKnobs(), CostParams(), GPU)
    for rid, _, size, _ in rows:
        sim.map_range(rid, size)
    mm = mm_operands(rows, 2.0 * m * n * k, 4)
    stages = TileOrders(108).stages(mm, "nn", 4, sim.page_gids)
    assert stages is not None
    reads, writes = stages
    a_pages = sim.range_gids(0)
    first_a = reads[0][np.isin(reads[0], a_pages)][:m].tolist()
    assert first_a == a_pages[:: k * 4 // PAGE_BYTES].tolist()  # page 0 of every row, rows in order
    assert writes[1] and sorted(writes[0].tolist()) == sim.range_gids(2).tolist()


# -- the driver ------------------------------------------------------------------------------------------------


def _sim(cap: int = 80 << 30, **knobs) -> UvmSim:  # type: ignore[no-untyped-def]
    return UvmSim(cap, UvmKnobs(**knobs), CostParams(), GPU)


def test_access_in_order_batches_the_next_missing_pages_and_skips_resident_ones() -> None:
    sim = _sim(prefetch_enable=False)
    npages = 64 * PAGES_PER_BLOCK
    sim.map_range(0, npages * PAGE_BYTES)
    idx = np.concatenate([np.arange(0, npages, 16), np.arange(1, npages, 16)])  # 2,048 + 2,048 pages, scattered
    sim.access([(0, 0, PAGE_BYTES, False)])  # page 0 resident before the kernel: it raises no fault
    before = sim.totals.fault_count
    c = sim.access_in_order([(sim.page_gids(0, idx), False)])
    per_batch = sim.knobs.pages_per_batch
    assert c.fault_count == idx.size - 1 == sim.totals.fault_count - before
    assert c.fault_batch_count == -(-(idx.size - 1) // per_batch)
    assert all(sim.resident([(0, int(p) * PAGE_BYTES, PAGE_BYTES, False)]) for p in idx[::97])
    assert not sim.resident([(0, 2 * PAGE_BYTES, PAGE_BYTES, False)])  # an unlisted page stays where it was


def test_access_in_order_single_touch_and_reads_before_writes() -> None:
    """A page listed in both stages faults once (as a read); the write stage's batches are counted as writes."""
    sim = _sim(prefetch_enable=False)
    sim.map_range(0, 2 * PAGES_PER_BLOCK * PAGE_BYTES)
    gids = sim.range_gids(0)
    c = sim.access_in_order([(gids[:100], False), (gids[50:150], True)])
    assert c.read_fault_count == 100 and c.write_fault_count == 50 and c.fault_count == 150


def _gemm_records(order: bool, layouts: str, m: int, n: int, k: int, batch: int = 1) -> dict[str, float]:
    """An A100 mm (``batch`` > 1: a bmm) whose operands start on the host, through the replay: its nsys HtoD
    records, bytes and faults."""
    e = 4
    rows = [(0, 0, batch * m * k * e, False), (1, 0, batch * k * n * e, False), (2, 0, batch * m * n * e, True)]
    sim = UvmSim(80 << 30, UvmKnobs(gemm_tile_order=order), CostParams(), GPU)
    for rid, _, size, _ in rows:
        sim.map_range(rid, size)
        if rid < 2:
            sim.host_write(rid, 0, size)
    name = "aten::bmm" if batch > 1 else "aten::mm"
    rp = run_one_gemm(sim, GPU, rows, 2.0 * batch * m * n * k, layouts, name)
    t = sim.totals
    assert rp.tiled_kernels == int(order and bool(layouts))
    return {"records": t.htod_records, "bytes": t.htod_bytes, "faults": t.fault_count}


@pytest.mark.parametrize("layouts", ["nn", "nt"])
def test_a_gemm_that_fits_moves_more_smaller_records_in_tile_order(layouts: str) -> None:
    """The mechanism of section 3: in address order a batch's faults are side by side and the prefetcher moves them
    in few large records; in tile order the faults lie a row apart and each migration is split into more, smaller
    records. The same bytes move (every page of a and b, once)."""
    m = n = k = 4096
    addr, tiled = _gemm_records(False, layouts, m, n, k), _gemm_records(True, layouts, m, n, k)
    assert tiled["bytes"] == addr["bytes"] == 2 * m * k * 4
    assert tiled["records"] >= 4 * addr["records"]
    assert tiled["bytes"] / tiled["records"] <= addr["bytes"] / addr["records"] / 4


def test_the_in_place_baddbmm_is_a_batched_gemm_as_the_recorder_writes_its_layout() -> None:
    """The recorder writes a layout for ``baddbmm_`` (``c.baddbmm_(a, b)``), so the replay takes it as batched too
    (``op_base`` keeps the trailing underscore); the in-place ``addmm_`` is a 2-D GEMM."""
    from uvmlab.sim.uvm.reread import BATCHED_GEMM_OPS
    from uvmlab.trace.orchestrate import op_base
    from uvmlab.trace.recorder import GEMM_LAYOUT_OPS

    batched = {op for op in GEMM_LAYOUT_OPS if "bmm" in op}
    assert {op_base(f"aten::{op}") for op in batched} <= BATCHED_GEMM_OPS
    assert not ({op_base(f"aten::{op}") for op in GEMM_LAYOUT_OPS - batched} & BATCHED_GEMM_OPS)


def test_a_batched_gemm_faults_in_tile_order_too() -> None:
    """A bmm of 16 batches of 512 x 512 x 2048 fp32 (``q @ k.transpose``, ``nt``: 8 KiB storage rows) whose
    operands start on the host: each batch's operands are read across their storage rows as an mm's are, so its
    faults come in tile order (before batched GEMMs had a layout and a shape, the address order: 512 records)."""
    addr, tiled = _gemm_records(False, "nt", 512, 512, 2048, 16), _gemm_records(True, "nt", 512, 512, 2048, 16)
    assert tiled["bytes"] == addr["bytes"] == 2 * 16 * 512 * 2048 * 4
    assert tiled["records"] >= 4 * addr["records"] and tiled["faults"] < addr["faults"]


def test_resident_or_unknown_layout_gemms_keep_address_order() -> None:
    """No layout in the trace: address order (the same records as with the rule off); a GEMM whose operands are
    all resident: no tile order, no fault; a GEMM larger than the GPU swept several times: the re-read passes."""
    assert _gemm_records(True, "", 512, 512, 512)["records"] == _gemm_records(False, "", 512, 512, 512)["records"]
    m = n = k = 1024
    rows = _mm_rows(m, n, k)
    sim = _sim()
    for rid, _, size, _ in rows:
        sim.map_range(rid, size)
    assert run_one_gemm(sim, GPU, rows, 2.0 * m * n * k, "nn").tiled_kernels == 1
    faults = sim.totals.fault_count
    assert run_one_gemm(sim, GPU, rows, 2.0 * m * n * k, "nn").tiled_kernels == 0
    assert sim.totals.fault_count == faults
    m = n = k = 4096  # 3 x 64 MiB on a 96 MiB GPU: 10 sweeps of b (test_uvm_reread)
    rows = _mm_rows(m, n, k)
    sim = _sim(cap=96 << 20)
    for rid, _, size, _ in rows:
        sim.map_range(rid, size)
    rp = run_one_gemm(sim, GPU, rows, 2.0 * m * n * k, "nn")
    assert (rp.reread_kernels, rp.tiled_kernels) == (1, 0)


def test_cli_gemm_tile_order_knob(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    from uvmlab.cli import main

    assert main(["run", "gpt2", "--sim-option", "gemm_tile_order=2", "-o", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err
    assert "gemm_tile_order must be 0 or 1" in err and err.count("\n") == 1
    assert not (tmp_path / "bad").exists()


# -- the memoized schedules (uvmlab.sim.uvm.tile_schedule) -------------------------------------------------------


def _gemm_sequence(bulk: bool, cap_blocks: int, seed: int) -> tuple[dict, np.ndarray, np.ndarray, list[int], int]:
    """A seeded sequence of mm kernels over a few host-initialised and fresh matrices on a small GPU (evictions
    between and within kernels), each faulted in tile order: the totals, the final GPU / CPU bitmaps and LRM order,
    and how many schedules were memoized."""
    from uvmlab.sim.uvm.faults import FaultService

    rng = np.random.default_rng(seed)
    shapes = [(256, 1024, 2048), (512, 512, 1024), (1024, 256, 512)]
    old = FaultService.bulk_tile_schedules
    FaultService.bulk_tile_schedules = bulk
    try:
        knobs = UvmKnobs(thrashing_enable=False)  # host writes would put every block under tracking (no bulk)
        sim = UvmSim(cap_blocks * PAGES_PER_BLOCK * PAGE_BYTES, knobs, CostParams(), GPU)
        orders = TileOrders(4)
        rid = 0
        for step in range(12):
            m, n, k = shapes[int(rng.integers(len(shapes)))]
            rows = _mm_rows(m, n, k, offsets=(0, 0, 0))
            rows = [(rid + j, o, size, w) for j, (_, o, size, w) in enumerate(rows)]
            for r in rows:
                sim.map_range(r[0], r[2])
                if not r[3] and rng.random() < 0.7:
                    sim.host_write(r[0], 0, r[2])
            layouts = "".join(rng.choice(["n", "t"], 2))
            for _ in range(2):  # the same kernel twice: the second finds some blocks resident, some evicted
                mm = mm_operands(rows, 2.0 * m * n * k, 4)
                stages = orders.stages(mm, layouts, 4, sim.page_gids)
                sim.access_in_order(stages, sim.kernel_slots(rows), orders.schedule_key(mm, layouts, 4))
                sim.check_invariants()
            if step % 3 == 2:
                for r in rows:
                    sim.unmap_range(r[0])
            rid += 3
        return sim.totals.as_dict(), sim._gpu.copy(), sim._cpu.copy(), list(sim._lrm), len(sim._tile_schedules)
    finally:
        FaultService.bulk_tile_schedules = old


@pytest.mark.parametrize(("cap_blocks", "seed"), [(64, 0), (24, 1), (12, 2)])
def test_memoized_schedules_give_the_same_counters_and_state(cap_blocks: int, seed: int) -> None:
    """The bulk replay of a memoized schedule is an optimisation: every counter (time to rounding), the residency
    bitmaps and the LRM order equal the batch-by-batch path's, on GPUs small enough to evict within kernels."""
    fast, slow = _gemm_sequence(True, cap_blocks, seed), _gemm_sequence(False, cap_blocks, seed)
    for key in fast[0]:
        assert fast[0][key] == pytest.approx(slow[0][key], rel=1e-9), key
    assert np.array_equal(fast[1], slow[1]) and np.array_equal(fast[2], slow[2])
    assert fast[3] == slow[3]
    assert fast[4] > 0 == slow[4]  # the fast run did replay schedules


BMM_WORKLOAD = """
import torch  # noqa: TID251
from workloads.base import Workload

DEFAULT_BATCH_SIZE = 8
OPTIONS = {"heads": 8, "tokens": 256, "dim": 512}


def build(cfg, device, options):
    dev = torch.device(device)
    h, t, d = options["heads"], options["tokens"], options["dim"]
    with dev:
        model = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(h, d, d) * 0.01)])

    def make_batch():
        return torch.randn(h, t, d, device=dev)

    def loss_fn(m, x):
        y = torch.bmm(x, m[0])  # batched GEMMs only: no mm, no addmm
        return torch.bmm(y, y.transpose(1, 2)).mean()

    return Workload("bmm_only", model, make_batch, loss_fn, dev)
"""


def test_a_workload_of_batched_gemms_faults_in_tile_order_through_the_cli(tmp_path: Path) -> None:
    """End to end: a user workload file whose only GEMMs are ``bmm`` runs through ``uvmlab run`` with its batched
    GEMMs in tile order (result.json ``tiled_kernels``; 0 before batched GEMMs had a layout), and the knob off
    gives none."""
    import json

    from uvmlab.cli import main

    wl = tmp_path / "bmm_only.py"
    wl.write_text(BMM_WORKLOAD)
    tiled = {}
    for knob in (1, 0):
        out = tmp_path / f"run{knob}"
        argv = ["run", str(wl), "--pca", "off", "--iterations", "2", "--sim-option", f"gemm_tile_order={knob}"]
        assert main([*argv, "-o", str(out)]) == 0
        tiled[knob] = json.loads((out / "result.json").read_text())["tiled_kernels"]
    assert tiled[0] == 0 and tiled[1] >= 2 * 2  # at least the two forward bmm of each iteration
