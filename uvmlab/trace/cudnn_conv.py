"""cuDNN convolution calls of a trace: their geometry, and the workspace each family of cuDNN engines needs.

PyTorch's cuDNN path (aten/src/ATen/native/cudnn/Conv_v8.cpp at 06ca69ca, used with cuDNN 8 and 9) runs, per
convolution call, the first engine of cuDNN's heuristic list (``get_configs_from_heuristics``,
``CUDNN_HEUR_MODE_INSTANT``; mode B with ``TORCH_CUDNN_USE_HEURISTIC_MODE_B``) whose workspace the caching
allocator can give (``try_configs`` catches ``OutOfMemoryError`` and tries the next); the workspace is
``plan.getWorkspaceSize()`` bytes, allocated by ``run_conv_plan`` through ``CUDACachingAllocator::get()->allocate``
and freed when the call returns; the plan is kept in ``benchmark_cache`` (keyed by shapes, strides, dtype and
pointer alignment), so every later call of the same convolution needs the same workspace. There is no size limit
on that path (pytorch/pytorch issue #49207: "the workspace size for algorithms returned by cuDNN heuristics could
be large sometimes"). Which engine cuDNN's heuristics rank first is not knowable without cuDNN, so the size is a
MODEL, one of ``WORKSPACE_MODELS``, each the buffer layout of a documented cuDNN algorithm family:

- ``envelope`` (default): the largest operand of the call, capped (``CUDNN_WORKSPACE_CAP_BYTES``,
  overridable per run): an upper envelope of the real per-call sizes in allocator snapshots of 1x1
  convolutions (docs/estimate.md "Real cuDNN workspaces per call"); one workspace for the two backward calls.
- ``layout``: NCHW <-> NHWC copies of the call's three tensors for a tensor-core (TF32) engine: input + filter +
  output (forward), grad-output + filter + grad-input (backward data), input + grad-output + grad-filter
  (backward filter). cuDNN documents that it "may use padding, folding, and NCHW-to-NHWC transformations to call
  the Tensor Core operations" (cuDNN Legacy API guide, "Data and Filter Formats",
  https://docs.nvidia.com/deeplearning/cudnn/developer/legacy-api.html); TensorFlow raised its cuDNN workspace
  limit because "the TF32 cudnn kernels might need larger workspace to allow the rounding of fp32->tf32 on Ampere"
  (tensorflow/tensorflow PR #56055).
- ``fft`` / ``fft-pow2``: cuDNN's FFT algorithm ("a significant memory workspace is needed to store
  intermediate results", cuDNN API reference, ``CUDNN_CONVOLUTION_FWD_ALGO_FFT``): the frequency-domain input,
  filter and output, ``Hf x (Wf/2 + 1)`` complex64 values per plane (a real-to-complex transform), with
  ``Hf = H + kh - 1`` (the linear-convolution size, ``fft``) or that rounded up to a power of two (``fft-pow2``);
  the two bound the transform size cuDNN picks (not documented). Only for dense stride-1 convolutions with a
  kernel larger than 1x1 and ``H + kh - 1 <= 256`` (the FFT algorithm's documented limits); other calls take
  ``envelope``. Evidence that the heuristics pick it for VGG16 on an A100: pytorch/pytorch issue #49207 (an
  nsys profile of a VGG16 forward: 8 ``ampere_gcgemm_64x64_nt`` complex-GEMM launches, cuDNN's FFT kernels, for
  13 convolutions; fp16, cuDNN 8.0).
- ``winograd``: cuDNN's non-fused Winograd algorithm (``CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED``) for dense
  3x3 stride-1 convolutions: the input and the output transformed into 6x6 tiles of a F(4x4, 3x3) transform, one
  tile per 4x4 output block, and the filter into 6x6 tiles: ``(N x C + N x K) x ceil(Ho/4) x ceil(Wo/4) x 36 + K x C
  x 36`` elements. This reproduces to the byte every WINOGRAD_NONFUSED workspace of the real cuDNN 7.6.3
  measurements in ../shared/real-data/cudnn (DLPerf, V100 and T4, VGG16/19 and ResNet-50, batch 8-32:
  tests/test_cudnn_conv.py); other calls take ``envelope``.
- ``gemm``: cuDNN's explicit-GEMM algorithm (``CUDNN_CONVOLUTION_FWD_ALGO_GEMM``, "needs a significant memory
  workspace to store the matrix that holds the input tensor data"): the im2col matrix,
  ``C x kh x kw x N x Ho x Wo`` elements, for dense convolutions; others take ``envelope``.

With every model but ``envelope``, a backward call is two cuDNN calls in a row, backward-data then
backward-filter (``cudnn_convolution_backward`` in ConvShared.cpp), each with its own workspace.

The geometry comes from the trace alone: the bytes of input, weight and output and PyTorch's FLOP count of the call
(``torch.utils.flop_counter``: ``2 x N x K x Ho x Wo x C/groups x kh x kw`` per forward; backward counts
backward-data and backward-filter, each that much) and the batch size. APPROXIMATION: square images and kernels;
stride 1, 2 or 4, the first that makes ``kh x kw`` a perfect square; a grouped or depthwise convolution is not
resolved (``ConvGeometry.known`` False) and takes ``envelope``; the element size is the run's dtype (under autocast
the bytes do not match it and the call stays unresolved); a transposed convolution (also ``aten::convolution``)
is sized as if it were direct. This module never imports torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from uvmlab.units import MiB

if TYPE_CHECKING:  # light at import time: the CLI takes WORKSPACE_MODELS from here
    import pandas as pd

    from uvmlab.trace.schema import Trace

WORKSPACE_MODELS = ("envelope", "layout", "fft", "fft-pow2", "winograd", "gemm")
"""Per-call cuDNN workspace models (module docstring); ``envelope`` is the default."""
FFT_MAX_SIDE = 256
"""cuDNN's FFT algorithm: feature map height/width plus twice the padding at most 256 (cuDNN API reference,
``cudnnConvolutionForward``, ``CUDNN_CONVOLUTION_FWD_ALGO_FFT`` conditions)."""
MAX_KERNEL = 11
"""Largest kernel side resolved (AlexNet's 11x11 stem); a larger one means the inference failed."""
CUDNN_WORKSPACE_CAP_BYTES = 256 * MiB
"""Cap on the approximated per-call cuDNN workspace: our choice, checked as an envelope against real snapshots
(every v8 workspace in HugePandaCoder/octree-nca-groupeq 0cc72993 and 3e8aa21a is at most 128 MiB, 185 calls with
outputs up to 7.35 GB; tests/test_cudnn_workspace.py, docs/estimate.md). No VGG/ResNet per-layer size was found."""
ELEMENT_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2}
"""Bytes per element of the trace's dtype (WorkloadConfig.dtype)."""


