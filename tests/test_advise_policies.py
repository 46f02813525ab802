"""uvmlab advise: each policy's mechanism (what it changes in the allocator, the driver knobs, the job shape)."""

from __future__ import annotations

import pytest

from tests.uvm_synth import make_trace
from uvmlab.advise.policies import POLICIES, compose, get_policy
from uvmlab.config import RunConfig, WorkloadConfig
from uvmlab.errors import InputError
from uvmlab.sim.allocator.placement import place
from uvmlab.uvm.simulate import iteration_ends


def _cfg(**kw: object) -> RunConfig:
    return RunConfig(workload=WorkloadConfig("alexnet", batch_size=2), oversub=2.0, **kw)  # type: ignore[arg-type]


def test_release_each_iteration_frees_cached_segments_between_iterations() -> None:
    """empty_cache at each iteration end cudaFree's the cached segments: their ranges close there.

    30 MiB tensors get segments of their own (> 10 MiB: rounded to 2 MiB), so freed activations leave whole
    segments cached; the toy's default 4-8 MiB tensors share 20 MiB segments with live parameters.
    """
    trace = make_trace(n_iter=3, param_mb=30, act_mb=30)
    ends = iteration_ends(trace)
    assert len(ends) == 2  # before iterations 1 and 2
    kept = place(trace, "pca")
    released = place(trace, "pca", release_at_seqs=ends)
    closed_kept = (kept.ranges["free_seq"] >= 0).sum()
    closed_released = released.ranges["free_seq"] >= 0
    assert closed_released.sum() > closed_kept  # segments destroyed that PCA would have kept
    assert set(released.ranges.loc[closed_released, "free_seq"]) & set(ends)  # destroyed exactly at the release
    # every tensor still gets memory and the live bytes are unchanged: only caching differs
    assert released.peak_allocated_bytes == kept.peak_allocated_bytes


def test_iteration_ends_precede_the_next_iteration_and_follow_the_step() -> None:
    trace = make_trace(n_iter=3)
    k = trace.kernels
    for it, end in zip((1, 2), iteration_ends(trace), strict=True):
        assert end > k.loc[k["iteration"] == it - 1, "seq"].max()  # after the optimizer step
        assert end <= k.loc[k["iteration"] == it, "seq"].min()  # before the next iteration's first kernel


def test_release_points_change_nothing_without_caching() -> None:
    trace = make_trace(n_iter=3)
    a = place(trace, "nocache")
    b = place(trace, "nocache", release_at_seqs=iteration_ends(trace))
    assert a.ranges.equals(b.ranges)


def test_pca_off_policy_turns_caching_off_and_sets_the_env() -> None:
    pol = POLICIES["pca-off"]
    cfg = pol.apply(_cfg())
    assert cfg.pca is False and cfg.policy == "pca-off"
    assert pol.gpu_env == {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}


def test_driver_policies_set_the_module_parameter_knobs() -> None:
    from uvmlab.sim.uvm.knobs import UvmKnobs

    off = POLICIES["driver-prefetch-off"].apply(_cfg())
    assert UvmKnobs.from_options(off.sim_options).prefetch_enable is False
    aggressive = POLICIES["driver-prefetch-aggressive"].apply(_cfg())
    assert UvmKnobs.from_options(aggressive.sim_options).prefetch_threshold == 1


def test_a_policy_contradicting_the_runs_knobs_is_refused() -> None:
    with pytest.raises(InputError, match="prefetch_enable"):
        POLICIES["driver-prefetch-off"].apply(_cfg(sim_options={"prefetch_enable": True}))


