"""Tiny Llama/Mistral/Qwen2/Gemma configs (a user's config.json) for the LoRA, QLoRA and data-parallel tests: they
capture in a couple of seconds on the meta device."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TINY: dict[str, dict[str, Any]] = {
    "llama": {"architectures": ["LlamaForCausalLM"], "head_dim": 32},
    "mistral": {"architectures": ["MistralForCausalLM"], "head_dim": 32, "sliding_window": None},
    "qwen2": {"architectures": ["Qwen2ForCausalLM"], "use_sliding_window": False},
    "gemma": {"architectures": ["GemmaForCausalLM"], "head_dim": 32, "hidden_activation": "gelu_pytorch_tanh"},
}
"""Family -> the fields that differ from :data:`COMMON`."""
COMMON: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}


def tiny_config(folder: Path, family: str = "llama", **fields: Any) -> Path:
    """Write ``folder/config.json`` of a tiny model of ``family``; return the folder (an ``hf:`` name's path)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {"model_type": family, **COMMON, **TINY[family], **fields}
    (folder / "config.json").write_text(json.dumps(config))
    return folder
