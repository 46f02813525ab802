"""Collocation: the fit verdict arithmetic and the round-robin UVM simulation on synthetic jobs."""

from __future__ import annotations

from dataclasses import replace

import pytest
from eval_helpers import synthetic_job

from uvmlab.errors import InputError
from uvmlab.gpus import get_gpu
from uvmlab.memory.colocate import DEFAULT_MARGIN_BYTES, colocate, parse_job, simulate_together
from uvmlab.memory.devicemem import context_model
from uvmlab.memory.estimate import required_margin
from uvmlab.units import GiB, MiB


def test_parse_job() -> None:
    assert parse_job("gpt2:8").batch_size == 8
    assert parse_job("resnet50").batch_size is None
    assert parse_job("dir/my_model.py:4").workload == "dir/my_model.py"
    cfg = parse_job("resnet50:8,image_size=64,num_classes=10")
    assert cfg.batch_size == 8 and cfg.options == {"image_size": 64, "num_classes": 10}
    with pytest.raises(InputError, match="KEY=VALUE"):
        parse_job("gpt2:2,n_layer")
    with pytest.raises(InputError, match=">= 1"):
        parse_job("gpt2:0")
    with pytest.raises(InputError):
        parse_job(":8")


CONTEXT = context_model("A100-80GB").total_bytes
"""The CUDA context of a job without convolutions on an A100 (the rule uvmlab estimate uses): 429 MiB."""


def test_verdict_arithmetic() -> None:
    gpu = get_gpu("A100-80GB")
    a = synthetic_job("a", 4, 64 * MiB, 2)
    b = synthetic_job("b", 4, 64 * MiB, 2)
    res = colocate([a, b], gpu, simulate="no")
    device_peak = 256 * MiB + CONTEXT
    model_margin = required_margin(device_peak, a.trace)[0]  # uvmlab estimate's required_mb rule, per job
    assert model_margin > 0 and list(res.verdict["model_margin_bytes"]) == [model_margin] * 2
    assert res.need_bytes == 2 * (device_peak + model_margin) + DEFAULT_MARGIN_BYTES
    assert res.fits and res.uvm is None
    small = gpu.with_memory(2 * CONTEXT + 300 * MiB)  # room for one job, not two
    res = colocate([a, b], small, margin_bytes=0, simulate="no")
    assert not res.fits and res.need_bytes == 2 * (device_peak + model_margin)
    given = replace(gpu, context_bytes=600 * MiB)  # a GpuSpec's explicit context is kept, as in estimate
    assert set(colocate([a, b], given, simulate="no").verdict["context_bytes"]) == {600 * MiB}


def test_oversubscribed_jobs_fault_more_than_alone() -> None:
    gpu = get_gpu("A100-80GB")
    small = gpu.with_memory(2 * CONTEXT + 300 * MiB)
    a = synthetic_job("a", 4, 64 * MiB, 6)
    b = synthetic_job("b", 4, 64 * MiB, 6)
    res = colocate([a, b], small, margin_bytes=0)
    assert not res.fits and res.uvm_capacity_bytes == 300 * MiB
    uvm = res.uvm.set_index("job")
    # alone each job's 256 MiB fits: only first-touch faults; together 512 MiB cycle through 300 MiB
    for j in ("a", "b"):
        assert uvm.loc[j, "fault_count"] > uvm.loc[j, "fault_count_alone"]
        assert uvm.loc[j, "dtoh_bytes"] > 0 and uvm.loc[j, "dtoh_bytes_alone"] == 0
        assert uvm.loc[j, "slowdown"] > 1.0
        assert uvm.loc[j, "kernels"] == 6


def test_round_robin_alone_equals_single_run() -> None:
    gpu = get_gpu("A100-80GB")
    a = synthetic_job("a", 2, 8 * MiB, 3)
    one = simulate_together([a], 1 * GiB, gpu).iloc[0]
    again = simulate_together([a], 1 * GiB, gpu).iloc[0]
    assert one["fault_count"] == again["fault_count"] > 0  # deterministic; first touch faults
    assert one["eviction_count"] == 0


def test_bad_inputs() -> None:
    gpu = get_gpu("A100-80GB")
    a = synthetic_job("a", 1, MiB, 1)
    with pytest.raises(InputError):
        colocate([], gpu)
    with pytest.raises(InputError):
        colocate([a], gpu, simulate="maybe")
    with pytest.raises(InputError):
        colocate([a], gpu, margin_bytes=-1)
