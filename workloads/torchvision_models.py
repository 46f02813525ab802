"""``torchvision:NAME``: every torchvision classification model, with random weights.

The names are torchvision's own (``torchvision.models.list_models(module=torchvision.models)``: 80 in
torchvision 0.29). Inputs: (B, 3, S, S) images and B labels; loss: cross entropy, as in torchvision's
reference training (references/classification/train.py: ``criterion = nn.CrossEntropyLoss()``). ``weights=None``
never downloads anything. Models with auxiliary heads return a tuple in train mode; the loss adds the auxiliary
heads' cross entropies to the main one, as their training recipes do:

- Inception v3 (``InceptionOutputs(logits, aux_logits)``): ``loss + 0.4 * aux`` (PyTorch's fine-tuning tutorial,
  https://pytorch.org/tutorials/beginner/finetuning_torchvision_models_tutorial.html, "loss1 + 0.4*loss2");
- GoogLeNet (``GoogLeNetOutputs(logits, aux_logits2, aux_logits1)``): ``loss + 0.3 * (aux1 + aux2)`` (Szegedy
  et al., "Going deeper with convolutions", CVPR 2015, section 5: auxiliary losses weighted by 0.3).

The weights change no allocation size, only which tensors exist (the auxiliary logits and their backward).

Image size: 224 (torchvision's reference default ``--train-crop-size 224``), except Inception v3 at 299 (its
recipe in references/classification/README.md: ``--train-crop-size 299``; at 224 its auxiliary head's 5x5
convolution gets a 3x3 input and fails). The Vision Transformers are built for the chosen size
(``image_size=S``; their position embeddings depend on it) and MaxViT likewise (``input_size=(S, S)``).
"""

from __future__ import annotations

import difflib
from functools import partial
from typing import Any

from uvmlab.config import WorkloadConfig
from uvmlab.errors import InputError
from workloads.base import Workload, WorkloadSpec, build_module, positive

DEFAULT_BATCH_SIZE = 32
"""Default batch size of a named vision model (the seed study's ResNet-50 batch)."""
DEFAULT_IMAGE_SIZE = 224
IMAGE_SIZE = {"inception_v3": 299}
"""Models whose reference training crop is not 224 (torchvision references/classification/README.md)."""
AUX_LOSS_WEIGHTS = {"InceptionOutputs": 0.4, "GoogLeNetOutputs": 0.3}
"""Weight of each auxiliary head's loss, by output type (module docstring)."""
SIZE_KWARG = {"maxvit_t": "input_size"}
"""Builders that take the input size (besides the ViTs' ``image_size``)."""


def torchvision_spec(name: str) -> WorkloadSpec:
    """The WorkloadSpec of ``torchvision:name`` (cheap: torchvision is imported only when it is built)."""
    arch = name.strip().lower()
    if not arch:
        raise InputError("torchvision: needs a model name, e.g. torchvision:vgg16 (uvmlab workloads --all)")
    options = {"image_size": IMAGE_SIZE.get(arch, DEFAULT_IMAGE_SIZE), "num_classes": 1000}
    return WorkloadSpec(
        f"torchvision:{arch}",
        f"torchvision.models.{arch}(weights=None), 3x{options['image_size']}x{options['image_size']} images",
        DEFAULT_BATCH_SIZE,
        partial(build_torchvision, arch),
        options,
        source="torchvision",
    )


def list_torchvision_models() -> list[str]:
    """torchvision's classification models (imports torchvision)."""
    import torchvision

    return sorted(torchvision.models.list_models(module=torchvision.models))


def check_name(family: str, name: str, known: list[str]) -> None:
    """Refuse a model name ``family`` does not have, suggesting the closest known names."""
    if name in known:
        return
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise InputError(f"{family} has no classification model {name!r}{hint}; uvmlab workloads --all lists them")


def classification_loss(out: Any, labels: Any) -> Any:
    """Cross entropy of the logits, plus the weighted auxiliary heads of a tuple output (module docstring)."""
    import torch.nn.functional as F

    if not isinstance(out, tuple):
        _check_logits(out, labels)
        return F.cross_entropy(out, labels)
    _check_logits(out[0], labels)
    weight = AUX_LOSS_WEIGHTS.get(type(out).__name__, 1.0)
    loss = F.cross_entropy(out[0], labels)
    for aux in out[1:]:
        if aux is not None:
            loss = loss + weight * F.cross_entropy(aux, labels)
    return loss


def _check_logits(logits: Any, labels: Any) -> None:
    """Refuse, in one sentence, an output that is not one score per class and image (a feature encoder)."""
    from uvmlab.errors import InputError

    shape = list(getattr(logits, "shape", []))
    if len(shape) != 2 or shape[0] != labels.shape[0]:
        raise InputError(
            f"the model returns {'a tensor of shape ' + str(shape) if shape else type(logits).__name__}, not one "
            f"score per class for each of the {labels.shape[0]} images: it has no classification head (an image "
            "encoder), which the image-classification loop cannot train; write a workload file with its own loss"
        )


def image_workload(name: str, model: Any, dev: Any, batch: int, size: int, classes: int) -> Workload:
    """An image-classification workload: random (B, 3, size, size) images and B labels, cross entropy."""
    import torch

    def make_batch() -> tuple[torch.Tensor, torch.Tensor]:
        images = torch.randn(batch, 3, size, size, device=dev)
        labels = torch.randint(0, classes, (batch,), device=dev)
        return images, labels

    def loss_fn(m: torch.nn.Module, b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return classification_loss(m(b[0]), b[1])

    return Workload(name, model, make_batch, loss_fn, dev, attention=None)


def build_torchvision(arch: str, cfg: WorkloadConfig, device: str, opts: dict[str, Any]) -> Workload:
    """Build torchvision model ``arch`` on ``device`` in train mode, with its image batch maker."""
    import warnings

    import torch
    import torchvision

    check_name("torchvision", arch, list_torchvision_models())
    positive(f"torchvision:{arch}", opts, "image_size", "num_classes")
    size, classes = opts["image_size"], opts["num_classes"]
    kwargs: dict[str, Any] = {"weights": None, "num_classes": classes}
    if arch.startswith("vit_"):
        kwargs["image_size"] = size
    elif arch in SIZE_KWARG:
        kwargs[SIZE_KWARG[arch]] = (size, size)
    if arch in ("inception_v3", "googlenet"):
        kwargs["init_weights"] = True  # silences torchvision's FutureWarning; same tensors either way
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = build_module(device, lambda: torchvision.models.get_model(arch, **kwargs))
    model.train()
    return image_workload(f"torchvision:{arch}", model, torch.device(device), cfg.batch_size, size, classes)
