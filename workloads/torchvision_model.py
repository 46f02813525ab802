"""Workload file: any torchvision classification model by name, random weights (``weights=None``).

Used for third-party ground truth (``uvmlab.evaluate.xmem_sample``): xMem's trainer builds
``torchvision.models.<arch>(weights=None, **kwargs)`` and trains it on CIFAR-10 resized to ``image_size`` with
cross entropy (Stone-ResearchLife/xMem README). Options: ``arch`` (a torchvision.models builder name),
``image_size``, ``num_classes``, ``labels`` (how many distinct labels the data has: CIFAR-10's 10; only the
label values depend on it). Tuple outputs (GoogLeNet/Inception in train mode) use their main logits.
"""

from __future__ import annotations

from typing import Any

DEFAULT_BATCH_SIZE = 32
OPTIONS: dict[str, Any] = {"arch": "resnet50", "image_size": 224, "num_classes": 1000, "labels": 10}
DESCRIPTION = "a torchvision classifier by name (weights=None)"


def build(cfg: Any, device: str, options: dict[str, Any]) -> Any:
    """The model, a (B, 3, S, S) image batch maker and cross entropy."""
    import torch
    import torch.nn.functional as F
    import torchvision

    from uvmlab.errors import InputError
    from workloads.base import Workload

    arch = str(options["arch"])
    builder = getattr(torchvision.models, arch, None)
    if not callable(builder):
        raise InputError(f"torchvision.models has no model {arch!r}")
    dev = torch.device(device)
    with dev:
        model = builder(weights=None, num_classes=int(options["num_classes"]))
    model.train()
    batch, size = cfg.batch_size, int(options["image_size"])
    labels = min(int(options["labels"]), int(options["num_classes"]))

    def make_batch() -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(batch, 3, size, size, device=dev), torch.randint(0, labels, (batch,), device=dev)

    def loss_fn(m: torch.nn.Module, b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        out = m(b[0])
        logits = out.logits if hasattr(out, "logits") else out
        return F.cross_entropy(logits, b[1])

    return Workload(f"torchvision-{arch}", model, make_batch, loss_fn, dev)
