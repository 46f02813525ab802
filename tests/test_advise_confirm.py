"""``uvmlab advise --confirm-on-gpu N`` (issue 28 item 5): the job as given and the top N policies uvmlab applies on a
GPU, run for real and compared with the prediction. Here (no GPU): the choice and the comparison with a stub runner,
the GPU plans of a dry run through the CLI, and one sentence with exit 2 when there is no GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from uvmlab.advise.confirm import GIVEN, confirm, pick
from uvmlab.config import RunConfig, WorkloadConfig
from uvmlab.errors import InputError

SMALL = ["-b", "16", "--option", "image_size=64", "--option", "num_classes=10", "-n", "2", "--oversub", "1.5"]
SMALL_WL = WorkloadConfig("alexnet", batch_size=16, options={"image_size": 64, "num_classes": 10}, iterations=2)


def _uvmlab(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "uvmlab", *args], capture_output=True, text=True, timeout=900, cwd=cwd)


def test_confirm_runs_the_given_job_then_the_best_applicable_and_compares(small_advice) -> None:
    calls: list[tuple[str | None, str, Path]] = []
    measured = {}

    def runner(cfg: RunConfig, out: Path) -> dict:
        calls.append((cfg.policy, cfg.mode, out))
        t = 200e6 if cfg.policy is None else 100e6 + 10e6 * len(calls)  # a stub GPU: the policies help
        measured[cfg.policy] = t
        return {"iteration_time_ns": t, "nsys": False}

    cfg = RunConfig(workload=SMALL_WL, oversub=1.5, mode="sim")
    conf = confirm(small_advice, cfg, 2, runner, Path("/nowhere"))
    recs = small_advice.records()
    ok = [r for r in recs if r["outcome"] == "ok" and r["policy"] != small_advice.given_policy]
    want = [r for r in ok if r["uvmlab_gpu"]][:2]
    assert [c[0] for c in calls] == [None, *(r["policy"] for r in want)]  # the job as given first
    assert all(mode == "gpu" for _, mode, _ in calls)
    assert calls[0][2] == Path("/nowhere/given") and "+" not in calls[-1][2].name
    skipped_names = [p for p, _ in conf.skipped]
    better = [r["policy"] for r in ok[: ok.index(want[-1])] if not r["uvmlab_gpu"]]
    assert skipped_names == better and all("uvmlab cannot apply it on a GPU" in w for _, w in conf.skipped)
    given_pred = next(r for r in recs if r["policy"] == small_advice.given_policy)["iteration_time_ns"]
    assert conf.rows[0]["policy"] == GIVEN and conf.rows[0]["speedup_ratio"] == pytest.approx(1.0)
    for row, r in zip(conf.rows[1:], want, strict=True):
        assert row["predicted_ns"] == pytest.approx(r["iteration_time_ns"])
        assert row["measured_speedup"] == pytest.approx(200e6 / measured[r["policy"]])
        assert row["speedup_ratio"] == pytest.approx((given_pred / r["iteration_time_ns"]) / row["measured_speedup"])
        assert row["time_ratio"] == pytest.approx(r["iteration_time_ns"] / measured[r["policy"]])
    json.dumps(conf.to_dict())  # JSON-ready


def test_pick_refuses_zero(small_advice) -> None:
    with pytest.raises(InputError, match=">= 1"):
        pick(small_advice, 0)


def test_a_dry_run_prints_each_runs_plan_and_writes_nothing(tmp_path) -> None:
    out = tmp_path / "confirm"
    proc = _uvmlab("advise", "alexnet", *SMALL, "--no-combine", "--policy", "pca-on", "--policy", "pca-off",
                   "--policy", "discard-freed-blocks", "--policy", "prefetch-on-alloc", "--confirm-on-gpu", "2",
                   "--dry-run", "--out", str(out), "--format", "json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    runs = d["confirm"]["runs"]
    assert runs[0]["policy"] == GIVEN and {r["policy"] for r in runs[1:]} == {"pca-off", "prefetch-on-alloc"}
    for r in runs:
        assert r["measured_ns"] is None and r["predicted_ns"] > 0
        assert "PYTORCH_CUDA_ALLOC_CONF" in r["plan"] and "balloon" in r["plan"]
    assert "UVMLAB_PREFETCH=on_alloc" in next(r["plan"] for r in runs if r["policy"] == "prefetch-on-alloc")
    assert "PYTORCH_NO_CUDA_MEMORY_CACHING=1" in next(r["plan"] for r in runs if r["policy"] == "pca-off")
    skipped = d["confirm"]["skipped"]
    if any(p["policy"] == "discard-freed-blocks" for p in skipped):
        assert "C++ extension" in skipped[0]["reason"]
    assert not out.exists()


def test_without_a_gpu_confirm_is_one_sentence_and_exit_2_before_any_simulation(tmp_path) -> None:
    from uvmlab.run import gpu_availability

    if gpu_availability().available:
        pytest.skip("this machine has a GPU: --confirm-on-gpu would run")
    proc = _uvmlab("advise", "alexnet", *SMALL, "--confirm-on-gpu", "3", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--confirm-on-gpu needs a CUDA device" in lines[0]
    assert "simulating" not in proc.stderr and not any(tmp_path.iterdir())


@pytest.mark.parametrize(("args", "message"), [(["--confirm-on-gpu", "0"], ">= 1"), (["--dry-run"], "--dry-run goes")])
def test_bad_confirm_options_are_one_sentence(args: list[str], message: str) -> None:
    proc = _uvmlab("advise", "alexnet", *SMALL, *args)
    assert proc.returncode == 2 and message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
