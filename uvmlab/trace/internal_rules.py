"""The rules: which allocations each CUDA kernel makes inside itself, from the op's arguments (capture side).

``temporaries(func, args, kwargs, outs)`` returns the kernels-table ``temporaries`` value of one aten op
(``uvmlab.trace.internal_allocs`` describes the format; the orchestrator inserts the allocations). Each rule reads
the PyTorch 2.14.1 CUDA source named in its docstring: the functions were read in the source and checked against
the installed ``libtorch_cuda.so`` (its disassembly shows the allocating calls each host function makes: the
``contiguous``/``empty``/``mul`` calls below) and, where a header holds the code, against the installed header.
docs/estimate.md ("Temporaries inside CUDA kernels") has the table with every rule's source and condition.

A contiguous copy (``Tensor::contiguous()`` / ``expect_contiguous()`` of a tensor that is not contiguous) is
``numel x element size`` bytes; a contiguous tensor is used as is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from uvmlab.trace.emulate import cudnn_channels_last
from uvmlab.trace.internal_allocs import encode, round_up

aten = torch.ops.aten
Entry = dict[str, Any]
Rule = Callable[[tuple[Any, ...], dict[str, Any], list[Any]], list[Entry]]

REDUCE_MAX_THREADS = 512
"""Reduce.cuh ``mnt_wrapper<T>::MAX_NUM_THREADS`` (256 for complex<double>, not modelled)."""


def _copy(t: Any, label: str, pre: bool = False) -> list[Entry]:
    """A ``.contiguous()`` copy of ``t`` when it is a non-contiguous tensor with elements."""
    if not isinstance(t, torch.Tensor) or t.numel() == 0 or t.is_contiguous():
        return []
    return [{"l": label, "b": t.nbytes, **({"pre": 1} if pre else {})}]


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], i: int, name: str, default: Any = None) -> Any:
    return args[i] if len(args) > i else kwargs.get(name, default)


# ---- softmax family: aten/src/ATen/native/cuda/SoftMax.cu ----------------------------------------------------------
def softmax_forward(args: tuple[Any, ...], kwargs: dict[str, Any], outs: list[Any]) -> list[Entry]:
    """``_softmax`` / ``_log_softmax`` (``host_softmax``): ``input_.contiguous()`` after the structured output is
    allocated; freed when the op returns."""
    return _copy(args[0], "contiguous_input")


def softmax_backward(args: tuple[Any, ...], kwargs: dict[str, Any], outs: list[Any]) -> list[Entry]:
    """``_softmax_backward_data`` (``softmax_backward_cuda_out``): ``Tensor tmp = grad * output`` always, then
    ``host_softmax_backward`` makes ``tmp`` and ``output`` contiguous. APPROXIMATION: ``tmp`` takes TensorIterator's
    layout; it is taken as contiguous when ``grad`` is contiguous and ``output`` is contiguous or shares its
    strides, else as needing one more copy."""
    grad, output = args[0], args[1]
    dtype = torch.promote_types(grad.dtype, output.dtype)
    n = torch.broadcast_shapes(grad.shape, output.shape).numel()
    if n == 0:
        return []
    out = [{"l": "grad_times_output", "b": n * dtype.itemsize}]
    tmp_contiguous = grad.is_contiguous() and (output.is_contiguous() or grad.stride() == output.stride())
    if not tmp_contiguous:
        out.append({"l": "contiguous_grad", "b": out[0]["b"]})
    return out + _copy(output, "contiguous_output")


def log_softmax_backward(args: tuple[Any, ...], kwargs: dict[str, Any], outs: list[Any]) -> list[Entry]:
    """``_log_softmax_backward_data`` (``host_softmax_backward``): ``grad_.contiguous()`` then
    ``output_.contiguous()``."""
    return _copy(args[0], "contiguous_grad") + _copy(args[1], "contiguous_output")


# ---- losses: aten/src/ATen/native/cuda/Loss.cu, NLLLoss2d.cu ------------------------------------------------------
def nll_loss(args: tuple[Any, ...], kwargs: dict[str, Any], outs: list[Any]) -> list[Entry]:
    """``nll_loss_forward`` / ``nll_loss2d_forward`` (``nll_loss_forward_out_cuda_template``,
    ``nll_loss2d_forward_out_cuda_template``): ``expect_contiguous`` of input, target and weight."""
    weight = _arg(args, kwargs, 2, "weight")
    return _copy(args[0], "contiguous_input") + _copy(args[1], "contiguous_target") + _copy(weight, "contiguous_weight")


def nll_loss_backward(args: tuple[Any, ...], kwargs: dict[str, Any], outs: list[Any]) -> list[Entry]:
    """``nll_loss_backward`` / ``nll_loss2d_backward`` (``nll_loss_backward_out_cuda_template``): ``contiguous`` of
    input, target, weight and grad_output (the grad_input output is allocated and zeroed first)."""
    weight = _arg(args, kwargs, 3, "weight")
    return (
        _copy(args[1], "contiguous_input")
        + _copy(args[2], "contiguous_target")
        + _copy(weight, "contiguous_weight")
        + _copy(args[0], "contiguous_grad_output")
    )


# ---- layer norm: aten/src/ATen/native/cuda/layer_norm_kernel.cu -------------------------------------------------
def layer_norm(args: tuple[Any, ...], kwargs: dict[str, Any], outs: list[Any]) -> list[Entry]:
    """``native_layer_norm`` (``layer_norm_cuda``): ``expect_contiguous`` of input, weight and bias BEFORE the
    outputs (Y, mean, rstd) are allocated."""
    weight, bias = _arg(args, kwargs, 2, "weight"), _arg(args, kwargs, 3, "bias")
    return (
        _copy(args[0], "contiguous_input", pre=True)
        + _copy(weight, "contiguous_weight", pre=True)
        + _copy(bias, "contiguous_bias", pre=True)
    )


def layer_norm_backward(args: tuple[Any, ...], kwargs: dict[str, Any], outs: list[Any]) -> list[Entry]:
    """``native_layer_norm_backward`` (``layer_norm_backward_cuda``): ``expect_contiguous`` of input, weight and
    bias before the outputs, ``dY.contiguous()`` after them; then, in ``LaunchGammaBetaBackwardCUDAKernel``, the
    dgamma/dbeta partial sums of its two-pass path (GPU-dependent: ``internal_allocs.gamma_beta_partials``), which
    are then reduced by ``.sum(0)`` (a reduction whose own buffers are not modelled here)."""
    grad_out, x, normalized = args[0], args[1], args[2]
    weight = _arg(args, kwargs, 5, "weight")
    bias = _arg(args, kwargs, 6, "bias")
    mask = _arg(args, kwargs, 7, "output_mask", [True, True, True])
    out = (
        _copy(x, "contiguous_input", pre=True)
        + _copy(weight, "contiguous_weight", pre=True)
        + _copy(bias, "contiguous_bias", pre=True)
        + _copy(grad_out, "contiguous_grad_output")
    )
    n = 1
    for s in normalized:
        n *= int(s)
    m = x.numel() // max(n, 1)
    n_buffers = int(bool(mask[1]) and weight is not None) + int(bool(mask[2]) and bias is not None)
    if n_buffers and m > 0:
        elem = (weight if weight is not None else bias).element_size()
        out.append({"l": "gamma_beta_partials", "gamma_beta": [m, n, elem, n_buffers]})
    return out


# ---- convolution backward: aten/src/ATen/native/cudnn/ConvShared.cpp, cuda/DepthwiseConv2d.cu ----------------------
def _cudnn_layout(a: Any, b: Any) -> torch.memory_format:
    """ConvUtils.h ``cudnn_conv_suggest_memory_format(a, b)`` (``uvmlab.trace.emulate.cudnn_channels_last``)."""
    return torch.channels_last if cudnn_channels_last(a, b) else torch.contiguous_format


def _copy_to(t: Any, fmt: torch.memory_format, label: str) -> list[Entry]:
    if not isinstance(t, torch.Tensor) or t.numel() == 0 or t.is_contiguous(memory_format=fmt):
        return []
    return [{"l": label, "b": t.nbytes}]


def convolution_backward(args: tuple[Any, ...], kwargs: dict[str, Any], outs: list[Any]) -> list[Entry]:
    """``convolution_backward`` on cuDNN (cudnn/ConvShared.cpp): ``cudnn_convolution_backward_input`` makes
    grad_output and the weight contiguous in ``cudnn_conv_suggest_memory_format(grad_output, weight)``, then
    ``cudnn_convolution_backward_weight`` makes grad_output and the input contiguous in
    ``cudnn_conv_suggest_memory_format(input, grad_output)``, each after allocating its gradient and freeing its
    copies when it returns (PyTorch's own NCHW depthwise kernels, ``conv_depthwise2d_backward_cuda_out``, copy the
    same operands to NCHW). APPROXIMATION: the op's temporaries are the copies of the call that copies more (the
    two calls run one after the other)."""
    grad_out, x, w = args[0], args[1], args[2]
    mask = _arg(args, kwargs, 10, "output_mask", [True, True, True])
    if grad_out.numel() == 0:
        return []
    calls = []
    if mask[0]:
        fmt = _cudnn_layout(grad_out, w)
        calls.append(_copy_to(grad_out, fmt, "contiguous_grad_output") + _copy_to(w, fmt, "contiguous_weight"))
    if mask[1]:
        fmt = _cudnn_layout(x, grad_out)
        calls.append(_copy_to(grad_out, fmt, "contiguous_grad_output") + _copy_to(x, fmt, "contiguous_input"))
    return max(calls, key=lambda c: sum(e["b"] for e in c), default=[])


# ---- embedding backward: aten/src/ATen/native/cuda/Embedding.cu, EmbeddingBackwardKernel.cu -------------------------
EMBEDDING_SMALL = 3072
"""Embedding.cu ``embedding_dense_backward_cuda``: ``num_indices <= 3072`` without ``scale_grad_by_freq`` runs
``embedding_backward_feature_kernel`` (no sort)."""
EMBEDDING_NROWS_PER_THREAD = 10
"""EmbeddingBackwardKernel.cu ``NROWS_PER_THREAD``."""


def embedding_backward(args: tuple[Any, ...], kwargs: dict[str, Any], outs: list[Any]) -> list[Entry]:
    """``embedding_dense_backward`` (``embedding_dense_backward_cuda``): ``grad_.contiguous()``; for at most 3072
    indices without ``scale_grad_by_freq``, ``indices.contiguous()`` and the output; otherwise a radix sort into
    ``sorted_indices``/``orig_indices`` (with an ``arange`` of the indices, freed after the sort), ``count`` with
    ``scale_grad_by_freq``, then ``embedding_backward_cuda_kernel``: the output, ``segment_offsets``, two scalars,
    ``partials_per_segment`` and its offsets (``min(numel, num_weights)`` each), ``partial_segment_offset``
    (``numel / 10 + min(numel, num_weights)``) and the last step's buffers (GPU-dependent:
    ``internal_allocs.embedding_final``). NOT modelled: cub's own temporary storage of the sort, unique and scans
    (its size is internal to cub)."""
    grad, indices, num_weights = args[0], args[1], int(args[2])
    scale = bool(_arg(args, kwargs, 4, "scale_grad_by_freq", False))
    n = indices.numel()
    out = _copy(grad, "contiguous_grad", pre=True)
    if n <= EMBEDDING_SMALL and not scale:
        return out + _copy(indices, "contiguous_indices", pre=True)
    ib = indices.element_size()
    out += [
        {"l": "sorted_indices", "b": n * ib, "pre": 1},
        {"l": "orig_indices", "b": n * ib, "pre": 1},
        {"l": "sort_range", "b": n * ib, "pre": 1, "until": "outputs"},  # dies with the sort lambda
    ]
    if scale:
        out.append({"l": "count", "b": n * ib, "pre": 1})
    max_segments = min(n, num_weights)
    max_partial = n // EMBEDDING_NROWS_PER_THREAD + max_segments
    stride = int(grad.shape[-1])
    acc = 4 if grad.dtype in (torch.float16, torch.bfloat16) else grad.element_size()
    tail = [
        {"l": "segment_offsets", "b": n * ib},
        {"l": "num_of_segments", "b": 8},
        {"l": "partials_per_segment", "b": max_segments * ib},
        {"l": "partials_per_segment_offset", "b": max_segments * ib},
        {"l": "num_of_partial_segments", "b": 8},
        {"l": "partial_segment_offset", "b": max_partial * ib},
        {
            "l": "final",
            "embedding": [max_segments, max_partial, stride, ib, acc, num_weights, int(acc != grad.element_size())],
        },
    ]
    return out + tail


# ---- attention: aten/src/ATen/native/transformers/cuda/attention_backward.cu, flash_attn/flash_api.cpp -----------
MEM_EFF_SM80_F32_TILES = ((32, 64, 64), (64, 64, 64), (128, 128, 64), (65536, 128, 64))
"""(kMaxK, kBlockSizeI, kBlockSizeJ) of the fp32 sm80 backward kernels without dropout, in the order
``dispatch_cutlassB_f32_sm80`` tries them (mem_eff_attention/kernels/cutlassB.h, the installed header); the first
whose ``kMaxK`` holds the head dimension runs (alignment and shared-memory checks not modelled)."""
MEM_EFF_SM80_HALF_TILES = ((32, 64, 64), (64, 64, 64), (128, 128, 128), (65536, 128, 64))
"""(kMaxK, kBlockSizeI, kBlockSizeJ) of the bf16/fp16 sm80 backward kernels in ``dispatch_cutlassB_bf16_sm80``
order on compute capability 8.0/9.0 (8.6/8.9 insert a 128x64 tile for head dimensions up to 96; the
``seqaligned`` kernels, taken when both sequence lengths are multiples of the tile, have the same tiles). The
dropout kernels have the same tiles."""


def _mem_eff_tile(head_dim: int, half: bool) -> tuple[int, int, int]:
    tiles = MEM_EFF_SM80_HALF_TILES if half else MEM_EFF_SM80_F32_TILES
    return next(t for t in tiles if t[0] >= head_dim)


def efficient_attention_backward(args: tuple[Any, ...], kwargs: dict[str, Any], outs: list[Any]) -> list[Entry]:
    """``_scaled_dot_product_efficient_attention_backward`` -> ``_efficient_attention_backward`` on sm80+:

    - ``grad_out_.contiguous()`` of the gradient in (B, M, nH, K) layout;
    - fp32 (``kKernelComputesDelta`` is false unless the kernel is half/bf16): ``delta =
      (grad_out.to(float) * out.to(float)).sum(-1).transpose(-2, -1).contiguous()``: the product (freed once
      summed), the sum (freed once copied) and ``delta`` (B, nH, M) fp32; half/bf16: ``delta`` =
      ``at::empty({B, nH, M}, float)``;
    - the workspace ``at::empty({p.workspace_size()}, Byte)`` (kernel_backward.h, installed header):
      ``kNeedsAccumGradQ`` is always true on sm70+ (``kEnableSplitKeys``), so ``B x nH x align4(ceil(M / kBlockSizeI)
      x ceil(K / kBlockSizeJ) x (4 + kBlockSizeI x kBlockSizeJ))`` floats of grad-Q staging; the grad-K/V staging of
      half kernels with ``kMaxK > kBlockSizeI`` (num_splits_key heuristic) is not modelled.
    """
    grad_out, q, v = args[0], args[1], args[3]
    b, nh, m, kd = (int(s) for s in q.shape)
    kv = int(v.shape[-1])
    half = q.dtype in (torch.float16, torch.bfloat16)
    res: list[Entry] = []
    g_t = grad_out.transpose(1, 2)
    if grad_out.numel() and not g_t.is_contiguous():  # before grad_q/k/v are allocated
        res.append({"l": "contiguous_grad_out", "b": grad_out.nbytes, "pre": 1})
    if half:
        res.append({"l": "delta", "b": b * nh * m * 4})
    else:
        prod = {"l": "grad_out_times_out", "b": b * m * nh * kv * 4}
        res.append(prod)
        i_prod = len(res) - 1
        res.append({"l": "delta_sum", "b": b * m * nh * 4})
        i_sum = len(res) - 1
        res.append({"l": "delta", "b": b * nh * m * 4})
        res[i_prod]["until"] = i_sum
        res[i_sum]["until"] = i_sum + 1
    _max_k, bi, bj = _mem_eff_tile(max(kd, kv), half)
    per_bh = -(-m // bi) * -(-kd // bj) * (4 + bi * bj)
    res.append({"l": "workspace_grad_q", "b": b * nh * round_up(per_bh, 4) * 4})
    return res


def flash_attention_backward(args: tuple[Any, ...], kwargs: dict[str, Any], outs: list[Any]) -> list[Entry]:
    """``_scaled_dot_product_flash_attention_backward`` -> ``_flash_attention_backward`` -> ``mha_bwd``
    (flash_api.cpp): after dq/dk/dv, ``softmax_d`` = (B, nH, round128(M)) fp32 and, not deterministic,
    ``dq_accum`` = (B, round128(M), nH, round(K)) fp32 (K rounded to 32, or 64 above 128); with fewer key/value
    heads (MQA/GQA) ``dk_expanded``/``dv_expanded`` of (B, N, nH, K) in the input dtype."""
    q, k = args[1], args[2]
    b, nh, m, kd = (int(s) for s in q.shape)
    nh_k, n = int(k.shape[1]), int(k.shape[2])
    kr = round_up(round_up(kd, 8), 32 if round_up(kd, 8) <= 128 else 64)
    mr = round_up(m, 128)
    res = [{"l": "softmax_d", "b": b * nh * mr * 4}, {"l": "dq_accum", "b": b * mr * nh * kr * 4}]
    if nh_k != nh:
        res += [{"l": "dk_expanded", "b": b * n * nh * kd * q.element_size()},
                {"l": "dv_expanded", "b": b * n * nh * int(args[3].shape[-1]) * q.element_size()}]  # fmt: skip
    return res


# ---- reductions: aten/src/ATen/native/cuda/Reduce.cuh, TensorIterator.cpp -----------------------------------------
def reduction_layout(
    shape: tuple[int, ...], in_strides: tuple[int, ...], reduced: set[int], out_strides: tuple[int, ...], elem: int
) -> tuple[int, int, int, bool, bool, bool, int]:
    """TensorIterator's view of a reduction: (num_outputs, inputs_per_output, ndim, on_fastest, fastest_is_element,
    one_reduce_dim, output_vec_size) after ``reorder_dimensions`` (reduced dims first, then by ascending stride,
    ties by size) and ``coalesce_dimensions``; strides in elements, ``out_strides`` 0 on reduced dims. The output
    vector size is ``get_output_vec_size`` (Reduce.cuh) with an aligned base address."""
    nd = len(shape)
    if nd == 0:
        return 1, 1, 0, True, True, True, 4
    ops = [(tuple(out_strides), True), (tuple(in_strides), False)]
    shp = list(shape)

    def should_swap(d0: int, d1: int) -> int:
        for strides, is_out in ops:
            s0, s1 = strides[d0], strides[d1]
            if is_out and (s0 == 0) != (s1 == 0):
                return 1 if s1 == 0 else -1
            if s0 == 0 or s1 == 0:
                continue
            if s0 < s1:
                return -1
            if s0 > s1:
                return 1
            if shp[d0] > shp[d1]:
                return 1
        return 0

    perm = list(range(nd - 1, -1, -1))
    for i in range(1, nd):
        d1 = i
        for d0 in range(i - 1, -1, -1):
            c = should_swap(perm[d0], perm[d1])
            if c > 0:
                perm[d0], perm[d1] = perm[d1], perm[d0]
                d1 = d0
            elif c < 0:
                break
    sizes = [shp[p] for p in perm]
    strides = [[s[p] for p in perm] for s, _ in ops]
    prev = 0
    for dim in range(1, nd):
        s0, s1 = sizes[prev], sizes[dim]
        if s0 == 1 or s1 == 1 or all(s0 * st[prev] == st[dim] for st in strides):
            if sizes[prev] == 1:
                for st in strides:
                    st[prev] = st[dim]
            sizes[prev] *= sizes[dim]
        else:
            prev += 1
            if prev != dim:
                for st in strides:
                    st[prev] = st[dim]
                sizes[prev] = sizes[dim]
    ndim = prev + 1
    sizes = sizes[:ndim]
    out_st, in_st = strides[0][:ndim], strides[1][:ndim]
    n_red = 0
    for s in out_st:
        if s != 0:
            break
        n_red += 1
    numel = 1
    for s in shape:
        numel *= int(s)
    n_out = 1
    for s, st in zip(sizes, out_st, strict=True):
        if st != 0:
            n_out *= s
    on_fastest = n_red == ndim or in_st[0] < in_st[n_red]
    fastest = in_st[0] if on_fastest else in_st[n_red]
    vec = 4
    if n_red < ndim:
        for value in [sizes[n_red], *(st for j, st in enumerate(in_st) if j != n_red)]:
            while value % vec:
                vec //= 2
    return n_out, numel // max(n_out, 1), ndim, bool(on_fastest), fastest == 1, n_red == 1, vec


def _reduced_dims(x: torch.Tensor, dims: Any) -> set[int]:
    if dims is None or (isinstance(dims, list | tuple) and len(dims) == 0):
        return set(range(x.dim()))
    if isinstance(dims, int):
        dims = [dims]
    return {int(d) % max(x.dim(), 1) for d in dims}


def _reduction(x: Any, dims: Any, out: Any, arg_bytes: int, in_vec: int) -> list[Entry]:
    if not isinstance(x, torch.Tensor) or not isinstance(out, torch.Tensor) or x.numel() == 0 or out.numel() == 0:
        return []
    red = _reduced_dims(x, dims)
    keep = [d for d in range(x.dim()) if d not in red]
    if out.dim() == x.dim():
        o_full = [0 if d in red else int(out.stride(d)) for d in range(x.dim())]
    elif out.dim() == len(keep):
        it = iter(out.stride())
        o_full = [0 if d in red else int(next(it)) for d in range(x.dim())]
    else:
        return []
    n_out, n_in, ndim, fastest, fast_elem, one, vec = reduction_layout(
        tuple(int(s) for s in x.shape), tuple(int(s) for s in x.stride()), red, tuple(o_full), x.element_size()
    )
    spec = [arg_bytes, n_out, n_in, ndim, int(fastest), int(fast_elem), int(one), vec, in_vec, REDUCE_MAX_THREADS]
    return [{"l": "reduce_partials", "reduce": spec}]


def _acc_bytes(x: torch.Tensor) -> int:
    return 8 if x.dtype in (torch.float64, torch.int64, torch.complex64) else 4


def _in_vec(x: torch.Tensor, sixteen_bit: int = 8) -> int:
    return sixteen_bit if x.element_size() == 2 and x.is_floating_point() else 4


def sum_like(args: tuple[Any, ...], kwargs: dict[str, Any], outs: list[Any]) -> list[Entry]:
    """``sum`` / ``mean`` / ``prod`` / ``nansum`` (``sum_kernel_cuda``, ``mean_kernel_cuda``...):
    ``gpu_reduce_kernel`` with an fp32 accumulator (fp64 for double), ``input_vec_size`` 8 for 16-bit floats
    (ReduceSumProdKernel.cu, ReduceMomentKernel.cu; the template arguments are in the binary's symbols)."""
    x = args[0]
    return _reduction(x, _arg(args, kwargs, 1, "dim"), outs[0] if outs else None, _acc_bytes(x), _in_vec(x))


def full_sum_like(args: tuple[Any, ...], kwargs: dict[str, Any], outs: list[Any]) -> list[Entry]:
    """``sum.default`` / ``mean.default`` (every dimension; no ``dim`` argument): as ``sum_like``."""
    x = args[0]
    return _reduction(x, None, outs[0] if outs else None, _acc_bytes(x), _in_vec(x))


def norm_like(args: tuple[Any, ...], kwargs: dict[str, Any], outs: list[Any]) -> list[Entry]:
    """``linalg_vector_norm`` / ``norm``: ``gpu_reduce_kernel`` with ``NormOps``/``NormTwoOps`` (fp32 accumulator,
    ``input_vec_size`` 4)."""
    x = args[0]
    return _reduction(x, _arg(args, kwargs, 2, "dim"), outs[0] if outs else None, _acc_bytes(x), 4)


def minmax_values(args: tuple[Any, ...], kwargs: dict[str, Any], outs: list[Any]) -> list[Entry]:
    """``amax`` / ``amin``: ``func_wrapper`` over the element type (accumulator = the element)."""
    x = args[0]
    return _reduction(x, _arg(args, kwargs, 1, "dim"), outs[0] if outs else None, max(x.element_size(), 1), 4)


def minmax_with_index(args: tuple[Any, ...], kwargs: dict[str, Any], outs: list[Any]) -> list[Entry]:
    """``max.dim`` / ``min.dim`` / ``argmax`` / ``argmin``: ``MaxOps``/``ArgMaxOps``: a (value, int64 index) pair
    accumulator, 16 bytes."""
    x = args[0]
    dim = _arg(args, kwargs, 1, "dim")
    if dim is None:
        return []  # argmax of the flattened tensor: reshaped first (not modelled)
    return _reduction(x, dim, outs[0] if outs else None, 16, 4)


def welford(args: tuple[Any, ...], kwargs: dict[str, Any], outs: list[Any]) -> list[Entry]:
    """``var`` / ``std`` / ``var_mean`` / ``std_mean`` (``std_var_kernel_cuda``): ``WelfordOps`` with a
    ``WelfordData<float, int>`` accumulator (16 bytes), ``input_vec_size`` 2."""
    x = args[0]
    return _reduction(x, _arg(args, kwargs, 1, "dim"), outs[0] if outs else None, 16, 2)


def any_all(args: tuple[Any, ...], kwargs: dict[str, Any], outs: list[Any]) -> list[Entry]:
    """``any.dim`` / ``all.dim``: ``func_wrapper<bool>`` (1-byte accumulator)."""
    return _reduction(args[0], _arg(args, kwargs, 1, "dim"), outs[0] if outs else None, 1, 4)


RULES: dict[Any, Rule] = {
    aten._softmax.default: softmax_forward,
    aten._log_softmax.default: softmax_forward,
    aten._softmax_backward_data.default: softmax_backward,
    aten._log_softmax_backward_data.default: log_softmax_backward,
    aten.nll_loss_forward.default: nll_loss,
    aten.nll_loss2d_forward.default: nll_loss,
    aten.nll_loss_backward.default: nll_loss_backward,
    aten.nll_loss2d_backward.default: nll_loss_backward,
    aten.native_layer_norm.default: layer_norm,
    aten.native_layer_norm_backward.default: layer_norm_backward,
    aten.convolution_backward.default: convolution_backward,
    aten.embedding_dense_backward.default: embedding_backward,
    aten._scaled_dot_product_efficient_attention_backward.default: efficient_attention_backward,
    aten._scaled_dot_product_flash_attention_backward.default: flash_attention_backward,
    aten.sum.dim_IntList: sum_like,
    aten.sum.default: full_sum_like,
    aten.mean.dim: sum_like,
    aten.mean.default: full_sum_like,
    aten.nansum.default: sum_like,
    aten.prod.dim_int: sum_like,
    aten.linalg_vector_norm.default: norm_like,
    aten.amax.default: minmax_values,
    aten.amin.default: minmax_values,
    aten.max.dim: minmax_with_index,
    aten.min.dim: minmax_with_index,
    aten.argmax.default: minmax_with_index,
    aten.argmin.default: minmax_with_index,
    aten.var.correction: welford,
    aten.std.correction: welford,
    aten.var_mean.correction: welford,
    aten.std_mean.correction: welford,
    aten.any.dim: any_all,
    aten.all.dim: any_all,
    aten.any.dims: any_all,
    aten.all.dims: any_all,
}
"""The op overloads with a rule; every other op allocates nothing inside its CUDA kernel that the trace lacks (or
is not modelled: docs/estimate.md lists what was checked and left out)."""


def temporaries(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], outs: list[Any]) -> str:
    """The ``temporaries`` column value of one aten op (``""`` when it allocates nothing inside its kernel)."""
    rule = RULES.get(func)
    if rule is None:
        return ""
    return encode(rule(args, kwargs, outs))
