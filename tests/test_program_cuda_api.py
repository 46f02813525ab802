"""What a CUDA program can now say (issue 41 section 4), each through ``uvmlab run`` on its example in
docs/examples/programs: streams and events, plain device memory and cudaMemcpy, a GPU described by a file or
options, the time breakdown, in-place and ``out=`` GEMMs, gathers over a given index."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from uvmlab.cli import main
from uvmlab.files.rundir import RunDir
from uvmlab.gpus import GPUS
from uvmlab.sim.uvm.breakdown import BREAKDOWN_COLUMNS, ITERATION_BREAKDOWN_COLUMNS
from uvmlab.sim.uvm.cuda_streams import StreamClocks
from uvmlab.sim.uvm.index_order import draw_rows, parse_spec, thread_page_visits

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "docs" / "examples" / "programs"
GPU_FILE = REPO / "docs" / "examples" / "gpus" / "rtx4060ti.json"


pytestmark = pytest.mark.usefixtures("module_trace_cache")


def run(tmp_path: Path, name: str, *args: str) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    out = tmp_path / f"run-{name}-{abs(hash(args))}"
    assert main(["run", str(EXAMPLES / f"{name}.py"), "--mode", "sim", "-o", str(out), *args]) == 0
    tables = out / "tables"
    return (
        RunDir(out).read_result(),
        pd.read_parquet(tables / "kernels.parquet"),
        pd.read_parquet(tables / "iterations.parquet"),
    )


# ---- streams and events -----------------------------------------------------------------------------------------
def test_stream_clocks_order_by_events_and_barriers() -> None:
    c = StreamClocks()
    assert c.start(0) == 0.0
    c.finish(0, 10.0)  # a kernel on stream 0: 0-10
    assert c.start(1) == 0.0  # stream 1 runs beside it
    c.finish(1, 4.0)
    c.record("e", 4.0)
    assert c.wait("e", 10.0) == 10.0 and c.wait("e", 2.0) == 4.0 and c.wait("never", 3.0) == 3.0
    c.finish(0, 12.0, barrier=True)  # a synchronize: everyone at 12, the host too
    assert c.start(1) == 12.0 and c.now() == 12.0


def test_prefetch_on_a_second_stream_overlaps_compute(tmp_path: Path) -> None:
    """The next chunk's prefetch on a copy stream runs during this chunk's compute: the iteration is shorter than
    with every prefetch on the default stream, by at most the compute it hides; old code ran every row serially."""
    r_on, k_on, it_on = run(tmp_path, "streams_overlap", "-n", "3")
    r_off, _, _ = run(tmp_path, "streams_overlap", "-n", "3", "--option", "overlap=false")
    on, off = r_on["iteration_time_ns"], r_off["iteration_time_ns"]
    hidden = off - on
    assert 0 < hidden <= r_on["time_breakdown_ns"]["compute_ns"] * 1.0001
    assert hidden > 0.5 * 3 / 4 * r_on["time_breakdown_ns"]["compute_ns"]  # most of 3 of the 4 chunks' compute
    assert set(k_on["kernel_class"]) >= {"memory", "api"}
    side = k_on[(k_on["name"] == "cudaMemPrefetchAsync") & (k_on["iteration"] == 1)]
    compute = k_on[(k_on["name"] == "aten::mul_") & (k_on["iteration"] == 1)]
    first_copy = side.iloc[1]  # chunk 1's prefetch, issued before chunk 0's compute
    assert first_copy["start_ns"] < compute.iloc[0]["end_ns"]  # it overlaps
    # one transfer at a time: chunk 1's prefetch on the copy stream waits for chunk 0's on the default stream (they
    # ran side by side before, each at the link's full rate, and hid more than the compute)
    assert first_copy["start_ns"] >= side.iloc[0]["end_ns"]
    assert it_on["other_ns"].iloc[1] < 0  # the breakdown's sum exceeds the iteration: overlap


# ---- device memory and cudaMemcpy -----------------------------------------------------------------------------
def test_device_memory_is_never_managed_and_memcpy_takes_the_link(tmp_path: Path) -> None:
    r, k, _ = run(tmp_path, "device_memory", "-n", "2", "--oversub", "2")
    n = 64 << 20
    assert r["device_bytes"] == n
    assert r["footprint_bytes"] == 2 * n  # data and out only: the table is not managed
    assert r["skipped_accesses"] == 0  # the table's accesses are not "unplaced" errors
    h2d = k[k["name"] == "cudaMemcpyHtoD"].iloc[0]
    link = r["cost_params"]["link_bytes_per_s"]
    assert h2d["duration_ns"] > 0.9 * n / link * 1e9  # old code: 0 (the table was not placed)
    add = k[(k["name"] == "aten::add") & (k["iteration"] >= 0)]
    assert len(add) == 2 and add["kernel_bytes"].iloc[0] == 3 * n
    assert (k.loc[k["name"] == "cudaMemcpyDtoH", "copy_ns"] > 0).all()


def test_device_memory_takes_gpu_memory_from_uvm(tmp_path: Path) -> None:
    r, _, _ = run(tmp_path, "device_memory", "-n", "2", "--gpu-memory", "1GiB", "--option", "mb=256")
    assert r["available_bytes"] <= (1 << 30) - r["gpu_spec"]["context_bytes"] - (256 << 20)


# ---- GPUs not in the list ---------------------------------------------------------------------------------------
def test_a_gpu_file_and_gpu_set_describe_the_gpu(tmp_path: Path) -> None:
    r, _, _ = run(tmp_path, "device_memory", "-n", "2", "--gpu", str(GPU_FILE))
    spec = r["gpu_spec"]
    assert (spec["name"], spec["sm_count"], spec["hbm_bytes_per_s"], spec["memory"]) == (
        "RTX4060Ti-16GB",
        34,
        288e9,
        16 << 30,
    )
    assert (spec["link"], spec["driver"], spec["memory_kind"]) == ("PCIe 4.0 x8", "550.54.15", "GDDR")
    assert spec["l2_bytes"] == 32 << 20  # AD106's L2, not the RTX 4060's (AD107) 24 MiB the file starts from
    r2, _, _ = run(tmp_path, "device_memory", "-n", "2", "--gpu", str(GPU_FILE), "--gpu-set", "hbm_bytes_per_s=576e9")
    assert r2["gpu_spec"]["hbm_bytes_per_s"] == 576e9
    assert r2["time_breakdown_ns"]["compute_ns"] == pytest.approx(r["time_breakdown_ns"]["compute_ns"] / 2, rel=0.02)


def test_a_bad_gpu_description_is_one_sentence(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = str(EXAMPLES / "device_memory.py")
    assert main(["run", f, "--mode", "sim", "--gpu-set", "sm_count=-3", "-o", str(tmp_path / "a")]) == 2
    assert main(["run", f, "--mode", "sim", "--gpu-set", "warp_speed=9", "-o", str(tmp_path / "b")]) == 2
    deep = "sm_count=" + "[" * 5000  # a RecursionError traceback when --gpu-set had its own parser
    assert main(["run", f, "--mode", "sim", "--gpu-set", deep, "-o", str(tmp_path / "d")]) == 2
    bad = tmp_path / "gpu.json"
    bad.write_text("{not json")
    assert main(["run", f, "--mode", "sim", "--gpu", str(bad), "-o", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "sm_count" in err and "warp_speed" in err and "not valid JSON" in err


def test_the_api_takes_a_gpu_file(tmp_path: Path) -> None:
    from uvmlab import api

    g = api.get_gpu("RTX4060", spec=json.loads(GPU_FILE.read_text()))
    assert g.sm_count == 34 and api.read_gpu_file(GPU_FILE)["base"] == "RTX4060"


# ---- time breakdown ---------------------------------------------------------------------------------------------
def test_time_breakdown_adds_up(tmp_path: Path) -> None:
    """Per kernel the seven columns add up to the duration; per iteration plus other_ns to its duration; the
    result.json figures are their steady means."""
    r, k, it = run(tmp_path, "device_memory", "-n", "3", "--oversub", "2")
    assert np.allclose(k[list(BREAKDOWN_COLUMNS)].sum(axis=1), k["duration_ns"], rtol=1e-9, atol=1e-3)
    assert np.allclose(it[list(ITERATION_BREAKDOWN_COLUMNS)].sum(axis=1), it["duration_ns"], rtol=1e-9, atol=1e-3)
    assert r["time_breakdown_ns"]["compute_ns"] == pytest.approx(it["compute_ns"].iloc[1:].mean())
    assert r["time_breakdown_ns"]["copy_ns"] > 0 and r["time_breakdown_ns"]["migration_ns"] >= 0


def test_oversubscribed_training_step_has_fault_migration_and_eviction_time(tmp_path: Path) -> None:
    from tests.uvm_program import Program

    p = Program({"a": 64 << 20, "b": 64 << 20})
    p.api("host_write", "a")
    for _ in range(3):
        p.kernel(reads=("a",), writes=("b",))
    _, k = p.run(64 << 20)  # half the footprint
    steady = k.iloc[-1]
    assert steady["migration_ns"] > 0 and steady["eviction_ns"] > 0 and steady["fault_stall_ns"] > 0
    assert steady[list(BREAKDOWN_COLUMNS)].sum() == pytest.approx(steady["duration_ns"])


# ---- in-place and out= GEMMs ------------------------------------------------------------------------------------
def test_in_place_and_out_gemms_are_timed_as_gemms(tmp_path: Path) -> None:
    """``c.addmm_(a, b)`` was an elementwise op (n^2 FLOPs, a few ms less than the GEMM): now 2 n^3 FLOPs, class
    gemm, at the A100's FP32 rate x 0.80."""
    _, k, _ = run(tmp_path, "inplace_gemm", "-n", "2")
    n, b = 2048, 4
    k = k[k["iteration"] == 1].set_index("name")
    for name in ("aten::addmm_", "aten::mm"):
        assert k.loc[name, "kernel_class"] == "gemm"
        assert k.loc[name, "native_ns"] == pytest.approx(2 * n**3 / (GPUS["A100-80GB"].fp32_flops * 0.8) * 1e9)
    assert k.loc["aten::baddbmm_", "kernel_class"] == "gemm"
    assert k.loc["aten::baddbmm_", "native_ns"] > 0.9 * 2 * b * n * (n // b) * n / 19.5e12 * 1e9


# ---- gathers over a given index ---------------------------------------------------------------------------------
def test_index_specs_draw_what_they_say() -> None:
    rng_rows = draw_rows(parse_spec("zipf:1.2;rows=10000;lookups=20000"), seed=0)
    uni = draw_rows(parse_spec("uniform;rows=10000;lookups=20000"), seed=0)
    srt = draw_rows(parse_spec("sorted;rows=10000;lookups=20000"), seed=0)
    assert len(np.unique(rng_rows)) < 0.5 * len(np.unique(uni))  # a Zipf law reuses its hot rows
    assert (np.diff(srt) >= 0).all() and not (np.diff(uni) >= 0).all()
    v = thread_page_visits(np.arange(8), row_bytes=2048, n_threads=2, page_bytes=4096)
    assert v.tolist() == [[0, 0, 1, 1], [2, 2, 3, 3]]
    with pytest.raises(Exception, match="zipf needs an exponent"):
        parse_spec("zipf:0;rows=1;lookups=1")


def test_gather_index_distribution_changes_the_faults(tmp_path: Path) -> None:
    """At 2x oversubscription, a sorted index sweeps the table in order (prefetcher-friendly, fewer, bigger
    migrations) and a Zipf index refaults less than a uniform one; old code drew one uniform order for all."""
    res = {
        ix: run(tmp_path, "gather_index", "-n", "2", "--oversub", "2", "--option", f"index={ix}")[0]
        for ix in ("uniform", "sorted", "zipf:1.3")
    }
    assert res["sorted"]["iteration_time_ns"] < 0.6 * res["uniform"]["iteration_time_ns"]
    assert res["zipf:1.3"]["htod_bytes"] < res["uniform"]["htod_bytes"]


def test_gather_index_rows_from_a_tensor_and_a_file(tmp_path: Path) -> None:
    r_rows, _, _ = run(tmp_path, "gather_index", "-n", "2", "--option", "index=rows")
    rows = np.random.default_rng(0).integers(0, 1 << 18, size=1 << 16)
    npy = tmp_path / "index.npy"
    np.save(npy, rows)
    r_file, _, _ = run(tmp_path, "gather_index", "-n", "2", "--option", f"index={npy}")
    assert r_rows["outcome"] == r_file["outcome"] == "ok"
    assert (
        main(["trace", str(EXAMPLES / "gather_index.py"), "--option", f"index={npy}", "-o", str(tmp_path / "t")]) == 0
    )
    from uvmlab.trace.schema import read_trace

    tr = read_trace(tmp_path / "t")
    assert len(tr.header["kernel_indices"]) == 1
    assert set(tr.kernels["index"]) - {""} == {f"rows:1;rows={1 << 18};lookups={1 << 16}"}


def test_bad_index_is_one_sentence(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = str(EXAMPLES / "gather_index.py")
    assert main(["run", f, "--mode", "sim", "--option", "index=pareto", "-o", str(tmp_path / "a")]) == 2
    bad = tmp_path / "bad.npy"
    np.save(bad, np.array([1 << 40]))
    assert main(["run", f, "--mode", "sim", "--option", f"index={bad}", "-o", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "pareto" in err and "index rows must lie" in err


def test_a_gpu_backend_without_stream_support_refuses_in_one_sentence() -> None:
    """On a GPU whose backend cannot issue them, the new calls are refused (exit 2), not silently serialised."""
    from uvmlab.config import WorkloadConfig
    from uvmlab.errors import UnavailableError
    from workloads.program import Program

    class OldBackend:  # a backend with only the original methods
        def host_access(self, *a: object) -> None: ...
        def prefetch(self, *a: object) -> None: ...
        def advise(self, *a: object) -> None: ...
        def kernel(self, *a: object) -> None: ...
        def prefetch_new_allocations(self, *a: object) -> None: ...

    uvm = Program("meta", WorkloadConfig(str(EXAMPLES / "device_memory.py")), backend=OldBackend())
    for call in (uvm.stream, lambda: uvm.device_empty(16)):
        with pytest.raises(UnavailableError, match="not issued on this GPU path"):
            call()
