"""Collocation: the fit verdict arithmetic and the round-robin UVM simulation on synthetic jobs."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import pytest

from uvmlab.colocate import DEFAULT_MARGIN_BYTES, Job, colocate, parse_job, simulate_together
from uvmlab.errors import InputError
from uvmlab.gpus import get_gpu
from uvmlab.trace.schema import NEVER_FREED, Trace
from uvmlab.units import GiB, MiB


@dataclass
class FakePlacement:
    """One managed range per tensor (what the nocache allocator does), for unit tests of the loop."""

    blocks: pd.DataFrame
    ranges: pd.DataFrame
    peak_reserved_bytes: int


def synthetic_job(name: str, n_tensors: int, tensor_bytes: int, n_kernels: int) -> Job:
    """n_tensors live all run; each kernel reads every tensor and writes the first one."""
    alloc = pd.DataFrame(
        {
            "alloc_id": range(n_tensors),
            "size_bytes": tensor_bytes,
            "alloc_seq": range(n_tensors),
            "free_seq": NEVER_FREED,
            "category": "activation",
            "phase": "forward",
            "iteration": 0,
            "op": "x",
            "stream": 0,
        }
    ).astype({"iteration": "int32", "stream": "int32"})
    kernels = pd.DataFrame(
        {
            "kernel_id": range(n_kernels),
            "seq": range(n_tensors, n_tensors + n_kernels),
            "name": "k",
            "phase": "forward",
            "iteration": 0,
            "flops": 1e9,
            "stream": 0,
        }
    ).astype({"iteration": "int32", "stream": "int32"})
    acc = pd.DataFrame(
        [(k, t, 0, tensor_bytes, t == 0) for k in range(n_kernels) for t in range(n_tensors)],
        columns=["kernel_id", "alloc_id", "offset_bytes", "size_bytes", "is_write"],
    )
    trace = Trace(allocations=alloc, kernels=kernels, accesses=acc)
    blocks = pd.DataFrame(
        {
            "alloc_id": range(n_tensors),
            "address": [i * tensor_bytes for i in range(n_tensors)],
            "block_bytes": tensor_bytes,
            "range_id": range(n_tensors),
        }
    )
    ranges = pd.DataFrame(
        {
            "range_id": range(n_tensors),
            "address": blocks["address"],
            "size_bytes": tensor_bytes,
            "alloc_seq": range(n_tensors),
            "free_seq": NEVER_FREED,
        }
    )
    return Job(name, None, trace, FakePlacement(blocks, ranges, n_tensors * tensor_bytes))


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


def test_verdict_arithmetic() -> None:
    gpu = get_gpu("A100-80GB")
    a = synthetic_job("a", 4, 64 * MiB, 2)
    b = synthetic_job("b", 4, 64 * MiB, 2)
    res = colocate([a, b], gpu, simulate="no")
    assert res.need_bytes == 2 * (256 * MiB + gpu.context_bytes) + DEFAULT_MARGIN_BYTES
    assert res.fits and res.uvm is None
    small = gpu.with_memory(2 * gpu.context_bytes + 300 * MiB)  # room for one job, not two
    res = colocate([a, b], small, margin_bytes=0, simulate="no")
    assert not res.fits and res.need_bytes == 2 * (256 * MiB + gpu.context_bytes)


def test_oversubscribed_jobs_fault_more_than_alone() -> None:
    gpu = get_gpu("A100-80GB")
    small = gpu.with_memory(2 * gpu.context_bytes + 300 * MiB)
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