def test_compose_merges_settings_and_refuses_contradictions() -> None:
    both = get_policy("max-split-128+roundup-pow2-4")
    assert both.alloc_conf == "max_split_size_mb:128,roundup_power2_divisions:4"
    assert both.gpu_env["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:128,roundup_power2_divisions:4"
    with pytest.raises(InputError, match="PCA"):
        compose([POLICIES["pca-off"], POLICIES["release-each-iteration"]])
    with pytest.raises(InputError, match="unknown policy"):
        get_policy("no-such-policy")


def test_alloc_conf_policies_change_the_allocator_settings_the_simulator_uses() -> None:
    trace = make_trace(n_iter=2, param_mb=300, act_mb=200)
    plain = place(trace, "pca")
    split = place(trace, "pca", settings=POLICIES["max-split-128"].alloc_conf)
    assert split.settings is not None and split.settings.max_split_size_bytes == 128 * 2**20
    assert plain.settings is not None and plain.settings.max_split_size_bytes != split.settings.max_split_size_bytes


def test_changes_nothing_for_is_true_only_for_the_job_as_given() -> None:
    assert POLICIES["pca-on"].changes_nothing_for(_cfg())
    assert not POLICIES["pca-on"].changes_nothing_for(_cfg(pca=False))
    assert not POLICIES["release-each-iteration"].changes_nothing_for(_cfg())
    assert not POLICIES["driver-prefetch-off"].changes_nothing_for(_cfg())


def test_every_policy_names_its_source_and_how_to_apply_it() -> None:
    for pol in POLICIES.values():
        assert pol.source and pol.apply_how and pol.summary, pol.name
        assert "+" not in pol.name  # + composes


def test_a_gpu_plan_applies_the_policys_environment_and_names_driver_setup() -> None:
    """On a GPU the policy is applied as simulated: allocator settings, empty_cache per step, driver note."""
    from uvmlab.measure.gpu.plan import EMPTY_CACHE_ENV, GpuRunOptions, plan_run

    def plan(policy: str) -> object:
        return plan_run(
            get_policy(policy).apply(_cfg()),
            GpuRunOptions(footprint=2**30, shim_library="/x.so"),
            estimate=lambda c: 2**30,
        )

    release = plan("release-each-iteration").step("run").env  # type: ignore[attr-defined]
    assert release[EMPTY_CACHE_ENV] == "1"
    split = plan("max-split-128")
    assert "max_split_size_mb:128" in split.step("run").env["PYTORCH_CUDA_ALLOC_CONF"]  # type: ignore[attr-defined]
    assert "backend:native" in split.alloc_conf  # type: ignore[attr-defined]
    assert EMPTY_CACHE_ENV not in split.step("run").env  # type: ignore[attr-defined]
    driver = plan("driver-prefetch-off")
    assert any("uvm_perf_prefetch_enable=0" in n for n in driver.notes)  # type: ignore[attr-defined]
    off = plan("pca-off").step("run").env  # type: ignore[attr-defined]
    assert off["PYTORCH_NO_CUDA_MEMORY_CACHING"] == "1"


def test_prefetch_on_alloc_replaces_faults_by_prefetches() -> None:
    """Each new managed range is prefetched at cudaMallocManaged: its first touches no longer fault, the pages
    are populated without fault batches, and the counters say so (issue 16: the policy's mechanism)."""
    from uvmlab.gpus import get_gpu
    from uvmlab.sim.uvm.knobs import UvmKnobs
    from uvmlab.sim.uvm.replay import replay

    trace = make_trace(n_iter=3, param_mb=30, act_mb=30)
    placement = place(trace, "nocache")  # one range per tensor: every activation is a fresh range each iteration
    gpu = get_gpu("A100-80GB")
    roomy = 10 * 2**30
    plain = replay(trace, placement, roomy, gpu, UvmKnobs())
    pf = replay(trace, placement, roomy, gpu, UvmKnobs(prefetch_on_alloc=True))
    assert plain.totals.fault_count > 0
    assert pf.totals.fault_count < plain.totals.fault_count / 10  # first touches were the faults
    assert pf.totals.fault_batch_count < plain.totals.fault_batch_count
    assert pf.totals.zero_fill_bytes >= plain.totals.zero_fill_bytes * 0.99  # still populated, by the prefetch
    assert pf.iterations["duration_ns"].sum() < plain.iterations["duration_ns"].sum()
    # under pressure a prefetch evicts other data: the policy can move more bytes than it saves
    tight = int(placement.peak_allocated_bytes * 0.5)
    pressed = replay(trace, placement, tight, gpu, UvmKnobs(prefetch_on_alloc=True))
    assert pressed.totals.dtoh_bytes > 0


def test_every_alloc_conf_policy_sets_the_same_conf_on_a_real_gpu() -> None:
    confs = {n: p for n, p in POLICIES.items() if p.alloc_conf}
    assert confs  # the allocator family has PYTORCH_CUDA_ALLOC_CONF policies
    for pol in confs.values():
        assert pol.gpu_env["PYTORCH_CUDA_ALLOC_CONF"] == pol.alloc_conf
