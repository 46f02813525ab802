"""FLOP estimates per leaf aten op (the ``flops`` column of the kernels table).

Rules, in order:

1. Ops in ``torch.utils.flop_counter.flop_registry`` (mm, addmm, bmm, baddbmm, convolution and its backward,
   the SDPA kernels and their backwards): PyTorch's own formula (2 FLOPs per multiply-add; causal masking not
   discounted, as in PyTorch). Their ``out=`` overloads (``mm.out``, ``bmm.out``, ``addmm.out``) share the packet.
   The in-place and other BLAS forms the registry lacks (:data:`GEMM_VARIANTS`) take the same formula:
   ``addmm_`` is ``addmm`` (``c.addmm_(a, b)`` is a cuBLAS GEMM, 2 m n k FLOPs, not an elementwise op),
   ``baddbmm_`` is ``baddbmm``, ``addbmm``/``addbmm_`` sum ``b`` GEMMs (2 b m n k), ``mv``/``addmv``/``addmv_`` are
   GEMVs (2 m n).
2. Data-movement and fill ops (``DATA_MOVEMENT``: copies, concatenation, gathers, embedding lookups, fills,
   random fills): 0 FLOPs.
3. Everything else (elementwise, reductions, normalizations, softmax, losses, optimizer foreach ops):
   1 FLOP per element of the largest tensor the op reads or writes (for foreach ops: summed over the list).
   This undercounts transcendental ops (exp, erf, ...) and multi-pass kernels (layer_norm, softmax) by a small
   constant factor; it is an estimate of work, not a hardware counter.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.flop_counter import flop_registry

DATA_MOVEMENT = frozenset(
    {
        "copy_",
        "clone",
        "_to_copy",
        "cat",
        "stack",
        "index",
        "index_select",
        "gather",
        "embedding",
        "embedding_dense_backward",
        "fill_",
        "zero_",
        "zeros",
        "zeros_like",
        "ones",
        "ones_like",
        "full",
        "full_like",
        "scalar_tensor",
        "new_zeros",
        "new_ones",
        "new_full",
        "constant_pad_nd",
        "normal_",
        "uniform_",
        "random_",
        "randint",
        "randn",
        "rand",
        "arange",
        "_unsafe_index",
        "slice_scatter",
        "select_scatter",
        "as_strided_scatter",
        "_foreach_copy_",
        "_foreach_zero_",
        "lift_fresh_copy",
        "repeat",
        "masked_fill_",
        "masked_fill",
    }
)
"""Ops counted as 0 FLOPs (they move or fill memory)."""


def _shape(x: Any) -> tuple[int, ...]:
    return tuple(x.shape) if isinstance(x, torch.Tensor) else ()


def _addbmm_flops(args: tuple[Any, ...]) -> float:
    b, m, k = _shape(args[1])
    n = _shape(args[2])[-1]
    return 2.0 * b * m * n * k


def _gemv_flops(args: tuple[Any, ...], first: int) -> float:
    m, n = _shape(args[first])
    return 2.0 * m * n


GEMM_VARIANTS = {
    "addmm_": lambda a, kw, out: flop_registry[torch.ops.aten.addmm](*a, **kw, out_val=out),
    "baddbmm_": lambda a, kw, out: flop_registry[torch.ops.aten.baddbmm](*a, **kw, out_val=out),
    "addbmm": lambda a, kw, out: _addbmm_flops(a),
    "addbmm_": lambda a, kw, out: _addbmm_flops(a),
    "mv": lambda a, kw, out: _gemv_flops(a, 0),
    "addmv": lambda a, kw, out: _gemv_flops(a, 1),
    "addmv_": lambda a, kw, out: _gemv_flops(a, 1),
}
"""BLAS ops ``flop_registry`` lacks, by overload packet name: FLOPs of ``(args, kwargs, out)`` (module docstring)."""


def _numel(x: Any) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel()
    if isinstance(x, list | tuple):
        if x and all(isinstance(t, torch.Tensor) for t in x):
            return sum(t.numel() for t in x)  # a foreach tensor list
        return max((_numel(t) for t in x), default=0)
    return 0


def estimate_flops(func: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> float:
    """FLOPs of one call of ``func`` (see the module docstring for the rules)."""
    packet = func._overloadpacket
    formula = flop_registry.get(packet)
    if formula is not None:
        return float(formula(*args, **kwargs, out_val=out))
    variant = GEMM_VARIANTS.get(packet.__name__)
    if variant is not None:
        return float(variant(args, kwargs, out))
    if packet.__name__ in DATA_MOVEMENT:
        return 0.0
    biggest = _numel(out)
    for a in args:
        biggest = max(biggest, _numel(a))
    for a in kwargs.values():
        biggest = max(biggest, _numel(a))
    return float(biggest)