@dataclass(frozen=True)
class ConvGeometry:
    """One cuDNN convolution call of a trace: operand bytes, and the shape inferred from them (module docstring)."""

    kernel_id: int
    backward: bool
    x_bytes: int
    y_bytes: int
    w_bytes: int
    largest_bytes: int
    grad_input: bool = True
    """A backward call that computes the input's gradient (backward data; False: backward filter only)."""
    known: bool = False
    """The shape below was resolved (a dense convolution with square kernels)."""
    n: int = 0
    c: int = 0
    k: int = 0
    kh: int = 0
    side: float = 0.0
    """Input height (= width), in elements."""
    stride: int = 1
    elem: int = 4
    depthwise: bool = False
    """A depthwise forward call (``is_depthwise``): PyTorch runs it without cuDNN (no workspace). Backward calls
    are not classified here (PyTorch's FLOP count of a grouped ``convolution_backward`` counts the filter gradient
    as if ``groups`` were 1); ``rule_cudnn_workspace`` matches them to their forward by operand bytes."""


DEPTHWISE_KERNELS = (3, 5, 7, 9, 11)
"""Kernel sides ``is_depthwise`` recognises: odd, as depthwise layers use (MobileNet/MnasNet/EfficientNet 3 and 5,
ConvNeXt 7); even sides are left out, as a 1x1 convolution with 4, 16, 36 or 64 input channels has the same
bytes and FLOPs as a 2x2/4x4/6x6/8x8 depthwise one."""


