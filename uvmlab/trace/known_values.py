"""Values of small meta tensors, computed on the CPU, so that a meta capture can read data-dependent scalars.

A meta tensor has a shape but no data, so ``Tensor.item()``, ``bool(t)``, ``t.tolist()``, ``x in t`` and
``torch.equal`` fail on it ("Tensor.item() cannot be called on meta tensors"). Models read such scalars from their
inputs to steer Python control flow: transformers' ``warn_if_padding_and_no_attention_mask`` asks whether a pad token
is in ``input_ids`` (BERT-style encoders: ConvBERT, DeBERTa, BigBird, ...), ``create_causal_mask`` asks whether the
padding mask is all ones (BART, Blenderbot, BioGPT, ...), XLM/Flaubert assert ``lengths.max().item() <= slen``.

:class:`KnownValues` answers them the first way issue 44 names: it evaluates **the small scalar-producing subgraph on
the CPU from the same seeded inputs**. It mirrors, on the CPU, every op whose meta tensor inputs all have known
values and whose outputs are not too large (at most ``max_elements`` elements each): random factories (``randint``,
``rand``, ...) draw from a private CPU generator seeded with ``seed``; deterministic factories (``arange``, ``full``,
``zeros``, a CPU tensor copied to the device) and every op on known tensors are run on the CPU copies. A value read
(``_local_scalar_dense``, ``equal``, ``is_nonzero``, a copy to the CPU) of a tensor with a known value returns it;
without one it raises :class:`UnknownValueError` (the capture refuses the model in one sentence that says so). The
meta trace itself is unchanged: the ops still run on meta under the recorder; this mode only adds the values next to
them (only during the training iterations: a model's build makes no value a scalar read needs).

Values are kept per meta **storage** (a CPU storage of the same byte size, viewed with each tensor's sizes, strides
and offset), so views and in-place writes through views stay consistent with their base. A storage's value is
dropped when an op writes to it from an unknown value or when its size changes, and forgotten when the meta storage
dies (a ``weakref`` on it, as the recorder tracks frees). Tensors that PyTorch makes from Python data without a
dispatched op (``torch.tensor([...], device=...)``, ``as_tensor``, ``new_tensor``, and the index tensors of
``x[:, [-1, 0]]`` / ``x[[0, 1]] = v``) are seen one level up, by :class:`KnownLiterals` (a TorchFunctionMode), which
repeats the call on the CPU values.

A random factory with no tensor argument (``randn``, ``rand``, ``randint``, ``randperm``) is drawn **when its value
is first read**, not when it runs: a model's random batch is rarely read (it goes into a layer with unknown
weights), and drawing it cost more than the rest of the mirroring (a GPUMemNet MLP's batch and its views: about 15
of its 95 ms of capture). The draws keep their order: reading one makes every draw before it first (a storage that
died or was overwritten in between is still drawn, and thrown away), and any other seeded CPU op makes every pending
draw first, so every value is the one an immediate draw gives. A view op is not run on the CPU at all: its output
shares its input's storage, whose value it already is. ``counts`` is unchanged by both (a pending draw is counted as
mirrored when made).

What it approximates: the values are those of one seeded draw of the workload's random batch, not of the CUDA run's
own draw (a CUDA generator gives other numbers from the same distribution): a scalar that depends on the data (is a
pad token present among random token ids?) takes the value this draw gives. Data-dependent *sizes* (``nonzero``,
boolean masks) keep their documented rule (uvmlab.trace.emulate): their meta outputs have the rule's shape, so a
CPU result of another shape is not kept as a value. Tensors larger than ``max_elements`` (activations, the B x T x T
masks of long sequences) and anything computed from parameters (which have no values) stay unknown. The
device-to-host copies that answer a read launch nothing the trace records (on CUDA they allocate no device memory).
"""

from __future__ import annotations

import weakref
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

aten = torch.ops.aten

