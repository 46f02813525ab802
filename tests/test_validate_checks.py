"""Unit tests of the checks' own pieces: raw-SQL totals, the HtoD-only link fit, the abc log parser, the snapshot
list, and a crashing check through the CLI (exit 3, results still written)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from uvmlab.cli import main
from uvmlab.validate.nsys_checks import export_files, parser_totals, raw_totals
from uvmlab.validate.points import CHECKS, Check, Point
from uvmlab.validate.snapshot_checks import snapshot_files, snapshot_points
from uvmlab.validate.titanv_checks import merge_same_kind, parse_abc


def test_raw_totals_and_parser_agree_on_a_synthetic_export(tmp_path: Path) -> None:
    from uvmlab.measure.nsys.synthetic import write_synthetic_export

    path = tmp_path / "synthetic.sqlite"
    truth = write_synthetic_export(path, faults=300, migrations=120, seed=3)
    raw = raw_totals(path)
    parsed = parser_totals(path)
    assert raw["GPU fault records"] == 300 and raw["HtoD migrations"] + raw["DtoH migrations"] == 120
    for key, value in raw.items():
        assert parsed[key] == value, key
    assert truth  # the generator's own totals exist (their keys are the generator's business)
    assert export_files(tmp_path) == [path]


@pytest.mark.real_data
def test_link_fit_on_htod_only_differs_from_the_fit_on_both(real_data: Path) -> None:
    from uvmlab.measure.calibrate import fit_link_bandwidth
    from uvmlab.measure.nsys import schema as S
    from uvmlab.measure.nsys.read import open_export

    with open_export(real_data / "nsys" / "csc746_a100_um_migrations_nsys2022.2.1.sqlite") as ex:
        both, d_both = fit_link_bandwidth(ex)
        htod, d_htod = fit_link_bandwidth(ex, copy_kinds=(S.COPY_KIND_UVM_HTOD,))
    assert d_both["migrations"] == 18432 and d_htod["migrations"] == 12288  # real-data/nsys README
    assert both is not None and htod is not None and both != htod
    assert 20e9 < htod < 30e9  # an A100 on PCIe 4.0 x16 (about 25 GB/s); the fit gives 25.1 GB/s


@pytest.mark.real_data
def test_cpu_fault_points_fitted_on_the_a100_export_validated_on_the_laptop_one(real_data: Path) -> None:
    """nsys-cpu-faults: csc746 defines the A100 profile's CPU-fault cost (a fitted point, equal by construction);
    the RTX 4060 laptop export is held out against the open-driver cost a run on that GPU takes (30 us: 1.22x)."""
    from uvmlab.validate.nsys_checks import check_nsys_cpu_faults

    points = {p.case.split("_")[0]: p for p in check_nsys_cpu_faults(real_data)}
    assert set(points) == {"csc746", "easycuda"}
    a100, laptop = points["csc746"], points["easycuda"]
    assert a100.fitted and a100.band is None and a100.ratio == pytest.approx(1.0)
    assert a100.measured == pytest.approx(41.7e-6, abs=0.1e-6)
    assert not laptop.fitted and laptop.band == 1.5 and laptop.within(1.5)
    assert laptop.measured == pytest.approx(24.5e-6, abs=0.1e-6) and laptop.predicted == pytest.approx(30e-6)


@pytest.mark.real_data
def test_serial_refault_points_of_the_a100_export(real_data: Path) -> None:
    """nsys-serial-refaults, through the simulator: csc746's median latency per fault size (the fit's data, fitted
    points) against the simulator replaying the same faults on a CPU-initialised block (0.74-1.29x); the fit's base
    within 1.5x of the simulator's fault without the unmapping (13.9 vs 9.4 us); a block's first fault a fitted
    point under the export's driver 525 (270.6 us measured, 266.1 us simulated: 512 CPU chunks mapped; stop 49's
    model gave 70 us, 0.26x)."""
    from uvmlab.validate.nsys_checks import check_nsys_serial_refaults

    points = {p.quantity.rsplit(", ", 1)[-1]: p for p in check_nsys_serial_refaults(real_data)}
    sizes = [points[f"{n} pages"] for n in (16, 32, 64, 128, 256)]
    assert all(p.fitted and 0.7 < p.ratio < 1.3 for p in sizes)
    base, first = points["base"], points["a block's first fault"]
    assert not base.fitted and base.band == 1.5 and base.within(1.5) and base.ratio == pytest.approx(0.676, abs=0.01)
    assert first.fitted and first.band is None and first.ratio == pytest.approx(0.983, abs=0.01)
    assert "driver 525" in first.note


SMALL_LOG = """\
4,1,1000,-;s,
4,2,1001,-;f,7f0000000000,0,0,1,2,1,0,0,0,127,1,0,1,63
4,3,1002,-;f,7f0000200000,0,0,1,2,1,0,0,0,127,1,0,1,63
4,4,1100,-;b,
4,5,1200,-;s,
4,6,1201,-;f,7f0000001000,0,0,1,2,1,0,0,0,127,1,0,1,63
4,7,1250,-;b,
4,8,1300,-;s,
4,9,1301,-;f,7f0000400000,0,0,2,4,1,0,0,0,127,1,0,1,63
4,10,1400,-;b,
4,11,1500,-;uvm range destroy va_range->node.start, va_range->size: 0x7f0000000000, 2097152
"""


def test_parse_abc_small_log(tmp_path: Path) -> None:
    log = tmp_path / "abc.kmsg"
    log.write_text(SMALL_LOG)
    got = parse_abc(log)
    assert got["batches"] == [("read", 2, 2), ("read", 1, 1), ("write", 1, 1)]
    assert got["blocks"] == {"read": 2, "write": 1}  # the second read batch re-touches the first block
    assert got["destroyed"] == [(0x7F0000000000, 2 << 20)]
    assert got["wall_us"] == 400
    assert merge_same_kind(got["batches"]) == [("read", 3), ("write", 1)]


@pytest.mark.real_data
def test_snapshot_list_and_state_only_snapshot(real_data: Path) -> None:
    files = snapshot_files(real_data / "snapshots")
    assert len(files) == 48
    state_only = real_data / "snapshots" / "Yiyi-philosophy__LLM-inference__61261a2e__oom_snapshot.pickle"
    assert snapshot_points(state_only) == []
    small = real_data / "snapshots" / "silmont2000__assignment2-systems__75d09aad__mem_snapshot.pickle"
    pts = {p.quantity: p for p in snapshot_points(small)}
    assert pts["allocations at the real address"].measured == 36  # tests/test_replay_real.py
    assert pts["peak reserved"].measured == 3_781_165_056  # MANIFEST.tsv
    assert all(p.band == 1.0 and p.keeps_band for p in pts.values())


@pytest.mark.real_data
def test_incoming_snapshots_replay_identically(real_data: Path) -> None:
    """The four snapshots of real-data/incoming (issue 25), read where they are: three replay identically (every
    allocation at its real address, same peaks and segment events, including 584/579 segment alloc/free bursts),
    the state-only one gives no point."""
    from uvmlab.validate.snapshot_checks import SNAPSHOT_FOLDERS

    folder = real_data / "incoming" / "snapshots"
    if not folder.is_dir():
        pytest.skip("real-data/incoming/snapshots absent")
    assert "incoming/snapshots" in SNAPSHOT_FOLDERS
    by_file = {f.name: snapshot_points(f) for f in snapshot_files(folder)}
    assert sorted(by_file) == [
        "Maphsge4__select_n__04d383cd__snapshot.pickle",
        "Maphsge4__select_n__1f2f5480__snapshot.pickle",
        "Maphsge4__select_n__dec166a3__snapshot.pickle",
        "ZidongLiu__DeComFL__edd30e09__memory.pickle",
    ]
    assert by_file.pop("Maphsge4__select_n__dec166a3__snapshot.pickle") == []  # state only
    for name, pts in by_file.items():
        assert pts and all(p.keeps_band for p in pts), name
    bursts = {p.quantity: p.measured for p in by_file["Maphsge4__select_n__04d383cd__snapshot.pickle"]}
    assert bursts["segment events"] == 1163 and bursts["allocations at the real address"] == 3058


def test_crashing_check_exits_3_and_still_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "data" / "a").mkdir(parents=True)

    def ok(data_dir: Path) -> list[Point]:
        return [Point("a", "c", "q", "count", 2, 2, band=1.0)]

    def crash(data_dir: Path) -> list[Point]:
        raise ZeroDivisionError("division by zero")

    monkeypatch.setitem(CHECKS, "fake-ok", Check(name="fake-ok", fn=ok, fast=True, needs="a"))
    monkeypatch.setitem(CHECKS, "fake-crash", Check(name="fake-crash", fn=crash, fast=True, needs="a"))
    out = tmp_path / "run"
    rc = main(["validate", str(tmp_path / "data"), "--check", "fake-ok", "--check", "fake-crash", "-o", str(out)])
    assert rc == 3
    assert "fake-crash crashed" in capsys.readouterr().err
    result = json.loads((out / "result.json").read_text())
    assert result["points"] == 1 and "ZeroDivisionError" in result["check_errors"]["fake-crash"]


@pytest.mark.real_data
def test_stream_native_points_are_the_two_device_seq_stream_rows(real_data: Path) -> None:
    from uvmlab.validate.microbench_checks import check_stream_native

    pts = check_stream_native(real_data)
    assert [p.measured for p in pts] == [7.527, 15.695]  # rq1 0.25x and rq2 0.5x, seq_stream device median_ms
    # 8.42 GB and 16.83 GB at 1792 GB/s x 0.624 (the GDDR stream share, rq1's own point): 7.53 ms and 15.06 ms
    assert [round(p.predicted, 2) for p in pts] == [7.53, 15.06]
    assert pts[0].fitted and pts[0].band is None  # the constant's source
    assert pts[1].band == 1.5 and pts[1].keeps_band and not pts[1].fitted
