"""The nsys parser on every real export, checked against independent SQL written here."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest

from uvmlab.measure.nsys import schema as S
from uvmlab.measure.nsys.read import open_export
from uvmlab.measure.nsys.stats import summarize

pytestmark = pytest.mark.real_data

GH200 = "cudamicrobench_gh200_um_gpu_faults_nsys2023.4.4.sqlite"
NO_CUDA = "cudamicrobench_gh200_uvm_flags_no_cuda_events_nsys2023.4.4.sqlite"
EZ = "easycuda_rtx4060_um_migrations_nsys2023.4.4.sqlite"
A100 = "csc746_a100_um_migrations_nsys2022.2.1.sqlite"
LEGACY = "mordred_rtx6000_legacy_schema_nsys2021.2.1.sqlite"
GEMM = "gemmspmm_a100_cuda_memory_usage_nsys2024.2.3.sqlite"
T26 = "testcuda_nsys2026.1.1_schema3.24.14.sqlite"
UT = "uvmtorch_pytorch_uvm_flags_nsys2025.3.2.sqlite"
ALL = [GH200, NO_CUDA, EZ, A100, LEGACY, GEMM, T26, UT]

VERSIONS = {
    GH200: ("2023.4.4.54", "3.7.2", "META_DATA_EXPORT"),
    NO_CUDA: ("2023.4.4.54", "3.7.2", "META_DATA_EXPORT"),
    EZ: ("2023.4.4.54", "3.7.2", "META_DATA_EXPORT"),
    A100: ("2022.2.1.31", "2.9.1", "EXPORT_META_DATA"),
    LEGACY: ("2021.2.1", None, "StringIds path"),
    GEMM: ("2024.2.3.38", "3.11.1", "META_DATA_EXPORT"),
    T26: ("2026.1.1.204", "3.24.14", "META_DATA_EXPORT"),
    UT: ("2025.3.2.367", "3.20.3", "META_DATA_EXPORT"),
}


def nsys_file(real_data: Path, name: str) -> Path:
    p = real_data / "nsys" / name
    if not p.is_file():
        pytest.skip(f"{p} missing")
    return p


def sql(path: Path, query: str):
    con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    try:
        return con.execute(query).fetchall()
    finally:
        con.close()


def tables(path: Path) -> set[str]:
    return {r[0] for r in sql(path, "SELECT name FROM sqlite_master WHERE type='table'")}


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("name", ALL)
def test_every_export_parses_and_matches_independent_sql(real_data: Path, name: str) -> None:
    path = nsys_file(real_data, name)
    before = digest(path)
    with open_export(path) as ex:
        s = summarize(ex)
        # version detection
        assert (ex.version.nsys_version, ex.version.schema_version, ex.version.source) == VERSIONS[name]
        # row counts per table
        have = tables(path)
        for t, n in s.export["tables"].items():
            if t in have:
                assert n == sql(path, f'SELECT count(*) FROM "{t}"')[0][0]
            else:
                assert n is None
        kernels = ex.kernels()
    after = digest(path)
    assert before == after, "the export was modified"
    # GPU fault sum = sum(numberOfPageFaults), not rows
    if S.GPU_FAULTS in have:
        want = sql(path, f"SELECT sum(numberOfPageFaults), count(*) FROM {S.GPU_FAULTS}")[0]
        assert (s.faults["gpu_fault_count"], s.faults["gpu_fault_records"]) == tuple(want)
        reads = sql(path, f"SELECT sum(numberOfPageFaults) FROM {S.GPU_FAULTS} WHERE faultAccessType = 1")[0][0] or 0
        assert s.faults["read_fault_count"] == reads
    # migration bytes by direction
    if S.MEMCPY in have:
        for kind, d in ((11, "htod"), (12, "dtoh")):
            n, b = sql(path, f"SELECT count(*), coalesce(sum(bytes), 0) FROM {S.MEMCPY} WHERE copyKind = {kind}")[0]
            assert s.migrations["by_direction"][d] == {"count": n, "bytes": b}
    # kernels: count and per-kernel sums add up with the outside bucket
    if S.KERNEL in have:
        assert len(kernels) == sql(path, f"SELECT count(*) FROM {S.KERNEL}")[0][0]
        if s.migrations["count"] is not None:
            inside = int(s.kernels["htod_bytes"].sum())
            outside = sum(b["htod_bytes"] for b in s.attribution["outside_kernels"].values())
            assert inside + outside == s.migrations["by_direction"]["htod"]["bytes"]


def test_gh200_attribution_reproduces_reference_breakdown(real_data: Path) -> None:
    """reference/nsys.md §4 trap 3: 3842 faults inside cudaMemcpy, 253 inside cudaMalloc, 100 overlap kernels."""
    with open_export(nsys_file(real_data, GH200)) as ex:
        s = summarize(ex)
    a = s.attribution
    assert a["inside_kernels"]["fault_records"] == 100
    assert a["outside_kernels"]["cudaMemcpy"]["fault_records"] == 3842
    assert a["outside_kernels"]["cudaMalloc"]["fault_records"] == 253
    assert set(a["outside_kernels"]) == {"cudaMemcpy", "cudaMalloc"}
    assert s.faults["gpu_fault_distinct_pages"] == 4096
    assert s.kernels["reserved_bytes"].isna().all()  # memory usage not collected: null, not 0
    # NVIDIA's um_total_sum would refuse (no CPU fault table) but the figures exist
    assert s.um_total_sum["nvidia_report_runs"] is False
    assert s.um_total_sum["total_gpu_page_faults"] == 4195
    assert s.um_total_sum["total_cpu_page_faults"] == 0  # flag on + GPU work: collected, none occurred
    assert s.collection["cpu_faults"]["status"] == "zero"


def test_a100_migration_totals_by_cause(real_data: Path) -> None:
    path = nsys_file(real_data, A100)
    with open_export(path) as ex:
        s = summarize(ex)
    want = {}
    for cause, n, b in sql(
        path, f"SELECT migrationCause, count(*), sum(bytes) FROM {S.MEMCPY} WHERE copyKind IN (11, 12, 13) GROUP BY 1"
    ):
        want[S.MIGRATION_CAUSE[cause]] = {"count": n, "bytes": b}
    got = {k: v for k, v in s.migrations["by_cause"].items() if v["count"]}
    assert got == want
    assert got["fault"]["count"] == 9216 and got["prefetch"]["count"] == 9216
    assert s.migrations["bytes"] == 3 << 30  # 2 GiB HtoD + 1 GiB DtoH
    # legacy 2.9.1: no capture metadata, so faults are unknown, not zero
    assert s.faults["gpu_fault_count"] is None and s.collection["gpu_faults"]["status"] == "unknown"


def test_no_cuda_tables_gives_unknown_not_zero(real_data: Path) -> None:
    with open_export(nsys_file(real_data, NO_CUDA)) as ex:
        s = summarize(ex)
    assert s.collection["gpu_faults"]["status"] == "unknown"
    assert s.collection["migrations"]["status"] == "unknown"
    assert s.faults["gpu_fault_count"] is None
    assert s.faults["cpu_fault_count"] is None
    assert s.migrations["count"] is None and s.migrations["bytes"] is None
    assert s.um_total_sum["total_htod_migration_bytes"] is None


def test_legacy_2021_schema_unknown_and_version_from_strings(real_data: Path) -> None:
    with open_export(nsys_file(real_data, LEGACY)) as ex:
        s = summarize(ex)
        assert "virtualAddress" not in ex.columns(S.MEMCPY)
        assert not ex.flags.present
    assert s.faults["gpu_fault_count"] is None
    assert s.memory["peak_live_bytes"] is None
    assert s.migrations["count"] == 0  # the copy table exists: no UM rows among its 48 copies
    assert len(s.kernels) == 12


def test_flags_off_is_not_collected(real_data: Path) -> None:
    with open_export(nsys_file(real_data, EZ)) as ex:
        s = summarize(ex)
    assert s.collection["gpu_faults"]["status"] == "not_collected"
    assert s.faults["gpu_fault_count"] is None
    assert s.migrations["count"] == 72  # migrations need no fault flag


def test_gemm_memory_usage_peak_device_bytes(real_data: Path) -> None:
    path = nsys_file(real_data, GEMM)
    with open_export(path) as ex:
        s = summarize(ex)
        mem = ex.memory_usage()
        nvtx = ex.nvtx_ranges()
    # independent: running sum of device allocations (memKind 2) minus frees
    rows = sql(path, f"SELECT bytes, memoryOperationType FROM {S.MEMORY_USAGE} WHERE memKind = 2 ORDER BY start")
    live = peak = 0
    for b, op in rows:
        live += b if op == 0 else -b
        peak = max(peak, live)
    assert s.memory["peak_live_bytes_by_kind"]["device"] == peak == 37_752_520_704
    assert s.memory["allocs"] + s.memory["frees"] == len(mem) == 25
    # kernels run while every device allocation is live: memory at kernel start = the peak (device + static)
    static = sum(
        b for (b,) in sql(path, f"SELECT bytes FROM {S.MEMORY_USAGE} WHERE memKind = 5 AND memoryOperationType = 0")
    )
    assert (s.kernels["reserved_bytes"] == peak + static).all()
    assert s.top_kernels["max_reserved_bytes"].iloc[0] == peak + static
    # the cuBLAS range has its text in textId only
    assert "cublasCreate_v2" in set(nvtx["text"])


UM_SUM_SQL = """
SELECT a, sum(cpu), sum(gpu), sum(d2h), sum(h2d),
       (sum(d2h) + sum(h2d)) * (1000000000 / (sum(dd) + sum(hd))) AS thr