MAX_ELEMENTS = 1 << 24
"""Largest tensor (elements) whose value is kept: 16 Mi elements (64 MiB in fp32). Token ids, their reductions and the
B x 1 x T x T masks made from them up to batch 8 x 1,448 tokens (Longformer's padding check reads one of batch 8 x
512 x 512) fit; activations of real sizes do not (a choice that bounds the CPU work and memory)."""
SEED = 0
"""Seed of the private CPU generator random factories draw from (one draw per capture, repeatable)."""
VALUE_READS = frozenset({"_local_scalar_dense", "equal", "is_nonzero", "allclose"})
"""Ops that hand a tensor's value to Python (``.item()``, ``bool(t)``, ``torch.equal``)."""
UNDEFINED_FACTORIES = frozenset({"empty", "empty_strided", "new_empty", "new_empty_strided", "empty_like"})
"""Factories whose values are undefined: their outputs get no value until something writes all of them."""
WHOLE_WRITES = frozenset({"fill_", "zero_", "copy_", "normal_", "uniform_", "random_", "bernoulli_", "exponential_"})
"""In-place ops that overwrite all of ``self`` without reading it: they give an unknown storage a value when ``self``
covers all of it."""
SPECIAL = VALUE_READS | WHOLE_WRITES | {"_to_copy"}
"""Ops that need the full path even when an input has no value (reads, copies out, whole writes)."""
_CPU_ERRORS = (RuntimeError, NotImplementedError, TypeError, ValueError, IndexError)
"""What a CPU op may raise for a mirrored op it cannot run (no CPU kernel, a dtype it lacks): the value stays
unknown."""


class UnknownValueError(RuntimeError):
    """A value read (``.item()``, ``.tolist()``, ``bool(t)``) of a meta tensor whose value is not known."""


def _tensors(args: Any, kwargs: dict[str, Any]) -> Iterator[torch.Tensor]:
    """The tensors among an op's arguments (top level and inside lists: aten arguments nest no deeper)."""
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, list | tuple):
            for b in a:
                if isinstance(b, torch.Tensor):
                    yield b


def _covers_storage(t: torch.Tensor) -> bool:
    return (
        t.storage_offset() == 0 and t.is_contiguous() and t.numel() * t.element_size() == t.untyped_storage().nbytes()
    )


LAZY_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})
"""Output dtypes of a random factory drawn lazily (the CPU's normal/uniform kernels take all of them); integer
draws too (``INTEGER_DRAWS``). A draw of any other dtype is made at once, as before, so that a CPU kernel missing
for it drops the value right away."""
INTEGER_DRAWS = frozenset({"randint", "randperm"})
LAZY_INT_DTYPES = frozenset({torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64})


@dataclass(eq=False)
class _Draw:
    """A random factory's CPU draw not made yet: what to run and the meta storage (``key``) its value is for (None
    once that storage died or was given another value: the draw is still made, in its turn, for the generator)."""

    key: int | None
    func: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    nbytes: int
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int


