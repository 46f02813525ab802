"""Depthwise convolutions take PyTorch's own kernels, not cuDNN: no cuDNN workspace (uvmlab.trace.cudnn_conv).

Source: aten/src/ATen/native/Convolution.cpp ``ConvParams::use_cudnn_depthwise`` ("Use cudnn for FP16 depthwise
convolutions"): fp32 NCHW depthwise calls go to ``ConvBackend::CudaDepthwise2d`` (DepthwiseConv2d.cu).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.test_cudnn_conv import _conv_trace
from tests.test_orchestrate_rules import TraceMaker
from uvmlab.gpus import get_gpu
from uvmlab.trace.cudnn_conv import is_depthwise
from uvmlab.trace.orchestrate import to_cuda

A100 = get_gpu("A100-40GB")


def _bytes_flops(n: int, c: int, k: int, side: int, kh: int, groups: int, stride: int) -> tuple[int, int, int, float]:
    """(input, output, filter bytes, forward FLOPs) of an fp32 convolution with padding kh // 2."""
    out = (side + 2 * (kh // 2) - kh) // stride + 1
    flops = 2.0 * n * k * out * out * (c // groups) * kh * kh  # torch.utils.flop_counter's conv_flop
    return n * c * side * side * 4, n * k * out * out * 4, k * (c // groups) * kh * kh * 4, flops


@pytest.mark.parametrize(
    ("c", "side", "kh", "stride"),
    [(96, 21, 7, 1), (768, 2, 7, 1), (48, 43, 3, 2), (120, 11, 5, 1), (32, 43, 3, 1), (480, 6, 5, 2)],
)
def test_depthwise_calls_are_recognised(c: int, side: int, kh: int, stride: int) -> None:
    """ConvNeXt's 7x7 and MnasNet's 3x3/5x5 depthwise layers at xMem's 86 px, stride 1 and 2."""
    x, y, w, flops = _bytes_flops(200, c, c, side, kh, c, stride)
    assert is_depthwise(x, y, w, flops, 200, 4)


@pytest.mark.parametrize(
    ("c", "k", "side", "kh", "groups", "stride"),
    [
        (64, 64, 56, 3, 1, 1),  # dense 3x3
        (16, 16, 43, 1, 1, 1),  # dense 1x1 (same bytes as a 4x4 depthwise: even kernels are not recognised)
        (64, 64, 21, 1, 1, 1),  # dense 1x1 (same bytes as an 8x8 depthwise)
        (3, 32, 86, 3, 1, 2),  # a stem
        (1, 32, 28, 3, 1, 1),  # a 1-channel stem (9 FLOPs per output element, but 32 output channels)
        (128, 128, 28, 3, 32, 1),  # ResNeXt's grouped 3x3 (4 channels per group)
        (96, 96, 21, 7, 48, 1),  # grouped, 2 channels per group
    ],
)
def test_dense_and_grouped_calls_are_not_depthwise(
    c: int, k: int, side: int, kh: int, groups: int, stride: int
) -> None:
    x, y, w, flops = _bytes_flops(8, c, k, side, kh, groups, stride)
    assert not is_depthwise(x, y, w, flops, 8, 4)


def _depthwise_trace(n: int, c: int, side: int, kh: int) -> Any:
    """One fp32 depthwise convolution, forward and backward; the backward FLOPs as PyTorch's counter gives them
    (the filter gradient counted as if groups were 1)."""
    m = TraceMaker()
    w = m.alloc(c * kh * kh * 4, "parameter", "setup", -1)
    x = m.alloc(n * c * side * side * 4, "input", "data", 0)
    y = m.alloc(n * c * side * side * 4, "activation", "forward", 0)
    fwd = 2.0 * n * c * side * side * kh * kh
    m.kernel("aten::convolution", "forward", 0, [x, w, y])
    m.kernels[-1]["flops"] = fwd
    m.accesses[-1]["is_write"] = True
    dy = m.alloc(n * c * side * side * 4, "gradient", "backward", 0)
    dx = m.alloc(n * c * side * side * 4, "gradient", "backward", 0)
    dw = m.alloc(c * kh * kh * 4, "gradient", "backward", 0)
    m.kernel("aten::convolution_backward", "backward", 0, [dy, x, w, dx, dw])
    m.kernels[-1]["flops"] = fwd + c * fwd
    for acc in m.accesses[-2:]:
        acc["is_write"] = True
    for a in (dy, dx, y, x):
        m.free(a)
    return m.trace(config={"zero_grad": "iteration_start", "batch_size": n, "dtype": "fp32"})


def _workspaces(t: Any) -> int:
    a = t.allocations
    return int((a["op"] == "cudnn_workspace").sum())


def test_depthwise_forward_and_backward_get_no_cudnn_workspace() -> None:
    out = to_cuda(_depthwise_trace(8, 96, 21, 7), A100)
    assert _workspaces(out) == 0
    assert out.header["orchestration"]["cudnn_depthwise_calls_without_workspace"] == 2


def test_dense_convolutions_still_get_their_workspace() -> None:
    out = to_cuda(_conv_trace(4, 64, 64, 56, 3, 1, backward=True), A100)
    assert _workspaces(out) == 2
    assert out.header["orchestration"]["cudnn_depthwise_calls_without_workspace"] == 0
