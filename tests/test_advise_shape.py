"""Job-shape policies: activation checkpointing (a re-traced job) and CPU offload of the optimizer (a trace
transform), their mechanisms, the advisor rows and ``uvmlab run --policy``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.uvm_synth import make_trace, nocache_placement
from uvmlab.advise.policies import POLICIES, compose, get_policy
from uvmlab.config import RunConfig, WorkloadConfig
from uvmlab.errors import InputError
from uvmlab.gpus import get_gpu
from uvmlab.sim.uvm.replay import replay
from uvmlab.sim.uvm.timing import CostParams, transfer_time_ns
from uvmlab.trace.offload import CPU_ADAM_PARAMS_PER_S, offload_optimizer
from uvmlab.units import MiB

TINY_GPT2 = {"n_layer": 2, "n_embd": 64, "n_head": 2, "vocab_size": 512, "seq_len": 64, "n_positions": 64}


def _uvmlab(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "uvmlab", *args], capture_output=True, text=True, timeout=600)


# --- activation checkpointing -------------------------------------------------------------------------------


def _capture(name: str, checkpoint: str = "", **kw: object):
    from uvmlab.trace.capture import capture_trace

    return capture_trace(WorkloadConfig(name, iterations=2, checkpoint=checkpoint, **kw))  # type: ignore[arg-type]


def _phase(trace, phase: str, it: int = 1):
    k = trace.kernels
    return k[(k["phase"] == phase) & (k["iteration"] == it)]


def _saved(trace, it: int = 1) -> int:
    a = trace.allocations
    return int(a.loc[(a["category"] == "activation") & (a["iteration"] == it), "size_bytes"].sum())


@pytest.fixture(scope="module")
def gpt2_pair():
    kw = {"batch_size": 2, "options": TINY_GPT2}
    return _capture("gpt2", **kw), _capture("gpt2", "auto", **kw)


def test_checkpointing_saves_fewer_activations_and_recomputes_the_blocks_forward(gpt2_pair) -> None:
    plain, ck = gpt2_pair
    assert _saved(ck) < _saved(plain)
    # forward computes the same (minus the KV-cache writes a checkpointed block skips); backward runs each
    # block's forward again: more kernels and FLOPs, under one extra forward (embeddings and LM head are not redone)
    assert _phase(ck, "forward")["flops"].sum() == _phase(plain, "forward")["flops"].sum()
    assert len(_phase(ck, "forward")) <= len(_phase(plain, "forward"))
    extra = _phase(ck, "backward")["flops"].sum() - _phase(plain, "backward")["flops"].sum()
    assert 0 < extra < _phase(plain, "forward")["flops"].sum()
    recomputed = set(_phase(ck, "backward")["name"]) - set(_phase(plain, "backward")["name"])
    assert recomputed & set(_phase(plain, "forward")["name"])  # forward-only ops now appear in backward
    assert any("GPT2Block x2" in n for n in ck.header["notes"])
    # the same parameters and optimizer state
    for cat in ("parameter", "optimizer_state"):
        a, b = plain.allocations, ck.allocations
        assert a.loc[a["category"] == cat, "size_bytes"].sum() == b.loc[b["category"] == cat, "size_bytes"].sum()


def test_checkpointed_encoder_decoder_layers_do_not_write_the_kv_cache_twice() -> None:
    """Whisper's decoder layers get a KV cache; checkpointed, they run without it (transformers'
    GradientCheckpointingLayer rule), or the recomputation would differ and torch.utils.checkpoint refuse."""
    opts = {"encoder_layers": 2, "decoder_layers": 2, "d_model": 64, "n_head": 2, "ffn_dim": 128, "label_len": 64}
    plain = _capture("whisper-small", batch_size=1, options=opts)
    ck = _capture("whisper-small", "auto", batch_size=1, options=opts)
    assert _saved(ck) < _saved(plain)
    assert any("WhisperEncoderLayer x2, WhisperDecoderLayer x2" in n for n in ck.header["notes"])
    assert _phase(ck, "backward")["flops"].sum() > _phase(plain, "backward")["flops"].sum()


def test_auto_segments_are_the_repeated_blocks_or_alexnets_two_halves() -> None:
    from workloads.checkpointing import repeated_blocks
    from workloads.registry import load_workload

    def classes(name: str, **opts: object) -> dict[str, int]:
        wl = load_workload(name).build(WorkloadConfig(name, batch_size=1, options=opts), "meta")
        out: dict[str, int] = {}
        for m in repeated_blocks(wl.model):
            out[type(m).__name__] = out.get(type(m).__name__, 0) + 1
        return out

    assert classes("gpt2", **TINY_GPT2) == {"GPT2Block": 2}
    assert classes("resnet50") == {"Bottleneck": 16}  # 3 + 4 + 6 + 3
    assert classes("bert", n_layer=3) == {"BertLayer": 3}
    assert classes("alexnet") == {"Sequential": 2}  # features and classifier


def test_a_class_name_or_the_workloads_hook_chooses_the_segments() -> None:
    import torch

    from workloads.base import Workload
    from workloads.checkpointing import apply_checkpointing, segments

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 4))
    wl = Workload("toy", model, lambda: None, lambda m, b: m(b), torch.device("meta"))
    assert [type(m).__name__ for m in segments(wl, "Linear")] == ["Linear", "Linear"]
    with pytest.raises(InputError, match="no module of class 'Conv2d'"):
        segments(wl, "Conv2d")
    wl.checkpoint_segments = lambda: [model[2]]
    assert segments(wl, "auto") == [model[2]]
    assert apply_checkpointing(wl, "auto") == ["Linear x1"]
    x = torch.randn(3, 4, requires_grad=True)
    model(x).sum().backward()  # the wrapped forward still computes and backpropagates
    assert x.grad is not None and x.grad.shape == (3, 4)


def test_checkpoint_setting_is_validated_and_left_out_of_old_hashes() -> None:
    plain = WorkloadConfig("alexnet")
    assert "checkpoint" not in plain.to_dict()  # every existing trace cache key and sweep hash stays valid
    ck = WorkloadConfig("alexnet", checkpoint="auto")
    assert ck.to_dict()["checkpoint"] == "auto"
    assert RunConfig.from_dict(RunConfig(workload=ck).to_dict()).workload.checkpoint == "auto"
    with pytest.raises(InputError, match="checkpoint must be"):
        WorkloadConfig("alexnet", checkpoint="not a class")


def test_checkpoint_policy_sets_the_workloads_checkpointing() -> None:
    pol = POLICIES["checkpoint-activations"]
    cfg = RunConfig(workload=WorkloadConfig("alexnet", batch_size=2), oversub=2.0)
    assert not pol.changes_nothing_for(cfg)
    assert pol.apply(cfg).workload.checkpoint == "auto"
    assert "use_reentrant=False" in pol.needs_code_change


# --- CPU offload of the optimizer ------------------------------------------------------------------------------


def _toy(n_iter: int = 3):
    trace = make_trace(n_iter=n_iter, param_mb=8, act_mb=4, n_layers=3)
    n = 3 * 8 * MiB // 4
    trace.header.update(parameter_count=n, parameter_bytes=4 * n, trainable_parameter_bytes=4 * n)
    return trace


def test_offload_removes_the_optimizer_state_and_step_from_the_device() -> None:
    trace = _toy()
    off = offload_optimizer(trace)
    assert not (off.allocations["category"] == "optimizer_state").any()
    assert "adam" not in set(off.kernels["name"])
    names = off.kernels.loc[off.kernels["phase"] == "optimizer", "name"].tolist()
    assert names == ["offload:grad_dtoh", "offload:cpu_step", "offload:param_htod"] * 3
    # everything else is kept, in the same order
    kept = off.kernels[~off.kernels["name"].str.startswith("offload:")]
    assert kept["name"].tolist() == trace.kernels.loc[trace.kernels["phase"] != "optimizer", "name"].tolist()
    assert off.kernels["seq"].is_monotonic_increasing and off.kernels["seq"].is_unique


def test_offload_moves_two_times_the_parameter_bytes_per_iteration() -> None:
    trace = _toy()
    off = offload_optimizer(trace)
    a = trace.allocations
    param_bytes = int(a.loc[a["category"] == "parameter", "size_bytes"].sum())
    head = off.header["offload_optimizer"]
    assert head["dtoh_bytes_per_iteration"] + head["htod_bytes_per_iteration"] == 2 * param_bytes
    acc = off.accesses.merge(off.kernels[["kernel_id", "name", "iteration"]], on="kernel_id")
    for it in range(3):
        d = acc[(acc["iteration"] == it) & (acc["name"] == "offload:grad_dtoh")]
        h = acc[(acc["iteration"] == it) & (acc["name"] == "offload:param_htod")]
        assert not d["is_write"].any() and h["is_write"].all()
        assert d["size_bytes"].sum() == param_bytes == h["size_bytes"].sum()
    # the replay: the HtoD copies are explicit copies; the step waits for the CPU and the link
    gpu = get_gpu("A100-80GB")
    costs = CostParams().for_gpu(gpu)
    res = replay(off, nocache_placement(off), 10**12, gpu, costs=costs)
    k = res.kernels.set_index("kernel_id")
    htod = off.kernels[off.kernels["name"] == "offload:param_htod"]["kernel_id"]
    assert (k.loc[htod, "memcpy_htod_bytes"] == param_bytes).all() and (k.loc[htod, "fault_count"] == 0).all()
    step = off.kernels[off.kernels["name"] == "offload:cpu_step"]["kernel_id"]
    assert np.allclose(k.loc[step, "duration_ns"], 3 * 8 * MiB / 4 / CPU_ADAM_PARAMS_PER_S * 1e9)
    dtoh = off.kernels[off.kernels["name"] == "offload:grad_dtoh"]["kernel_id"]
    link = transfer_time_ns(np.array([8 * MiB] * 3), costs.link_bytes_per_s)
    assert np.allclose(k.loc[dtoh, "native_ns"], link)  # all resident: only the transfer


def test_offload_frees_device_memory_and_costs_time_when_everything_fits() -> None:
    trace = _toy()
    off = offload_optimizer(trace)
    gpu = get_gpu("A100-80GB")
    plain = replay(trace, nocache_placement(trace), 10**12, gpu)
    moved = replay(off, nocache_placement(off), 10**12, gpu)
    assert moved.peak_resident_bytes == plain.peak_resident_bytes - 3 * 8 * MiB  # the optimizer state
    assert moved.baseline_iteration_ns > plain.baseline_iteration_ns  # transfers + CPU step > the GPU's Adam


def test_offload_of_a_stateless_optimizer_is_refused() -> None:
    from uvmlab.trace.offload import offload_optimizer_of

    with pytest.raises(InputError, match="nothing to offload"):
        offload_optimizer_of(_toy(), "sgd")
    assert POLICIES["offload-optimizer"].resolved().offload_optimizer
    assert not POLICIES["pca-off"].resolved().offload_optimizer  # a policy that does not offload leaves the trace


def test_shape_policies_compose_with_each_other_and_with_uvm_policies() -> None:
    both = get_policy("checkpoint-activations+offload-optimizer")
    assert both.checkpoint == "auto" and both.offload_optimizer
    mixed = compose([POLICIES["offload-optimizer"], POLICIES["driver-prefetch-aggressive"]])
    assert mixed.offload_optimizer and mixed.sim_options


def test_the_combination_chooser_pairs_shape_policies() -> None:
    from uvmlab.advise.advisor import _combinations

    singles = {"checkpoint-activations": 5.0, "offload-optimizer": 6.0, "driver-prefetch-aggressive": 7.0}
    combos = _combinations(singles, {"iteration_time_ns": 10.0})
    assert ("checkpoint-activations", "offload-optimizer") in combos
    assert all(
        "fit-batch-accumulate" not in c
        for c in _combinations({"fit-batch-accumulate": 1.0}, {"iteration_time_ns": 10.0})
    )


def test_offload_is_paired_with_the_micro_batch_search_only_when_neither_fits_alone() -> None:
    from uvmlab.advise.advisor import _fit_base, shape_fit_combination

    rows = [
        {"policy": "fit-batch-accumulate", "outcome": "n/a"},
        {"policy": "offload-optimizer", "outcome": "ok", "footprint_bytes": 200},
    ]
    assert shape_fit_combination(rows, available=100) == ("offload-optimizer", "fit-batch-accumulate")
    assert shape_fit_combination(rows, available=300) is None  # the offloaded job fits: nothing to search
    rows[0]["outcome"] = "ok"
    assert shape_fit_combination(rows, available=100) is None  # a micro-batch fits without offloading
    given = RunConfig(workload=WorkloadConfig("alexnet", batch_size=2), oversub=2.0)
    combo = get_policy("offload-optimizer+fit-batch-accumulate")
    assert _fit_base(combo, given).policy == "offload-optimizer"  # the search sizes offloaded footprints
    assert _fit_base(POLICIES["fit-batch-accumulate"], given) is given
    ck = _fit_base(get_policy("checkpoint-activations+fit-batch-accumulate"), given)
    assert ck.workload.checkpoint == "auto" and ck.policy is None  # checkpointed footprints, nothing offloaded


# --- end to end ------------------------------------------------------------------------------------------------

SMALL = ["-b", "16", "--option", "image_size=64", "--option", "num_classes=10", "-n", "2", "--oversub", "1.5"]


def test_advise_ranks_both_shape_policies_with_their_notes() -> None:
    proc = _uvmlab(
        "advise", "alexnet", *SMALL, "--policy", "pca-on", "--policy", "checkpoint-activations",
        "--policy", "offload-optimizer", "--format", "json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rows = {p["policy"]: p for p in json.loads(proc.stdout)["policies"]}
    ck, off, given = rows["checkpoint-activations"], rows["offload-optimizer"], rows["pca-on"]
    assert ck["outcome"] == off["outcome"] == "ok" and ck["rank"] and off["rank"]
    assert "recomputed forward" in ck["note"] and "optimizer state off the device" in off["note"]
    assert off["footprint_bytes"] < given["footprint_bytes"]
    assert "torch.optim.Adam" in off["needs_code_change"]


def test_run_accepts_the_shape_policies(tmp_path: Path) -> None:
    ck = _uvmlab("run", "alexnet", *SMALL, "--policy", "checkpoint-activations", "-o", str(tmp_path / "c"))
    assert ck.returncode == 0, ck.stderr
    config = json.loads((tmp_path / "c" / "config.json").read_text())
    assert config["applied"]["workload"]["checkpoint"] == "auto"
    off = _uvmlab("run", "alexnet", *SMALL, "--policy", "offload-optimizer", "-o", str(tmp_path / "o"))
    assert off.returncode == 0, off.stderr
    result = json.loads((tmp_path / "o" / "result.json").read_text())
    assert result["policy"] == "offload-optimizer" and result["memcpy_htod_bytes"] > 0


def test_the_gpu_worker_applies_checkpointing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker (run on the CPU here) wraps the same segments before training, and training still runs."""
    import workloads.checkpointing as ckmod
    from uvmlab.files.atomic import atomic_write_json
    from uvmlab.measure.gpu.worker import main

    seen: list[list[str]] = []
    real = ckmod.apply_checkpointing
    monkeypatch.setattr(ckmod, "apply_checkpointing", lambda wl, rule: seen.append(real(wl, rule)) or seen[-1])
    opts = {"seq_len": 16, "n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 128, "n_positions": 16}
    wl = WorkloadConfig("gpt2", batch_size=2, iterations=2, options=opts, checkpoint="auto")
    cfg = RunConfig(wl, oversub=4, pca=False, mode="gpu")
    atomic_write_json(tmp_path / "config.json", {**cfg.to_dict(), "gpu_options": {"footprint": "estimate"}})
    assert main([str(tmp_path), "--role", "run", "--device", "cpu"]) == 0
    assert seen == [["GPT2Block x2"]]
    doc = json.loads((tmp_path / "logs" / "run.worker.json").read_text())
    assert doc["outcome"] == "ok" and len(doc["iterations"]) == 2


@settings(max_examples=25, deadline=None)
@given(
    n_iter=st.integers(1, 4),
    n_layers=st.integers(1, 5),
    param_mb=st.integers(1, 6),
    act_mb=st.integers(1, 6),
)
def test_offload_invariants_on_any_toy_loop(n_iter: int, n_layers: int, param_mb: int, act_mb: int) -> None:
    """Whatever the loop: no optimizer state or step is left on the device, every event keeps a distinct seq in the
    original order, and each iteration moves its gradients down and its parameters up once."""
    trace = make_trace(n_iter=n_iter, param_mb=param_mb, act_mb=act_mb, n_layers=n_layers)
    off = offload_optimizer(trace)
    a, k = off.allocations, off.kernels
    assert not (a["category"] == "optimizer_state").any() and not (k["name"] == "adam").any()
    seqs = np.concatenate([a["alloc_seq"], a.loc[a["free_seq"] >= 0, "free_seq"], k["seq"]])
    assert len(np.unique(seqs)) == len(seqs)
    assert k["seq"].is_monotonic_increasing
    old = trace.allocations.set_index("alloc_id")
    assert (a.set_index("alloc_id")["alloc_seq"] == old.loc[a["alloc_id"], "alloc_seq"] * 4).all()
    acc = off.accesses.merge(k[["kernel_id", "name", "iteration"]], on="kernel_id")
    moved = acc[acc["name"].str.startswith("offload:")].groupby(["iteration", "name"])["size_bytes"].sum()
    per_it = n_layers * param_mb * MiB
    assert (moved == per_it).all() and len(moved) == 2 * n_iter


def test_a_gpu_run_of_the_offload_policy_is_refused_with_one_sentence(tmp_path: Path) -> None:
    out = str(tmp_path / "g")
    proc = _uvmlab("run", "alexnet", *SMALL, "--policy", "offload-optimizer", "--mode", "gpu", "--dry-run", "-o", out)
    assert proc.returncode == 2 and "needs a code change" in proc.stderr and "Traceback" not in proc.stderr


class _ReadsCache:
    _can_checkpoint_with_cache = True


def test_checkpointed_segments_drop_the_kv_cache_under_every_argument_name() -> None:
    """transformers renamed the layers' cache argument (past_key_values -> cache in 5.24): the rule drops a Cache
    under any name or position, and keeps it for a layer that only reads it (``_can_checkpoint_with_cache``)."""
    from transformers.cache_utils import DynamicCache

    from workloads.checkpointing import drop_kv_cache

    for key in ("cache", "past_key_values", "layer_past", "my_kv"):
        kwargs = {key: DynamicCache(), "use_cache": True, "attention_mask": None}
        assert drop_kv_cache((), kwargs) == ()
        assert kwargs == {key: None, "use_cache": False, "attention_mask": None}
    args = drop_kv_cache((1, DynamicCache()), {})
    assert args == (1, None)
    kept = {"cache": DynamicCache(), "use_cache": True}
    drop_kv_cache((), kept, _ReadsCache())
    assert kept["cache"] is not None and kept["use_cache"] is False
