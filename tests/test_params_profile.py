"""Issue 42 section 4: a ``--params`` file sets only its own costs over the run GPU's profile, says which were fitted,
and ``calibrate`` refuses impossible measurements and never writes a file that ``run`` refuses."""

from __future__ import annotations

import json
import shutil
import sqlite3
from dataclasses import fields, replace
from pathlib import Path

import pytest

from tests.hostile import Probe, assert_refused, run_probes
from tests.uvm_synth import make_trace
from uvmlab.cli import main
from uvmlab.config import RunConfig, WorkloadConfig
from uvmlab.errors import InputError
from uvmlab.gpus import get_gpu
from uvmlab.measure.calibrate import calibrate
from uvmlab.measure.nsys.synthetic import GLOBAL_PID, write_synthetic_export
from uvmlab.sim.allocator.placement import place
from uvmlab.sim.uvm.profile import PROFILE_DIR, pick_profile
from uvmlab.sim.uvm.replay import peak_managed_bytes
from uvmlab.sim.uvm.timing import ZERO_MEANS, CostParams, check_cost_values, cost_limits, read_params_file
from uvmlab.uvm import simulate

A100_EXPORT = "csc746_a100_um_migrations_nsys2022.2.1.sqlite"
COSTS = [f.name for f in fields(CostParams)]


def _cfg(params: Path | None, gpu: str = "A100-80GB") -> RunConfig:
    return RunConfig(
        WorkloadConfig("alexnet", batch_size=2),
        oversub=4,
        pca=False,
        gpu=gpu,
        params_file=str(params) if params else None,
    )


def _write(path: Path, doc: dict) -> Path:
    path.write_text(json.dumps(doc))
    return path


# -- the rule: a file's costs over the run GPU's profile ----------------------------------------------------------
@pytest.mark.parametrize("gpu", ["A100-80GB", "RTX5090", "V100-PCIe", "H100-80GB"])
def test_a_file_of_one_cost_keeps_every_other_cost_of_the_gpu_profile(tmp_path: Path, gpu: str) -> None:
    """The issue's case: a calibrated file holding only the link. On the old code every other cost fell back to the
    generic defaults (21.6 s / 26.2x for GPT-2 x4 PCA off on the A100, against 5.1 s / 6.2x without the file)."""
    link = 20e9
    f = _write(
        tmp_path / "p.json", {"schema_version": 1, "params": {"link_bytes_per_s": link}, "fitted": ["link_bytes_per_s"]}
    )
    costs, why = simulate.costs_and_source(_cfg(f, gpu))
    profile, profile_why = pick_profile(get_gpu(gpu))
    assert costs == replace(profile, link_bytes_per_s=min(link, get_gpu(gpu).link_limit_bytes_per_s))
    assert "fitted link_bytes_per_s" in why and profile_why in why