FROM (
  SELECT address AS a, 0 AS cpu, sum(numberOfPageFaults) AS gpu, 0 AS d2h, 0 AS h2d, 0 AS dd, 0 AS hd
    FROM CUDA_UM_GPU_PAGE_FAULT_EVENTS GROUP BY address
  UNION ALL SELECT virtualAddress, 0, 0, sum(bytes), 0, sum("end" - start), 0
    FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE copyKind = 12 GROUP BY virtualAddress
  UNION ALL SELECT virtualAddress, 0, 0, 0, sum(bytes), 0, sum("end" - start)
    FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE copyKind = 11 GROUP BY virtualAddress
) GROUP BY a ORDER BY thr DESC, a LIMIT 10
"""


@pytest.mark.parametrize("name", [GH200, A100, EZ])
def test_um_sum_matches_nvidia_style_sql(real_data: Path, tmp_path: Path, name: str) -> None:
    """um_sum's rows equal a plain-SQL version of NVIDIA's query (integer throughput, LIMIT 10)."""
    path = nsys_file(real_data, name)
    q = UM_SUM_SQL
    if S.GPU_FAULTS not in tables(path):
        q = q.replace(
            "FROM CUDA_UM_GPU_PAGE_FAULT_EVENTS GROUP BY address",
            "FROM (SELECT 0 AS address, 0 AS numberOfPageFaults WHERE 0) GROUP BY address",
        )
    want = [tuple(r) for r in sql(path, q)]
    with open_export(path) as ex:
        got = [tuple(r.values()) for r in summarize(ex).um_sum]
    assert got == want


def test_json_export_gpu_faults(real_data: Path, tmp_path: Path) -> None:
    import json

    path = nsys_file(real_data, "cudamicrobench_gh200_um_gpu_faults_nsys_export.json")
    want_n = want_rows = 0
    with open(path) as fh:
        for line in fh:
            ev = json.loads(line).get("CudaUvmGpuPageFaultEvent")
            if ev:
                want_rows += 1
                want_n += int(ev["numberOfPageFaults"])
    before = digest(path)
    with open_export(path) as ex:
        s = summarize(ex)
        assert ex.version.source.startswith("JSON export")
    assert digest(path) == before
    assert (s.faults["gpu_fault_records"], s.faults["gpu_fault_count"]) == (want_rows, want_n) == (253, 253)
    assert s.migrations["count"] is None and s.faults["cpu_fault_count"] is None  # unknown, not 0
    # a JSON export cut mid-line: one sentence, exit 2
    from uvmlab.cli import main

    bad = tmp_path / "cut.json"
    bad.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    assert main(["nsys", "summarize", str(bad)]) == 2
