"""Workload file: one MLP of the GPUMemNet A100 set rebuilt from its row (``uvmlab.evaluate.gpumemnet``).

GPUMemNet (itu-rad/GPUMemNet, commit f01eb0592e1b2030d3bceb73441747912b6652a6) generates each model with
``NeuroNetGen_scripts/MLP/mlp_next.py``: ``nn.Sequential`` of Linear [+ BatchNorm1d] + activation [+ Dropout]
blocks, a final Linear and Softmax (several outputs) or Sigmoid/Identity (one output); Adam with default
settings; CrossEntropyLoss (several outputs) or BCEWithLogitsLoss (one output); fp32; batches of float32
inputs and int64 labels copied from the host each step. The layer list comes from the row's
``Activations-Params`` column (the torchsummary lines: kind, output width); ``input_size`` from its file name.
Options: ``layers`` (``kind:width`` items joined by ``,``), ``input_size``, ``dropout`` (the rate; it does not
change memory), and ``slope_params`` (unused placeholder for forward compatibility: PReLU has one parameter).
"""

from __future__ import annotations

from typing import Any

DEFAULT_BATCH_SIZE = 32
OPTIONS: dict[str, Any] = {"layers": "linear:2,Softmax:2", "input_size": 4, "dropout": 0.5}
DESCRIPTION = "a GPUMemNet MLP rebuilt from its layer list"

ACTIVATIONS = {
    "ReLU": "ReLU",
    "LeakyReLU": "LeakyReLU",
    "PReLU": "PReLU",
    "ELU": "ELU",
    "SELU": "SELU",
    "Tanh": "Tanh",
    "Softplus": "Softplus",
    "SiLU": "SiLU",
    "Mish": "Mish",
    "GELU": "GELU",
    "Identity": "Identity",
    "Sigmoid": "Sigmoid",
}
"""torchsummary class name -> torch.nn class (mlp_next.py's ``valid_hidden_activations`` and output layers)."""


def parse_layers(text: str) -> list[tuple[str, int]]:
    """``"linear:1173,batch_normalization:1173,ReLU:1173"`` -> [(kind, width), ...]."""
    out = []
    for item in text.split(","):
        kind, _, width = item.partition(":")
        out.append((kind.strip(), int(width)))
    return out


def build(cfg: Any, device: str, options: dict[str, Any]) -> Any:
    """The MLP, its batch maker (host tensors copied to the device, as mlp_next.py does) and its loss."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from uvmlab.errors import InputError
    from workloads.base import Workload

    layers = parse_layers(str(options["layers"]))
    width = int(options["input_size"])
    mods: list[nn.Module] = []
    dev = torch.device(device)
    with dev:
        for kind, out in layers:
            if kind == "linear":
                mods.append(nn.Linear(width, out))
                width = out
            elif kind == "batch_normalization":
                mods.append(nn.BatchNorm1d(out))
            elif kind == "dropout":
                mods.append(nn.Dropout(float(options["dropout"])))
            elif kind == "Softmax":
                mods.append(nn.Softmax(dim=1))
            elif kind in ACTIVATIONS:
                mods.append(getattr(nn, ACTIVATIONS[kind])())
            else:
                raise InputError(f"GPUMemNet layer kind {kind!r} is not one mlp_next.py makes")
        model = nn.Sequential(*mods)
    model.train()
    batch, n_in, n_out = cfg.batch_size, int(options["input_size"]), width

    def make_batch() -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(batch, n_in, device=dev)
        y = torch.randint(0, max(n_out, 2), (batch,), device=dev)
        return x, y

    def loss_fn(m: nn.Module, b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        out = m(b[0].view(b[0].size(0), -1))
        if out.size(1) == 1:  # BCEWithLogitsLoss on float labels (mlp_next.py)
            return F.binary_cross_entropy_with_logits(out, b[1].view(-1, 1).float())
        return F.cross_entropy(out, b[1])

    return Workload("gpumemnet-mlp", model, make_batch, loss_fn, dev)
