"""simulate_prepared picks the cost parameters once and reports where they came from."""

from __future__ import annotations

import pytest

from tests.uvm_synth import make_trace
from uvmlab.config import RunConfig, WorkloadConfig
from uvmlab.sim.allocator.placement import place
from uvmlab.sim.uvm.replay import peak_managed_bytes
from uvmlab.uvm import simulate


def test_the_cost_profile_is_picked_once_and_named_in_the_result(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = RunConfig(workload=WorkloadConfig("alexnet", batch_size=2), oversub=2.0)
    trace = make_trace(n_iter=2)
    placement = place(trace, "pca")
    footprint = peak_managed_bytes(placement.ranges)
    prep = simulate.Prepared(simulate.run_gpu_spec(cfg), trace, placement, footprint, footprint // 2)
    picks: list[str] = []
    real = simulate.costs_and_source

    def counting(c: RunConfig):  # type: ignore[no-untyped-def]
        costs, source = real(c)
        picks.append(source)
        return costs, source

    monkeypatch.setattr(simulate, "costs_and_source", counting)
    _, result = simulate.simulate_prepared(cfg, prep)
    assert len(picks) == 1
    assert result["cost_params_source"] == picks[0] and picks[0]
