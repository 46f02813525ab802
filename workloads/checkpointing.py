"""Activation checkpointing of a workload's segments, as a user writes it: ``torch.utils.checkpoint.checkpoint``.

Each chosen module's ``forward`` is replaced (on that instance) by ``checkpoint(forward, *args,
use_reentrant=False, **kwargs)``. In the non-reentrant mode (torch/utils/checkpoint.py,
``_checkpoint_without_reentrant_generator``) the forward runs under saved-tensor hooks that keep only the
segment's inputs (and, with the default ``preserve_rng_state=True``, the RNG state); the first time backward needs
a tensor the segment saved, the whole segment's forward is run again and its saved tensors are recomputed. On the
meta device this is the same Python program, so the trace holds the fewer saved activations and the recomputed
forward kernels (in the backward phase) as a GPU run makes them. This is what HuggingFace's
``model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})`` does per layer,
including its cache rule (transformers ``modeling_layers.GradientCheckpointingLayer``): a checkpointed segment
gets ``use_cache=False`` and no ``past_key_values``/``layer_past``, since the recomputation would write the KV
cache a second time. (That switch itself is not called: with it, transformers 5.x builds GPT-2's causal mask
through ``find_packed_sequence_indices``, which reads a tensor value that the meta device does not have.)

Which segments (``WorkloadConfig.checkpoint``):

- ``auto``: the workload's own ``Workload.checkpoint_segments()`` when it has one; otherwise the rule
  :func:`repeated_blocks`: the outermost elements of every ``nn.ModuleList`` / ``nn.Sequential`` holding at least
  two modules of one class (GPT-2's and BERT's transformer layers, Whisper's encoder and decoder layers, ResNet's
  bottlenecks); a model without such blocks (AlexNet) gets its top-level ``nn.Sequential`` children (AlexNet's
  ``features`` and ``classifier`` halves).
- a class name, e.g. ``GPT2Block``: every outermost module of that class (the rule for user workloads).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from uvmlab.errors import InputError

if TYPE_CHECKING:
    import torch

    from workloads.base import Workload

AUTO = "auto"
CACHE_ARGUMENTS = ("cache", "past_key_values", "past_key_value", "layer_past")
"""Names transformers layers have given their KV-cache argument (``drop_kv_cache``)."""


def repeated_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The outermost elements of containers holding >= 2 parameterised modules of one class (see module doc);
    failing that, the model's top-level ``nn.Sequential`` children that hold parameters."""
    import torch

    chosen: list[torch.nn.Module] = []
    taken: set[int] = set()

    def visit(mod: torch.nn.Module) -> None:
        if isinstance(mod, torch.nn.ModuleList | torch.nn.Sequential):
            kids = list(mod.children())
            classes = {type(k) for k in kids}
            if len(kids) >= 2 and len(classes) == 1 and any(True for _ in kids[0].parameters()):
                for k in kids:
                    chosen.append(k)
                    taken.add(id(k))
                return
        for child in mod.children():
            visit(child)

    visit(model)
    if chosen:
        return chosen
    return [
        c
        for c in model.children()
        if isinstance(c, torch.nn.Sequential) and any(True for _ in c.parameters()) and id(c) not in taken
    ]


def modules_of_class(model: torch.nn.Module, class_name: str) -> list[torch.nn.Module]:
    """Every outermost module of ``model`` whose class is named ``class_name``."""
    found: list[torch.nn.Module] = []

    def visit(mod: torch.nn.Module) -> None:
        for child in mod.children():
            if type(child).__name__ == class_name:
                found.append(child)
            else:
                visit(child)

    visit(model)
    return found


def segments(workload: Workload, rule: str) -> list[torch.nn.Module]:
    """The modules ``rule`` (``auto`` or a class name) names in ``workload``; an InputError when there are none."""
    if rule == AUTO:
        hook = workload.checkpoint_segments
        mods = list(hook()) if hook is not None else repeated_blocks(workload.model)
        if not mods:
            raise InputError(
                f"workload {workload.name} has no repeated blocks to checkpoint; name a module class "
                "(checkpoint=CLASS) or give the workload a checkpoint_segments() hook"
            )
        return mods
    mods = modules_of_class(workload.model, rule)
    if not mods:
        names = sorted({type(m).__name__ for m in workload.model.modules()})
        raise InputError(
            f"workload {workload.name} has no module of class {rule!r} to checkpoint; its classes: "
            + ", ".join(names[:30])
        )
    return mods


def _same_function_modes() -> tuple[contextlib.AbstractContextManager[None], contextlib.AbstractContextManager[None]]:
    """``context_fn`` of ``checkpoint``: the recomputation runs under the torch-function modes active at the
    forward (none on a GPU; on meta, uvmlab's SDPA/dropout/autocast emulations, which the autograd engine does not
    carry into backward, so without this the recomputed segment would take other kernels and checkpoint's
    metadata check fails)."""
    from torch.overrides import _get_current_function_mode_stack

    modes = list(_get_current_function_mode_stack())

    @contextlib.contextmanager
    def recompute() -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for mode in modes:
                stack.enter_context(mode)
            yield

    return contextlib.nullcontext(), recompute()


def apply_checkpointing(workload: Workload, rule: str) -> list[str]:
    """Wrap each segment's forward in non-reentrant ``torch.utils.checkpoint``; return the wrapped classes
    with their counts (for the trace header's notes)."""
    from torch.utils.checkpoint import checkpoint

    mods = segments(workload, rule)
    for mod in mods:
        inner = mod.forward

        def forward(*args: Any, _inner: Any = inner, _module: Any = mod, **kwargs: Any) -> Any:
            args = drop_kv_cache(args, kwargs, _module)
            return checkpoint(_inner, *args, use_reentrant=False, context_fn=_same_function_modes, **kwargs)

        mod.forward = forward  # type: ignore[method-assign]
    return _counts(mods)


def drop_kv_cache(args: tuple[Any, ...], kwargs: dict[str, Any], module: Any = None) -> tuple[Any, ...]:
    """A checkpointed segment must not write a KV cache (the recomputation would write it again): what
    transformers does under gradient checkpointing (``modeling_layers.GradientCheckpointingLayer``:
    ``use_cache=False`` and the cache argument None, unless the layer class sets ``_can_checkpoint_with_cache``
    because it only reads the cache). The cache argument's name changed across transformers releases
    (``past_key_value`` / ``past_key_values`` / ``layer_past`` before 5.24, ``cache`` from 5.24 on; GPT-2 passed
    its cache positionally), so every argument holding a transformers ``Cache`` is dropped, whatever its name,
    as are the names above. Returns ``args`` with any ``Cache`` replaced by None; ``kwargs`` is changed in place."""
    try:
        from transformers.cache_utils import Cache
    except ImportError:  # no transformers: no KV cache to drop
        return args
    if kwargs.get("use_cache"):
        kwargs["use_cache"] = False
    if getattr(module, "_can_checkpoint_with_cache", False):  # a layer that only reads the cache keeps it
        return args
    for key, value in kwargs.items():
        if value is not None and (key in CACHE_ARGUMENTS or isinstance(value, Cache)):
            kwargs[key] = None
    return tuple(None if isinstance(a, Cache) else a for a in args)


def _counts(mods: list[Any]) -> list[str]:
    counts: dict[str, int] = {}
    for mod in mods:
        counts[type(mod).__name__] = counts.get(type(mod).__name__, 0) + 1
    return [f"{name} x{n}" for name, n in counts.items()]
