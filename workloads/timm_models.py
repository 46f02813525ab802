"""``timm:NAME``: any timm model (``pip install uvmlab[timm]``), with random weights, as an image classifier.

``timm.create_model(NAME, pretrained=False, num_classes=C)`` never downloads anything. Inputs: (B, 3, S, S)
images and B labels, cross-entropy loss (tuple outputs as in :mod:`workloads.torchvision_models`). ``S`` is the
model's own input size (``pretrained_cfg["input_size"]``) unless ``image_size`` is given; a model whose
constructor takes ``img_size`` (ViT, Swin, ...) is then built for that size, others just get larger images.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from uvmlab.config import WorkloadConfig
from uvmlab.errors import InputError
from workloads.base import Workload, WorkloadSpec, build_module, positive
from workloads.torchvision_models import DEFAULT_BATCH_SIZE, check_name, image_workload

TIMM_OPTIONS: dict[str, Any] = {"image_size": 0, "num_classes": 1000}
"""``image_size`` 0: the model's own input size."""


def timm_spec(name: str) -> WorkloadSpec:
    """The WorkloadSpec of ``timm:name`` (cheap: timm is imported only when it is built)."""
    arch = name.strip()
    if not arch:
        raise InputError("timm: needs a model name, e.g. timm:vit_base_patch16_224 (uvmlab workloads --all)")
    return WorkloadSpec(
        f"timm:{arch}",
        f"timm.create_model({arch!r}, pretrained=False)",
        DEFAULT_BATCH_SIZE,
        partial(build_timm, arch),
        TIMM_OPTIONS,
        source="timm",
    )


def import_timm() -> Any:
    """timm, or an InputError saying how to install it."""
    try:
        import timm
    except ImportError:
        raise InputError("timm: models need the timm package: pip install 'uvmlab[timm]'") from None
    return timm


def list_timm_models() -> list[str]:
    """timm's model names (imports timm)."""
    return list(import_timm().list_models())


def build_timm(arch: str, cfg: WorkloadConfig, device: str, opts: dict[str, Any]) -> Workload:
    """Build timm model ``arch`` on ``device`` in train mode, with its image batch maker."""
    import torch

    timm = import_timm()
    if not timm.is_model(arch):
        check_name("timm", arch, list(timm.list_models()))
    if opts["image_size"] < 0 or opts["num_classes"] < 1:
        positive(f"timm:{arch}", opts, "image_size", "num_classes")
    classes = opts["num_classes"]

    def create(**extra: Any) -> Any:
        return build_module(device, lambda: timm.create_model(arch, pretrained=False, num_classes=classes, **extra))

    size = opts["image_size"]
    if size:
        try:
            model = create(img_size=size)
        except TypeError:  # a CNN: no img_size argument, any input size works
            model = create()
    else:
        model = create()
        size = int(model.pretrained_cfg.get("input_size", (3, 224, 224))[-1])
    model.train()
    return image_workload(f"timm:{arch}", model, torch.device(device), cfg.batch_size, size, classes)
