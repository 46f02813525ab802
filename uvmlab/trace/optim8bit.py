"""Adam's state in 8 bits (bitsandbytes ``Adam8bit``) as a transformation of a CUDA-orchestrated trace. Torch-free.

bitsandbytes' 8-bit optimizers (Dettmers et al., "8-bit Optimizers via Block-wise Quantization", ICLR'22;
``bitsandbytes/optim/optimizer.py`` ``Optimizer2State.init_state``, bitsandbytes-foundation/bitsandbytes @06029dd)
keep each state tensor of a parameter with at least ``min_8bit_size`` = 4,096 elements as ``uint8`` (one byte per
element, 2 states for Adam) plus an fp32 ``absmax`` per block of 2,048 elements (block-wise quantization, the
default); smaller parameters keep fp32 state. The step is one fused kernel per parameter
(``optimizer_update_8bit_blockwise``): it reads the gradient, the parameter and both states and writes the parameter
and both states, with no temporaries.

The transformation (no new capture):

- every ``optimizer_state`` allocation of 4 x n bytes (fp32, n >= :data:`MIN_8BIT_ELEMENTS`) shrinks to
  n + 4 x ceil(n / :data:`BLOCK_ELEMENTS`) bytes (the two 256-entry quantization maps, shared by every parameter,
  are left out: 2 KiB);
- the optimizer phase's kernels and temporaries are removed (``uvmlab.trace.offload.strip_optimizer_step``) and each
  iteration gets one step event, ``bnb:adam8bit_blockwise``, at the seq of its last removed kernel, touching the
  gradients alive at the step (read), every parameter (read and write) and every state tensor (read and write).

Approximations (docs/advise.md): one step event per iteration instead of one kernel per parameter (the launch
floors of the per-parameter kernels, ``CostParams.kernel_min_ns`` each, are not charged); the event has no FLOPs
(the step is memory-bound); an allocation of optimizer state is taken to be an fp32 tensor of the parameter's size.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from uvmlab.errors import InputError
from uvmlab.trace.offload import assemble, event, strip_optimizer_step
from uvmlab.trace.schema import NEVER_FREED, Trace

MIN_8BIT_ELEMENTS = 4096
"""``min_8bit_size`` default (Optimizer2State.__init__) and the ``p.numel() < 4096`` rule of init_state."""
BLOCK_ELEMENTS = 2048
"""Elements per quantization block: ``blocks = n // 2048`` (+1 for a remainder) in init_state."""


def state_bytes_8bit(fp32_bytes: np.ndarray) -> np.ndarray:
    """Bytes of an 8-bit state tensor (uint8 values + fp32 absmax per block) in place of ``fp32_bytes``."""
    n = np.asarray(fp32_bytes, dtype=np.int64) // 4
    small = n < MIN_8BIT_ELEMENTS
    return np.where(small, n * 4, n + 4 * (-(-n // BLOCK_ELEMENTS)))


def optimizer_8bit(trace: Trace) -> Trace:
    """``trace`` (orchestrated) with 8-bit Adam state and bitsandbytes' fused step (module docstring)."""
    s = strip_optimizer_step(trace, keep_state=True)
    a = s.allocations
    state = a["category"] == "optimizer_state"
    if not state.any():
        raise InputError("the job keeps no optimizer state (sgd without momentum): there is nothing to quantise")
    old = a.loc[state, "size_bytes"].to_numpy(dtype=np.int64)
    new = state_bytes_8bit(old)
    a.loc[state, "size_bytes"] = new
    scale = dict(zip(a.loc[state, "alloc_id"].astype(int).tolist(), (new / np.maximum(old, 1)).tolist(), strict=True))
    acc = s.accesses
    hit = acc["alloc_id"].isin(list(scale))
    if hit.any():  # accesses to the state outside the step (none in a plain loop) shrink with it
        f = acc.loc[hit, "alloc_id"].map(scale)
        acc.loc[hit, "offset_bytes"] = (acc.loc[hit, "offset_bytes"] * f).astype(np.int64)
        acc.loc[hit, "size_bytes"] = np.maximum((acc.loc[hit, "size_bytes"] * f).astype(np.int64), 1)
    params = a[a["category"] == "parameter"]
    grads = a[a["category"] == "gradient"]
    states = a[state]
    new_k: list[dict[str, Any]] = []
    new_acc: list[dict[str, Any]] = []
    kid = s.next_kernel_id
    for it, last in zip(s.steps["iteration"].tolist(), s.steps["last"].tolist(), strict=True):
        alive = (grads["alloc_seq"] < last) & ((grads["free_seq"] == NEVER_FREED) | (grads["free_seq"] > last))
        made = states[states["alloc_seq"] < last]
        new_k.append(event(kid, int(last), "bnb:adam8bit_blockwise", int(it), s.stream, ""))
        for tensors, writes in ((grads[alive], (False,)), (params, (False, True)), (made, (False, True))):
            for a_id, n in zip(tensors["alloc_id"].tolist(), tensors["size_bytes"].tolist(), strict=True):
                new_acc.extend(
                    {"kernel_id": kid, "alloc_id": int(a_id), "offset_bytes": 0, "size_bytes": int(n), "is_write": w}
                    for w in writes
                )
        kid += 1
    out = assemble(trace, s, new_k, new_acc, allocations=a)
    out.header["optimizer_8bit"] = {
        "state_bytes_fp32": int(old.sum()),
        "state_bytes_8bit": int(new.sum()),
        "tensors_kept_fp32": int((old // 4 < MIN_8BIT_ELEMENTS).sum()),
    }
    out.header["notes"] = [
        *out.header.get("notes", []),
        "Adam state in 8 bits (uvmlab.trace.optim8bit, bitsandbytes block-wise): one fused step per iteration",
    ]
    out.validate("8-bit optimizer trace")
    return out