class KnownValues(TorchDispatchMode):
    """CPU copies of small meta tensors' values (module docstring); ``counts`` says what it answered."""

    def __init__(self, max_elements: int = MAX_ELEMENTS, seed: int = SEED) -> None:
        super().__init__()
        self.max_elements = max_elements
        # meta StorageImpl address -> CPU storage of its bytes, or the pending draw that will give it
        self._values: dict[int, torch.UntypedStorage | _Draw] = {}
        self._draws: deque[_Draw] = deque()  # pending draws, in the order they were made
        self._refs: dict[int, weakref.ref] = {}
        gen = torch.Generator().manual_seed(seed)
        self._rng_state = gen.get_state()
        self.counts: Counter[str] = Counter()
        self._mutable: dict[Any, tuple[int, ...]] = {}

    # ---- values per storage ----------------------------------------------------------------------------------
    def _storage_value(self, t: torch.Tensor) -> torch.UntypedStorage | None:
        st = t.untyped_storage()
        value = self._values.get(st._cdata)
        if type(value) is _Draw:
            self._draw_until(value)
            value = self._values.get(st._cdata)
        if value is not None and value.nbytes() != st.nbytes():  # resized in place: the old bytes say nothing
            self._forget(st._cdata)
            return None
        return value  # type: ignore[return-value]

    def _has_value(self, t: torch.Tensor) -> bool:
        """``_storage_value(t) is not None`` without making a pending draw."""
        st = t.untyped_storage()
        value = self._values.get(st._cdata)
        if value is None:
            return False
        if (value.nbytes if type(value) is _Draw else value.nbytes()) != st.nbytes():  # type: ignore[union-attr]
            self._forget(st._cdata)
            return False
        return True

    def _draw_until(self, last: _Draw) -> None:
        """Make the pending draws in their order, up to and including ``last``."""
        while self._draws:
            d = self._draws.popleft()
            try:
                c = self._seeded(d.func, d.args, d.kwargs)
            except _CPU_ERRORS:
                c = None
            if d.key is not None:
                del self._values[d.key]
                if isinstance(c, torch.Tensor) and tuple(c.shape) == d.shape and c.dtype == d.dtype:
                    st = self._values[d.key] = torch.UntypedStorage(d.nbytes)
                    torch.empty(0, dtype=d.dtype).set_(st, d.offset, d.shape, d.stride).copy_(c)
            if d is last:
                return

    def _lazy_draw(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> bool:
        """Queue ``func``'s CPU draw for ``out`` if it is a random factory of no tensor (True), instead of making it."""
        if (
            not isinstance(out, torch.Tensor)
            or out.device.type != "meta"
            or out.numel() > self.max_elements
            or kwargs.get("generator") is not None
            or torch.Tag.nondeterministic_seeded not in func.tags
            or any(True for _ in _tensors(args, kwargs))
            or out.dtype not in (LAZY_INT_DTYPES if func._opname in INTEGER_DRAWS else LAZY_DTYPES)
        ):
            return False
        st = out.untyped_storage()
        key = st._cdata
        if key in self._values:
            return False
        args = tuple(list(a) if isinstance(a, list) else a for a in args)  # sizes the caller may reuse
        d = _Draw(key, func, args, dict(kwargs), st.nbytes(), out.dtype, tuple(out.shape), out.stride(),
                  out.storage_offset())  # fmt: skip
        self._values[key] = d
        self._draws.append(d)
        if key not in self._refs:
            self._refs[key] = weakref.ref(st, lambda _r, k=key: self._forget(k))
        return True

    def value(self, t: torch.Tensor) -> torch.Tensor | None:
        """The CPU value of meta tensor ``t`` (a view of its storage's value), or None when unknown."""
        if t.device.type != "meta":
            return t
        st = self._storage_value(t)
        if st is None:
            return None
        return torch.empty(0, dtype=t.dtype).set_(st, t.storage_offset(), t.shape, t.stride())

    def _forget(self, key: int) -> None:
        value = self._values.pop(key, None)
        if type(value) is _Draw:
            value.key = None  # still drawn in its turn
        self._refs.pop(key, None)

    def new_value(self, t: torch.Tensor) -> torch.Tensor:
        """A fresh value for the storage of meta tensor ``t`` (its bytes undefined); returns ``t``'s view of it."""
        st = t.untyped_storage()
        key = st._cdata
        pending = self._values.get(key)
        if type(pending) is _Draw:
            pending.key = None  # overwritten before it was read: still drawn in its turn
        self._values[key] = torch.UntypedStorage(st.nbytes())
        if key not in self._refs:
            self._refs[key] = weakref.ref(st, lambda _r, k=key: self._forget(k))
        view = self.value(t)
        assert view is not None
        return view

    def drop(self, t: torch.Tensor) -> None:
        """Forget the value of ``t``'s storage (something wrote an unknown value into it)."""
        if t.device.type == "meta":
            self._forget(t.untyped_storage()._cdata)

    # ---- dispatch --------------------------------------------------------------------------------------------
    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if not isinstance(func, torch._ops.OpOverload):
            return func(*args, **kwargs)
        name = func._opname
        metas = [t for t in _tensors(args, kwargs) if t.device.type == "meta"]
        values = self._values
        if name not in SPECIAL and not all(t.untyped_storage()._cdata in values for t in metas):
            # the common case (an op on the weights or activations): nothing to mirror; forget what it overwrites
            out = func(*args, **kwargs)
            if values:
                for t in self._mutated(func, args, kwargs):
                    self.drop(t)
            return out
        if func.is_view and name not in SPECIAL:
            return self._view(func, args, kwargs, metas)
        known = all(self._storage_value(t) is not None for t in metas)
        if metas and (name in VALUE_READS or self._is_copy_out(func, args, kwargs)):
            if known:
                self.counts["value reads" if name in VALUE_READS else "copies to the CPU"] += 1
                return self._on_cpu(func, args, kwargs)
            raise UnknownValueError(
                "Python reads the value of a tensor that is not computed from the inputs alone (from the model's "
                "weights: a router's choices, an entropy), which a meta capture does not have"
            )
        out = func(*args, **kwargs)
        mutated = self._mutated(func, args, kwargs)
        if name in UNDEFINED_FACTORIES:
            return out
        if name in WHOLE_WRITES and mutated and self._fills_unknown(mutated[0], metas):
            self.new_value(mutated[0])  # written whole from known values: the CPU op below writes its value
            known = True
        outs = [t for t in (out if isinstance(out, list | tuple) else (out,)) if isinstance(t, torch.Tensor)]
        small = all(t.numel() <= self.max_elements for t in outs)
        if not (known and small) or (not metas and not any(t.device.type == "meta" for t in outs)):
            for t in mutated:
                self.drop(t)
            return out
        if not metas and self._lazy_draw(func, args, kwargs, out):
            self.counts["ops mirrored"] += 1
            return out
        if not self._mirror_outputs(func, args, kwargs, outs):
            for t in mutated:
                self.drop(t)
        return out

    def _view(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], metas: list[torch.Tensor]) -> Any:
        """A view op: when its outputs share its inputs' storages, their values are known already and nothing runs on
        the CPU (the full path ran the view there and kept nothing); counted as mirrored as before."""
        known = all(self._has_value(t) for t in metas)
        out = func(*args, **kwargs)
        outs = [t for t in (out if isinstance(out, list | tuple) else (out,)) if isinstance(t, torch.Tensor)]
        if not metas or not known or not all(t.numel() <= self.max_elements for t in outs):
            return out  # a view writes nothing: nothing to forget
        bases = {t.untyped_storage()._cdata for t in metas}
        if all(t.untyped_storage()._cdata in bases for t in outs):
            self.counts["ops mirrored"] += 1
        else:  # not a view here after all
            self._mirror_outputs(func, args, kwargs, outs)
        return out

    def _mirror_outputs(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], outs: list[Any]) -> bool:
        """Run ``func`` on the CPU values and keep its outputs' values; False when the CPU cannot run it."""
        try:
            cpu_out = self._on_cpu(func, args, kwargs)
        except _CPU_ERRORS:
            return False
        self.counts["ops mirrored"] += 1
        cpu_outs = cpu_out if isinstance(cpu_out, list | tuple) else (cpu_out,)
        for t, c in zip(outs, [c for c in cpu_outs if isinstance(c, torch.Tensor)], strict=False):
            if t.device.type != "meta" or self._storage_value(t) is not None:
                continue  # a view or an in-place result: its storage's value was written by the CPU op itself
            if tuple(c.shape) == tuple(t.shape) and c.dtype == t.dtype:
                self.new_value(t).copy_(c)
        return True

    def _fills_unknown(self, target: torch.Tensor, metas: list[torch.Tensor]) -> bool:
        """``target`` (written whole by the op) is a small meta tensor covering an unknown storage, and the op's
        other meta inputs are known."""
        if target.device.type != "meta" or target.numel() > self.max_elements or not _covers_storage(target):
            return False
        if self._storage_value(target) is not None:
            return False
        return all(self._storage_value(t) is not None for t in metas if t is not target)

    def _mutated(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
        idx = self._mutable.get(func)
        if idx is None:
            idx = tuple(
                i for i, a in enumerate(func._schema.arguments) if a.alias_info is not None and a.alias_info.is_write
            )
            self._mutable[func] = idx
        if not idx:
            return []
        schema = func._schema.arguments
        found = []
        for i in idx:
            v = args[i] if i < len(args) else kwargs.get(schema[i].name)
            found += [v] if isinstance(v, torch.Tensor) else [t for t in (v or ()) if isinstance(t, torch.Tensor)]
        return found

    @staticmethod
    def _is_copy_out(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """A copy from a meta tensor to the CPU (``.cpu()``, ``.tolist()``, ``cpu_tensor.copy_(meta)``)."""
        if func is aten._to_copy.default:
            dev = kwargs.get("device")
            return bool(args) and args[0].device.type == "meta" and dev is not None and torch.device(dev).type == "cpu"
        if func is aten.copy_.default:
            return len(args) > 1 and args[0].device.type == "cpu" and args[1].device.type == "meta"
        return False

    def _on_cpu(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run ``func`` on the CPU values of its meta tensors (a random op draws from the private generator)."""

        def cpu(a: Any) -> Any:
            if isinstance(a, torch.Tensor):
                return self.value(a)
            if isinstance(a, list | tuple):
                return type(a)(cpu(b) for b in a)
            if isinstance(a, torch.device) and a.type == "meta":
                return torch.device("cpu")
            return a

        cargs = tuple(cpu(a) for a in args)
        ckwargs = {k: (torch.device("cpu") if k == "device" and v is not None and str(v) == "meta" else cpu(v))
                   for k, v in kwargs.items()}  # fmt: skip
        if torch.Tag.nondeterministic_seeded not in func.tags:
            with _disable_current_modes(), torch._C.DisableTorchFunction():
                return func(*cargs, **ckwargs)
        if self._draws:  # the generator's earlier draws first, in their order
            self._draw_until(self._draws[-1])
        return self._seeded(func, cargs, ckwargs, converted=True)

    def _seeded(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], converted: bool = False) -> Any:
        """Run the random op ``func`` on the CPU from the private generator's state (advancing it)."""
        if not converted:
            args = tuple(torch.device("cpu") if isinstance(a, torch.device) and a.type == "meta" else a for a in args)
            kwargs = {k: (torch.device("cpu") if k == "device" and v is not None and str(v) == "meta" else v)
                      for k, v in kwargs.items()}  # fmt: skip
        cargs, ckwargs = args, kwargs
        with _disable_current_modes(), torch._C.DisableTorchFunction():
            saved = torch.get_rng_state()
            torch.set_rng_state(self._rng_state)
            try:
                return func(*cargs, **ckwargs)
            finally:
                self._rng_state = torch.get_rng_state()
                torch.set_rng_state(saved)


LITERAL_FUNCTIONS = frozenset({"tensor", "as_tensor", "new_tensor", "__getitem__", "__setitem__"})
"""Python-level calls that make tensors from Python data without a dispatched op (literals, list indices)."""


class KnownLiterals(TorchFunctionMode):
    """Values of the tensors :data:`LITERAL_FUNCTIONS` make from Python data (for the :class:`KnownValues` given)."""

    def __init__(self, values: KnownValues) -> None:
        super().__init__()
        self.values = values

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name not in LITERAL_FUNCTIONS:
            return func(*args, **kwargs)
        vals = self.values
        before = None
        if name == "__setitem__" and isinstance(args[0], torch.Tensor) and args[0].device.type == "meta":
            current = vals.value(args[0])
            before = None if current is None else current.clone()  # the dispatched index_put_ may drop it
        out = func(*args, **kwargs)
        if name == "__setitem__":
            if before is not None and args[0].numel() <= vals.max_elements:
                self._setitem(args[0], before, args[1:])
            return out
        if not isinstance(out, torch.Tensor) or out.device.type != "meta" or out.numel() > vals.max_elements:
            return out
        if vals.value(out) is not None:
            return out  # a view of a known tensor, or mirrored by the dispatched ops
        cpu = self._on_cpu(func, args, kwargs)
        if isinstance(cpu, torch.Tensor) and tuple(cpu.shape) == tuple(out.shape) and cpu.dtype == out.dtype:
            vals.counts["literals"] += 1
            vals.new_value(out).copy_(cpu)
        return out

    def _setitem(self, target: torch.Tensor, before: torch.Tensor, rest: tuple[Any, ...]) -> None:
        index, value = rest[0], rest[1] if len(rest) > 1 else None
        cpu = self._cpu_args((index, value))
        if cpu is None:
            self.values.drop(target)
            return
        with _disable_current_modes(), torch._C.DisableTorchFunction():
            try:
                before[cpu[0]] = cpu[1]
            except _CPU_ERRORS:
                self.values.drop(target)
                return
        view = self.values.value(target)
        if view is None:
            if not _covers_storage(target):
                return
            view = self.values.new_value(target)
        with _disable_current_modes(), torch._C.DisableTorchFunction():
            view.copy_(before)
        self.values.counts["literals"] += 1

    def _cpu_args(self, args: Any) -> Any:
        """``args`` with meta tensors replaced by their values and meta devices by the CPU; None if one is unknown."""
        if isinstance(args, torch.Tensor):
            return self.values.value(args) if args.device.type == "meta" else args
        if isinstance(args, list | tuple):
            out = [self._cpu_args(a) for a in args]
            if any(o is None and a is not None for o, a in zip(out, args, strict=True)):
                return None
            return type(args)(out)
        if isinstance(args, torch.device) and args.type == "meta":
            return torch.device("cpu")
        if isinstance(args, str) and args == "meta":
            return "cpu"
        return args

    def _on_cpu(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        cargs = self._cpu_args(args)
        ckwargs = {k: self._cpu_args(v) for k, v in kwargs.items()}
        if cargs is None or any(v is None and kwargs[k] is not None for k, v in ckwargs.items()):
            return None
        with _disable_current_modes(), torch._C.DisableTorchFunction():
            try:
                return func(*cargs, **ckwargs)
            except _CPU_ERRORS:
                return None
