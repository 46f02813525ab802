"""``--sdpa-backend``: the attention backend's memory on a long sequence (uvmlab.trace.emulate.SdpaEmulation)."""

from __future__ import annotations

from pathlib import Path

import pytest
from llm_tiny import COMMON, tiny_config

from uvmlab.config import WorkloadConfig
from uvmlab.errors import InputError


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_config(tmp_path_factory.mktemp("sdpa"), "llama", num_hidden_layers=2)


def _trace(folder: Path, **kw: object) -> object:
    from uvmlab.trace.cache import get_trace

    return get_trace(WorkloadConfig(f"hf:{folder}", batch_size=1, iterations=1, options={"seq_len": 1024}, **kw))


def test_backends_and_their_memory(folder: Path) -> None:
    """auto takes flash in bf16, efficient is forced on request, math materializes the B x H x T x T scores (the
    largest allocations of its forward), flash and efficient keep nothing that size."""
    from uvmlab.trace.summary import peak_live

    seq, heads = 1024, COMMON["num_attention_heads"]
    scores = heads * seq * seq * 4  # fp32 probabilities of one layer (the math path upcasts bf16)
    runs = {b: _trace(folder, dtype="bf16", sdpa_backend=b) for b in ("auto", "efficient", "math")}
    notes = {b: " ".join(t.header["notes"]) for b, t in runs.items()}  # type: ignore[attr-defined]
    assert "flash x" in notes["auto"] and "efficient x" in notes["efficient"] and "math x" in notes["math"]
    for b in ("auto", "efficient"):
        a = runs[b].allocations  # type: ignore[attr-defined]
        assert a.loc[a["phase"] == "forward", "size_bytes"].max() < scores / 2
    a = runs["math"].allocations  # type: ignore[attr-defined]
    assert a.loc[a["phase"] == "forward", "size_bytes"].max() >= scores / 2
    assert peak_live(runs["math"])[0] > peak_live(runs["auto"])[0] + scores / 2


def test_flash_refuses_fp32(folder: Path) -> None:
    """PyTorch has no flash kernel for fp32: forcing it is one sentence."""
    with pytest.raises(InputError, match="flash"):
        _trace(folder, sdpa_backend="flash")
