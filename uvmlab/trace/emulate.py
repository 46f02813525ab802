"""Emulate CUDA's choices while capturing on the meta device (see DESIGN.md "Traps").

* SDPA: on meta, ``F.scaled_dot_product_attention`` takes the math path (materializing B x H x T x T); on CUDA
  it takes flash attention (fp16/bf16, no mask, one head dim <= 256 for q, k and v) or memory-efficient attention
  (otherwise, e.g. multi-head latent attention, whose values have a smaller head dim than queries and keys),
  which keep only a logsumexp. :class:`SdpaEmulation` routes the call to
  ``aten._scaled_dot_product_flash_attention`` / ``aten._scaled_dot_product_efficient_attention`` (both have
  meta kernels and autograd formulas). A boolean mask becomes an additive float bias first, as CUDA's
  ``convert_boolean_attn_mask`` does. Not emulated: CUDA's padding of the bias's last dimension to a multiple of
  16, the cuDNN attention backend, and the math fallback CUDA takes for unsupported shapes.
* bf16 autocast: autocast has no meta backend, so :class:`AutocastEmulation` (a TorchFunctionMode) applies
  CUDA autocast's op lists at the Python function level: ``LOWER_PRECISION`` functions get floating inputs cast
  to bf16, ``FP32`` functions get them cast to fp32; casts of leaf tensors that require grad (parameters) are
  cached for the duration of the autocast region, as autocast's weight cache does. Approximation: autocast works
  at the dispatcher level and also reaches ops called inside C++ composites; this emulation sees only functions
  called from Python (which covers nn.Linear/Conv/LayerNorm/softmax/cross_entropy in the built-in models).
* Dropout: on CUDA, ``F.dropout(x, p, training=True)`` with 0 < p < 1 on a non-empty tensor takes the fused
  kernel (PyTorch aten/src/ATen/native/Dropout.cpp: ``dropout`` calls ``at::native_dropout`` when
  ``is_fused_kernel_acceptable``), which returns the output and a 1-byte-per-element mask (``bool``;
  aten/src/ATen/native/cuda/Dropout.cu allocates it with ``empty_like(self, ...dtype(kBool))``, older releases
  ``kByte``) that autograd keeps for ``native_dropout_backward``. On meta and CPU, ``dropout`` takes the unfused
  ``_dropout_impl``: a noise tensor of the input's dtype (4 bytes per element in fp32) and a multiply.
  :class:`DropoutEmulation` routes the call to ``aten.native_dropout`` (which has a meta kernel and an autograd
  formula). In-place dropout (``dropout_``), feature/alpha dropout and p in {0, 1} are unfused on CUDA too and
  are left alone.
* Convolution memory formats: CUDA's convolutions return their output in the memory format cuDNN suggests for
  the operands (aten/src/ATen/native/ConvUtils.h ``cudnn_conv_suggest_memory_format``: channels-last when the
  input or the 4-D weight is channels-last, not for float64), and cuDNN's backward does the same for the input
  gradient (from grad_output and weight) and the weight gradient (from input and grad_output); the meta kernels
  return contiguous (NCHW) tensors whatever the input. :class:`ConvLayoutEmulation` gives the meta outputs CUDA's
  format (the same bytes, other strides), so what follows sees CUDA's layouts: ConvNeXt's blocks permute a
  channels-last convolution output to NHWC, contiguous on CUDA (no copy in the layer norm that follows), not on
  meta. Not emulated: the 5-D (``ChannelsLast3d``) case and cuDNN versions before 7.6.3.
* Data-dependent ops: the meta device cannot know how many elements ``nonzero`` and the ops built on it return.
  :class:`DataDependentEmulation` gives each a documented size instead of failing; ``fraction``
  (the ``data_dependent_fraction`` option, 1.0 by default) scales the upper bound:

  - ``nonzero(x)``: ``(ceil(fraction * x.numel()), x.dim())`` int64 (the upper bound: every element nonzero);
  - ``masked_select(x, mask)``: ``ceil(fraction * n)`` elements, n the broadcast size;
  - indexing with a boolean mask (``x[mask]``, ``index``/``index_put_``): the mask becomes the long indices of
    its nonzero elements (the nonzero rule), as CUDA's indexing does (it calls ``nonzero`` and allocates them);
  - ``unique`` / ``unique_consecutive`` / ``unique_dim`` (``_unique2``, ``unique_consecutive``, ``unique_dim``):
    ``ceil(fraction * n)`` values (all distinct), inverse indices of the input's shape, counts like the values;
  - ``bincount(x, weights, minlength)``: ``minlength`` bins when given (the values assumed below it: counting
    labels of a known range), else ``x.numel()`` (values assumed below the count, e.g. indices); no upper bound
    exists without the data.

  Not emulated: ``repeat_interleave`` without ``output_size``, and the ``nonzero`` temporary CUDA's
  ``masked_select`` makes (it goes through ``index``). ``.item()``/``.tolist()`` of values that come from the
  inputs: uvmlab.trace.known_values.
  A CPU capture cannot see the ``nonzero`` inside a boolean-mask ``index`` (it happens inside the CPU kernel);
  the meta rule records it, as the CUDA caching allocator sees it.
"""

