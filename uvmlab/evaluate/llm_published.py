"""Published per-GPU peak memory of named fine-tuning jobs, and uvmlab's estimate of each (nothing fitted to them).

Each :class:`PublishedRow` is one measurement a project published with its configuration: the source (repository,
file, commit or address), what was measured (``allocated``: ``torch.cuda.max_memory_allocated()``; ``reserved``:
``max_memory_reserved()``; ``device``: the whole process as nvidia-smi sees it; ``unnamed``: the source does not
say), the value, or ``oom`` when the run did not fit, and the uvmlab configuration that stands for it with every
difference named in ``approximations``. :func:`evaluate` estimates every row with uvmlab's ordinary path
(``uvmlab.memory.estimate.estimate``) and compares the figure of the same kind (an ``unnamed`` measurement is
compared with the device peak). ``benchmarks/llm_published.py`` prints the table that docs/estimate.md holds.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from uvmlab.config import WorkloadConfig
from uvmlab.gpus import get_gpu

GB = 1e9
GIB = 1 << 30
LITGPT = "Lightning-AI/lit-gpt tutorials/resource-tables.md (doc dated 2023-10-20, Lit-GPT commit 8641822)"
QWEN = "QwenLM/Qwen README.md, 'Profiling of Memory and Speed' (finetune/finetune_lora_single_gpu.sh)"
TITAN = "pytorch/torchtitan docs/performance.md, Table 1 (Llama 3.1 8B, 8 x H100 96GB)"
GIST = "https://gist.github.com/chenyaofo/d4cd6a20ab4b95cb3a49491747e2139a (DeepSpeed 0.14.2, PyTorch 2.2.0, 8 x A800)"

QWEN_7B_AS_QWEN2 = {
    "model_type": "qwen2",
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "vocab_size": 151936,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "use_sliding_window": False,
}
"""Qwen-7B (QwenLM/Qwen, remote code: hidden 4096, 32 layers and heads, MLP w1/w2 of 11,008 = intermediate_size
22,016 / 2, vocabulary 151,936, bias on c_attn) written as transformers' Qwen2 architecture, which has the same
shapes (Qwen1.5 = Qwen2 is its successor)."""
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class PublishedRow:
    """One published measurement (module docstring)."""

    row_id: str
    source: str
    gpu: str
    metric: str
    measured_bytes: float | None
    """None: the run did not fit (out of memory)."""
    workload: str
    config: dict[str, Any] = field(default_factory=dict)
    approximations: str = ""
    gpu_memory: str | None = None
    """A capacity other than the uvmlab.gpus entry's (the H100 with 96 GB HBM2e of torchtitan's table)."""


def rows() -> list[PublishedRow]:
    """The published rows (module docstring), in table order."""
    lora = {"lora_rank": 8, "weights_dtype": "bf16", "dtype": "bf16", "iterations": 2, "options": {"seq_len": 1304}}
    litgpt = ("LitGPT's own Llama implementation (chunked lm_head and loss; bf16-true keeps the adapters in bf16); "
              "the longest Alpaca sample, 1,304 tokens, sets the peak")  # fmt: skip
    qwen = {"lora_rank": 64, "lora_targets": ALL_LINEAR, "weights_dtype": "bf16", "dtype": "bf16", "iterations": 2,
            "checkpoint": "auto", "batch_size": 1}  # fmt: skip
    qwen_note = "Qwen's remote-code model as Qwen2; fused c_attn adapters as q/k/v; LoRA dropout 0.05 not modelled"
    out = [
        PublishedRow("litgpt-7b-lora-mb1", LITGPT, "A100-40GB", "allocated", 21.30 * GB, "hf:llama-2-7b",
                     {**lora, "batch_size": 1}, litgpt),
        PublishedRow("litgpt-7b-lora-mb2", LITGPT, "A100-40GB", "allocated", 29.07 * GB, "hf:llama-2-7b",
                     {**lora, "batch_size": 2}, litgpt),
        PublishedRow("litgpt-7b-lora-mb4", LITGPT, "A100-40GB", "allocated", None, "hf:llama-2-7b",
                     {**lora, "batch_size": 4}, litgpt),
        PublishedRow("litgpt-7b-qlora-nf4dq-mb1", LITGPT, "A100-40GB", "allocated", 13.84 * GB, "hf:llama-2-7b",
                     {**lora, "batch_size": 1, "qlora": True}, litgpt + "; Lit-GPT may quantize lm_head too"),
        PublishedRow("litgpt-13b-lora-mb1", LITGPT, "A100-40GB", "allocated", 38.12 * GB, "hf:llama-2-13b",
                     {**lora, "batch_size": 1}, litgpt),
        PublishedRow("litgpt-13b-lora-mb2", LITGPT, "A100-40GB", "allocated", None, "hf:llama-2-13b",
                     {**lora, "batch_size": 2}, litgpt),
        PublishedRow("litgpt-13b-qlora-nf4dq-mb1", LITGPT, "A100-40GB", "allocated", 22.55 * GB, "hf:llama-2-13b",
                     {**lora, "batch_size": 1, "qlora": True}, litgpt + "; Lit-GPT may quantize lm_head too"),
    ]  # fmt: skip
    for seq, gb in ((256, 20.1), (1024, 21.5), (2048, 23.8), (4096, 29.7), (8192, 36.6)):
        out.append(PublishedRow(f"qwen-7b-lora-{seq}", QWEN, "A100-80GB", "unnamed", gb * GB, "qwen-7b",
                                {**qwen, "options": {"seq_len": seq}}, qwen_note))  # fmt: skip
    titan = {"batch_size": 2, "options": {"seq_len": 8192}, "optimizer": "adamw", "dtype": "bf16", "iterations": 2,
             "shard": "fsdp2", "world_size": 8}  # fmt: skip
    titan_note = ("torchtitan's own Llama; selective (op) activation checkpointing between the two bounds shown; "
                  "MixedPrecisionPolicy(bf16 params) approximated by bf16 autocast over fp32 shards")  # fmt: skip
    out += [
        PublishedRow("torchtitan-8b-fsdp2-fullAC", TITAN, "H100-80GB", "reserved", 82.4 * GIB, "hf:llama-3.1-8b",
                     {**titan, "checkpoint": "auto"}, titan_note + " (this row: full AC, a lower bound)", "96GB"),
    ]  # fmt: skip
    ds = {"options": {"seq_len": 4096}, "weights_dtype": "bf16", "dtype": "bf16", "iterations": 2, "world_size": 8,
          "optimizer": "adamw"}  # fmt: skip
    auto2 = {"reduce_bucket_size": "auto"}
    auto3 = {"reduce_bucket_size": "auto", "prefetch_bucket_size": "auto", "param_persistence_threshold": "auto"}
    ds_note = "precision, bucket sizes (HF 'auto' assumed) and the metric (the second 'GPU Mem.' figure) not stated"
    for stage, ckpt, bs, gb in ((2, False, 1, 44.8), (2, True, 1, 23.5), (2, True, 4, 38.6), (3, False, 2, 75.7),
                                (3, True, 2, 20.4), (3, True, 8, 39.1)):  # fmt: skip
        cfg = {**ds, "shard": f"zero{stage}", "batch_size": bs, "shard_options": auto2 if stage == 2 else auto3}
        if ckpt:
            cfg["checkpoint"] = "auto"
        out.append(PublishedRow(f"gist-7b-zero{stage}-{'ckpt' if ckpt else 'nockpt'}-bs{bs}", GIST, "A100-80GB",
                                "unnamed", gb * GB, "hf:llama-2-7b", cfg, ds_note))  # fmt: skip
    return out


@dataclass
class RowResult:
    """uvmlab's figures for one row."""

    row: PublishedRow
    estimated_bytes: int
    """The figure of the row's metric: peak allocated, peak reserved, or the device peak."""
    fits: bool
    device_peak_bytes: int
    peak_reserved_bytes: int
    peak_allocated_bytes: int
    seconds: float

    @property
    def error(self) -> float | None:
        """(estimate - measured) / measured, None for an out-of-memory row."""
        m = self.row.measured_bytes
        return None if m is None else (self.estimated_bytes - m) / m


def workload_config(row: PublishedRow, folder: Path) -> WorkloadConfig:
    """The WorkloadConfig of ``row`` (a config.json in ``folder`` for the rows that need one)."""
    workload = row.workload
    if workload == "qwen-7b":
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(QWEN_7B_AS_QWEN2))
        workload = f"hf:{folder}"
    return WorkloadConfig(workload, **row.config)


def evaluate(selected: list[PublishedRow] | None = None, progress: Any = None) -> list[RowResult]:
    """Estimate every row with uvmlab (its captures are cached)."""
    from uvmlab.memory.estimate import estimate

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for row in selected if selected is not None else rows():
            if progress is not None:
                progress(row.row_id)
            cfg = workload_config(row, Path(tmp) / row.row_id)
            est = estimate(cfg, get_gpu(row.gpu, row.gpu_memory))
            figure = {
                "allocated": est.peak_allocated_bytes,
                "reserved": est.peak_reserved_bytes,
            }.get(row.metric, est.device_peak_bytes)
            results.append(
                RowResult(
                    row,
                    int(figure),
                    not est.oom,
                    est.device_peak_bytes,
                    est.peak_reserved_bytes,
                    est.peak_allocated_bytes,
                    est.seconds["total"],
                )
            )
    return results
