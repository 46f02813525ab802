"""Job shape without surprises (issue 28 item 2): the effective batch kept exactly, estimate's margin, the BatchNorm
warning, micro-batch time from the simulator's kernel model and k micro-batches from two."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from uvmlab.advise.advisor import (
    FIT_STEPS,
    MIN_BATCH_STAT_MICRO_BATCH,
    batch_stat_ops,
    batch_stat_warning,
    fit_batch,
    fit_margin,
    last_micro_batch,
)
from uvmlab.config import RunConfig, WorkloadConfig
from uvmlab.memory.estimate import default_margin
from uvmlab.units import GiB, MiB

TINY_GPT2 = {"n_layer": 2, "n_embd": 64, "n_head": 2, "vocab_size": 512, "seq_len": 64, "n_positions": 64}


def _linear_footprint(fixed: int, per_sample: int):
    def footprint(cfg: RunConfig) -> int:
        return fixed + per_sample * cfg.workload.batch_size

    return footprint


def test_the_fit_margin_is_estimates() -> None:
    for fp in (100 * MiB, 4 * GiB, 40 * GiB):
        assert fit_margin(fp) == default_margin(fp)
    assert fit_margin(100 * MiB) == 256 * MiB  # the floor that made a 58 MiB slack "fit" before


def test_fit_keeps_the_effective_batch_exactly_and_leaves_estimates_margin() -> None:
    cfg = RunConfig(workload=WorkloadConfig("alexnet", batch_size=32))
    fp = _linear_footprint(1 * GiB, 100 * MiB)
    # 1 GiB + 11 x 100 MiB would fit without a margin; with estimate's 256 MiB only 8 (a divisor of 32) does
    avail = 1 * GiB + 11 * 100 * MiB
    micro, k = fit_batch(cfg, avail, 32, fp)
    assert micro * k == 32 and micro == 8
    used = fp(replace(cfg, workload=replace(cfg.workload, batch_size=micro)))
    assert used + default_margin(used) <= avail
    assert fit_batch(cfg, 1 * GiB, 32, fp) is None  # not even micro-batch 1
    assert fit_batch(cfg, 10 * GiB, 32, fp) == (32, 1)  # the given batch fits


@settings(max_examples=40, deadline=None)
@given(
    batch=st.integers(1, 96), fixed_mib=st.integers(64, 4096), per=st.integers(1, 400), avail_mib=st.integers(1, 40000)
)
def test_fit_is_the_largest_divisor_micro_batch_that_fits(batch: int, fixed_mib: int, per: int, avail_mib: int) -> None:
    cfg = RunConfig(workload=WorkloadConfig("alexnet", batch_size=batch))
    fp = _linear_footprint(fixed_mib * MiB, per * MiB)
    avail = avail_mib * MiB

    def fits(m: int) -> bool:
        f = fp(replace(cfg, workload=replace(cfg.workload, batch_size=m)))
        return f + default_margin(f) <= avail

    got = fit_batch(cfg, avail, batch, fp)
    fitting = [m for m in range(1, batch + 1) if batch % m == 0 and fits(m)]
    if not fitting:
        assert got is None
        return
    assert got is not None and got[0] * got[1] == batch
    assert got[0] == max(fitting)


def test_the_search_sizes_the_accumulating_loop_of_at_most_two_micro_batches() -> None:
    seen: list[tuple[int, int]] = []

    def fp(cfg: RunConfig) -> int:
        seen.append((cfg.workload.batch_size, cfg.workload.accumulation_steps))
        return cfg.workload.batch_size * GiB

    fit_batch(RunConfig(workload=WorkloadConfig("alexnet", batch_size=16)), 3 * GiB, 16, fp)
    assert all(steps == min(16 // m, FIT_STEPS) for m, steps in seen)


def test_batchnorm_warning_below_eight_samples() -> None:
    k = pd.DataFrame({"name": ["aten::convolution", "aten::native_batch_norm", "aten::relu"], "phase": ["forward"] * 3})
    trace = type("T", (), {"kernels": k})()
    ops = batch_stat_ops(trace)
    assert ops == ["native_batch_norm"]
    assert "BatchNorm" in batch_stat_warning(ops, 3) and "micro-batches of 3" in batch_stat_warning(ops, 3)
    assert batch_stat_warning(ops, MIN_BATCH_STAT_MICRO_BATCH) == ""
    ln = pd.DataFrame({"name": ["aten::native_layer_norm"], "phase": ["forward"]})
    assert batch_stat_ops(type("T", (), {"kernels": ln})()) == []  # a per-sample norm: no warning


BN_NET = """
import torch
import torch.nn.functional as F
from workloads.base import Workload

DEFAULT_BATCH_SIZE = 32