def test_the_same_simulation_with_a_file_of_the_profile_own_link(tmp_path: Path) -> None:
    """A file that fits the A100 profile's own link predicts what the profile alone predicts."""
    profile, _ = pick_profile(get_gpu("A100-80GB"))
    f = _write(tmp_path / "p.json", {"schema_version": 1, "params": {"link_bytes_per_s": profile.link_bytes_per_s}})
    trace = make_trace(n_iter=2)
    placement = place(trace, "nocache")
    footprint = peak_managed_bytes(placement.ranges)
    results = []
    for cfg in (_cfg(None), _cfg(f)):
        prep = simulate.Prepared(simulate.run_gpu_spec(cfg), trace, placement, footprint, footprint // 4)
        results.append(simulate.simulate_prepared(cfg, prep)[1])
    assert results[0]["iteration_time_ns"] == results[1]["iteration_time_ns"]
    assert results[0]["slowdown_vs_native"] == results[1]["slowdown_vs_native"]


def test_an_older_calibrate_file_sets_only_what_it_fitted(tmp_path: Path) -> None:
    """A file of the old calibrate (every cost written, the unfitted ones with generic defaults, listed in 'kept')."""
    params = {**CostParams().to_dict(), "link_bytes_per_s": 25e9}
    kept = [n for n in COSTS if n != "link_bytes_per_s"]
    f = _write(
        tmp_path / "old.json", {"schema_version": 1, "params": params, "fitted": ["link_bytes_per_s"], "kept": kept}
    )
    read = read_params_file(f)
    assert read.values == {"link_bytes_per_s": 25e9} and set(read.ignored) == set(kept)
    costs, _ = simulate.costs_and_source(_cfg(f))
    assert costs == replace(pick_profile(get_gpu("A100-80GB"))[0], link_bytes_per_s=25e9)


def test_every_shipped_profile_passes_the_file_checks() -> None:
    for p in sorted(PROFILE_DIR.glob("*.json")):
        read_params_file(p)


@pytest.mark.parametrize(
    ("params", "words"),
    [
        (dict.fromkeys(COSTS, 0), "are 0, a cost that is never free"),
        ({"link_bytes_per_s": 0}, "link_bytes_per_s is 0"),
        ({"batch_turnaround_ns": 1e308}, "outside"),
        ({"link_bytes_per_s": 656_249e9}, "outside"),
        ({"compute_efficiency": 3.5}, "outside"),
        ({"raw_entries_per_fault": 0.5}, "outside"),
    ],
)
def test_costs_no_run_can_use_are_refused(tmp_path: Path, params: dict, words: str) -> None:
    f = _write(tmp_path / "p.json", {"schema_version": 1, "params": params})
    with pytest.raises(InputError, match=words):
        read_params_file(f)


def test_zero_is_allowed_only_where_it_means_something() -> None:
    for name in COSTS:
        low, _, _ = cost_limits(name)
        assert (low == 0) == (name in ZERO_MEANS), name
        if name in ZERO_MEANS:
            check_cost_values({name: 0}, "x")


# -- calibrate --------------------------------------------------------------------------------------------------
def test_calibrate_writes_only_what_it_fitted(tmp_path: Path) -> None:
    db = tmp_path / "x.sqlite"
    write_synthetic_export(db, faults=0, migrations=400, seed=5)
    doc = calibrate(db, tmp_path / "p.json")
    on_disk = json.loads((tmp_path / "p.json").read_text())
    assert on_disk["params"] == {k: doc["params"][k] for k in doc["fitted"]} and doc["fitted"] == ["link_bytes_per_s"]
    assert sorted(on_disk["kept"]) == sorted(n for n in COSTS if n != "link_bytes_per_s")
    assert "profile A100-80GB" in on_disk["fitted_against"]


def test_calibrate_base_values_carry_over(tmp_path: Path) -> None:
    db = tmp_path / "x.sqlite"
    write_synthetic_export(db, faults=0, migrations=400, seed=5)
    base = _write(tmp_path / "base.json", {"schema_version": 1, "params": {"evict_fixed_ns": 1234.0}})
    doc = calibrate(db, tmp_path / "p.json", base=base)
    assert doc["params"]["evict_fixed_ns"] == 1234.0 and doc["fitted"] == ["link_bytes_per_s"]


@pytest.mark.real_data
def test_the_issue_example_a100_fit_predicts_what_the_profile_predicts(real_data: Path, tmp_path: Path) -> None:
    src = real_data / "nsys" / A100_EXPORT
    if not src.is_file():
        pytest.skip("missing")
    out = tmp_path / "params.json"
    assert main(["calibrate", str(src), "-o", str(out), "--format", "json"]) == 0
    costs, _ = simulate.costs_and_source(_cfg(out))
    profile, _ = pick_profile(get_gpu("A100-80GB"))
    assert costs.link_bytes_per_s == pytest.approx(25.0e9, rel=0.01)
    assert replace(costs, link_bytes_per_s=profile.link_bytes_per_s) == profile  # the profile's own link: 25.0 GB/s


def _damaged(tmp_path: Path) -> dict[str, Path]:
    base = tmp_path / "base.sqlite"
    write_synthetic_export(base, faults=200, migrations=400, seed=5)
    out = {}
    for name, sql in {
        "negative": 'UPDATE CUPTI_ACTIVITY_KIND_MEMCPY SET "end" = start - 1000 WHERE rowid % 2 = 0',
        "one-ns": 'UPDATE CUPTI_ACTIVITY_KIND_MEMCPY SET "end" = start + 1',
        "fault-sum": "UPDATE CUDA_UM_GPU_PAGE_FAULT_EVENTS SET numberOfPageFaults = 4611686018427387904",
        "kernel-backwards": 'UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET "end" = start - 5 WHERE rowid = 3',
    }.items():
        p = tmp_path / f"{name}.sqlite"
        shutil.copy(base, p)
        con = sqlite3.connect(p)
        con.execute(sql)
        con.commit()
        con.close()
        out[name] = p
    return out


def test_impossible_measurements_are_one_sentence_naming_the_rows(tmp_path: Path) -> None:
    """Migrations that end before they start, 1 ns migrations (a 983,511 GB/s link was fitted), fault counts whose
    sum passes int64 (a traceback in nsys summarize): every command that reads the export refuses, naming rows."""
    probes = []
    for name, db in _damaged(tmp_path).items():
        out = tmp_path / f"p-{name}.json"
        probes.append(Probe(f"calibrate {name}", ["calibrate", str(db), "-o", str(out)], tmp_path, tmp_path))
        probes.append(Probe(f"summarize {name}", ["nsys", "summarize", str(db)], tmp_path, tmp_path))
        imp = tmp_path / f"imp-{name}"
        probes.append(Probe(f"import {name}", ["nsys", "import", str(db), "-o", str(imp)], tmp_path, tmp_path))
    for outcome in run_probes(probes).values():
        line = assert_refused(outcome, words=["rowid", "no hardware measures that"])
        assert "CUPTI" in line or "CUDA_UM" in line
    assert not list(tmp_path.glob("p-*.json")) and not list(tmp_path.glob("imp-*"))


def test_calibrate_never_writes_a_file_that_run_refuses(tmp_path: Path) -> None:
    """Fault batches of 20 s each fit a per-batch cost no run takes (over 1 s): refused, nothing written."""
    db = tmp_path / "slow.sqlite"
    write_synthetic_export(db, faults=0, migrations=0, seed=5)
    con = sqlite3.connect(db)
    t0, dur = 10**12, 20 * 10**9
    con.executemany(
        "INSERT INTO CUDA_UM_GPU_PAGE_FAULT_EVENTS VALUES (?, ?, ?, 0, ?, 2, 1)",
        [(t0 + i * 10**11, t0 + i * 10**11 + dur, GLOBAL_PID, (i + 1) << 22) for i in range(40)],
    )
    con.commit()
    con.close()
    out = tmp_path / "p.json"
    with pytest.raises(InputError, match=r"batch_turnaround_ns .* is outside .*no parameter file written"):
        calibrate(db, out)
    assert not out.exists()


@pytest.mark.parametrize("name", ["gemm_efficiency", "index_memory_efficiency", "compute_efficiency"])
def test_every_efficiency_is_a_share_in_the_file_limits(name: str) -> None:
    """A parameter file's efficiencies are shares of a peak: 5.0 is refused by the file check itself (gemm and index
    efficiencies were missing from its share list and took the 1e9 ns limit)."""
    from uvmlab.errors import InputError
    from uvmlab.sim.uvm.timing import check_cost_values, cost_limits

    assert cost_limits(name)[1:] == (1.0, "")
    with pytest.raises(InputError, match=name):
        check_cost_values({name: 5.0}, "p.json")
