"""The candidates experts try first (issue 28 item 3): activation offload (save_on_cpu), 8-bit optimizer state, the
CPU step overlapped, prefetch k kernels ahead with eviction of what the next kernels do not touch, bf16 autocast;
each a transformation or knob with its own unit tests, and each a row of ``uvmlab advise`` with its effect and
source."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.uvm_synth import make_trace, nocache_placement
from uvmlab.advise.policies import POLICIES, compose, get_policy
from uvmlab.errors import InputError
from uvmlab.gpus import get_gpu
from uvmlab.sim.uvm.driver import UvmSim
from uvmlab.sim.uvm.knobs import VA_BLOCK_BYTES, UvmKnobs
from uvmlab.sim.uvm.replay import replay
from uvmlab.sim.uvm.timing import CostParams
from uvmlab.trace.offload import offload_optimizer
from uvmlab.trace.offload_activations import offload_activations
from uvmlab.trace.optim8bit import BLOCK_ELEMENTS, MIN_8BIT_ELEMENTS, optimizer_8bit, state_bytes_8bit
from uvmlab.units import MiB

NEW = ("bf16-autocast", "offload-activations", "optimizer-8bit", "offload-optimizer-overlapped", "prefetch-ahead-evict")


def _peak_live(trace) -> int:
    return int(trace.live_bytes().max())


# --- activation offload (torch.autograd.graph.save_on_cpu) ------------------------------------------------------


def test_saved_activations_leave_the_device_between_forward_and_backward() -> None:
    trace = make_trace(n_iter=2, param_mb=2, act_mb=8, n_layers=3)
    off = offload_activations(trace)
    assert _peak_live(off) < _peak_live(trace)
    k, acc = off.kernels, off.accesses
    down = k[k["name"] == "offload:act_dtoh"]
    up = k[k["name"] == "offload:act_htod"]
    assert (down["phase"] == "forward").all() and (up["phase"] == "backward").all()
    # every activation a backward kernel reads went down once and came back once (the toy reads no weight there)
    a = trace.allocations
    read_in_bwd = acc.merge(k[["kernel_id", "phase", "name"]], on="kernel_id")
    saved = a[a["category"] == "activation"]
    moved_down = acc[acc["kernel_id"].isin(down["kernel_id"])]
    assert set(moved_down["alloc_id"]) == set(saved["alloc_id"]) & set(trace.accesses["alloc_id"])
    assert moved_down["size_bytes"].sum() == acc[acc["kernel_id"].isin(up["kernel_id"])]["size_bytes"].sum()
    # backward kernels read the copies, never the packed originals
    bwd = read_in_bwd[(read_in_bwd["phase"] == "backward") & ~read_in_bwd["name"].str.startswith("offload:")]
    assert not set(bwd["alloc_id"]) & set(saved["alloc_id"])
    # events keep distinct seqs
    seqs = np.concatenate([off.allocations["alloc_seq"], off.allocations.query("free_seq >= 0")["free_seq"], k["seq"]])
    assert len(np.unique(seqs)) == len(seqs)


def test_activation_offload_costs_link_time_when_everything_fits() -> None:
    trace = make_trace(n_iter=2, param_mb=2, act_mb=8, n_layers=3)
    gpu = get_gpu("A100-80GB")
    plain = replay(trace, nocache_placement(trace), 10**12, gpu)
    off = offload_activations(trace)
    moved = replay(off, nocache_placement(off), 10**12, gpu)
    assert moved.baseline_iteration_ns > plain.baseline_iteration_ns  # the copies are on the stream
    assert moved.peak_resident_bytes < plain.peak_resident_bytes


def test_a_trace_without_saved_tensors_is_refused() -> None:
    trace = make_trace(n_iter=1, n_layers=1)
    trace.accesses = trace.accesses[
        ~trace.accesses["kernel_id"].isin(trace.kernels.loc[trace.kernels["phase"] == "backward", "kernel_id"])
    ]
    with pytest.raises(InputError, match="no saved tensors"):
        offload_activations(trace)


# --- 8-bit optimizer state (bitsandbytes Adam8bit) ---------------------------------------------------------------


def test_8bit_state_sizes_follow_bitsandbytes() -> None:
    n = np.array([10, MIN_8BIT_ELEMENTS - 1, MIN_8BIT_ELEMENTS, 2 * BLOCK_ELEMENTS + 1, 10**6])
    got = state_bytes_8bit(4 * n)
    assert got[0] == 40 and got[1] == 4 * (MIN_8BIT_ELEMENTS - 1)  # small tensors keep fp32 state
    assert got[2] == MIN_8BIT_ELEMENTS + 4 * 2  # uint8 per element + one fp32 absmax per 2048
    assert got[3] == 2 * BLOCK_ELEMENTS + 1 + 4 * 3
    assert got[4] == 10**6 + 4 * 489


def test_8bit_optimizer_has_one_fused_step_and_a_quarter_of_the_state() -> None:
    trace = make_trace(n_iter=3, param_mb=8, act_mb=4, n_layers=3)
    q = optimizer_8bit(trace)
    a = q.allocations
    st_old = trace.allocations.loc[trace.allocations["category"] == "optimizer_state", "size_bytes"].sum()
    st_new = a.loc[a["category"] == "optimizer_state", "size_bytes"].sum()
    assert st_new == int(state_bytes_8bit(np.full(3, 8 * MiB)).sum()) and st_new < st_old / 3.9
    opt = q.kernels[q.kernels["phase"] == "optimizer"]
    assert opt["name"].tolist() == ["bnb:adam8bit_blockwise"] * 3
    acc = q.accesses[q.accesses["kernel_id"].isin(opt["kernel_id"])].merge(a[["alloc_id", "category"]], on="alloc_id")
    per = acc.groupby(["kernel_id", "category", "is_write"]).size()
    assert (per.xs(("parameter", True), level=(1, 2)) == 3).all()  # every parameter written once per step
    assert (per.xs(("optimizer_state", True), level=(1, 2)) == 3).all()


def test_8bit_of_a_stateless_job_is_refused() -> None:
    trace = make_trace(n_iter=1)
    trace.allocations = trace.allocations[trace.allocations["category"] != "optimizer_state"]
    trace.accesses = trace.accesses[trace.accesses["alloc_id"].isin(trace.allocations["alloc_id"])]
    with pytest.raises(InputError, match="no optimizer state"):
        optimizer_8bit(trace)


# --- the CPU step overlapped (ZeRO-Offload's delayed parameter update) -------------------------------------------


def test_an_overlapped_cpu_step_costs_max_of_gpu_and_cpu_work_plus_the_copies() -> None:
    trace = make_trace(n_iter=4, param_mb=8, act_mb=4, n_layers=3)
    n = 3 * 8 * MiB // 4
    trace.header.update(parameter_count=n, parameter_bytes=4 * n, trainable_parameter_bytes=4 * n)
    gpu = get_gpu("A100-80GB")
    for rate in (1e5, 1e12):  # a CPU step far longer, then far shorter, than the forward and backward
        serial = offload_optimizer(trace, params_per_s=rate)
        over = offload_optimizer(trace, params_per_s=rate, overlap=True)
        rs = replay(serial, nocache_placement(serial), 10**12, gpu)
        ro = replay(over, nocache_placement(over), 10**12, gpu)
        step = n / rate * 1e9
        gpu_part = rs.iterations["duration_ns"].iloc[2] - step  # forward, backward and the two copies
        copies = rs.kernels.query("name in ['offload:grad_dtoh', 'offload:param_htod'] and iteration == 2")
        fwd_bwd = gpu_part - copies["duration_ns"].sum()
        want = max(fwd_bwd, step) + copies["duration_ns"].sum()
        assert ro.iterations["duration_ns"].iloc[2] == pytest.approx(want, rel=1e-6)
        assert ro.iterations["duration_ns"].iloc[2] <= rs.iterations["duration_ns"].iloc[2]


# --- prefetch k kernels ahead, evict what the next kernels do not touch -----------------------------------------


def test_protect_moves_the_next_kernels_blocks_out_of_the_eviction_front() -> None:
    gpu = get_gpu("A100-80GB")
    sim = UvmSim(2 * VA_BLOCK_BYTES, UvmKnobs(prefetch_enable=False), CostParams().for_gpu(gpu), gpu)
    for r in (1, 2, 3):
        sim.map_range(r, VA_BLOCK_BYTES)
    sim.access([(1, 0, VA_BLOCK_BYTES, True)])
    sim.access([(2, 0, VA_BLOCK_BYTES, True)])
    sim.protect([(1, 0, VA_BLOCK_BYTES, False)])  # the next kernels read range 1: range 2 goes first
    sim.access([(3, 0, VA_BLOCK_BYTES, True)])
    assert sim.resident_bytes() == 2 * VA_BLOCK_BYTES
    c = sim.access([(1, 0, VA_BLOCK_BYTES, False)])
    assert c.fault_count == 0  # still resident: range 2 was evicted instead


def test_prefetch_ahead_evict_prefetches_every_category_k_kernels_ahead() -> None:
    pol = POLICIES["prefetch-ahead-evict"]
    knobs = UvmKnobs.from_options(pol.sim_options)
    assert knobs.prefetch_next_kernels >= 2 and knobs.prefetch_protect_next
    assert {"activation", "parameter", "gradient", "temporary"} <= knobs.hint_categories("prefetch_next_categories")
    trace = make_trace(n_iter=2, param_mb=4, act_mb=8, n_layers=4)
    gpu = get_gpu("A100-80GB")
    cap = 40 * MiB
    plain = replay(trace, nocache_placement(trace), cap, gpu, UvmKnobs())
    ahead = replay(trace, nocache_placement(trace), cap, gpu, knobs)
    assert ahead.api_calls.get("cudaMemPrefetchAsync", 0) > 0
    assert ahead.totals.fault_count < plain.totals.fault_count


@settings(max_examples=15, deadline=None)
@given(n_iter=st.integers(1, 3), n_layers=st.integers(1, 4), act_mb=st.integers(1, 6))
def test_offload_transforms_keep_the_trace_valid(n_iter: int, n_layers: int, act_mb: int) -> None:
    """Whatever the loop: each transform gives a valid trace whose events keep distinct seqs, no access before its
    allocation or after its free, and a replay that completes."""
    trace = make_trace(n_iter=n_iter, param_mb=2, act_mb=act_mb, n_layers=n_layers)
    for t in (offload_activations(trace), optimizer_8bit(trace)):
        a, k, acc = t.allocations, t.kernels, t.accesses
        assert k["seq"].is_unique
        m = acc.merge(k[["kernel_id", "seq"]], on="kernel_id").merge(a, on="alloc_id", suffixes=("", "_a"))
        assert (m["alloc_seq"] < m["seq"]).all()
        assert ((m["free_seq"] < 0) | (m["free_seq"] > m["seq"])).all()
        replay(t, nocache_placement(t), 64 * MiB, get_gpu("A100-80GB"))


# --- catalogue and advisor rows ----------------------------------------------------------------------------------


def test_new_candidates_are_policies_with_a_source_and_the_lines_to_add() -> None:
    for name in NEW:
        pol = POLICIES[name]
        assert pol.source and pol.needs_code_change and pol.apply_how
    assert POLICIES["bf16-autocast"].dtype == "bf16"
    with pytest.raises(InputError, match="no device state to quantise"):
        get_policy("offload-optimizer+optimizer-8bit")
    assert compose([POLICIES["optimizer-8bit"], POLICIES["driver-prefetch-aggressive"]]).optimizer_8bit
    for name in ("offload-activations", "optimizer-8bit", "offload-optimizer-overlapped", "prefetch-ahead-evict"):
        assert "needs a code change" in POLICIES[name].resolved().gpu_refusal


def test_the_new_candidates_are_ranked_with_their_effect_and_source(small_advice) -> None:
    rows = {r["policy"]: r for r in small_advice.records()}
    for name in NEW:
        r = rows[name]
        assert r["outcome"] == "ok" and r["rank"] >= 1, (name, r["note"])
        assert r["evidence"] == "modelled" and r["evidence_detail"] and r["needs"]
    assert "optimizer state" in rows["optimizer-8bit"]["note"] and "->" in rows["optimizer-8bit"]["note"]
    assert "saved tensors" in rows["offload-activations"]["note"]
    assert "overlapped" in rows["offload-optimizer-overlapped"]["note"]
    assert rows["optimizer-8bit"]["footprint_bytes"] < rows["pca-on"]["footprint_bytes"]
    assert rows["offload-optimizer-overlapped"]["iteration_time_ns"] <= rows["offload-optimizer"]["iteration_time_ns"]
