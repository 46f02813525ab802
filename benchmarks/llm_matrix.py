"""Every fine-tuning layout on the Llama, Mistral, Qwen and Gemma families: LoRA, QLoRA and each --shard mode at
world sizes 1, 2, 8 and 64, for ``hf:`` names and for a user's config.json (issue 45's matrix).

    python benchmarks/llm_matrix.py [--quick]

Each cell is ``uvmlab.memory.estimate.estimate`` (the path ``uvmlab estimate`` takes): batch 1, seq_len 2048, two
iterations, bf16 weights and autocast, AdamW; the layouts train every weight (full fine-tuning) with activation
checkpointing, LoRA rank 16 on peft's default targets, QLoRA the same on NF4 weights. A cell prints the device peak
in GB (1e9 bytes) and whether it fits an 80 GB A100; a refusal (InputError: one sentence) and a traceback are counted
apart. ``--quick`` uses 2-layer versions (num_layers=2) of the same configs. Captures are cached (UVMLAB_CACHE).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from uvmlab.config import SHARD_MODES, WorkloadConfig
from uvmlab.errors import InputError
from uvmlab.gpus import get_gpu
from uvmlab.memory.estimate import estimate
from workloads.hf_models import PRESETS

NAMES = {"llama": "llama-3.1-8b", "mistral": "mistral-7b", "qwen": "qwen2.5-7b", "gemma": "gemma-7b"}
USER_FILES = {"llama": "llama-3.2-1b", "mistral": "mistral-7b", "qwen": "qwen2.5-0.5b", "gemma": "gemma-2b"}
"""The user's config.json of each family: a preset's fields written to a file (Mistral's 7B: it has no small one)."""
WORLD_SIZES = (1, 2, 8, 64)


def cells(workload: str, quick: bool) -> list[tuple[str, dict[str, Any]]]:
    """(label, WorkloadConfig fields) of every cell of one model."""
    base: dict[str, Any] = {"batch_size": 1, "iterations": 2, "options": {"seq_len": 2048}, "weights_dtype": "bf16",
                            "dtype": "bf16", "optimizer": "adamw"}  # fmt: skip
    if quick:
        base["options"] = {"seq_len": 2048, "num_layers": 2}
    out = [("lora", {**base, "lora_rank": 16}), ("qlora", {**base, "lora_rank": 16, "qlora": True})]
    for mode in SHARD_MODES:
        for n in WORLD_SIZES:
            out.append((f"{mode}@{n}", {**base, "checkpoint": "auto", "shard": mode, "world_size": n}))
    out.append(("lora+fsdp2@8", {**base, "lora_rank": 16, "shard": "fsdp2", "world_size": 8}))
    out.append(("lora+zero3@8", {**base, "lora_rank": 16, "shard": "zero3", "world_size": 8}))
    return out


def main(argv: list[str]) -> None:
    quick = "--quick" in argv
    gpu = get_gpu("A100-80GB")
    counts = {"cells": 0, "estimated": 0, "refused": 0, "tracebacks": 0}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        models = [(f, f"hf:{n}", "name") for f, n in NAMES.items()]
        for family, preset in USER_FILES.items():
            folder = Path(tmp) / family
            folder.mkdir()
            (folder / "config.json").write_text(json.dumps(PRESETS[preset][0]))
            models.append((family, f"hf:{folder}", f"config.json ({preset})"))
        for family, workload, kind in models:
            row = []
            for label, fields in cells(workload, quick):
                counts["cells"] += 1
                try:
                    est = estimate(WorkloadConfig(workload, **fields), gpu)
                    counts["estimated"] += 1
                    row.append(f"{label} {est.device_peak_bytes / 1e9:.1f}{'' if not est.oom else ' OOM'}")
                except InputError as exc:
                    counts["refused"] += 1
                    row.append(f"{label} refused ({str(exc)[:60]})")
                except Exception:
                    counts["tracebacks"] += 1
                    row.append(f"{label} TRACEBACK")
                    traceback.print_exc()
                print(f"... {family} {kind} {row[-1]}", file=sys.stderr, flush=True)
            print(f"| {family} | {kind} | " + "; ".join(row) + " |", flush=True)
    print(f"\n{counts} in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
