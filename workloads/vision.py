"""torchvision image classifiers (AlexNet, ResNet50, ResNet101) with random weights.

Inputs: (B, 3, image_size, image_size) images and B class labels; loss: cross entropy. ``weights=None``
(torchvision's default) never downloads anything.
"""

from __future__ import annotations

from typing import Any

from uvmlab.config import WorkloadConfig
from workloads.base import Workload, positive

VISION_OPTIONS: dict[str, Any] = {"image_size": 224, "num_classes": 1000}
ARCHS = {"alexnet": "alexnet", "resnet50": "resnet50", "resnet101": "resnet101"}
MIN_IMAGE_SIZE = {"alexnet": 63, "resnet50": 32, "resnet101": 32}
"""Smallest input side the architecture accepts (AlexNet's strided convolutions and pools need 63 px)."""


def build_vision(arch: str, cfg: WorkloadConfig, device: str, opts: dict[str, Any]) -> Workload:
    """Build torchvision ``arch`` on ``device`` with the batch maker for (B, 3, S, S) images."""
    import torch
    import torch.nn.functional as F
    import torchvision

    from uvmlab.errors import InputError

    positive(arch, opts, "image_size", "num_classes")
    if opts["image_size"] < MIN_IMAGE_SIZE[arch]:
        raise InputError(f"{arch} needs image_size >= {MIN_IMAGE_SIZE[arch]}, not {opts['image_size']}")
    batch = cfg.batch_size
    dev = torch.device(device)
    with dev:
        model = getattr(torchvision.models, ARCHS[arch])(weights=None, num_classes=opts["num_classes"])
    model.train()
    size, classes = opts["image_size"], opts["num_classes"]

    def make_batch() -> tuple[torch.Tensor, torch.Tensor]:
        images = torch.randn(batch, 3, size, size, device=dev)
        labels = torch.randint(0, classes, (batch,), device=dev)
        return images, labels

    def loss_fn(m: torch.nn.Module, b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return F.cross_entropy(m(b[0]), b[1])

    return Workload(arch, model, make_batch, loss_fn, dev, attention=None)
