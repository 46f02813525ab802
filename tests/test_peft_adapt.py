"""LoRA and QLoRA through the real peft and bitsandbytes (workloads.peft_adapt): what trains, what is frozen, and the
4-bit storage layout, on tiny Llama-family configs captured on the meta device."""

from __future__ import annotations

from pathlib import Path

import pytest
from llm_tiny import COMMON, tiny_config

from uvmlab.config import WorkloadConfig
from uvmlab.errors import InputError

pytest.importorskip("peft", reason="peft is a test dependency (pip install -e '.[test]')")

FAMILIES = ("llama", "mistral", "qwen2", "gemma")
HEAD_DIM = {"llama": 32, "mistral": 32, "qwen2": COMMON["hidden_size"] // COMMON["num_attention_heads"], "gemma": 32}


def _trace(folder: Path, **kw: object) -> object:
    from uvmlab.trace.cache import get_trace

    return get_trace(WorkloadConfig(f"hf:{folder}", batch_size=2, iterations=2, options={"seq_len": 64}, **kw))


def _lora_bytes(family: str, rank: int) -> int:
    """Adapter bytes of q_proj and v_proj (peft's default targets) from their shapes: r x (in + out) fp32 each."""
    hidden, heads, kv = COMMON["hidden_size"], COMMON["num_attention_heads"], COMMON["num_key_value_heads"]
    q_out, v_out = heads * HEAD_DIM[family], kv * HEAD_DIM[family]
    per_layer = rank * (hidden + q_out) + rank * (hidden + v_out)
    return 4 * per_layer * COMMON["num_hidden_layers"]


@pytest.mark.parametrize("family", FAMILIES)
def test_lora_trains_only_the_adapters(tmp_path: Path, family: str) -> None:
    """Rule: the trainable bytes are the adapters' (from their shapes); every gradient and every optimizer state
    is an adapter's (the frozen base has none); Adam keeps two fp32 states per adapter weight."""
    folder = tiny_config(tmp_path / family, family)
    t = _trace(folder, lora_rank=4)
    expected = _lora_bytes(family, 4)
    assert t.header["trainable_parameter_bytes"] == expected
    a = t.allocations
    grads = a[(a["category"] == "gradient") & (a["iteration"] == 1)]
    assert int(grads["size_bytes"].sum()) == expected
    assert int(a.loc[a["category"] == "optimizer_state", "size_bytes"].sum()) == 2 * expected
    trainable = [p for p in t.header["parameters"] if p["trainable"]]
    assert all(".lora_" in p["name"] for p in trainable)
    assert {p["name"].split(".")[-3] for p in trainable} == {"lora_A", "lora_B"}
    frozen = [p for p in t.header["parameters"] if not p["trainable"]]
    assert frozen and all(g == -1 for p in frozen for g in p["grads"])


def test_lora_targets_and_bf16_base(tmp_path: Path) -> None:
    """--lora-targets chooses the wrapped modules; --weights-dtype bf16 stores the frozen base in bf16 while peft keeps
    the adapters in fp32 (autocast_adapter_dtype)."""
    folder = tiny_config(tmp_path / "m", "llama")
    t = _trace(folder, lora_rank=2, lora_targets=("gate_proj",), weights_dtype="bf16")
    params = t.header["parameters"]
    lora = [p for p in params if p["trainable"]]
    assert {p["name"].split(".")[-4] for p in lora} == {"gate_proj"}
    assert {p["dtype"] for p in lora} == {"float32"}
    assert {p["dtype"] for p in params if not p["trainable"]} == {"bfloat16"}
    hidden, ffn = COMMON["hidden_size"], COMMON["intermediate_size"]
    assert t.header["trainable_parameter_bytes"] == 4 * 2 * (hidden + ffn) * COMMON["num_hidden_layers"]


def test_setup_holds_the_loaded_model_only(tmp_path: Path) -> None:
    """Rule: the adapted model is rebuilt under the recorder as a loaded model holds it: at setup, parameters (and
    QLoRA's quantization state) only, no full-precision copy freed on the way."""
    folder = tiny_config(tmp_path / "m", "llama")
    t = _trace(folder, lora_rank=4, qlora=True, weights_dtype="bf16", dtype="bf16")
    a = t.allocations
    setup = a[a["phase"] == "setup"]
    assert len(setup) and set(setup["category"]) <= {"parameter", "other"}
    assert (setup["free_seq"] == -1).all()


def test_qlora_storage_is_bitsandbytes_layout(tmp_path: Path) -> None:
    """Rule: a 4-bit weight of n elements is ceil(n/2) packed bytes plus a uint8 absmax per 64 elements and an fp32
    absmax per 256 blocks (double quantization), the NF4 code and an offset; lm_head stays in the weights dtype."""
    from workloads.peft_adapt import qlora_weight_bytes

    folder = tiny_config(tmp_path / "m", "llama")
    t = _trace(folder, lora_rank=4, qlora=True, weights_dtype="bf16", dtype="bf16")
    params = {p["name"]: p for p in t.header["parameters"]}
    a = t.allocations.set_index("alloc_id")
    hidden, ffn = COMMON["hidden_size"], COMMON["intermediate_size"]
    q = params["base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"]
    assert q["dtype"] == "uint8" and not q["trainable"]
    assert int(a.at[q["alloc_id"], "size_bytes"]) == qlora_weight_bytes(hidden * hidden)["packed"]
    gate = params["base_model.model.model.layers.1.mlp.gate_proj.weight"]
    assert int(a.at[gate["alloc_id"], "size_bytes"]) == qlora_weight_bytes(hidden * ffn)["packed"]
    head = params["base_model.model.lm_head.weight"]
    assert head["dtype"] == "bfloat16"
    other = t.allocations[t.allocations["category"] == "other"]["size_bytes"].tolist()
    layer = [hidden * hidden, hidden * 64, hidden * 64, hidden * hidden, hidden * ffn, hidden * ffn, hidden * ffn]
    for n in layer:  # each weight's double-quantized absmax and its fp32 absmax
        parts = qlora_weight_bytes(n)
        assert parts["absmax_uint8"] in other
        assert parts["nested_absmax_fp32"] in other


def test_qlora_forward_dequantizes_the_weight_above_1536_rows(tmp_path: Path) -> None:
    """Rule (bitsandbytes' CUDA gemm_4bit): more than 1,536 input rows take the dequantize + F.linear fallback, a
    temporary of the whole weight in bf16 per call; fewer take the fused kernel (no such temporary)."""
    folder = tiny_config(tmp_path / "m", "llama")
    hidden = COMMON["hidden_size"]

    def dequantized(seq: int) -> list[int]:
        from uvmlab.trace.cache import get_trace

        cfg = WorkloadConfig(f"hf:{folder}", batch_size=1, iterations=1, options={"seq_len": seq}, lora_rank=4,
                             qlora=True, weights_dtype="bf16", dtype="bf16")  # fmt: skip
        a = get_trace(cfg).allocations
        f = a[(a["phase"] == "forward") & (a["op"] == "bitsandbytes::dequantize_4bit")]
        return f["size_bytes"].tolist()

    assert dequantized(1024) == []
    sizes = dequantized(2048)
    assert hidden * hidden * 2 in sizes and len(sizes) == 7 * COMMON["num_hidden_layers"]


def test_lora_refusals(tmp_path: Path) -> None:
    """One sentence for a QLoRA without adapters, targets without a rank, and targets matching nothing."""
    with pytest.raises(InputError, match="--lora R"):
        WorkloadConfig("gpt2", qlora=True)
    with pytest.raises(InputError, match="--lora R"):
        WorkloadConfig("gpt2", lora_targets=("q_proj",))
    folder = tiny_config(tmp_path / "m", "llama")
    with pytest.raises(InputError, match="peft"):
        _trace(folder, lora_rank=4, lora_targets=("no_such_module",))


def test_training_setup_keeps_old_hashes() -> None:
    """The new fields are left out of to_dict at their defaults (cache keys and run directories stay)."""
    d = WorkloadConfig("gpt2").to_dict()
    assert not {"lora_rank", "qlora", "shard", "world_size", "weights_dtype", "sdpa_backend", "lora_targets"} & set(d)
    d = WorkloadConfig("gpt2", lora_rank=8, lora_targets="q_proj, v_proj", shard="zero3", world_size=8).to_dict()
    assert d["lora_targets"] == ["q_proj", "v_proj"] and d["shard"] == "zero3" and d["world_size"] == 8


def test_a_bf16_base_cast_by_weights_dtype_keeps_fp32_compute(tmp_path: Path) -> None:
    """Only ``--dtype auto`` reads the built model's 2-byte weights as bf16 compute (workloads.hf_dtype): a base cast
    by ``--weights-dtype bf16`` (whose parameters are 2 bytes each too) keeps the run's fp32 kernels."""
    folder = tiny_config(tmp_path / "m", "llama")
    t = _trace(folder, weights_dtype="bf16")
    assert t.header["parameter_bytes"] <= 2 * t.header["parameter_count"]  # what the guard must not misread
    assert t.header["compute_dtype"] == "fp32"
