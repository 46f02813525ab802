"""GPU-mode plans (dry run): golden files for the six workloads at factors 1.25 and 4, PCA on and off, and the plan's
rules (environment, alloc conf, steps, footprint sources).

A missing or different golden FAILS. To regenerate after an intended change: UVMLAB_UPDATE_GOLDEN=1 pytest
tests/test_gpu_plan.py, then review the diff of tests/golden/.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import pytest

from uvmlab.config import RunConfig, WorkloadConfig
from uvmlab.errors import InputError
from uvmlab.measure.gpu import shim
from uvmlab.measure.gpu.detect import GpuStatus
from uvmlab.measure.gpu.runner import REQUIRED_ALLOC_CONF, GpuRunOptions, build_alloc_conf, format_plan, plan_run
from uvmlab.units import GiB

GOLDEN = Path(__file__).parent / "golden"
NO_GPU = GpuStatus(False, "no NVIDIA driver (test)")
FOOTPRINTS = {
    # Fixed stand-ins (bytes) so the goldens test the plan, not the estimator (uvmlab.uvm.simulate owns that number).
    "alexnet": 6 * GiB,
    "resnet50": 14 * GiB,
    "resnet101": 20 * GiB,
    "gpt2": 36 * GiB,
    "bert": 24 * GiB,
    "whisper-small": 30 * GiB,
}
CASES = [(w, f, pca) for w in FOOTPRINTS for f in (1.25, 4.0) for pca in (True, False)]


def _plan(workload: str, factor: float, pca: bool, **opts):
    cfg = RunConfig(WorkloadConfig(workload), oversub=factor, pca=pca, mode="gpu", gpu="A100-80GB")
    o = GpuRunOptions(footprint=FOOTPRINTS[workload], nsys=True, baseline=True, host_memory_bytes=512 * GiB, **opts)
    return plan_run(cfg, o, "/RUN", status=NO_GPU)


def _normalized(text: str) -> str:
    return text.replace(str(shim.shim_path()), "<SHIM>").replace(sys.executable, "<PYTHON>")


@pytest.mark.parametrize(("workload", "factor", "pca"), CASES)
def test_dry_run_matches_golden(workload: str, factor: float, pca: bool) -> None:
    text = _normalized(format_plan(_plan(workload, factor, pca)))
    path = GOLDEN / f"plan_{workload}_f{factor:g}_pca-{'on' if pca else 'off'}.txt"
    if os.environ.get("UVMLAB_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert path.is_file(), f"golden file {path} is missing; create it with UVMLAB_UPDATE_GOLDEN=1 and review it"
    assert text == path.read_text(), f"the dry run of {workload} f={factor} pca={pca} differs from {path}"


@pytest.mark.parametrize(("workload", "factor", "pca"), CASES)
def test_plan_rules(workload: str, factor: float, pca: bool) -> None:
    plan = _plan(workload, factor, pca)
    b = plan.balloon
    assert [s.name for s in plan.steps] == ["baseline", "run", "export"]
    # balloon arithmetic: capacity = footprint / factor (2 MiB floor); the balloon takes the rest
    assert b.available_bytes == int(FOOTPRINTS[workload] / factor) // (2 << 20) * (2 << 20)
    assert b.balloon_bytes + b.context_bytes + b.reserve_bytes + b.available_bytes == 80 * GiB
    run, base = plan.step("run"), plan.step("baseline")
    for step in (run, base):
        assert step.env["PYTORCH_CUDA_ALLOC_CONF"] == REQUIRED_ALLOC_CONF
        assert step.env["LD_PRELOAD"] == str(shim.shim_path())
        assert ("PYTORCH_NO_CUDA_MEMORY_CACHING" in step.env) is (not pca)
    assert run.env["UVMLAB_SHIM_MODE"] == "managed" and base.env["UVMLAB_SHIM_MODE"] == "passthrough"
    assert run.env["UVMLAB_BALLOON_LEAVE_BYTES"] == str(b.available_bytes + b.reserve_bytes)
    assert "UVMLAB_BALLOON_LEAVE_BYTES" not in base.env
    assert run.env["UVMLAB_ALLOC_LOG"] == "/RUN/logs/run.alloc.bin"
    assert run.argv[:2] == ("nsys", "profile") and "--cuda-um-gpu-page-faults=true" in run.argv
    assert run.argv[-6:] == (sys.executable, "-m", "uvmlab.measure.gpu.worker", "/RUN", "--role", "run")
    assert plan.step("export").argv[-1] == "/RUN/logs/profile.nsys-rep"
    assert any("no GPU here" in n for n in plan.notes)


def test_format_plan_is_shell_quoted() -> None:
    plan = _plan("gpt2", 4.0, False, alloc_conf="roundup_power2_divisions:[256:1,>:4]")
    line = next(ln for ln in format_plan(plan).splitlines() if "--role run" in ln)
    tokens = shlex.split(line.removeprefix("  "))
    assert (
        "PYTORCH_CUDA_ALLOC_CONF=backend:native,expandable_segments:False,roundup_power2_divisions:[256:1,>:4]"
        in tokens
    )


def test_measure_plans_a_calibration_step_and_replans() -> None:
    cfg = RunConfig(WorkloadConfig("gpt2"), oversub=4, pca=True, mode="gpu")
    opts = GpuRunOptions(footprint="measure", host_memory_bytes=512 * GiB)
    plan = plan_run(cfg, opts, "/RUN", status=NO_GPU, estimate=lambda c: 20 * GiB)
    assert plan.needs_measurement and [s.name for s in plan.steps] == ["calibrate", "run"]
    cal = plan.step("calibrate")
    assert "UVMLAB_BALLOON_LEAVE_BYTES" not in cal.env and cal.argv[-2:] == ("--iterations", "2")
    assert "re-planned with the measured footprint" in format_plan(plan)
    again = plan_run(cfg, opts, "/RUN", status=NO_GPU, measured_footprint_bytes=8 * GiB)
    assert not again.needs_measurement and [s.name for s in again.steps] == ["run"]
    assert again.balloon.footprint_bytes == 8 * GiB and again.footprint_source.startswith("measured")


def test_estimate_calls_the_simulator_hook() -> None:
    cfg = RunConfig(WorkloadConfig("bert"), oversub=2, mode="gpu")
    seen = []
    plan = plan_run(cfg, GpuRunOptions(), "/RUN", status=NO_GPU, estimate=lambda c: seen.append(c) or 10 * GiB)
    assert seen == [cfg] and plan.balloon.footprint_bytes == 10 * GiB


def test_detected_gpu_is_used_over_the_spec() -> None:
    cfg = RunConfig(WorkloadConfig("gpt2"), oversub=2, mode="gpu", gpu="A100-80GB")
    status = GpuStatus(True, "", "NVIDIA H100 80GB HBM3", 81559347200, "580.1", "13.0", 0, 1)
    plan = plan_run(cfg, GpuRunOptions(footprint=20 * GiB, host_memory_bytes=512 * GiB), "/RUN", status=status)
    assert plan.gpu_name == "NVIDIA H100 80GB HBM3" and plan.gpu_source == "detected"
    assert plan.balloon.total_bytes == 81559347200 and not any("no GPU" in n for n in plan.notes)


def test_gpu_memory_override_applies_to_the_assumed_gpu() -> None:
    cfg = RunConfig(WorkloadConfig("gpt2"), oversub=2, mode="gpu", gpu="A100-80GB", gpu_memory_bytes=40 * GiB)
    plan = plan_run(cfg, GpuRunOptions(footprint=20 * GiB), "/RUN", status=NO_GPU)
    assert plan.balloon.total_bytes == 40 * GiB


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("backend:cudaMallocAsync", "never calls cudaMalloc"),
        ("expandable_segments:True", "cuMemCreate"),
        ("garbage", "key:value"),
    ],
)
def test_alloc_conf_refuses_what_the_shim_cannot_see(extra: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        build_alloc_conf(extra)


def test_alloc_conf_keeps_user_entries() -> None:
    assert build_alloc_conf(" max_split_size_mb:128 , expandable_segments:false") == (
        f"{REQUIRED_ALLOC_CONF},max_split_size_mb:128"
    )


def test_baseline_refused_when_the_job_cannot_fit_natively() -> None:
    cfg = RunConfig(WorkloadConfig("gpt2"), oversub=4, mode="gpu", gpu="A100-80GB")
    with pytest.raises(InputError, match="drop --baseline"):
        plan_run(
            cfg, GpuRunOptions(footprint=200 * GiB, baseline=True, host_memory_bytes=1024 * GiB), "/R", status=NO_GPU
        )


def test_bad_footprint_option() -> None:
    with pytest.raises(InputError, match="--footprint"):
        GpuRunOptions(footprint="guess")
    with pytest.raises(InputError, match="--footprint"):
        GpuRunOptions(footprint=0)


def test_measure_without_standin_or_with_a_refused_estimate_keeps_only_calibrate() -> None:
    cfg = RunConfig(WorkloadConfig("gpt2"), oversub=4, pca=True, mode="gpu")
    opts = GpuRunOptions(footprint="measure", baseline=True, host_memory_bytes=512 * GiB)

    def never(c: RunConfig) -> int:
        raise AssertionError("the estimate must not be computed")

    plan = plan_run(cfg, opts, "/RUN", status=NO_GPU, estimate=never, standin=False)
    assert [s.name for s in plan.steps] == ["calibrate"] and plan.balloon is None
    assert "footprint: unknown, to be measured by the calibrate step" in format_plan(plan)
    refused = plan_run(cfg, opts, "/RUN", status=NO_GPU, estimate=lambda c: 300 * GiB)
    assert [s.name for s in refused.steps] == ["calibrate"] and refused.balloon is None
    assert any("would be refused" in n for n in refused.notes)
