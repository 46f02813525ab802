"""Device peak: the context model (uvmlab.memory.devicemem), device_peak_bytes, and the cuDNN workspace sequence."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_orchestrate_rules import training_trace
from uvmlab.config import WorkloadConfig
from uvmlab.errors import InputError
from uvmlab.gpus import get_gpu
from uvmlab.memory.devicemem import (
    EAGER_MODULES_A100_BYTES,
    LAZY_CONTEXT_OTHER_BYTES,
    context_model,
    lmem_bytes,
)
from uvmlab.memory.estimate import estimate
from uvmlab.trace.orchestrate import OrchestrationRules, to_cuda

MiB = 1 << 20
A100 = get_gpu("A100-40GB")
CFG = WorkloadConfig(workload="synthetic")
SNAPSHOTS = Path(__file__).resolve().parents[2] / "shared" / "real-data" / "snapshots"


def test_lmem_is_sms_times_threads_times_stack() -> None:
    assert lmem_bytes("A100-40GB") == 108 * 2048 * 1024 == 216 * MiB
    assert lmem_bytes("RTX3060") == 28 * 1536 * 1024
    assert lmem_bytes("H100-PCIe") == 114 * 2048 * 1024  # longest prefix wins over "H100"
    assert lmem_bytes("H100-80GB") == 132 * 2048 * 1024


def test_context_model_parts_and_sources() -> None:
    lazy = context_model("A100-40GB")
    assert lazy.total_bytes == 216 * MiB + LAZY_CONTEXT_OTHER_BYTES and lazy.eager_modules_bytes == 0
    # the lazy Ada measurement (426 MiB) is reproduced by construction on its own GPU's SM count
    assert 426 * MiB == 142 * 1536 * 1024 + LAZY_CONTEXT_OTHER_BYTES
    eager = context_model("A100-40GB", "eager")
    assert eager.total_bytes - lazy.total_bytes == EAGER_MODULES_A100_BYTES
    assert context_model("A6000", "eager").notes  # the eager size was measured on an A100 stack
    assert context_model("NoSuchGPU").notes
    with pytest.raises(InputError):
        context_model("A100-40GB", "sometimes")


def test_device_peak_is_context_plus_reserved_and_required_adds_margin() -> None:
    est = estimate(CFG, A100, trace=training_trace(conv=True))
    j = est.to_json()
    lazy = context_model("A100-40GB", convolutions=True)  # the trace launches convolutions
    assert j["context_bytes"] == lazy.total_bytes == j["context_model"]["total_bytes"]
    assert j["device_peak_bytes"] == j["context_bytes"] + j["peak_reserved_bytes"] + j["outside_allocator_bytes"]
    assert j["required_bytes"] == j["device_peak_bytes"] + j["margin_bytes"]
    eager = estimate(CFG, A100, trace=training_trace(conv=True), module_loading="eager")
    # eager loads PyTorch's and cuBLAS's kernels up front and cuDNN's convolution images at the first convolution:
    # they replace the lazily loaded convolution modules
    ctx = eager.context
    assert ctx is not None and ctx.eager_cudnn_bytes > 0
    assert eager.device_peak_bytes - est.device_peak_bytes == (
        EAGER_MODULES_A100_BYTES + ctx.eager_cudnn_bytes - lazy.lazy_conv_modules_bytes
    )
    assert eager.usable_bytes == A100.memory_bytes - eager.context_bytes  # the context comes off the capacity


def test_cudnn_benchmark_adds_one_trial_per_distinct_conv_before_its_workspace() -> None:
    t = training_trace(iterations=3, conv=True)
    out = to_cuda(t, A100, OrchestrationRules(cudnn_benchmark=True))
    a = out.allocations
    trials = a[a["op"] == "cudnn_benchmark_workspace"]
    calls = a[a["op"] == "cudnn_workspace"].sort_values("alloc_seq")
    assert len(trials) == 1 and len(calls) == 3  # same convolution each iteration: benchmark_cache hit after one
    trial, first = trials.iloc[0], calls.iloc[0]
    assert trial["alloc_seq"] + 1 == trial["free_seq"] < first["alloc_seq"]  # freed before the chosen plan runs
    # the largest candidate engine's workspace (Conv_v8.cpp generate_and_filter_plans), not the whole device
    assert trial["size_bytes"] < (A100.memory_bytes - A100.context_bytes) // 4
    assert out.header["orchestration"]["cudnn_benchmark_trial_peak_bytes"] == trial["size_bytes"]
    plain = to_cuda(t, A100)
    assert (plain.allocations["op"] == "cudnn_benchmark_workspace").sum() == 0
    assert plain.header["orchestration"]["cudnn_benchmark_trial_peak_bytes"] is None


def test_cudnn_benchmark_raises_the_device_peak() -> None:
    t = training_trace(conv=True)
    plain = estimate(CFG, A100, trace=t)
    bench = estimate(CFG, A100, trace=t, rules=OrchestrationRules(cudnn_benchmark=True))
    assert bench.peak_reserved_bytes >= plain.peak_reserved_bytes
    assert bench.device_peak_bytes < A100.memory_bytes // 2  # a trial is one candidate's workspace (issue 25)


@pytest.mark.skipif(not SNAPSHOTS.is_dir(), reason="../shared/real-data/snapshots absent")
def test_real_cudnn_workspaces_are_per_call_temporaries() -> None:
    """In a real snapshot with frames, every workspace PyTorch's run_conv_plan allocates is freed before the next
    cuDNN workspace is allocated: the sequence rule_cudnn_workspace models (one temporary per call)."""
    from uvmlab.trace.safe_pickle import safe_load_file

    path = SNAPSHOTS / "HugePandaCoder__octree-nca-groupeq__0cc72993__my_snapshot.pickle"
    if not path.is_file():
        pytest.skip(f"{path.name} absent")
    data = safe_load_file(path)
    events = data["device_traces"][0]
    live: set[int] = set()
    sizes: list[int] = []
    for e in events:
        names = " ".join(str(f.get("name", "")) for f in e.get("frames") or [])
        if "run_conv_plan" not in names:
            continue
        if e["action"] == "alloc":
            assert not live, "a second cuDNN workspace while one is live"
            live.add(e["addr"])
            sizes.append(int(e["size"]))
        elif e["action"] == "free_completed":
            live.discard(e["addr"])
    assert len(sizes) == 45 and not live
    # the sizes seen: 4 MiB and 128 MiB (engine-specific; our size rule is an approximation, docs/estimate.md)
    assert sorted(set(sizes)) == [4 * MiB, 128 * MiB]


def test_lazy_loading_adds_conv_modules_only_to_runs_with_convolutions() -> None:
    """The lazily loaded cuDNN/cuBLAS modules of a CNN (calibrated on CARMA's CIFAR rows) count under lazy loading,
    for runs that launch convolutions; eager loading holds PyTorch's and cuBLAS's kernels for every run and cuDNN's
    convolution sub-libraries only for runs that convolve (their sm_80 images, tools/module_images.py)."""
    from uvmlab.memory.devicemem import LAZY_CONV_MODULES_BYTES, context_model

    plain = context_model("A100-40GB", "lazy")
    cnn = context_model("A100-40GB", "lazy", convolutions=True)
    assert cnn.total_bytes - plain.total_bytes == LAZY_CONV_MODULES_BYTES == 93 * 2**20
    eager = context_model("A100-40GB", "eager")
    eager_cnn = context_model("A100-40GB", "eager", convolutions=True)
    assert eager_cnn.total_bytes - eager.total_bytes == eager_cnn.eager_cudnn_bytes
    assert eager_cnn.by_library()["cudnn"] == int((215.4 + 6.5 + 0.3 + 42.9) * 2**20)  # the sm_80 images
    assert sum(eager_cnn.by_library().values()) == eager_cnn.total_bytes
    assert cnn.to_json()["lazy_conv_modules_bytes"] == LAZY_CONV_MODULES_BYTES
