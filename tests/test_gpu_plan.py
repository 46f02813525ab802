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


def _policy_plan(policy: str, **opts):
    from uvmlab.advise.policies import get_policy

    cfg = get_policy(policy).apply(RunConfig(WorkloadConfig("gpt2"), oversub=2.0, mode="gpu", gpu="A100-80GB"))
    o = GpuRunOptions(footprint=36 * GiB, baseline=True, host_memory_bytes=512 * GiB, shim_library="/x.so", **opts)
    return plan_run(cfg, o, "/RUN", status=NO_GPU)


@pytest.mark.parametrize("policy", ["read-mostly-parameters", "remote-optimizer-state", "prefetch-next-kernel"])
def test_hints_reach_the_managed_steps_only(policy: str) -> None:
    """Issue 26 defect 4: the baseline step runs on device memory, where cudaMemAdvise / cudaMemPrefetchAsync fail
    (CUDA 13 header: the range must be managed), so it must not get UVMLAB_HINTS."""
    plan = _policy_plan(policy)
    assert "UVMLAB_HINTS" not in plan.step("baseline").env
    assert plan.step("run").env["UVMLAB_HINTS"] == policy
    assert any("baseline runs the job without them" in n for n in plan.notes)


def test_gc_threshold_sets_a_memory_fraction_on_the_run_step() -> None:
    """Issue 26 defect 5: PyTorch's garbage_collection_threshold acts only with a memory fraction set
    (CUDACachingAllocator.cpp malloc: set_fraction && threshold > 0); the run step now carries one."""
    plan = _policy_plan("gc-threshold-0.8")
    b, run = plan.balloon, plan.step("run")
    assert "garbage_collection_threshold:0.8" in run.env["PYTORCH_CUDA_ALLOC_CONF"]
    assert float(run.env["UVMLAB_MEMORY_FRACTION"]) == pytest.approx(b.available_bytes / b.total_bytes, abs=1e-6)
    assert "UVMLAB_MEMORY_FRACTION" not in plan.step("baseline").env
    assert any("acts only with a memory fraction" in n for n in plan.notes)
    assert "UVMLAB_MEMORY_FRACTION" not in _policy_plan("max-split-128").step("run").env
    given = _policy_plan("gc-threshold-0.8", alloc_conf="per_process_memory_fraction:0.5")
    assert "UVMLAB_MEMORY_FRACTION" not in given.step("run").env  # the user's own fraction wins


def test_an_oversubscribed_run_requires_concurrent_managed_access() -> None:
    assert _plan("gpt2", 4.0, True).step("run").env["UVMLAB_REQUIRE_CONCURRENT_MANAGED"] == "1"
    assert "UVMLAB_REQUIRE_CONCURRENT_MANAGED" not in _plan("gpt2", 4.0, True).step("baseline").env


def test_inherited_variables_that_change_the_experiment_are_dropped_and_verbose_is_kept() -> None:
    """Issue 26 defect 6: CUBLAS_WORKSPACE_CONFIG, CUBLASLT_WORKSPACE_SIZE and CUDA_LAUNCH_BLOCKING change the
    footprint or the timing and were inherited; UVMLAB_SHIM_VERBOSE (a diagnostic) was dropped with every other
    UVMLAB_* variable, so the checklist's tip could not work."""
    from uvmlab.measure.gpu.plan import step_environment

    parent = {
        "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
        "CUBLASLT_WORKSPACE_SIZE": "1024",
        "CUDA_LAUNCH_BLOCKING": "1",
        "UVMLAB_SHIM_VERBOSE": "1",
        "UVMLAB_BALLOON_BYTES": "5",
        "HOME": "/home/x",
    }
    run = _plan("gpt2", 4.0, True).step("run")
    env = step_environment(run, parent)
    assert not {"CUBLAS_WORKSPACE_CONFIG", "CUBLASLT_WORKSPACE_SIZE", "CUDA_LAUNCH_BLOCKING"} & set(env)
    assert env["UVMLAB_SHIM_VERBOSE"] == "1" and "UVMLAB_BALLOON_BYTES" not in env and env["HOME"] == "/home/x"
    from uvmlab.measure.gpu.plan import dropped_from

    assert set(dropped_from(parent)) == set(parent) - {"UVMLAB_SHIM_VERBOSE", "HOME"}  # recorded in env.json


def test_a_pasted_dry_run_command_does_not_bring_back_dropped_variables(tmp_path: Path) -> None:
    """Issue 26 defect 6: the printed command set the step's variables but kept the shell's, so pasting it brought
    back what the plan removed (e.g. PYTORCH_NO_CUDA_MEMORY_CACHING turning a PCA-on run uncached). The printed
    line now unsets them: run through bash here with a stray environment, it sees none of them."""
    import json
    import subprocess
    from dataclasses import replace

    from uvmlab.measure.gpu.plan import Step

    plan = _plan("gpt2", 4.0, True)
    run = plan.step("run")
    probe = Step("probe", (sys.executable, "-c", "import json, os; print(json.dumps(dict(os.environ)))"),
                 run.env, str(tmp_path), "")  # fmt: skip
    printed = format_plan(replace(plan, steps=(probe,), needs_measurement=False)).splitlines()
    line = printed[printed.index("step 1: probe: ") + 1].removeprefix("  ")
    assert line.startswith(f"cd {tmp_path} && env -u PYTORCH_NO_CUDA_MEMORY_CACHING ")
    stray = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "UVMLAB_BALLOON_BYTES": "5", "CUDA_LAUNCH_BLOCKING": "1"}
    proc = subprocess.run(["bash", "-c", line], env={**os.environ, **stray}, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert not set(stray) & set(seen)
    assert seen["UVMLAB_BALLOON_LEAVE_BYTES"] == run.env["UVMLAB_BALLOON_LEAVE_BYTES"]
