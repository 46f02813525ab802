"""BERT-base for masked LM (``BertForMaskedLM``) from ``transformers.BertConfig`` with random weights.

Inputs: (B, seq_len) token ids; labels are the ids themselves at every position (an approximation of MLM that
keeps the memory the same: the vocabulary-sized logits are computed for every position either way).
"""

from __future__ import annotations

from typing import Any

from uvmlab.config import WorkloadConfig
from uvmlab.errors import InputError
from workloads.base import Workload, hf_attention, multiple_of, positive, token_lm_workload

BERT_OPTIONS: dict[str, Any] = {
    "seq_len": 512,
    "n_layer": 12,
    "n_head": 12,
    "hidden_size": 768,
    "intermediate_size": 3072,
    "vocab_size": 30522,
}
MAX_POSITIONS = 512
"""BertConfig.max_position_embeddings of BERT-base."""


def build_bert(cfg: WorkloadConfig, device: str, opts: dict[str, Any]) -> Workload:
    """Build BertForMaskedLM on ``device`` (attention implementation from ``cfg.attention``)."""
    import torch
    from transformers import BertConfig, BertForMaskedLM

    positive("bert", opts, *BERT_OPTIONS)
    if opts["seq_len"] > MAX_POSITIONS:
        raise InputError(f"bert seq_len must be <= {MAX_POSITIONS}, not {opts['seq_len']}")
    multiple_of("bert", opts, "hidden_size", "n_head")
    config = BertConfig(
        vocab_size=opts["vocab_size"],
        hidden_size=opts["hidden_size"],
        num_hidden_layers=opts["n_layer"],
        num_attention_heads=opts["n_head"],
        intermediate_size=opts["intermediate_size"],
        max_position_embeddings=MAX_POSITIONS,
        attn_implementation=hf_attention(cfg),
    )
    dev = torch.device(device)
    with dev:
        model = BertForMaskedLM(config)
    model.train()
    return token_lm_workload("bert", model, dev, cfg.batch_size, opts["seq_len"], opts["vocab_size"])
