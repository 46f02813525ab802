"""Whisper-small (``WhisperForConditionalGeneration``) with EVERY dimension set explicitly, random weights.

The transformers ``WhisperConfig`` defaults describe whisper-tiny, so every dimension is set here from OpenAI's
``ModelDimensions`` for small (d_model 768, 12+12 layers, 12 heads, FFN 3072, vocab 51865, 80 mel bins, 1500
source and 448 target positions). Inputs: features (B, 80, 2 x source_positions) = (B, 80, 3000) and
labels (B, label_len), label_len <= 448 (default 448: the seed study's label length is unknown).
"""

from __future__ import annotations

from typing import Any

from uvmlab.config import WorkloadConfig
from uvmlab.errors import InputError
from workloads.base import Workload, hf_attention, multiple_of, positive

WHISPER_OPTIONS: dict[str, Any] = {
    "d_model": 768,
    "encoder_layers": 12,
    "decoder_layers": 12,
    "n_head": 12,
    "ffn_dim": 3072,
    "vocab_size": 51865,
    "num_mel_bins": 80,
    "source_positions": 1500,
    "target_positions": 448,
    "label_len": 448,
}
CONV_STRIDE = 2
"""The encoder's conv1 stride (1) times conv2 stride (2): input frames = 2 x max_source_positions."""


def build_whisper(cfg: WorkloadConfig, device: str, opts: dict[str, Any]) -> Workload:
    """Build WhisperForConditionalGeneration on ``device``."""
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    positive("whisper-small", opts, *WHISPER_OPTIONS)
    if opts["label_len"] > opts["target_positions"]:
        raise InputError(
            f"whisper-small label_len {opts['label_len']} exceeds target_positions {opts['target_positions']}"
        )
    multiple_of("whisper-small", opts, "d_model", "n_head")
    config = WhisperConfig(
        vocab_size=opts["vocab_size"],
        num_mel_bins=opts["num_mel_bins"],
        d_model=opts["d_model"],
        encoder_layers=opts["encoder_layers"],
        decoder_layers=opts["decoder_layers"],
        encoder_attention_heads=opts["n_head"],
        decoder_attention_heads=opts["n_head"],
        encoder_ffn_dim=opts["ffn_dim"],
        decoder_ffn_dim=opts["ffn_dim"],
        max_source_positions=opts["source_positions"],
        max_target_positions=opts["target_positions"],
        attn_implementation=hf_attention(cfg),
    )
    dev = torch.device(device)
    with dev:
        model = WhisperForConditionalGeneration(config)
    model.train()
    batch = cfg.batch_size
    frames = CONV_STRIDE * opts["source_positions"]
    mels, labels_len, vocab = opts["num_mel_bins"], opts["label_len"], opts["vocab_size"]

    def make_batch() -> tuple[torch.Tensor, torch.Tensor]:
        features = torch.randn(batch, mels, frames, device=dev)
        labels = torch.randint(0, vocab, (batch, labels_len), device=dev)
        return features, labels

    def loss_fn(m: torch.nn.Module, b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return m(input_features=b[0], labels=b[1]).loss

    return Workload("whisper-small", model, make_batch, loss_fn, dev, attention=model.config._attn_implementation)
