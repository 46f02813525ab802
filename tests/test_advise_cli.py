"""uvmlab advise end to end (a small AlexNet, so the trace captures in seconds) and run --policy."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from uvmlab.advise.advisor import ROW_COLUMNS, fit_batch
from uvmlab.config import RunConfig, WorkloadConfig

SMALL = WorkloadConfig("alexnet", batch_size=16, options={"image_size": 64, "num_classes": 10}, iterations=2)


def _uvmlab(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "uvmlab", *args], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def advice(small_advice: object) -> object:
    return small_advice  # conftest: advise(RunConfig(workload=SMALL, oversub=1.5)), every policy and combination


def test_every_policy_gets_a_row_ranked_by_time(advice: object) -> None:
    rows = advice.rows  # type: ignore[attr-defined]
    assert list(rows.columns) == list(ROW_COLUMNS)
    ok = rows[rows["outcome"] == "ok"]
    assert ok["iteration_time_ns"].is_monotonic_increasing
    assert list(ok["rank"]) == list(range(1, len(ok) + 1))
    from uvmlab.advise.policies import POLICIES

    assert set(POLICIES) <= set(rows["policy"])
    # the reference is the all-resident PCA-on job: no policy that keeps the job's kernels beats it under
    # oversubscription (a job-shape policy may: e.g. 8-bit Adam's one fused step does less work than torch's)
    same_job = ~ok["family"].str.contains("job-shape")
    assert (ok.loc[same_job, "slowdown_vs_native_pca"] >= 0.99).all()
    # every ok row stays within the GPU memory UVM has
    assert (ok["peak_resident_bytes"] <= advice.available_bytes).all()  # type: ignore[attr-defined]
    # and says its regime (uvmlab.uvm.regime); a run whose peak stays a chunk below the memory never evicted
    assert ok["regime"].str.fullmatch(r"fits|paging|thrashing \(\d+%\)").all()
    below = ok[ok["peak_resident_bytes"] <= advice.available_bytes - 2 * 2**20]  # type: ignore[attr-defined]
    assert len(below) >= 3 and (below["regime"] == "fits").all()
    assert (ok.set_index("policy").loc["pca-on", "regime"]).startswith("thrashing")


def test_the_gc_threshold_policy_ooms_under_oversubscription(advice: object) -> None:
    row = advice.rows.set_index("policy").loc["gc-threshold-0.8"]  # type: ignore[attr-defined]
    assert row["outcome"] == "oom" and "fraction" in row["note"]


def test_fit_batch_finds_the_smallest_accumulation_that_fits(advice: object) -> None:
    from uvmlab.advise.advisor import fit_margin
    from uvmlab.uvm.simulate import prepare

    avail = advice.available_bytes  # type: ignore[attr-defined]
    cfg = RunConfig(workload=SMALL, oversub=1.5, mode="sim")
    fit = fit_batch(cfg, avail, 16)

    def footprint(micro: int, k: int) -> int:
        wl = {**SMALL.to_dict(), "batch_size": micro, "accumulation_steps": min(k, 2)}
        return prepare(RunConfig(workload=WorkloadConfig(**wl))).footprint_bytes

    if fit is None:  # parameters + optimizer state alone exceed the memory: then batch 1 must not fit either
        fp = footprint(1, 16)
        assert fp + fit_margin(fp) > avail
        return
    micro, k = fit
    assert micro * k == 16  # the effective batch, exactly
    fp = footprint(micro, k)
    assert fp + fit_margin(fp) <= avail  # with estimate's margin
    if k > 1:  # the next larger micro-batch dividing 16 does not fit
        bigger = min(m for m in range(micro + 1, 17) if 16 % m == 0)
        fp = footprint(bigger, 16 // bigger)
        assert fp + fit_margin(fp) > avail


def test_advise_cli_json_has_one_entry_per_policy() -> None:
    proc = _uvmlab(
        "advise", "alexnet", "-b", "16", "--option", "image_size=64", "--option", "num_classes=10", "-n", "2",
        "--oversub", "1.5", "--no-combine", "--format", "json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    names = [p["policy"] for p in d["policies"]]
    assert len(names) == len(set(names))
    assert {"available_bytes", "given_footprint_bytes", "native_pca_time_ns"} <= set(d)
    assert all("+" not in n for n in names)  # --no-combine


def test_unknown_policy_is_one_sentence_and_exit_2(tmp_path: Path) -> None:
    proc = _uvmlab("run", "alexnet", "-b", "2", "--policy", "bogus", "-o", str(tmp_path / "r"))
    assert proc.returncode == 2
    assert "unknown policy 'bogus'" in proc.stderr and "Traceback" not in proc.stderr


def test_run_with_a_policy_records_it_and_uses_the_given_jobs_memory(tmp_path: Path) -> None:
    args = ["-b", "16", "--option", "image_size=64", "--option", "num_classes=10", "-n", "2", "--oversub", "1.5"]
    plain = _uvmlab("run", "alexnet", *args, "-o", str(tmp_path / "plain"), "--format", "json")
    pol = _uvmlab("run", "alexnet", *args, "--policy", "pca-off", "-o", str(tmp_path / "p"), "--format", "json")
    assert plain.returncode == 0 and pol.returncode == 0, pol.stderr
    a, b = json.loads(plain.stdout), json.loads(pol.stdout)
    assert b["policy"] == "pca-off" and b["pca"] is False
    assert b["available_bytes"] == a["available_bytes"]  # same GPU memory as the job as given
    config = json.loads((tmp_path / "p" / "config.json").read_text())
    assert config["run"]["policy"] == "pca-off" and config["applied"]["pca"] is False


def test_snapshot_with_an_empty_cache_policy_is_refused_before_force_removes_anything(tmp_path: Path) -> None:
    args = ["-b", "16", "--option", "image_size=64", "--option", "num_classes=10", "-n", "2", "-o", str(tmp_path / "r")]
    assert _uvmlab("run", "alexnet", *args).returncode == 0
    before = (tmp_path / "r" / "result.json").read_bytes()
    proc = _uvmlab(
        "run",
        "alexnet",
        *args,
        "--force",
        "--policy",
        "release-each-iteration",
        "--snapshot",
        str(tmp_path / "s.pickle"),
    )
    assert proc.returncode == 2 and "empty_cache" in proc.stderr and "Traceback" not in proc.stderr
    assert (tmp_path / "r" / "result.json").read_bytes() == before  # the previous run is still there
    assert not (tmp_path / "s.pickle").exists()
