"""GPT-2 (124M by default) from ``transformers.GPT2Config`` with random weights; causal LM loss on random tokens.

Inputs: (B, seq_len) token ids, ``labels = input_ids`` (the model shifts them). Options change the size, e.g.
``n_layer=2`` for a small model that also runs on the CPU.
"""

from __future__ import annotations

from typing import Any

from uvmlab.config import WorkloadConfig
from uvmlab.errors import InputError
from workloads.base import Workload, hf_attention, multiple_of, positive, token_lm_workload

GPT2_OPTIONS: dict[str, Any] = {
    "seq_len": 1024,
    "n_layer": 12,
    "n_head": 12,
    "n_embd": 768,
    "vocab_size": 50257,
    "n_positions": 1024,
}


def build_gpt2(cfg: WorkloadConfig, device: str, opts: dict[str, Any]) -> Workload:
    """Build GPT2LMHeadModel on ``device`` (attention implementation from ``cfg.attention``)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    positive("gpt2", opts, *GPT2_OPTIONS)
    if opts["seq_len"] > opts["n_positions"]:
        raise InputError(f"gpt2 seq_len {opts['seq_len']} exceeds n_positions {opts['n_positions']}")
    multiple_of("gpt2", opts, "n_embd", "n_head")
    config = GPT2Config(
        vocab_size=opts["vocab_size"],
        n_positions=opts["n_positions"],
        n_embd=opts["n_embd"],
        n_layer=opts["n_layer"],
        n_head=opts["n_head"],
        attn_implementation=hf_attention(cfg),
    )
    dev = torch.device(device)
    with dev:
        model = GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"  # what transformers falls back to anyway, minus its warning
    model.train()
    return token_lm_workload("gpt2", model, dev, cfg.batch_size, opts["seq_len"], opts["vocab_size"])
