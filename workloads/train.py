"""THE training loop: used by trace capture (to label phases) and by GPU runs (NVTX ranges), device-agnostic.

One iteration, with ``phase_hook(phase, iteration)`` called as each phase begins and ``phase_hook("end", it)``
after the last one::

    [zero_grad]  if cfg.zero_grad == "iteration_start"
    data         make the batch on the device                 \
    forward      model forward and loss (bf16 autocast when     | repeated cfg.accumulation_steps times
                 cfg.dtype == "bf16"; divided by the steps)     | (gradient accumulation: gradients stay
    [zero_grad]  if cfg.zero_grad == "before_backward" (first)  | alive between micro-batches)
    backward     loss.backward()                               /
    optimizer    optimizer.step()

``optimizer.zero_grad(set_to_none=True)`` is PyTorch's default. Optimizers are built with CUDA's defaults
(``foreach=True``: on CUDA tensors PyTorch picks the multi-tensor implementation; on meta and CPU it would pick
the single-tensor loop, which allocates differently, so it is passed explicitly).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from uvmlab.config import WorkloadConfig
from uvmlab.errors import InputError

if TYPE_CHECKING:
    import torch

    from workloads.base import Workload

PhaseHook = Callable[[str, int], None]
PHASE_END = "end"
"""The phase passed to the hook after the optimizer step (closes the last phase of an iteration)."""
LEARNING_RATES = {"sgd": 1e-2, "adam": 1e-4, "adamw": 1e-4}
"""Learning rates (memory does not depend on them)."""


def make_optimizer(model: torch.nn.Module, cfg: WorkloadConfig) -> torch.optim.Optimizer:
    """The optimizer ``cfg.optimizer`` over the model's parameters with CUDA's defaults (foreach=True).

    SGD has no momentum (no optimizer state), Adam/AdamW keep exp_avg and exp_avg_sq per parameter plus a
    ``step`` scalar (on the CPU, as CUDA does when capturable=False and fused=False).
    """
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    lr = LEARNING_RATES[cfg.optimizer]
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, foreach=True)
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=lr, foreach=True)
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=lr, foreach=True)
    raise InputError(f"optimizer must be one of {', '.join(LEARNING_RATES)}, not {cfg.optimizer!r}")


def autocast_for(cfg: WorkloadConfig, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """bf16 autocast for cfg.dtype == 'bf16' on cuda/cpu; a no-op context otherwise.

    Autocast has no meta backend: meta capture emulates it (uvmlab.trace.autocast) and passes its own context.
    """
    import torch

    if cfg.dtype == "bf16" and device.type in ("cuda", "cpu"):
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _noop(phase: str, iteration: int) -> None:
    return None


def train_step(
    workload: Workload,
    optimizer: torch.optim.Optimizer,
    cfg: WorkloadConfig,
    phase_hook: PhaseHook | None = None,
    iteration: int = 0,
    autocast: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
) -> torch.Tensor:
    """Run one training iteration; return the (detached) loss."""
    hook = phase_hook or _noop
    if cfg.zero_grad == "iteration_start":
        hook("zero_grad", iteration)
        optimizer.zero_grad(set_to_none=True)
    steps = cfg.accumulation_steps
    for micro in range(steps):
        hook("data", iteration)
        batch = workload.make_batch()
        hook("forward", iteration)
        ctx = autocast() if autocast is not None else autocast_for(cfg, workload.device)
        with ctx:
            loss = workload.loss_fn(workload.model, batch)
            if steps > 1:
                loss = loss / steps
        if cfg.zero_grad == "before_backward" and micro == 0:
            hook("zero_grad", iteration)
            optimizer.zero_grad(set_to_none=True)
        hook("backward", iteration)
        loss.backward()
    hook("optimizer", iteration)
    optimizer.step()
    hook(PHASE_END, iteration)
    return loss.detach()


def train(
    workload: Workload,
    optimizer: torch.optim.Optimizer,
    cfg: WorkloadConfig,
    phase_hook: PhaseHook | None = None,
    autocast: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
    on_iteration: Callable[[int], None] | None = None,
) -> None:
    """Run ``cfg.iterations`` training iterations with :func:`train_step`."""
    for it in range(cfg.iterations):
        train_step(workload, optimizer, cfg, phase_hook, it, autocast)
        if on_iteration is not None:
            on_iteration(it)
