"""Trace invariants on every built-in workload at the seed study's batch sizes (meta capture, 3 iterations).

To keep CI fast the transformer models keep their widths, vocabularies and sequence lengths but have 2 layers
(encoder and decoder for Whisper); the vision models are full size. benchmarks/trace_capture.py captures the
full-size models.
"""

from __future__ import annotations

import numpy as np
import pytest

from uvmlab.config import WorkloadConfig
from uvmlab.trace.capture import capture_trace
from uvmlab.trace.schema import NEVER_FREED, Trace
from workloads.registry import WORKLOADS

SMALL = {"gpt2": {"n_layer": 2}, "bert": {"n_layer": 2}, "whisper-small": {"encoder_layers": 2, "decoder_layers": 2}}
ITERATIONS = 3  # iterations 1 and 2 must repeat each other (iteration 0 creates the optimizer state)


@pytest.fixture(scope="module", params=list(WORKLOADS))
def seed_trace(request: pytest.FixtureRequest) -> tuple[str, Trace]:
    name = request.param
    return name, capture_trace(WorkloadConfig(name, iterations=ITERATIONS, options=SMALL.get(name, {})))


def _bytes(trace: Trace, category: str, iteration: int | None = None) -> int:
    a = trace.allocations
    sel = a["category"] == category
    if iteration is not None:
        sel &= a["iteration"] == iteration
    return int(a.loc[sel, "size_bytes"].sum())


def test_frees_follow_allocations_and_live_bytes_stay_non_negative(seed_trace: tuple[str, Trace]) -> None:
    name, trace = seed_trace
    a = trace.allocations
    freed = a[a["free_seq"] != NEVER_FREED]
    assert (freed["free_seq"] > freed["alloc_seq"]).all(), name
    live = trace.live_bytes().to_numpy()
    assert live.min() >= 0, name
    assert live.max() > trace.header["parameter_bytes"], name
    # every event has its own sequence number
    seqs = np.concatenate([a["alloc_seq"], freed["free_seq"], trace.kernels["seq"]])
    assert len(np.unique(seqs)) == len(seqs), name


def test_parameter_and_optimizer_state_bytes(seed_trace: tuple[str, Trace]) -> None:
    name, trace = seed_trace
    assert _bytes(trace, "parameter") == trace.header["parameter_bytes"], name
    # Adam with foreach: exp_avg + exp_avg_sq per trainable parameter on the device (Whisper's sinusoidal
    # encoder positions are frozen); its step counters live on the CPU, as on CUDA
    pbytes = trace.header["trainable_parameter_bytes"]
    assert _bytes(trace, "optimizer_state") == 2 * pbytes, name
    a = trace.allocations
    assert (a.loc[a["category"] == "optimizer_state", "iteration"] == 0).all(), name
    # set_to_none zero_grad: every iteration allocates a fresh gradient per parameter
    for it in range(ITERATIONS):
        assert _bytes(trace, "gradient", it) == pbytes, (name, it)
    assert _bytes(trace, "input", 0) > 0 and _bytes(trace, "activation", 0) > 0, name


def test_iterations_after_the_first_repeat(seed_trace: tuple[str, Trace]) -> None:
    name, trace = seed_trace
    a = trace.allocations.sort_values("alloc_seq")

    def seq(it: int) -> list[tuple[int, str, str]]:
        s = a[a["iteration"] == it]
        return list(zip(s["size_bytes"], s["category"], s["phase"], strict=True))

    assert seq(1) == seq(2), name
    assert len(seq(1)) > 0
    k = trace.kernels
    assert list(k.loc[k["iteration"] == 1, "name"]) == list(k.loc[k["iteration"] == 2, "name"]), name


def test_accesses_reference_known_allocations_within_bounds(seed_trace: tuple[str, Trace]) -> None:
    name, trace = seed_trace
    acc = trace.accesses.merge(trace.allocations[["alloc_id", "size_bytes"]], on="alloc_id", suffixes=("", "_alloc"))
    assert len(acc) == len(trace.accesses), name
    assert (acc["offset_bytes"] >= 0).all() and (acc["size_bytes"] > 0).all(), name
    assert (acc["offset_bytes"] + acc["size_bytes"] <= acc["size_bytes_alloc"]).all(), name
    assert trace.kernels["flops"].sum() > 0, name
