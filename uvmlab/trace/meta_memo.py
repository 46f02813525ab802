"""Memoized meta kernels: an op called again with the same argument metadata gets the same output metadata.

On the meta device an op's result depends only on its arguments' metadata (dtype, shape, strides, storage offset)
and its non-tensor arguments, never on values (a meta tensor has none). About half of a capture's time is PyTorch's
Python meta kernels (``torch._refs``, ``torch._meta_registrations``, decompositions; cProfile of 30 GPUMemNet MLP
rows, 2026-11-28), and a training loop repeats every op of its second iteration in each later one, so :func:`call`
runs an op's meta kernel once per distinct argument metadata and afterwards builds outputs of the recorded metadata
with ``torch.empty_strided``. FakeTensorMode's dispatch cache (``torch._subclasses.fake_tensor``) rests on the same
fact; this is the meta-device form, written for the recorder.

What is memoized, decided on the first (real) call of each key, so that a key is either always replayed or
always run:
- every argument is a strided, non-nested meta tensor without conj/neg bits, or a plain value (int, float, bool,
  str, None, dtype, device, layout, memory format) or a list/tuple of those; anything else (a Generator, a
  Storage, a SymInt, a CPU tensor) runs the kernel every time;
- the call changed no argument's metadata or storage (an in-place op such as ``add_`` is replayed; ``resize_``,
  ``set_``, ``transpose_`` and an ``out=`` that resizes are not, because their first call changed something);
- every output is None, an argument returned as itself (``add_`` returns ``self``), or a fresh meta tensor: a
  storage of exactly its strided extent (so at offset 0), shared with no argument and no other output (outputs
  cut from a larger buffer run the kernel every time; view ops, ``OpOverload.is_view``, are passed through
  without building a key).

The key also holds ``torch.get_default_dtype()`` (factory ops read it) and the output-changing emulations active
below the recorder (``variant``: CUDA's convolution memory formats). In the key of a ``_foreach_*`` op a float
argument is its type, not its value: a foreach op applies one elementwise op per tensor (ATen's
``native/ForeachOpsKernels.cpp``, the ``foreach_tensor_*_slow`` fallbacks, is exactly that loop), so its outputs
have the shapes of its tensor arguments and a dtype that type promotion takes from a Python scalar's category
(bool, int, float), never from its value. Adam's ``_foreach_addcdiv_`` takes the step sizes, which change every
iteration, as such a list: without this rule it ran its meta kernel (a Python loop over every parameter) in every
iteration. A replayed call dispatches no meta kernel (and so none of the ops a decomposition would have run inside
it: they were below the recorder and invisible to it anyway). Equality with the unmemoized capture is tested on
whole traces (tests/test_trace_meta_memo.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from uvmlab.trace.strides import extent_elements

MAX_ENTRIES = 200_000
"""The memo is emptied when it holds this many keys (a bound on memory across thousands of captures in one
process: an entry is a few hundred bytes)."""

_PLAIN = frozenset({int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format})
_UNCACHEABLE = object()
_MISSING = object()
_memo: dict[Any, Any] = {}
enabled = True
"""Off: every call runs its meta kernel (the tests compare whole captures both ways)."""
_variants: list[str] = []
"""Dispatch modes below the recorder that change what an op returns (``uvmlab.trace.emulate.ConvLayoutEmulation``):
part of every key, so a result recorded under one is never replayed without it."""


@contextlib.contextmanager
def variant(name: str) -> Iterator[None]:
    """Key the memo's entries by ``name`` while a mode that changes ops' outputs is active."""
    _variants.append(name)
    try:
        yield
    finally:
        _variants.remove(name)


class _Uncacheable(Exception):
    pass


def _key_of(x: Any, tensors: list[torch.Tensor], float_type: bool = False) -> Any:
    if float_type and type(x) is float:
        return float
    if isinstance(x, torch.Tensor):
        if x.device.type != "meta" or x.layout != torch.strided or x.is_nested or x.is_conj() or x.is_neg():
            raise _Uncacheable
        tensors.append(x)
        return (x.dtype, tuple(x.shape), x.stride(), x.storage_offset())
    t = type(x)
    if t in _PLAIN:
        return (t, x)
    if t is list or t is tuple:
        return (t, tuple(_key_of(e, tensors, float_type) for e in x))
    raise _Uncacheable


def _state(tensors: list[torch.Tensor]) -> list[tuple[Any, ...]]:
    """What a call must not change for it to be replayed: each argument's metadata and storage."""
    return [(t.dtype, tuple(t.shape), t.stride(), t.storage_offset(), t.untyped_storage()._cdata) for t in tensors]


def _spec_of(out: Any, inputs: list[torch.Tensor], in_storages: set[int], seen: set[int]) -> Any:
    """How to rebuild ``out`` (raises _Uncacheable where it cannot be rebuilt from metadata alone)."""
    if out is None:
        return None
    if isinstance(out, torch.Tensor):
        for i, t in enumerate(inputs):
            if out is t:
                return ("arg", i)
        storage = out.untyped_storage()
        if (
            out.device.type != "meta"
            or out.layout != torch.strided
            or out.is_nested
            or out.requires_grad
            or storage._cdata in in_storages
            or storage._cdata in seen
            or storage.nbytes() != extent_elements(out.shape, out.stride()) * out.element_size()
        ):
            raise _Uncacheable
        seen.add(storage._cdata)
        return ("new", tuple(out.shape), out.stride(), out.dtype)
    if type(out) is tuple or type(out) is list:
        return (type(out), tuple(_spec_of(o, inputs, in_storages, seen) for o in out))
    raise _Uncacheable


def _build(spec: Any, inputs: list[torch.Tensor]) -> Any:
    if spec is None:
        return None
    kind = spec[0]
    if kind == "new":
        return torch.empty_strided(spec[1], spec[2], dtype=spec[3], device="meta")
    if kind == "arg":
        return inputs[spec[1]]
    return kind(_build(s, inputs) for s in spec[1])


def call(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``func(*args, **kwargs)`` on meta tensors, replayed from the memo where the rules above allow."""
    if not enabled or func.is_view:  # a view shares its argument's storage: never replayed, so no key to build
        return func(*args, **kwargs)
    tensors: list[torch.Tensor] = []
    foreach = func._opname.startswith("_foreach_")  # floats keyed by their type (module docstring)
    try:
        key = (
            func,
            tuple(_variants),
            torch.get_default_dtype(),
            _key_of(args, tensors, foreach),
            _key_of(tuple(kwargs.items()), tensors, foreach),
        )
    except _Uncacheable:
        return func(*args, **kwargs)
    spec = _memo.get(key, _MISSING)
    if spec is _UNCACHEABLE:
        return func(*args, **kwargs)
    if spec is not _MISSING:
        return _build(spec, tensors)
    before = _state(tensors)
    out = func(*args, **kwargs)
    try:
        if _state(tensors) != before:
            raise _Uncacheable
        spec = _spec_of(out, tensors, {s[-1] for s in before}, set())
    except _Uncacheable:
        spec = _UNCACHEABLE
    if len(_memo) >= MAX_ENTRIES:
        _memo.clear()
    _memo[key] = spec
    return out


def clear() -> None:
    """Empty the memo."""
    _memo.clear()


def counts() -> tuple[int, int]:
    """(keys stored, keys that always run their kernel)."""
    return len(_memo), sum(spec is _UNCACHEABLE for spec in _memo.values())