from __future__ import annotations

import contextlib
import math
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from uvmlab.errors import InputError
from uvmlab.trace import meta_memo

FLASH_MAX_HEAD_DIM = 256
"""Flash attention's largest head dimension (PyTorch sdp_utils.cpp check_head_dim_size_flash)."""
FLASH_DTYPES = (torch.float16, torch.bfloat16)
"""Flash attention's dtypes (sdp_utils.cpp check_flash_attention_dtype)."""

LOWER_PRECISION = frozenset(
    {
        "linear",
        "matmul",
        "__matmul__",
        "__rmatmul__",
        "mm",
        "mv",
        "bmm",
        "addmm",
        "addmv",
        "addr",
        "baddbmm",
        "addbmm",
        "einsum",
        "conv1d",
        "conv2d",
        "conv3d",
        "conv_transpose1d",
        "conv_transpose2d",
        "conv_transpose3d",
        "prelu",
        "scaled_dot_product_attention",
    }
)
"""CUDA autocast's lower-precision ops (PyTorch aten/src/ATen/autocast_mode.cpp, AT_FORALL_LOWER_PRECISION_FP)."""
FP32 = frozenset(
    {
        "softmax",
        "log_softmax",
        "layer_norm",
        "group_norm",
        "cross_entropy",
        "cross_entropy_loss",
        "nll_loss",
        "mse_loss",
        "l1_loss",
        "smooth_l1_loss",
        "binary_cross_entropy_with_logits",
        "kl_div",
        "exp",
        "expm1",
        "log",
        "log1p",
        "log2",
        "log10",
        "pow",
        "reciprocal",
        "rsqrt",
        "softplus",
        "cumsum",
        "cumprod",
        "prod",
        "sum",
        "norm",
        "normalize",
        "acos",
        "asin",
        "cosh",
        "sinh",
        "tan",
        "erfinv",
    }
)
"""CUDA autocast's fp32 ops (autocast_mode.cpp, AT_FORALL_FP32)."""


def _cast(x: Any, dtype: torch.dtype, cache: dict[int, torch.Tensor] | None) -> Any:
    if isinstance(x, torch.Tensor):
        if not x.is_floating_point() or x.dtype == dtype or x.dtype == torch.float64:
            return x
        use_cache = cache is not None and x.is_leaf and x.requires_grad
        if use_cache and id(x) in cache:
            return cache[id(x)]
        y = x.to(dtype)
        if use_cache:
            cache[id(x)] = y
        return y
    if isinstance(x, list | tuple):
        return type(x)(_cast(v, dtype, cache) for v in x)
    return x


class AutocastEmulation(TorchFunctionMode):
    """bf16 autocast at the Python function level (see the module docstring)."""

    def __init__(self, dtype: torch.dtype = torch.bfloat16) -> None:
        super().__init__()
        self.dtype = dtype
        self.cache: dict[int, torch.Tensor] = {}
        self.counts: Counter[str] = Counter()

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in LOWER_PRECISION:
            self.counts["lower"] += 1
            args = _cast(args, self.dtype, self.cache)
            kwargs = {k: _cast(v, self.dtype, self.cache) for k, v in kwargs.items()}
        elif name in FP32:
            self.counts["fp32"] += 1
            args = _cast(args, torch.float32, None)
            kwargs = {k: _cast(v, torch.float32, None) for k, v in kwargs.items()}
        return func(*args, **kwargs)

    @contextlib.contextmanager
    def region(self) -> Iterator[None]:
        """One autocast region: the weight cast cache lives until it ends (as autocast's does)."""
        with self:
            try:
                yield
            finally:
                self.cache.clear()


