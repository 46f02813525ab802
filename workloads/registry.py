"""The workload registry: the seed study's six built-in workloads, named models and user workload files.

Default batch sizes are the seed study's (AlexNet 128, ResNet50 32, ResNet101 32, GPT-2 8, BERT 16,
Whisper-small 16). Named models: ``torchvision:NAME``, ``timm:NAME`` and ``hf:ARCH`` (see
workloads/torchvision_models.py, timm_models.py, hf_models.py). :func:`workload_identity` names a workload's
code for the trace cache key without importing anything heavy.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from uvmlab.errors import InputError
from workloads.base import WorkloadSpec
from workloads.bert import BERT_OPTIONS, build_bert
from workloads.gpt2 import GPT2_OPTIONS, build_gpt2
from workloads.hf_models import config_file, hf_spec
from workloads.packages import package_version
from workloads.timm_models import timm_spec
from workloads.torchvision_models import torchvision_spec
from workloads.userfile import file_identity, load_user_workload
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


FAMILIES: dict[str, tuple[Callable[[str], WorkloadSpec], str]] = {
    "torchvision": (torchvision_spec, "torchvision"),
    "timm": (timm_spec, "timm"),
    "hf": (hf_spec, "transformers"),
}
"""Named-model prefixes: ``PREFIX:NAME`` -> (spec maker, the package whose version is part of the cache key)."""


def family(name: str) -> tuple[str, str] | None:
    """(prefix, rest) of a named model such as ``torchvision:vgg16``; None otherwise."""
    prefix, sep, rest = name.partition(":")
    return (prefix, rest) if sep and prefix in FAMILIES else None


def is_path(name_or_path: str) -> bool:
    """True if the argument names a file rather than a built-in workload."""
    if family(name_or_path) is not None:
        return False
    return name_or_path.endswith(".py") or "/" in name_or_path or Path(name_or_path).is_file()


def _unknown(name: str) -> InputError:
    return InputError(
        f"unknown workload {name!r}; known workloads: {', '.join(WORKLOADS)}, torchvision:NAME, timm:NAME, "
        "hf:ARCH (uvmlab workloads --all), or the path of a Python workload file"
    )


def load_workload(name_or_path: str) -> WorkloadSpec:
    """The built-in workload called ``name_or_path``, a named model (``PREFIX:NAME``) or a user workload file."""
    spec = WORKLOADS.get(name_or_path)
    if spec is not None:
        return spec
    named = family(name_or_path)
    if named is not None:
        return FAMILIES[named[0]][0](named[1])
    if is_path(name_or_path):
        return load_user_workload(name_or_path)
    raise _unknown(name_or_path)


def workload_identity(name_or_path: str) -> dict[str, Any]:
    """What identifies a workload's code, for the trace cache key: cheap (imports no model, no user file).

    Built-ins: their name. Named models: the canonical name and the version of the package that defines them
    (torchvision, timm, transformers) plus, for an ``hf:`` config file, its resolved path and SHA-256. User files:
    the resolved path and the SHA-256 of the file's bytes, so the same file named by another path (relative,
    absolute, through a symlink) has the same identity. A user file's imports (other local modules) are not
    part of it: editing those needs ``UVMLAB_CACHE`` cleared.
    """
    if name_or_path in WORKLOADS:
        return {"workload": name_or_path}
    named = family(name_or_path)
    if named is not None:
        prefix, rest = named
        ident: dict[str, Any] = {"package": f"{FAMILIES[prefix][1]}=={package_version(FAMILIES[prefix][1])}"}
        if prefix == "hf":
            path = config_file(rest.strip())
            if path is None:
                return {"workload": f"hf:{rest.strip().lower()}", **ident}
            return {"workload": f"hf:{path}", **ident, **file_identity(path)}
        if prefix == "torchvision":
            rest = rest.lower()
        return {"workload": f"{prefix}:{rest.strip()}", **ident}
    if is_path(name_or_path):
        fid = file_identity(name_or_path)
        return {"workload": fid["path"], **fid}
    raise _unknown(name_or_path)