def is_depthwise(x: int, y: int, w: int, flops_fwd: float, n: int, elem: int) -> bool:
    """A depthwise convolution (``groups`` = input channels = output channels) from its bytes and forward FLOPs.

    PyTorch runs fp32 and bf16 depthwise convolutions of contiguous (NCHW) tensors with its own kernels
    (aten/src/ATen/native/Convolution.cpp ``ConvParams::use_cudnn_depthwise``, "Use cudnn for FP16 depthwise
    convolutions": cuDNN only for fp16 inputs or channels-last; otherwise ``ConvBackend::CudaDepthwise2d``,
    aten/src/ATen/native/cuda/DepthwiseConv2d.cu), which take no cuDNN workspace. APPROXIMATION (groups are not
    in the trace): ``C/groups = 1`` makes the forward FLOPs per output element ``2 x kh x kw`` with an odd square
    kernel (``DEPTHWISE_KERNELS``), the filter ``K x kh x kw`` elements, and the input ``K`` channels of a
    square plane, with at least 2 channels (``groups > 1``); a dense convolution matches only with
    ``C x kh x kw`` in {9, 25, 49, 81, 121} and as many input as output channels (e.g. 1x1 with 9 channels).
    APPROXIMATION (memory formats are not in the trace): a channels-last input goes to cuDNN on CUDA in any dtype
    (e.g. torchvision ConvNeXt's 7x7 depthwise layers), yet is taken here as a kernel without workspace
    (docs/estimate.md: no effect on xMem's ConvNeXt rows).
    """
    if min(x, y, w) <= 0 or flops_fwd <= 0 or n <= 0:
        return False
    y_el, w_el, x_el = y / elem, w / elem, x / elem
    q = flops_fwd / (2.0 * y_el)  # C/groups x kh x kw
    kh = round(math.sqrt(q))
    if kh not in DEPTHWISE_KERNELS or abs(kh * kh - q) > 0.01 * q:
        return False
    k = w_el / (kh * kh)
    if abs(k - round(k)) > 1e-6 * k or k < 2:  # PyTorch's is_depthwise: groups > 1
        return False
    k = round(k)
    in_plane, out_plane = x_el / (n * k), y_el / (n * k)
    if in_plane < out_plane or min(in_plane, out_plane) < 1:
        return False
    return all(abs(v - round(math.sqrt(v)) ** 2) < 1e-6 for v in (in_plane, out_plane))  # square planes


def _shape(x: int, y: int, w: int, flops_fwd: float, n: int, elem: int) -> tuple[bool, int, int, int, float, int]:
    """(known, C, K, kh, input side, stride) of a convolution from its bytes and forward FLOPs."""
    if min(x, y, w) <= 0 or flops_fwd <= 0 or n <= 0:
        return False, 0, 0, 0, 0.0, 1
    y_el, w_el, x_el = y / elem, w / elem, x / elem
    q = flops_fwd / (2.0 * y_el)  # C/groups x kh x kw
    k = w_el / q
    out_plane = y_el / (n * k)
    if k < 1 or out_plane <= 0:
        return False, 0, 0, 0, 0.0, 1
    side_out = math.sqrt(out_plane)
    if abs(side_out - round(side_out)) > 0.01 or abs(k - round(k)) > 0.01 * k:
        return False, 0, 0, 0, 0.0, 1  # not a square output, or a FLOP count that does not fit a dense conv
    for stride in (1, 2, 4):
        c = x_el / (n * out_plane * stride * stride)
        kk = q / c
        kh = round(math.sqrt(kk)) if kk > 0 else 0
        if 1 <= kh <= MAX_KERNEL and abs(kh * kh - kk) <= 0.02 * kk and abs(c - round(c)) <= 0.02 * c:
            return True, round(c), round(k), kh, round(side_out) * stride, stride
    return False, 0, 0, 0, 0.0, 1


def conv_geometry(trace: Trace, kernel: pd.Series, accesses: pd.DataFrame, batch: int, elem: int) -> ConvGeometry:
    """The geometry of one convolution kernel of ``trace`` from its ``accesses`` (module docstring).

    Forward (``convolution``): reads input, weight (category ``parameter``), bias; writes the output. Backward
    (``convolution_backward``): reads grad-output, input, weight in that order; writes grad-input (when needed),
    grad-weight, grad-bias.
    """
    a = accesses
    if "category" not in a.columns:  # callers with many kernels merge the categories once
        a = a.merge(trace.allocations[["alloc_id", "category"]], on="alloc_id", how="left")
    largest = int(a["size_bytes"].max()) if len(a) else 0
    reads, writes = a[~a["is_write"]], a[a["is_write"]]
    params = reads[reads["category"] == "parameter"]["size_bytes"]
    others = reads[reads["category"] != "parameter"]["size_bytes"].astype("int64").tolist()
    backward = "backward" in str(kernel["name"])
    kid = int(kernel["kernel_id"])
    if params.empty or not others or (backward and len(others) < 2):
        return ConvGeometry(kid, backward, 0, 0, 0, largest, known=False, elem=elem)
    w = int(params.max())
    if backward:
        y, x = others[0], others[1]
        grad_input = bool((writes["size_bytes"] == x).any())
    else:
        x, y = others[0], int(writes["size_bytes"].max()) if len(writes) else 0
        grad_input = False
    flops = float(kernel.get("flops", 0.0) or 0.0)
    flops_fwd = flops / 2.0 if backward and grad_input else flops
    known, c, k, kh, side, stride = _shape(x, y, w, flops_fwd, batch, elem)
    dw = not backward and is_depthwise(x, y, w, flops_fwd, batch, elem)  # backward: matched to its forward
    return ConvGeometry(kid, backward, x, y, w, largest, grad_input, known, batch, c, k, kh, side, stride, elem, dw)


