"""Which allocation holds which parameter, and its gradient in each iteration: the trace header's ``parameters``.

A data-parallel layout (uvmlab.trace.shard) needs what the allocator never sees: each parameter's name, shape and
dtype, whether it trains, the module that owns it, the repeated block it belongs to (the unit FSDP wraps: the
rule of ``workloads.checkpointing.repeated_blocks``) and the allocation of its gradient in every iteration. The
capture fills a :class:`ParamMap` after setup and before each optimizer step and writes it into the header as a
list of plain dicts (:data:`FIELDS`); ``read_parameters`` (uvmlab.trace.shard.params) reads it back without torch.
"""

from __future__ import annotations

from typing import Any

import torch

FIELDS = ("alloc_id", "name", "shape", "itemsize", "dtype", "trainable", "module", "block", "grads")
"""Keys of each ``header["parameters"]`` entry. ``block``: index of the repeated block holding the parameter, -1
outside every block (embeddings, final norm, head); ``grads``: the gradient's alloc_id per iteration (-1: none)."""


class ParamMap:
    """The parameters of a model at the end of setup, and their gradients per iteration."""

    def __init__(self, model: torch.nn.Module, alloc_id: Any) -> None:
        """``alloc_id(tensor)``: the recorder's allocation holding the tensor's storage (None if not recorded)."""
        from workloads.checkpointing import repeated_blocks

        self._alloc_id = alloc_id
        hidden = getattr(getattr(model, "config", None), "hidden_size", None)
        self.hidden_size: int | None = hidden if isinstance(hidden, int) else None
        """The model config's ``hidden_size`` (HF Trainer sizes DeepSpeed's ``auto`` buckets from it)."""
        block_of: dict[int, int] = {}
        for index, block in enumerate(repeated_blocks(model)):
            for p in block.parameters():
                block_of.setdefault(id(p), index)
        self.params: list[torch.nn.Parameter] = []
        self.entries: list[dict[str, Any]] = []
        for name, p in model.named_parameters():
            aid = alloc_id(p)
            if aid is None:
                continue
            self.params.append(p)
            self.entries.append(
                {
                    "alloc_id": int(aid),
                    "name": name,
                    "shape": [int(s) for s in p.shape],
                    "itemsize": int(p.element_size()),
                    "dtype": str(p.dtype).removeprefix("torch."),
                    "trainable": bool(p.requires_grad),
                    "module": name.rpartition(".")[0],
                    "block": block_of.get(id(p), -1),
                    "grads": [],
                }
            )

    def record_gradients(self, iteration: int) -> None:
        """Note each parameter's gradient allocation before the optimizer step of ``iteration``."""
        for p, entry in zip(self.params, self.entries, strict=True):
            grads = entry["grads"]
            while len(grads) < iteration:
                grads.append(-1)
            aid = self._alloc_id(p.grad) if p.grad is not None else None
            if len(grads) == iteration:
                grads.append(-1 if aid is None else int(aid))

    def to_header(self, iterations: int) -> list[dict[str, Any]]:
        """The header's ``parameters`` list (every ``grads`` list padded to ``iterations``)."""
        for entry in self.entries:
            entry["grads"] = (entry["grads"] + [-1] * iterations)[:iterations]
        return self.entries
