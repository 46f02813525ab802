"""`uvmlab calibrate`: fits recover known parameters from synthetic exports; real exports fit what they support."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from uvmlab.cli import main
from uvmlab.files.rundir import RunDir
from uvmlab.measure.calibrate import calibrate, costs_against
from uvmlab.measure.nsys.synthetic import GLOBAL_PID, write_synthetic_export
from uvmlab.sim.uvm.timing import STREAM_EFFICIENCY, CostParams, transfer_bandwidth
from uvmlab.stats.schema import KERNEL_COLUMNS, RESULT_KEYS

LINK = 18e9  # bytes/s at 2 MiB


def _set_transfer_times(path: Path, link: float) -> None:
    con = sqlite3.connect(path)
    rows = con.execute("SELECT rowid, start, bytes FROM CUPTI_ACTIVITY_KIND_MEMCPY").fetchall()
    upd = []
    for rowid, start, b in rows:
        t = b / float(transfer_bandwidth(np.array([b], dtype=float), link)[0])
        upd.append((start + round(t * 1e9), rowid))
    con.executemany('UPDATE CUPTI_ACTIVITY_KIND_MEMCPY SET "end" = ? WHERE rowid = ?', upd)
    con.commit()
    con.close()


def test_link_bandwidth_and_batch_cost_recovered(tmp_path: Path) -> None:
    db = tmp_path / "x.sqlite"
    write_synthetic_export(db, faults=0, migrations=400, seed=5)
    _set_transfer_times(db, LINK)
    con = sqlite3.connect(db)
    # 40 serial fault batches far after every migration: 200 µs each, 2 faults on one page each
    t0, dur = 10**12, 200_000
    con.executemany(
        "INSERT INTO CUDA_UM_GPU_PAGE_FAULT_EVENTS VALUES (?, ?, ?, 0, ?, 2, 1)",
        [(t0 + i * 10**6, t0 + i * 10**6 + dur, GLOBAL_PID, (i + 1) << 22) for i in range(40)],
    )
    con.commit()
    con.close()
    doc = calibrate(db, tmp_path / "p.json")
    d = costs_against(None, None, None)[0]  # fitted against the default GPU's profile, which a run keeps
    assert doc["fitted"] == ["batch_turnaround_ns", "link_bytes_per_s"]
    assert doc["params"]["link_bytes_per_s"] == pytest.approx(LINK, rel=0.01)
    want = dur - 2 * d.fault_entry_ns * d.raw_entries_per_fault - d.block_service_ns
    assert doc["params"]["batch_turnaround_ns"] == pytest.approx(want, abs=1)
    assert "compute_efficiency" in doc["kept"]
    p = CostParams.from_file(tmp_path / "p.json")
    assert p.link_bytes_per_s == pytest.approx(LINK, rel=0.01)


def test_kernel_time_scale_from_sim_run(tmp_path: Path) -> None:
    db = tmp_path / "k.sqlite"
    write_synthetic_export(db, faults=0, migrations=0, iterations=2, kernels_per_iteration=10)
    con = sqlite3.connect(db)
    k = con.execute(
        'SELECT s.value, k."end" - k.start FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName '
        "ORDER BY k.start"
    ).fetchall()
    con.close()
    rd = RunDir(tmp_path / "sim")
    rd.prepare()
    n = len(k)
    kt = pd.DataFrame({c: np.zeros(n, dtype=np.int64) for c in KERNEL_COLUMNS if c not in ("name", "phase")})
    kt["name"], kt["phase"] = [r[0] for r in k], ""
    kt["duration_ns"] = [r[1] * 10 for r in k]  # includes (simulated) stalls: must not be used
    kt["native_ns"] = [r[1] / 2 for r in k]  # the simulator is 2x too fast
    rd.write_table("kernels", kt)
    rd.write_json(rd.result_json, {**dict.fromkeys(RESULT_KEYS), "mode": "sim"})
    doc = calibrate(db, tmp_path / "p.json", sim_run=rd.path)
    d = CostParams()
    assert doc["details"]["kernel_time_scale"]["matched_kernels"] == n
    assert doc["params"]["compute_efficiency"] == pytest.approx(d.compute_efficiency / 2)
    assert doc["params"]["gemm_efficiency"] == pytest.approx(d.gemm_efficiency / 2)
    assert doc["params"]["memory_efficiency"] == pytest.approx(STREAM_EFFICIENCY["HBM"] / 2)  # None: resolved


@pytest.mark.real_data
@pytest.mark.parametrize(
    ("name", "fitted"),
    [
        ("cudamicrobench_gh200_um_gpu_faults_nsys2023.4.4.sqlite", ["batch_turnaround_ns", "link_bytes_per_s"]),
        (
            "csc746_a100_um_migrations_nsys2022.2.1.sqlite",
            ["cpu_chunk_map_ns", "cpu_fault_ns", "cpu_unmap_chunk_ns", "link_bytes_per_s"],
        ),
        ("easycuda_rtx4060_um_migrations_nsys2023.4.4.sqlite", ["cpu_fault_ns", "link_bytes_per_s"]),
        ("mordred_rtx6000_legacy_schema_nsys2021.2.1.sqlite", []),
    ],
)
def test_calibrate_real_exports(
    real_data: Path, tmp_path: Path, name: str, fitted: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    src = real_data / "nsys" / name
    if not src.is_file():
        pytest.skip("missing")
    out = tmp_path / "params.json"
    assert main(["calibrate", str(src), "-o", str(out), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["fitted"] == fitted
    p = CostParams.from_file(out)
    if "link_bytes_per_s" in fitted:
        # A100 PCIe 4 / GH200 C2C: fitted bandwidths between 5 and 100 GB/s
        assert 5e9 < p.link_bytes_per_s < 100e9
    else:
        assert p.link_bytes_per_s is None


def _cpu_fault_export(path: Path, fixed_us: float, per_kib_us: float, blocks: int = 4) -> None:
    """A synthetic export whose CPU faults read 2 MiB blocks back as the CPU-side prefetcher does (64K, 64K, 128K,
    256K, 512K, 1M per block: a 4 KiB "fault" record, then the prefetched rest), each fault ``fixed_us`` plus
    ``per_kib_us`` per KiB the previous one brought after the previous one's last copy."""
    write_synthetic_export(path, faults=0, migrations=0)
    rows, t, va = [], 10**9, 1 << 40
    for blk in range(blocks):
        offset = 0
        for kib in (64, 64, 128, 256, 512, 1024):
            addr = va + blk * (2 << 20) + offset * 1024
            rows.append((t, t + 2_000, 4096, 2, addr))
            rows.append((t + 2_000, t + 2_000 + kib * 40, (kib - 4) * 1024, 3, addr + 4096))
            t += 2_000 + kib * 40 + round((fixed_us + per_kib_us * kib) * 1e3)
            offset += kib
    con = sqlite3.connect(path)
    con.executemany(
        "INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY (start, end, deviceId, contextId, streamId, correlationId, globalPid,"
        f" bytes, copyKind, srcKind, dstKind, migrationCause, virtualAddress) VALUES (?, ?, 0, 1, 0, 0, {GLOBAL_PID},"
        " ?, 12, 7, 7, ?, ?)",
        [(s, e, b, cause, a) for s, e, b, cause, a in rows],
    )
    con.commit()
    con.close()