def build(cfg, device, options):
    dev = torch.device(device)
    with dev:
        layers = []
        for c_in in (3, 64, 64):
            layers += [torch.nn.Conv2d(c_in, 64, 3, padding=1), torch.nn.BatchNorm2d(64), torch.nn.ReLU()]
        model = torch.nn.Sequential(*layers, torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, 10))
    batch = cfg.batch_size or DEFAULT_BATCH_SIZE

    def make_batch():
        return torch.randn(batch, 3, 128, 128, device=dev), torch.randint(0, 10, (batch,), device=dev)

    return Workload("bn_net", model, make_batch, lambda m, b: F.cross_entropy(m(b[0]), b[1]), dev)
"""


def test_a_batchnorm_net_fit_below_eight_samples_carries_the_caveat(tmp_path) -> None:
    """A small conv net with BatchNorm whose activations dominate: at x3 only micro-batches below 8 fit."""
    from uvmlab.advise.advisor import advise

    path = tmp_path / "bn_net.py"
    path.write_text(BN_NET)
    wl = WorkloadConfig(str(path), iterations=2, optimizer="sgd")
    adv = advise(RunConfig(workload=wl, oversub=3.0, mode="sim"), policies=["pca-on", "fit-batch-accumulate"],
                 combine=False)  # fmt: skip
    row = next(r for r in adv.records() if r["policy"] == "fit-batch-accumulate")
    assert row["outcome"] == "ok", row["note"]
    assert row["batch_size"] * row["accumulation_steps"] == 32 and row["batch_size"] < MIN_BATCH_STAT_MICRO_BATCH
    assert "effective batch 32" in row["note"] and "kept exactly" in row["note"]
    assert any("BatchNorm" in c and f"micro-batches of {row['batch_size']}" in c for c in row["caveats"])
    assert row["time_per_sample_ns"] == pytest.approx(row["iteration_time_ns"] / 32)


def test_last_micro_batch_spans_the_second_loop_body() -> None:
    k = pd.DataFrame(
        {
            "iteration": [0] * 7,
            "phase": ["data", "forward", "backward", "data", "forward", "backward", "optimizer"],
            "start_ns": [0.0, 1, 3, 6, 7, 9, 12],
            "end_ns": [1.0, 3, 6, 7, 9, 12, 13],
            "fault_count": [0, 1, 2, 3, 4, 5, 6],
        }
    )
    last = last_micro_batch(k, ("fault_count",))
    assert last["time_ns"].tolist() == [6.0] and last["fault_count"].tolist() == [12.0]


@pytest.fixture(scope="module")
def tiny_runs():
    """The tiny GPT-2 at micro-batch 1: the real 4-step loop and the 2-step loop the advisor replays."""
    from uvmlab.uvm.simulate import prepare, simulate_prepared

    out = {}
    for steps in (2, 4):
        wl = WorkloadConfig("gpt2", batch_size=1, iterations=3, options=TINY_GPT2, accumulation_steps=steps)
        cfg = RunConfig(workload=wl, oversub=1.0, mode="sim")
        prep = prepare(cfg)
        out[steps] = (prep, *simulate_prepared(cfg, prep))
    return out


def test_two_micro_batches_size_and_time_the_loop_of_four(tiny_runs) -> None:
    from uvmlab.advise.advisor import _repeat_micro_batches  # the advisor's extrapolation, checked against k = 4

    p2, r2, res2 = tiny_runs[2]
    p4, _, res4 = tiny_runs[4]
    assert p2.footprint_bytes == p4.footprint_bytes
    got = dict(res2)
    _repeat_micro_batches(got, r2, 4)
    assert got["iteration_time_ns"] == pytest.approx(res4["iteration_time_ns"], rel=0.01)
    assert got["fault_count"] == pytest.approx(res4["fault_count"], rel=0.05)


def test_small_micro_batches_are_slower_per_sample_in_the_kernel_model() -> None:
    """The occupancy term (uvmlab.sim.uvm.reread.occupancy): a GEMM too small to fill the SMs computes at a share
    of the peak, so micro-batch 1 costs more per sample than the full batch (not a fixed factor: per kernel)."""
    from uvmlab.gpus import get_gpu
    from uvmlab.sim.uvm.reread import occupancy
    from uvmlab.sim.uvm.timing import CostParams, kernel_time_ns

    gpu = get_gpu("A100-80GB")
    # a 1024x1024 fp32 output fills the GPU; 8 rows of it do not, even split along K
    big = occupancy(np.array([2 * 1024**3]), np.array([4 * 1024 * 1024]), np.array([True]), "fp32", gpu.name)
    small = occupancy(np.array([2 * 8 * 1024**2]), np.array([4 * 8 * 1024]), np.array([True]), "fp32", gpu.name)
    assert big[0] == 1.0 and 0 < small[0] < 1
    assert occupancy(np.array([1e9]), np.array([4.0]), np.array([False]), "fp32", gpu.name)[0] == 1.0
    c = CostParams(kernel_min_ns=0.0)
    t_big = kernel_time_ns(np.array([2 * 1024**3]), np.array([0.0]), gpu, c, occupancy=big)[0]
    t_small = kernel_time_ns(np.array([2 * 8 * 1024**2]), np.array([0.0]), gpu, c, occupancy=small)[0]
    assert t_small / 8 > t_big / 1024  # per output row, the small GEMM is slower
