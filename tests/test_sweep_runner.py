"""Sweep execution: fresh process per run, failures recorded, resume after SIGKILL, submitit local executor.

The runs use tests/sweep_fake_run.py (UVMLAB_SWEEP_RUN_FN) so the machinery is tested in seconds; the
end-to-end test with the real ``uvmlab.run`` is in test_sweep_e2e.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from uvmlab.errors import InputError
from uvmlab.files.rundir import RunDir
from uvmlab.sweep.aggregate import collect
from uvmlab.sweep.runner import plan_entries, render_sbatch, run_sweep, submit_plan
from uvmlab.sweep.slurm import SlurmOptions
from uvmlab.sweep.spec import parse_spec


def attempts(path: Path) -> list[tuple[float, int, str]]:
    log = path / "logs" / "attempts.log"
    if not log.is_file():
        return []
    rows = []
    for line in log.read_text().splitlines():
        t, pid, event = line.split()
        rows.append((float(t), int(pid), event))
    return rows


SPEC = """
name: t
defaults: {mode: sim, iterations: 2}
grid:
  workload: [{workload: alexnet, batch_size: 2}, gpt2]
  oversub: [1.0, 2]
  pca: [on, off]
"""


def test_local_sweep_records_failures_and_resumes(tmp_path: Path, fake_env: dict[str, str]) -> None:
    text = SPEC.replace("{workload: alexnet, batch_size: 2}, ", "")
    text += "include:\n  - {workload: bert, oversub: 2, sim.fail: [oom, error, crash]}\n"
    spec = parse_spec(text)
    out = tmp_path / "out"
    summary = run_sweep(spec, out, jobs=2, progress=False)
    assert summary.total == 7 and summary.ran == 7
    assert summary.outcomes == {"ok": 4, "oom": 1, "error": 2}
    df = pd.read_parquet(out / "results.parquet")
    assert len(df) == 7 and df["run_id"].is_unique
    assert set(df.columns) >= {"cfg_workload", "cfg_oversub", "cfg_pca", "outcome", "slowdown_vs_native", "fault_count"}
    by_fail = df.set_index("cfg_sim.fail")
    assert by_fail.loc["oom", "outcome"] == "oom"
    assert "out of memory" in by_fail.loc["oom", "error"]
    assert by_fail.loc["error", "error"] == "fake run refused this configuration"
    crash = by_fail.loc["crash"]
    assert crash["outcome"] == "error" and "SIGABRT" in crash["error"]
    crash_dir = Path(crash["run_dir"])
    assert (crash_dir / "logs" / "worker.stderr").is_file()
    # every run ran in its own process
    pids = [attempts(Path(p))[0][1] for p in df["run_dir"]]
    assert len(set(pids)) == len(pids)

    again = run_sweep(spec, out, jobs=2, progress=False)
    assert again.ran == 0 and again.skipped == 7
    retry = run_sweep(spec, out, jobs=2, progress=False, retry_failed=True)
    assert retry.ran == 2  # the two outcome-"error" runs; oom is a result, not a failure


def test_interrupted_child_records_no_result(tmp_path: Path, fake_env: dict[str, str]) -> None:
    from uvmlab.sweep.runner import prepare
    from uvmlab.sweep.worker import run_one

    (entry,) = prepare(parse_spec("grid: {workload: [gpt2], sim.fail: [sigterm]}\n"), tmp_path / "out")
    assert run_one(entry.path) == "interrupted"
    assert not RunDir(entry.path).is_complete(), "an interrupted run must be run again on resume"


def test_partial_files_are_never_results(tmp_path: Path, fake_env: dict[str, str]) -> None:
    spec = parse_spec(SPEC)
    out = tmp_path / "out"
    entries = plan_entries(spec, out)
    # a killed attempt: tables (listed in its manifest, as uvmlab lists a name before writing it) and a temp file
    # of result.json, but no result.json
    victim = entries[0].path
    (victim / "tables").mkdir(parents=True)
    RunDir(victim).record(victim / "tables" / "kernels.parquet")
    (victim / "tables" / "kernels.parquet").write_bytes(b"PAR1 truncated")
    (victim / ".result.json.abc123.tmp").write_text('{"outcome": "ok"')
    (victim / "notes.txt").write_text("mine")  # a user's file in the run folder: never removed by a resume
    (victim / "src").mkdir()
    (victim / "src" / "a.py").write_text("x = 1")
    assert plan_entries(spec, out)[0].status == "pending"
    assert collect_or_empty(out) == 0
    summary = run_sweep(spec, out, jobs=2, progress=False)
    assert summary.ran == 8
    assert not (victim / ".result.json.abc123.tmp").exists()
    assert RunDir(victim).read_table("kernels")["kernel_bytes"].gt(0).all()
    assert (victim / "notes.txt").read_text() == "mine" and (victim / "src" / "a.py").is_file()


def collect_or_empty(out: Path) -> int:
    return len(collect(out)) if (out / "runs").is_dir() else 0


def test_two_workers_on_one_run_do_it_once(tmp_path: Path, fake_env: dict[str, str]) -> None:
    spec = parse_spec("grid: {workload: [gpt2], sim.sleep_s: [1.0]}\n")
    out = tmp_path / "out"
    from uvmlab.sweep.runner import prepare

    (entry,) = prepare(spec, out)
    argv = [sys.executable, "-m", "uvmlab.sweep.worker", str(entry.path)]
    procs = [subprocess.Popen(argv, env=fake_env, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=60)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    events = [e for _, _, e in attempts(entry.path)]
    assert events == ["start", "end"], events


def test_sigkill_mid_sweep_then_resume(tmp_path: Path, fake_env: dict[str, str]) -> None:
    spec_path = tmp_path / "s.yaml"
    spec_path.write_text(SPEC.replace("iterations: 2}", "iterations: 2, sim.sleep_s: 1.5}"))
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "uvmlab", "sweep", str(spec_path), "-o", str(out), "--jobs", "2"]
    proc = subprocess.Popen(argv, env=fake_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    runs = out / "runs"
    deadline = time.monotonic() + 120
    done = 0
    while time.monotonic() < deadline:
        done = len(list(runs.glob("*/result.json"))) if runs.is_dir() else 0
        if done >= 1:
            break
        time.sleep(0.05)
    assert 1 <= done < 8, f"expected to kill mid-way, {done} runs were complete"
    os.kill(proc.pid, signal.SIGKILL)  # the sweep only; its running workers become orphans and go on
    proc.wait()
    partial = len(list(runs.glob("*/result.json")))
    assert partial < 8

    rerun = subprocess.run([*argv, "--format", "json"], env=fake_env, capture_output=True, text=True, timeout=180)
    assert rerun.returncode == 0, rerun.stderr
    summary = json.loads(rerun.stdout)
    assert summary["total"] == 8 and summary["skipped"] >= partial

    run_dirs = sorted(p for p in runs.iterdir() if p.is_dir())
    assert len(run_dirs) == 8
    for path in run_dirs:
        result = json.loads((path / "result.json").read_text())
        assert result["outcome"] == "ok"
        events = attempts(path)
        ends = [e for e in events if e[2] == "end"]
        assert len(ends) == 1, f"{path.name} completed {len(ends)} times: {events}"
        starts = [e for e in events if e[2] == "start"]
        # an attempt of the killed sweep may have been cut (no end), but attempts never overlapped
        order = [e[2] for e in sorted(events)]
        assert "start,start" not in ",".join(order), events
        assert len(starts) >= 1
        assert not list(path.glob(".*.tmp")) and not list(path.glob("tables/.*.tmp"))
    df = pd.read_parquet(out / "results.parquet")
    assert len(df) == 8 and df["run_id"].is_unique and set(df["run_id"]) == {p.name for p in run_dirs}


def test_submitit_local_executor_packs_configs(tmp_path: Path, fake_env: dict[str, str]) -> None:
    pytest.importorskip("submitit")
    spec = parse_spec(SPEC.replace("pca: [on, off]", "pca: [on]"))  # 4 configurations
    out = tmp_path / "out"
    options = SlurmOptions(configs_per_task=2, time_min=5)
    summary = run_sweep(spec, out, executor="submitit-local", slurm=options, progress=False)
    assert summary.outcomes == {"ok": 4}, summary.errors
    assert summary.errors == []
    df = pd.read_parquet(out / "results.parquet")
    assert len(df) == 4
    pids = {attempts(Path(p))[0][1] for p in df["run_dir"]}
    assert len(pids) == 4, "each configuration runs in its own process even when packed into one task"
    logs = list((out / "submitit").rglob("*_log.out"))
    assert len(logs) == 2, "one submitit log per array task (2 tasks of 2 configurations)"


def test_submit_plan_is_pure_and_renders_sbatch(tmp_path: Path) -> None:
    spec = parse_spec(SPEC.replace("mode: sim", "mode: gpu"))
    entries = plan_entries(spec, tmp_path / "out")
    assert not (tmp_path / "out").exists(), "planning writes nothing"
    opts = SlurmOptions(partition="gpu", time_min=20, configs_per_task=3, array_parallelism=2, exclusive=True)
    plan = submit_plan(entries, tmp_path / "out", opts)
    assert [len(c) for c in plan.chunks] == [3, 3, 2]
    assert plan.parameters["gpus_per_node"] == 1  # GPU runs need a GPU
    assert plan.parameters["timeout_min"] == 60  # 3 configurations x 20 min
    assert plan.parameters["slurm_partition"] == "gpu"
    text = render_sbatch(plan)
    assert "#SBATCH --array=0-2%2" in text
    assert "#SBATCH --partition=gpu" in text
    assert "#SBATCH --exclusive" in text
    assert "#SBATCH --gpus-per-node=1" in text


def test_cli_dry_run_lists_configs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec_path = tmp_path / "s.yaml"
    spec_path.write_text(SPEC)
    from uvmlab.cli import main

    code = main(
        [
            "sweep",
            str(spec_path),
            "-o",
            str(tmp_path / "out"),
            "--dry-run",
            "--executor",
            "slurm",
            "--configs-per-task",
            "4",
            "--format",
            "json",
        ]
    )
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["configs"]) == 8 and {c["status"] for c in data["configs"]} == {"pending"}
    assert data["plan"]["array_size"] == 2
    assert not (tmp_path / "out").exists()


def test_slurm_without_sbatch_is_unavailable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    if shutil.which("sbatch"):
        pytest.skip("this machine has Slurm's sbatch")
    spec_path = tmp_path / "s.yaml"
    spec_path.write_text(SPEC)
    from uvmlab.cli import main

    assert main(["sweep", str(spec_path), "-o", str(tmp_path / "out"), "--executor", "slurm"]) == 2
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("flag", "value", "message"), [("--gpus", "-1", ">= 0"), ("--time-min", "0", ">= 1")])
def test_cli_slurm_overrides_follow_the_spec_rules(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str, message: str
) -> None:
    spec_path = tmp_path / "s.yaml"
    spec_path.write_text(SPEC)
    from uvmlab.cli import main

    code = main(["sweep", str(spec_path), "-o", str(tmp_path / "out"), "--dry-run", flag, value])
    assert code == 2
    assert f"{flag} must be {message}, not {value}" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_sweep_never_replaces_sweep_files_it_did_not_write(tmp_path: Path, fake_env: dict[str, str]) -> None:
    """A folder holding a user's sweep.json (not uvmlab's: no run_ids) is refused before anything is written."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "sweep.json").write_text('{"mine": 1}')
    with pytest.raises(InputError, match="did not write"):
        run_sweep(parse_spec(SPEC), out, jobs=1, progress=False)
    assert (out / "sweep.json").read_text() == '{"mine": 1}' and not (out / "runs").exists()
