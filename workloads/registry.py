"""The workload registry: the seed study's six built-in workloads, and user workload files by path.

Default batch sizes are the seed study's (AlexNet 128, ResNet50 32, ResNet101 32, GPT-2 8, BERT 16,
Whisper-small 16).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from uvmlab.errors import InputError
from workloads.base import WorkloadSpec
from workloads.bert import BERT_OPTIONS, build_bert
from workloads.gpt2 import GPT2_OPTIONS, build_gpt2
from workloads.userfile import load_user_workload
from workloads.vision import VISION_OPTIONS, build_vision
from workloads.whisper import WHISPER_OPTIONS, build_whisper


def _vision(arch: str, batch: int, description: str) -> WorkloadSpec:
    return WorkloadSpec(arch, description, batch, partial(build_vision, arch), VISION_OPTIONS)


WORKLOADS: dict[str, WorkloadSpec] = {
    spec.name: spec
    for spec in (
        _vision("alexnet", 128, "torchvision AlexNet, 3x224x224 images, 1000 classes"),
        _vision("resnet50", 32, "torchvision ResNet-50, 3x224x224 images, 1000 classes"),
        _vision("resnet101", 32, "torchvision ResNet-101, 3x224x224 images, 1000 classes"),
        WorkloadSpec("gpt2", "GPT-2 124M (GPT2LMHeadModel), 1024 tokens", 8, build_gpt2, GPT2_OPTIONS),
        WorkloadSpec("bert", "BERT-base (BertForMaskedLM), 512 tokens", 16, build_bert, BERT_OPTIONS),
        WorkloadSpec(
            "whisper-small",
            "Whisper-small (WhisperForConditionalGeneration), features 80x3000, 448 label tokens",
            16,
            build_whisper,
            WHISPER_OPTIONS,
        ),
    )
}


def is_path(name_or_path: str) -> bool:
    """True if the argument names a file rather than a built-in workload."""
    return name_or_path.endswith(".py") or "/" in name_or_path or Path(name_or_path).is_file()


def load_workload(name_or_path: str) -> WorkloadSpec:
    """The built-in workload called ``name_or_path``, or the user workload file at that path."""
    spec = WORKLOADS.get(name_or_path)
    if spec is not None:
        return spec
    if is_path(name_or_path):
        return load_user_workload(name_or_path)
    raise InputError(
        f"unknown workload {name_or_path!r}; known workloads: {', '.join(WORKLOADS)} "
        "(or give the path of a Python workload file)"
    )