def _bool_mask_to_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # CUDA: convert_boolean_attn_mask -> at::where(attn_mask.logical_not(), -inf, 0.0)
    return torch.where(mask.logical_not(), float("-inf"), 0.0).to(dtype)


class SdpaEmulation(TorchFunctionMode):
    """Route F.scaled_dot_product_attention to CUDA's flash or memory-efficient kernel (module docstring).

    ``backend`` forces one, as ``torch.nn.attention.sdpa_kernel(SDPBackend.X)`` does: ``flash`` (refused where
    flash cannot run: not fp16/bf16, a mask, a head dimension over 256, as PyTorch's "No available kernel"),
    ``efficient``, or ``math`` (``aten._scaled_dot_product_attention_math``, a composite op whose decomposition on
    meta is the one CUDA runs: the B x H x T x T scores and probabilities materialized); ``auto`` is PyTorch's
    priority order, flash then efficient."""

    def __init__(self, backend: str = "auto") -> None:
        super().__init__()
        self.backend = backend
        self.counts: Counter[str] = Counter()

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            return self._sdpa(*args, **kwargs)
        return func(*args, **kwargs)

    def _sdpa(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> torch.Tensor:
        if enable_gqa and key.size(-3) != query.size(-3):
            groups = query.size(-3) // key.size(-3)
            key = key.repeat_interleave(groups, dim=-3)
            value = value.repeat_interleave(groups, dim=-3)
        if query.dim() != 4:
            self.counts["math (not 4-D)"] += 1
            return F.scaled_dot_product_attention(
                query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
            )
        head_dim = query.size(-1)
        same_dims = head_dim == key.size(-1) == value.size(-1)  # check_head_dim_size_flash: MLA's v differs
        flash_ok = query.dtype in FLASH_DTYPES and attn_mask is None and head_dim <= FLASH_MAX_HEAD_DIM and same_dims
        if self.backend == "math":
            self.counts["math"] += 1
            return torch.ops.aten._scaled_dot_product_attention_math(
                query, key, value, attn_mask, dropout_p, is_causal, None, scale=scale
            )[0]
        if self.backend == "flash" and not flash_ok:
            raise InputError(
                f"--sdpa-backend flash cannot run this attention (dtype {str(query.dtype).removeprefix('torch.')}, "
                f"mask {'given' if attn_mask is not None else 'none'}, head dims {head_dim}/{key.size(-1)}/"
                f"{value.size(-1)}; flash needs fp16/bf16, no mask, one head dim <= {FLASH_MAX_HEAD_DIM}): PyTorch "
                "raises 'No available kernel'"
            )
        if flash_ok and self.backend != "efficient":
            self.counts["flash"] += 1
            out = torch.ops.aten._scaled_dot_product_flash_attention(
                query, key, value, dropout_p, is_causal, False, scale=scale
            )
            return out[0]
        if attn_mask is not None and attn_mask.dtype == torch.bool:
            attn_mask = _bool_mask_to_bias(attn_mask, query.dtype)
        if attn_mask is not None:
            attn_mask = attn_mask.expand(query.size(0), query.size(1), query.size(2), key.size(2))
        self.counts["efficient"] += 1
        need_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
        out = torch.ops.aten._scaled_dot_product_efficient_attention(
            query, key, value, attn_mask, need_grad, dropout_p, is_causal, scale=scale
        )
        return out[0]


class DropoutEmulation(TorchFunctionMode):
    """Route training-mode ``F.dropout`` to CUDA's fused ``native_dropout`` (1-byte mask; module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is F.dropout or func is torch.dropout:
            fused = self._fused(func, *args, **kwargs)
            if fused is not None:
                return fused
        return func(*args, **kwargs)

    def _fused(
        self, func: Any, input: Any, p: float = 0.5, training: bool = True, inplace: bool = False, **kw: Any
    ) -> Any:
        if func is torch.dropout:  # torch.dropout(input, p, train): no inplace argument
            training = kw.get("train", training)
        if inplace or not training or not (0 < p < 1) or not isinstance(input, torch.Tensor) or input.numel() == 0:
            self.counts["unfused"] += 1
            return None
        self.counts["fused"] += 1
        return torch.ops.aten.native_dropout(input, p, True)[0]


def _ceil_fraction(n: int, fraction: float) -> int:
    return min(n, math.ceil(fraction * n))


class DataDependentEmulation(TorchDispatchMode):
    """Sizes for data-dependent ops on meta (rules in the module docstring); counts what it emulated."""

    def __init__(
        self,
        fraction: float = 1.0,
        attributing: Callable[[str], contextlib.AbstractContextManager[None]] | None = None,
    ) -> None:
        """``attributing(op)``: a context under which new allocations are attributed to ``op`` (the recorder's)."""
        super().__init__()
        self._attributing = attributing or (lambda _op: contextlib.nullcontext())
        if not 0 < fraction <= 1:
            raise ValueError(f"data_dependent_fraction must be in (0, 1], not {fraction}")
        self.fraction = fraction
        self.counts: Counter[str] = Counter()
        aten = torch.ops.aten
        self._rules = {
            aten.nonzero.default: self._nonzero,
            aten.masked_select.default: self._masked_select,
            aten.index.Tensor: self._index,
            aten.index_put.default: self._index,
            aten.index_put_.default: self._index,
            aten._index_put_impl_.default: self._index,
            aten._unique2.default: self._unique2,
            aten.unique_consecutive.default: self._unique2,
            aten.unique_dim.default: self._unique_dim,
            aten.bincount.default: self._bincount,
        }
        self._index_ops = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default}
        self._index_ops.add(aten._index_put_impl_.default)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        rule = self._rules.get(func)
        if rule is not None and _on_meta(args):
            if func in self._index_ops:
                return rule(func, *args, **kwargs)  # labels the nonzero it adds; the index op is recorded as is
            with self._attributing(f"aten::{func._opname}"):
                return rule(func, *args, **kwargs)
        return func(*args, **kwargs)

    def _nonzero(self, func: Any, x: torch.Tensor) -> torch.Tensor:
        self.counts["nonzero" if func is not None else "boolean-mask index"] += 1
        n = _ceil_fraction(x.numel(), self.fraction)
        return torch.empty((n, x.dim()), dtype=torch.long, device=x.device)

    def _masked_select(self, func: Any, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        self.counts["masked_select"] += 1
        n = torch.broadcast_shapes(x.shape, mask.shape).numel()
        return torch.empty((_ceil_fraction(n, self.fraction),), dtype=x.dtype, device=x.device)

    def _long_indices(self, indices: Any) -> list[Any]:
        out: list[Any] = []
        for idx in indices:
            if isinstance(idx, torch.Tensor) and idx.dtype in (torch.bool, torch.uint8):
                with self._attributing("aten::nonzero"):  # CUDA: at::native::expandTensors -> mask.nonzero()
                    nz = self._nonzero(None, idx)
                out.extend(nz.select(1, d) for d in range(idx.dim()))
            else:
                out.append(idx)
        return out

    def _index(self, func: Any, x: torch.Tensor, indices: Any, *rest: Any, **kwargs: Any) -> Any:
        """index / index_put / index_put_ / _index_put_impl_: boolean masks become long indices first."""
        return func(x, self._long_indices(indices), *rest, **kwargs)

    def _unique2(self, func: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, ...]:
        """_unique2(self, sorted, return_inverse, return_counts) and unique_consecutive(self, return_inverse,
        return_counts, dim): outputs not asked for are empty, as in the real kernels."""
        self.counts[func._opname] += 1
        names = ("return_inverse", "return_counts")
        flags = args[1:3] if func._opname == "_unique2" else args[0:2]
        inv, cnt = (kwargs.get(k, flags[i] if i < len(flags) else False) for i, k in enumerate(names))
        n = _ceil_fraction(x.numel(), self.fraction)
        values = torch.empty((n,), dtype=x.dtype, device=x.device)
        inverse = torch.empty(x.shape if inv else (0,), dtype=torch.long, device=x.device)
        counts = torch.empty((n if cnt else 0,), dtype=torch.long, device=x.device)
        return values, inverse, counts

    def _unique_dim(self, func: Any, x: torch.Tensor, dim: int, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, ...]:
        """unique_dim(self, dim, sorted, return_inverse, return_counts)."""
        self.counts["unique_dim"] += 1
        inv = kwargs.get("return_inverse", args[1] if len(args) > 1 else False)
        cnt = kwargs.get("return_counts", args[2] if len(args) > 2 else False)
        rows = _ceil_fraction(x.size(dim), self.fraction)
        shape = list(x.shape)
        shape[dim] = rows
        values = torch.empty(shape, dtype=x.dtype, device=x.device)
        inverse = torch.empty((x.size(dim) if inv else 0,), dtype=torch.long, device=x.device)
        counts = torch.empty((rows if cnt else 0,), dtype=torch.long, device=x.device)
        return values, inverse, counts

    def _bincount(
        self, func: Any, x: torch.Tensor, weights: torch.Tensor | None = None, minlength: int = 0
    ) -> torch.Tensor:
        self.counts["bincount"] += 1
        dtype = torch.long if weights is None else (torch.double if weights.dtype != torch.float else torch.float)
        return torch.zeros((minlength if minlength > 0 else x.numel(),), dtype=dtype, device=x.device)


def suggests_channels_last(t: Any) -> bool:
    """``Tensor::suggest_memory_format() == ChannelsLast`` for a 4-D tensor: channels-last strides that are not also
    the contiguous ones."""
    return (
        isinstance(t, torch.Tensor)
        and t.dim() == 4
        and t.is_contiguous(memory_format=torch.channels_last)
        and not t.is_contiguous()
    )


def cudnn_channels_last(a: Any, b: Any) -> bool:
    """``cudnn_conv_suggest_memory_format(a, b) == ChannelsLast`` (ConvUtils.h) for 4-D operands, not float64."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or torch.float64 in (a.dtype, b.dtype):
        return False
    return b.dim() == 4 and (suggests_channels_last(a) or suggests_channels_last(b))


def _as_channels_last(t: Any) -> Any:
    if isinstance(t, torch.Tensor) and t.dim() == 4 and not t.is_contiguous(memory_format=torch.channels_last):
        return torch.empty(t.shape, dtype=t.dtype, device=t.device, memory_format=torch.channels_last)
    return t


class ConvLayoutEmulation(TorchDispatchMode):
    """Convolution outputs on meta in the memory format CUDA's cuDNN path gives them (module docstring). Entered
    outside the recorder, so the recorder records the emulated outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()
        aten = torch.ops.aten
        self._conv, self._conv_backward = aten.convolution.default, aten.convolution_backward.default

    def __enter__(self) -> ConvLayoutEmulation:
        self._memo_key = meta_memo.variant("conv-layout")
        self._memo_key.__enter__()  # the memo must not replay these outputs without the emulation
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            self._memo_key.__exit__(None, None, None)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func is self._conv and _on_meta(args) and cudnn_channels_last(args[0], args[1]):
            self.counts["convolution"] += 1
            return _as_channels_last(out)
        if func is self._conv_backward and _on_meta(args):
            grad_out, x, w = args[0], args[1], args[2]
            grad_input, grad_weight, grad_bias = out
            if cudnn_channels_last(grad_out, w) or cudnn_channels_last(x, grad_out):
                self.counts["convolution_backward"] += 1
            if cudnn_channels_last(grad_out, w):
                grad_input = _as_channels_last(grad_input)
            if cudnn_channels_last(x, grad_out):
                grad_weight = _as_channels_last(grad_weight)
            return grad_input, grad_weight, grad_bias
        return out


def _on_meta(args: tuple[Any, ...]) -> bool:
    return any(isinstance(a, torch.Tensor) and a.device.type == "meta" for a in args)
