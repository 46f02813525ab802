"""The dtype an ``hf:`` model trains in (``--dtype auto``), and the refusal of one it cannot train in on a GPU.

transformers runs the experts of its mixture-of-experts layers (classes decorated with ``use_experts_implementation``,
transformers ``integrations/moe.py``) through ``grouped_mm`` whenever the model class supports it
(``PreTrainedModel.get_correct_experts_implementation``: ``grouped_mm`` unless asked otherwise). On CUDA, torch's
grouped matrix multiply takes bf16 (or fp16) matrices only (ATen's ``_grouped_mm`` CUDA check: "Expected mat_a to be
BFloat16 or supported Float16 matrix"), and transformers casts the input to the weights' dtype first
(``integrations/moe.py`` ``_grouped_mm``: "not autocast-enabled"), so fp32 weights fail on a GPU with or without
autocast. Such a model trains in 16-bit weights: the config's ``dtype`` (``torch_dtype``) when that is bf16 or fp16,
else bf16; its gradients and optimizer state follow the parameters' dtype. Every other model keeps fp32 weights under
``auto`` (the checkpoints' dtype is a storage format; ``--dtype bf16`` is bf16 autocast over fp32 weights).

Whether a model has such layers is read from the model itself (a layer count or config may leave none: DeepSeek-V3's
first three layers are dense): one trial build on the meta device, outside any capture.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from uvmlab.errors import InputError
from workloads.hf_config import instantiate

SIXTEEN_BIT = ("bfloat16", "float16")
"""The dtypes grouped_mm takes on CUDA (the config's, when it names one of them)."""


def has_grouped_mm_experts(model: Any) -> bool:
    """The model has experts layers that run on ``grouped_mm`` (transformers' ``use_experts_implementation`` gives
    them ``has_gate`` and ``is_concatenated``; the config says which implementation they dispatch to)."""
    if getattr(model.config, "_experts_implementation", None) != "grouped_mm":
        return False
    return any(hasattr(m, "has_gate") and hasattr(m, "is_concatenated") for m in model.modules())


@contextlib.contextmanager
def default_dtype(dtype: Any) -> Iterator[None]:
    """``torch.set_default_dtype(dtype)`` for the block (nothing for None): parameters are created in it."""
    import torch

    if dtype is None:
        yield
        return
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def training_dtype(label: str, cls: Any, config: Any, fields: dict[str, Any], dtype: str) -> tuple[Any, list[str]]:
    """(the dtype to build the model in, or None for the default fp32; the trace note) for ``--dtype dtype``; refuses
    fp32 for a model whose experts need 16-bit weights (module docstring)."""
    import torch
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes(), torch.device("meta"):  # a trial build the capture does not see
        needs = has_grouped_mm_experts(instantiate(cls, config))
    if not needs:
        return None, []
    if dtype == "fp32":
        raise InputError(
            f"{label} cannot train in fp32 on a GPU: its mixture-of-experts layers run torch's grouped_mm, whose CUDA "
            "kernel takes bf16 or fp16 only; leave --dtype out (auto: 16-bit weights) or use --dtype bf16"
        )
    named = str(fields.get("dtype") or fields.get("torch_dtype") or "")
    name = named if named in SIXTEEN_BIT else "bfloat16"
    how = "from the config's dtype" if named in SIXTEEN_BIT else "bf16: grouped_mm takes no fp32 on CUDA"
    note = f"weights in {name} ({how}): the dtype {cls.__name__}'s mixture-of-experts layers train in"
    if dtype == "bf16":
        note += ", under bf16 autocast"
    return getattr(torch, name), [note]