def test_cpu_fault_cost_recovered_from_the_gaps_between_cpu_faults(tmp_path: Path) -> None:
    """The fixed cost of a CPU fault and the program's work per KiB between faults come back from a synthetic
    export (gaps that cross a 2 MiB block are left out: the fit uses faults of one block)."""
    from uvmlab.measure.calibrate import fit_cpu_fault_ns
    from uvmlab.measure.nsys.read import open_export

    _cpu_fault_export(tmp_path / "c.sqlite", fixed_us=37.0, per_kib_us=1.5)
    with open_export(tmp_path / "c.sqlite") as ex:
        ns, info = fit_cpu_fault_ns(ex)
    assert ns == pytest.approx(37_000, abs=5) and info["program_us_per_kib"] == pytest.approx(1.5, abs=1e-3)
    assert info["cpu_faults"] == 24 and info["gaps"] == 20
    doc = calibrate(tmp_path / "c.sqlite", tmp_path / "p.json")
    assert "cpu_fault_ns" in doc["fitted"] and CostParams.from_file(tmp_path / "p.json").cpu_fault_ns == pytest.approx(
        37_000, abs=5
    )


@pytest.mark.real_data
@pytest.mark.parametrize(
    ("name", "fixed_us"),
    [
        ("csc746_a100_um_migrations_nsys2022.2.1.sqlite", 41.7),
        ("easycuda_rtx4060_um_migrations_nsys2023.4.4.sqlite", 24.5),
    ],
)
def test_cpu_fault_cost_of_the_real_exports(real_data: Path, name: str, fixed_us: float) -> None:
    """An A100 host (Perlmutter) and an RTX 4060 laptop: 41.7 and 24.5 us per CPU fault besides its transfers; the
    open-driver profile's earlier 4.95 us (the GCN fault scale applied to it) was 5-8x below both."""
    from uvmlab.measure.calibrate import fit_cpu_fault_ns
    from uvmlab.measure.nsys.read import open_export

    src = real_data / "nsys" / name
    if not src.is_file():
        pytest.skip("missing")
    with open_export(src) as ex:
        ns, _ = fit_cpu_fault_ns(ex)
    assert ns == pytest.approx(fixed_us * 1e3, abs=100)


def test_calibrate_usage_errors(tmp_path: Path) -> None:
    assert main(["calibrate", "-o", str(tmp_path / "p.json")]) == 2  # no report
    assert main(["calibrate", str(tmp_path / "missing.sqlite"), "-o", str(tmp_path / "p.json")]) == 2
    # --microbench refuses without a GPU (exit 2), or runs where there is one (exit 2 still without CuPy)
    from uvmlab.measure.gpu.detect import gpu_status

    code = main(["calibrate", "--microbench", "-o", str(tmp_path / "p.json")])
    assert code == 2 if not gpu_status().available else code in (0, 2)
