"""CUDA emulation on meta: SDPA routed to flash / memory-efficient attention, bf16 autocast."""

from __future__ import annotations

import torch

from uvmlab.config import WorkloadConfig
from uvmlab.trace.capture import capture_trace
from uvmlab.trace.emulate import AutocastEmulation, SdpaEmulation

SMALL_GPT2 = {"n_layer": 1, "seq_len": 128}


def _kernels(trace) -> set[str]:
    return set(trace.kernels["name"])


def test_sdpa_fp32_uses_efficient_attention_and_keeps_no_attention_matrix() -> None:
    sdpa = capture_trace(WorkloadConfig("gpt2", batch_size=2, iterations=1, options=SMALL_GPT2))
    eager = capture_trace(WorkloadConfig("gpt2", batch_size=2, iterations=1, attention="eager", options=SMALL_GPT2))
    assert "aten::_scaled_dot_product_efficient_attention" in _kernels(sdpa)
    assert "aten::_scaled_dot_product_efficient_attention_backward" in _kernels(sdpa)
    assert any("efficient x1" in n for n in sdpa.header["notes"])
    # eager keeps B x H x T x T attention probabilities; sdpa (efficient) does not
    attn_matrix = 2 * 12 * 128 * 128 * 4
    for trace, has in ((eager, True), (sdpa, False)):
        a = trace.allocations
        act = a[(a["category"] == "activation") & (a["size_bytes"] == attn_matrix)]
        assert (len(act) > 0) == has

    def act_bytes(t):
        return t.allocations.query("category == 'activation'")["size_bytes"].sum()

    assert act_bytes(eager) > act_bytes(sdpa)


def test_sdpa_without_emulation_takes_the_math_path() -> None:
    t = capture_trace(WorkloadConfig("gpt2", batch_size=2, iterations=1, options=SMALL_GPT2), emulate_cuda=False)
    assert not any("scaled_dot_product" in k for k in _kernels(t))
    assert any("NOT emulated" in n for n in t.header["notes"])


def test_bf16_uses_flash_attention_and_bf16_activations() -> None:
    t = capture_trace(WorkloadConfig("gpt2", batch_size=2, iterations=1, dtype="bf16", options=SMALL_GPT2))
    assert "aten::_scaled_dot_product_flash_attention" in _kernels(t)
    assert any("bf16 autocast emulated" in n for n in t.header["notes"])
    f32 = capture_trace(WorkloadConfig("gpt2", batch_size=2, iterations=1, options=SMALL_GPT2))

    def matmul_outputs(tr) -> list[int]:
        return sorted(tr.allocations.query("phase == 'forward' and op == 'aten::addmm'")["size_bytes"])

    # every matmul output is bf16 (half the bytes); the bf16 weight copies of autocast's cache appear as _to_copy
    assert matmul_outputs(t) == [s // 2 for s in matmul_outputs(f32)]
    wte = 50257 * 768
    assert (t.allocations.query("phase == 'forward' and op == 'aten::_to_copy'")["size_bytes"] == 2 * wte).any()
    # parameters, gradients and optimizer state stay fp32 under autocast
    for cat in ("parameter", "gradient", "optimizer_state"):
        b16 = t.allocations.loc[t.allocations["category"] == cat, "size_bytes"].sum()
        b32 = f32.allocations.loc[f32.allocations["category"] == cat, "size_bytes"].sum()
        assert b16 == b32, cat


def test_autocast_emulation_casts_and_caches_weights() -> None:
    emu = AutocastEmulation()
    w = torch.empty(8, 8, device="meta", requires_grad=True)
    x = torch.empty(4, 8, device="meta")
    with emu.region():
        y1 = torch.nn.functional.linear(x, w)
        y2 = torch.nn.functional.linear(x, w)
        assert len(emu.cache) == 1  # one cast of the weight per autocast region
        s = torch.softmax(y1, dim=-1)
    assert y1.dtype == y2.dtype == torch.bfloat16 and s.dtype == torch.float32
    assert emu.cache == {}


def test_sdpa_emulation_converts_boolean_masks_to_bias() -> None:
    q = torch.empty(2, 4, 16, 8, device="meta", requires_grad=True)
    mask = torch.ones(16, 16, dtype=torch.bool, device="meta")
    emu = SdpaEmulation()
    with emu:
        out = torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask)
    assert out.shape == q.shape and emu.counts["efficient"] == 1