def _fft_bytes(g: ConvGeometry, pow2: bool) -> int | None:
    """Frequency-domain input + filter + output of cuDNN's FFT algorithm, or None where it does not apply."""
    if not g.known or g.stride != 1 or g.kh <= 1:
        return None
    hf = round(g.side) + g.kh - 1
    if hf > FFT_MAX_SIDE:
        return None
    if pow2:
        hf = 1 << (hf - 1).bit_length()
    plane = hf * (hf // 2 + 1) * 8  # complex64 values of a real-to-complex transform
    return (g.n * g.c + g.k * g.c + g.n * g.k) * plane


WINOGRAD_TILE = 6
"""Tile side of the F(4x4, 3x3) Winograd transform (4x4 outputs + 3 - 1)."""
WINOGRAD_OUT = 4


def _winograd_bytes(g: ConvGeometry) -> int | None:
    """Transformed input, output and filter of cuDNN's non-fused Winograd algorithm (3x3, stride 1), or None."""
    if not g.known or g.stride != 1 or g.kh != 3:
        return None
    tiles = math.ceil(round(g.side) / WINOGRAD_OUT) ** 2  # 'same' padding: output side = input side
    per_tile = WINOGRAD_TILE * WINOGRAD_TILE * g.elem
    return (g.n * g.c + g.n * g.k) * tiles * per_tile + g.k * g.c * per_tile


def candidate_workspaces(g: ConvGeometry) -> dict[str, int]:
    """Workspace bytes of each engine family that applies to the call (``cudnn.benchmark`` times all of them).

    With ``torch.backends.cudnn.benchmark=True`` PyTorch times every engine config of cuDNN's heuristic and fallback
    lists (Conv_v8.cpp ``get_plans_from_find``), so the trial workspace is the LARGEST candidate's (``
    generate_and_filter_plans``). The families: explicit GEMM (im2col), FFT (both transform sizes), non-fused
    Winograd, the TF32 layout copies; implicit-GEMM engines need none. An unresolved call gets its envelope."""
    if not g.known:
        return {"envelope": g.largest_bytes}
    out = {"gemm": int(g.c * g.kh * g.kh * g.n * (g.side / g.stride) ** 2 * g.elem),
           "layout": g.x_bytes + g.w_bytes + g.y_bytes}  # fmt: skip
    families = (("fft", _fft_bytes(g, False)), ("fft-pow2", _fft_bytes(g, True)), ("winograd", _winograd_bytes(g)))
    for name, size in families:
        if size is not None:
            out[name] = size
    return out


def workspace_sizes(g: ConvGeometry, model: str, cap: int = CUDNN_WORKSPACE_CAP_BYTES) -> tuple[int, ...]:
    """Workspace bytes of each cuDNN call behind one trace kernel under ``model`` (module docstring).

    Forward: one call. Backward: ``envelope`` gives one (the two calls share it); the other models give
    (backward-data, backward-filter), or only backward-filter when the input needs no gradient.
    """
    envelope = min(g.largest_bytes, cap)
    if model == "envelope":
        return (envelope,)
    if model not in WORKSPACE_MODELS:
        raise ValueError(f"cuDNN workspace model must be one of {', '.join(WORKSPACE_MODELS)}, not {model!r}")
    if model == "layout" and g.w_bytes > 0:
        fwd_or_dgrad = g.x_bytes + g.w_bytes + g.y_bytes
        sizes = [fwd_or_dgrad] if not g.backward else ([fwd_or_dgrad] if g.grad_input else []) + [fwd_or_dgrad]
        return tuple(sizes)
    one: int | None = None
    if model in ("fft", "fft-pow2"):
        one = _fft_bytes(g, model == "fft-pow2")
    elif model == "winograd":
        one = _winograd_bytes(g)
    elif model == "gemm" and g.known:
        out_plane = (g.side / g.stride) ** 2
        one = int(g.c * g.kh * g.kh * g.n * out_plane * g.elem)
    if one is None:
        one = envelope
    if not g.backward:
        return (one,)
    return (one, one) if g.grad_input else (one,)
