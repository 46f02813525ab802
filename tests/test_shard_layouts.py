"""One rank of a data-parallel job (uvmlab.trace.shard): each buffer rule of DDP, DeepSpeed ZeRO and FSDP/FSDP2 on a
tiny Llama captured once, and the DDP bucket assignment against PyTorch's own."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from llm_tiny import COMMON, tiny_config

from uvmlab.config import WorkloadConfig
from uvmlab.errors import InputError
from uvmlab.trace.schema import NEVER_FREED
from uvmlab.trace.shard import shard_trace
from uvmlab.trace.shard.ddp import DEFAULT_BUCKET_CAP_BYTES, DEFAULT_FIRST_BUCKET_BYTES, assign_buckets
from uvmlab.trace.shard.zero import ZeroConfig

WORLD_SIZES = (1, 2, 8, 64)


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> object:
    """Full fine-tuning of a tiny Llama (fp32, Adam), 2 iterations; odd vocabulary so dim-0 chunks pad."""
    from uvmlab.trace.cache import get_trace

    folder = tiny_config(tmp_path_factory.mktemp("full"), "llama", vocab_size=509)
    return get_trace(WorkloadConfig(f"hf:{folder}", batch_size=2, iterations=2, options={"seq_len": 64}))


@pytest.fixture(scope="module")
def lora(tmp_path_factory: pytest.TempPathFactory) -> object:
    """LoRA rank 4 on a bf16 base."""
    from uvmlab.trace.cache import get_trace

    folder = tiny_config(tmp_path_factory.mktemp("lora"), "llama")
    cfg = WorkloadConfig(f"hf:{folder}", batch_size=2, iterations=2, options={"seq_len": 64}, lora_rank=4,
                         weights_dtype="bf16", dtype="bf16")  # fmt: skip
    return get_trace(cfg)


def _params(trace: object) -> list[dict]:
    return trace.header["parameters"]  # type: ignore[attr-defined]


def _comm(t: object, op: str) -> object:
    a = t.allocations  # type: ignore[attr-defined]
    return a[(a["category"] == "communication") & (a["op"] == op)]


def _setup_params(t: object) -> int:
    a = t.allocations  # type: ignore[attr-defined]
    return int(a.loc[(a["phase"] == "setup") & (a["category"] == "parameter"), "size_bytes"].sum())


def _live_max(t: object, mask: object) -> int:
    """Largest number of bytes alive at once among the allocations selected by ``mask``."""
    a = t.allocations[mask]  # type: ignore[attr-defined]
    made = [(s, n) for s, n in zip(a["alloc_seq"], a["size_bytes"], strict=True)]
    freed = [(f, -n) for f, n in zip(a["free_seq"], a["size_bytes"], strict=True) if f != NEVER_FREED]
    ev = sorted(made + freed)
    return int(max(np.cumsum([n for _s, n in ev]), default=0))


# ---- FSDP2 ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_fsdp2_rank_parameter_bytes_are_padded_dim0_chunks(full: object, n: int) -> None:
    """Rule: a rank keeps ceil(dim0 / N) rows of every parameter (FSDPParam's padded shard): total / N up to the
    padding of one row per parameter."""
    t = shard_trace(full, "fsdp2", n)
    expected = sum(math.ceil(p["shape"][0] / n) * math.prod(p["shape"][1:]) * p["itemsize"] for p in _params(full))
    assert _setup_params(t) == expected
    total = sum(math.prod(p["shape"]) * p["itemsize"] for p in _params(full))
    row = max(math.prod(p["shape"][1:]) * p["itemsize"] for p in _params(full))
    assert total / n <= expected <= total / n + len(_params(full)) * row


def test_fsdp2_all_gather_and_reduce_scatter_buffers(full: object) -> None:
    """Rules: an all-gather output of N x the unit's padded shards, at most two alive (the next unit's copy-out frees
    the previous one in forward; one prefetch in backward); unsharded storages only inside an iteration; the
    reduce-scatter input holds the unit's padded gradients, its output (the sharded gradient) 1/N of it."""
    n = 8
    t = shard_trace(full, "fsdp2", n)
    a = t.allocations
    blocks = {}
    for p in _params(full):
        blocks.setdefault(p["block"], []).append(p)
    shard = {b: sum(math.ceil(p["shape"][0] / n) * math.prod(p["shape"][1:]) * p["itemsize"] for p in ps)
             for b, ps in blocks.items()}  # fmt: skip
    ag = _comm(t, "fsdp2:all_gather_output")
    assert set(ag["size_bytes"]) == {n * shard[b] for b in blocks}
    assert _live_max(t, (a["op"] == "fsdp2:all_gather_output").to_numpy()) <= 2 * max(ag["size_bytes"])
    unsharded = a[a["op"] == "fsdp2:unsharded_param"]
    assert (unsharded["free_seq"] != NEVER_FREED).all() and (unsharded["category"] == "parameter").all()
    rs_in = _comm(t, "fsdp2:reduce_scatter_input")
    rs_out = a[a["op"] == "fsdp2:reduce_scatter_output"]
    assert sorted(rs_in["size_bytes"] // n) == sorted(rs_out["size_bytes"])
    assert set(rs_out["category"]) == {"gradient"}
    assert _live_max(t, (a["op"] == "fsdp2:reduce_scatter_input").to_numpy()) <= max(rs_in["size_bytes"]) * 2
    assert {"nccl:all_gather", "nccl:reduce_scatter"} <= set(t.kernels["name"])


def test_fsdp2_keeps_lora_base_frozen(lora: object) -> None:
    """Rule: frozen base weights are sharded and gathered but never reduced: the reduce-scatter carries the
    adapters' gradients only."""
    n = 2
    t = shard_trace(lora, "fsdp2", n)
    adapters = sum(math.ceil(p["shape"][0] / n) * n * math.prod(p["shape"][1:]) * p["itemsize"]
                   for p in _params(lora) if p["trainable"])  # fmt: skip
    rs_in = _comm(t, "fsdp2:reduce_scatter_input")
    assert int(rs_in["size_bytes"].sum()) == adapters * 2  # two iterations


# ---- FSDP ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_fsdp_flat_parameter_shards(full: object, n: int) -> None:
    """Rule: one FlatParameter per unit padded to a multiple of N; a rank keeps 1/N; the all-gather output is the
    whole padded flat parameter, the sharded gradient 1/N of it."""
    t = shard_trace(full, "fsdp", n)
    units: dict[int, int] = {}
    for p in _params(full):
        units[p["block"]] = units.get(p["block"], 0) + math.prod(p["shape"])
    padded = {b: math.ceil(x / n) * n * 4 for b, x in units.items()}
    a = t.allocations
    shards = a[a["op"] == "fsdp:sharded_flat_param"]
    assert sorted(shards["size_bytes"]) == sorted(x // n for x in padded.values())
    assert _setup_params(t) == sum(x // n for x in padded.values())
    assert set(_comm(t, "fsdp:unsharded_flat_param")["size_bytes"]) == set(padded.values())
    assert set(a.loc[a["op"] == "fsdp:sharded_grad", "size_bytes"]) == {x // n for x in padded.values()}


def test_fsdp_refuses_mixed_dtype_units(lora: object) -> None:
    """FSDP's FlatParameter needs one dtype per unit; peft's fp32 adapters over a bf16 base mix two."""
    with pytest.raises(InputError, match="fsdp2"):
        shard_trace(lora, "fsdp", 2)


# ---- DDP -----------------------------------------------------------------------------------------------------
def test_ddp_buckets(full: object) -> None:
    """Rules: one bucket of every trainable gradient at construction (find_unused_parameters=False), rebuilt
    before the second forward in gradient-ready order with the 1 MiB / 25 MiB limits; the gradients stay."""
    t = shard_trace(full, "ddp", 8)
    trainable = sum(math.prod(p["shape"]) * p["itemsize"] for p in _params(full) if p["trainable"])
    b = _comm(t, "ddp:bucket")
    initial = b[b["phase"] == "setup"]
    assert initial["size_bytes"].tolist() == [trainable]
    rebuilt = b[b["phase"] != "setup"]
    assert int(rebuilt["size_bytes"].sum()) == trainable
    assert int(initial["free_seq"].iloc[0]) <= int(rebuilt["alloc_seq"].min())
    assert t.header["shard"]["buckets_rebuilt_bytes"][0] >= DEFAULT_FIRST_BUCKET_BYTES
    g = t.allocations[t.allocations["category"] == "gradient"]
    assert int(g["size_bytes"].sum()) == int(
        full.allocations.loc[full.allocations["category"] == "gradient", "size_bytes"].sum()  # type: ignore[attr-defined]
    )


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 3_000_000), min_size=1, max_size=40),
    dtypes=st.lists(st.sampled_from(["float32", "bfloat16"]), min_size=40, max_size=40),
    rebuild=st.booleans(),
)
def test_ddp_assignment_matches_pytorch(sizes: list[int], dtypes: list[str], rebuild: bool) -> None:
    """Rule: the torch-free assignment equals dist._compute_bucket_assignment_by_size (initial, sorted; and the
    rebuild's, with indices) for any tensor sizes and dtypes."""
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    kinds = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    tensors = [torch.empty(n, dtype=kinds[d], device="meta") for n, d in zip(sizes, dtypes, strict=False)]
    nbytes = [t.numel() * t.element_size() for t in tensors]
    keys = [str(t.dtype) for t in tensors]
    limits = [DEFAULT_FIRST_BUCKET_BYTES, DEFAULT_BUCKET_CAP_BYTES]
    indices = list(reversed(range(len(tensors)))) if rebuild else None
    ours = assign_buckets(nbytes, keys, limits, indices)
    theirs, their_limits = dist._compute_bucket_assignment_by_size(
        tensors, limits, [False] * len(tensors), indices or []
    )
    assert sorted(map(sorted, (b for b, _ in ours))) == sorted(map(sorted, theirs))
    if len({*keys}) == 1:  # one dtype: the order is defined
        assert [b for b, _ in ours] == theirs and [lim for _, lim in ours] == their_limits


# ---- ZeRO ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("stage", [1, 2])
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_zero12_partitions(full: object, stage: int, n: int) -> None:
    """Rules: the trainable parameters in one flat buffer padded to 2N elements; a rank's fp32 master partition and
    Adam's two fp32 states of 1/N of it; the ipg bucket of reduce_bucket_size elements during backward."""
    t = shard_trace(full, f"zero{stage}", n)
    numel = sum(math.prod(p["shape"]) for p in _params(full) if p["trainable"])
    aligned = math.ceil(numel / (2 * n)) * 2 * n
    a = t.allocations
    assert a.loc[a["op"] == "deepspeed:bit16_groups_flat", "size_bytes"].tolist() == [aligned * 4]
    assert a.loc[a["op"] == "deepspeed:fp32_partition", "size_bytes"].tolist() == [aligned // n * 4]
    assert a.loc[a["op"] == "deepspeed:adam_state", "size_bytes"].tolist() == [aligned // n * 4] * 2
    ipg = _comm(t, "deepspeed:ipg_buffer")
    assert set(ipg["size_bytes"]) == {ZeroConfig().reduce_bucket_size * 4}
    assert set(ipg["phase"]) <= {"backward", "forward"} and (ipg["free_seq"] != NEVER_FREED).all()
    captured = full.allocations  # type: ignore[attr-defined]
    assert not (a["category"] == "optimizer_state").sum() - 3  # master + 2 states replace torch's per-tensor states
    assert len(captured[captured["category"] == "optimizer_state"]) > 3


def test_zero2_releases_gradients_as_they_are_bucketed(full: object) -> None:
    """Rule: ZeRO-2 copies each gradient into the ipg bucket and releases it: no full gradient outlives backward;
    ZeRO-1 keeps them to the end of backward."""
    t1, t2 = shard_trace(full, "zero1", 8), shard_trace(full, "zero2", 8)
    big = max(math.prod(p["shape"]) * 4 for p in _params(full))
    for t, keeps in ((t1, True), (t2, False)):
        a = t.allocations
        g = a[(a["category"] == "gradient") & (a["size_bytes"] == big) & (a["phase"] == "backward")]
        assert len(g)
        lifetimes = (g["free_seq"] - g["alloc_seq"]).to_numpy()
        assert (lifetimes > 20).all() if keeps else (lifetimes < 20).all()


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_zero3_partitions_and_persistence(full: object, n: int) -> None:
    """Rules: each parameter partitioned to ceil(numel / N) elements, except those of at most 1e5 elements, which
    every rank keeps whole; gathers of N x the partition, released after use."""
    t = shard_trace(full, "zero3", n)
    threshold = ZeroConfig().param_persistence_threshold
    expected = sum((numel if numel <= threshold else math.ceil(numel / n)) * p["itemsize"]
                   for p in _params(full) for numel in [math.prod(p["shape"])])  # fmt: skip
    assert _setup_params(t) == expected
    gathers = _comm(t, "deepspeed:allgather_coalesced")
    assert (gathers["free_seq"] != NEVER_FREED).all()


def test_zero3_gathers_big_modules(tmp_path: Path) -> None:
    """With a module above the persistence threshold, ZeRO-3 gathers it (N x its partition) and releases it."""
    from uvmlab.trace.cache import get_trace

    folder = tiny_config(tmp_path / "big", "llama", vocab_size=1024)  # embeddings of 131,072 > 1e5 elements
    t0 = get_trace(WorkloadConfig(f"hf:{folder}", batch_size=1, iterations=1, options={"seq_len": 16}))
    n = 8
    t = shard_trace(t0, "zero3", n)
    sizes = set(_comm(t, "deepspeed:allgather_coalesced")["size_bytes"])
    assert 1024 * COMMON["hidden_size"] * 4 in sizes  # the embedding (and the head), padded to N: exact here


def test_shard_refusals(full: object) -> None:
    """One sentence: a world size without a layout, a trace without a parameter map, accumulation."""
    with pytest.raises(InputError, match="--shard"):
        WorkloadConfig("gpt2", world_size=8)
    with pytest.raises(InputError, match="world size"):
        WorkloadConfig("gpt2", shard="ddp", world_size=0)
    bare = type(full)(  # type: ignore[call-arg]
        allocations=full.allocations,
        kernels=full.kernels,
        accesses=full.accesses,  # type: ignore[attr-defined]
        header={k: v for k, v in full.header.items() if k != "parameters"},  # type: ignore[attr-defined]
    )
    with pytest.raises(InputError, match="parameter map"):
        shard_trace(bare, "fsdp2", 2)
    with pytest.raises(InputError, match="already rank 0"):
        shard_trace(shard_trace(full, "ddp", 2), "fsdp2", 2)


def test_zero_auto_buckets_follow_hf_trainer(full: object) -> None:
    """Rule: --shard-option KEY=auto is HF Trainer's: reduce_bucket_size = hidden_size ** 2 (and ZeRO-3's prefetch
    0.9 x that, persistence 10 x hidden_size); DDP's bucket_cap_mb sets both bucket limits."""
    hidden = COMMON["hidden_size"]
    t = shard_trace(full, "zero2", 8, {"reduce_bucket_size": "auto"})
    assert set(_comm(t, "deepspeed:ipg_buffer")["size_bytes"]) == {hidden * hidden * 4}
    t3 = shard_trace(full, "zero3", 8, {"param_persistence_threshold": "auto", "prefetch_bucket_size": "auto"})
    assert t3.header["shard"]["config"]["param_persistence_threshold"] == 10 * hidden
    assert t3.header["shard"]["config"]["prefetch_bucket_size"] == int(0.9 * hidden * hidden)
    d = shard_trace(full, "ddp", 8, {"bucket_cap_mb": 1})
    assert d.header["shard"]["first_bucket_bytes"] == d.header["shard"]["bucket_cap_bytes"] == 1 << 20
    with pytest.raises(InputError, match="applies to"):
        WorkloadConfig("gpt2", shard="ddp", shard_options={"reduce_bucket_size": 5})


def test_layouts_survive_checkpointing_and_autocast(tmp_path: Path) -> None:
    """With activation checkpointing under bf16 autocast a unit's gradients can finish after the next unit's
    backward (the weight casts' backward): every layout still orders its buffers (regression: FSDP2 freed a
    reduce-scatter input before making it)."""
    from uvmlab.trace.cache import get_trace

    folder = tiny_config(tmp_path / "ac", "llama")
    base = get_trace(WorkloadConfig(f"hf:{folder}", batch_size=2, iterations=2, options={"seq_len": 64},
                                    checkpoint="auto", dtype="bf16", optimizer="adamw"))  # fmt: skip
    for mode in ("ddp", "zero1", "zero2", "zero3", "fsdp", "fsdp2"):
        t = shard_trace(base, mode, 8)
        a = t.allocations
        assert ((a["free_seq"] == NEVER_FREED) | (a["free_seq"] > a["alloc_seq"])).all()


def test_orchestrator_keeps_gathered_parameters_transient(full: object) -> None:
    """Rule: the orchestrator's 'parameters live to the end' (xMem rule 1) is for the setup's parameters: FSDP2's
    gathered storages, made and freed inside an iteration, keep their lifetimes on the CUDA trace."""
    from uvmlab.gpus import get_gpu
    from uvmlab.trace.orchestrate import to_cuda

    cuda = to_cuda(shard_trace(full, "fsdp2", 8), get_gpu("A100-80GB"))
    a = cuda.allocations
    gathered = a[a["op"] == "fsdp2:unsharded_param"]
    assert len(gathered) and (gathered["free_seq"] != NEVER_FREED).all()
    setup = a[(a["category"] == "parameter") & (a["phase"] == "setup")]
    assert (setup["free_seq"] == NEVER_FREED).all()


def test_a_data_parallel_job_is_the_same_trace_captured_or_cached(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """``capture_trace`` (``uvmlab trace capture --shard``) and ``get_trace`` (``uvmlab run --shard``) make a job's
    trace in one place (uvmlab.trace.shard.job_trace): the same tables, the same rank-0 summary and the single-GPU
    config in both headers (the capture recorded the job's own config, with its layout, before)."""
    import pandas as pd

    from uvmlab.trace.cache import get_trace
    from uvmlab.trace.capture import capture_trace

    monkeypatch.setenv("UVMLAB_CACHE", str(tmp_path / "cache"))
    example = Path(__file__).resolve().parents[1] / "docs" / "examples" / "tiny_mlp.py"
    cfg = WorkloadConfig(str(example), iterations=2, shard="ddp", world_size=4)
    captured, cached = capture_trace(cfg), get_trace(cfg)
    assert captured.header["config"] == cached.header["config"] == cfg.single_gpu.to_dict()
    assert captured.header["shard"] == cached.header["shard"] and captured.header["shard"]["world_size"] == 4
    for name in ("allocations", "kernels", "accesses"):
        pd.testing.assert_frame_equal(getattr(captured, name), getattr(cached, name))
