"""Real per-layer cuDNN workspaces (DLPerf, ../shared/real-data/cudnn/rai-project_dlperf) against uvmlab's families.

rai-project/dlperf (commit 88ce3475) ran every convolution layer of VGG16/19 and ResNet-50 (ONNX models, forward
inference only) through cuDNN 7.6.3 on a V100-SXM2-16GB and a T4 at batch 8, 16 and 32, and recorded per layer the
algorithm that measured fastest (``assets/benchinfo``: what ``cudnn.benchmark`` picks) and the one cuDNN's
heuristic advises (``assets/cudnn_advised_benchinfo``: what ``benchmark=False`` picks), each with its workspace
bytes and the full shape. :func:`read_layers` reads one such JSON file; :func:`compare` puts each layer beside
uvmlab's engine families (``uvmlab.trace.cudnn_conv.candidate_workspaces``) built from the same shape.

What follows from this data and what does not (docs/estimate.md "cudnn.benchmark"): cuDNN 7, forward only, two
older GPUs. It checks the families' buffer formulas (non-fused Winograd to the byte), the order of magnitude of
the workspaces the fastest engines take and how they grow with the batch. It does not give cuDNN 8/9's choices on
an A100, nor backward-data / backward-filter workspaces.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from uvmlab.files.inputs import MAX_DATA_FILE_BYTES, read_json_file
from uvmlab.numbers import UINT64_MAX

FWD_ALGOS = ("IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT", "FFT", "FFT_TILING", "WINOGRAD",
             "WINOGRAD_NONFUSED")  # fmt: skip
"""``cudnnConvolutionFwdAlgo_t`` values 0-7 (cudnn.h, cuDNN 7)."""
DLPERF_DIR = "cudnn/rai-project_dlperf/assets"


@dataclass(frozen=True)
class Layer:
    """One forward convolution layer of a DLPerf file."""

    n: int
    c: int
    side: int
    k: int
    kh: int
    pad: int
    stride: int
    group: int
    algo: str
    workspace_bytes: int


def read_layers(path: str | Path, advised: bool = False) -> list[Layer]:
    """The forward convolution layers of one DLPerf JSON file (``advised``: the heuristic's choice)."""
    entries = read_json_file(path, MAX_DATA_FILE_BYTES, "a DLPerf layer file (JSON)", UINT64_MAX)
    out = []
    for e in entries:
        b: dict[str, Any] = e.get("benchmark", {})
        if "CONV_FWD" not in str(b.get("Name", "")):
            continue
        algo = int(b["advised_convolution_algorithm" if advised else "convolution_algorithm"])
        nbytes = int(b["advised_memory" if advised else "workspace_bytes"])
        out.append(Layer(int(b["input[0]"]), int(b["input[1]"]), int(b["input[2]"]), int(b["filter_count"]),
                         int(b["filter_height"]), int(b["pad_height"]), int(b["stride_height"]), int(b["group"]),
                         FWD_ALGOS[algo], nbytes))  # fmt: skip
    return out


def geometry(layer: Layer) -> Any:
    """The ``ConvGeometry`` uvmlab would infer for the layer from a trace (fp32, square, forward)."""
    from uvmlab.trace.cudnn_conv import ConvGeometry

    out_side = (layer.side + 2 * layer.pad - layer.kh) // layer.stride + 1
    x = layer.n * layer.c * layer.side**2 * 4
    y = layer.n * layer.k * out_side**2 * 4
    w = layer.k * layer.c // layer.group * layer.kh**2 * 4
    return ConvGeometry(0, False, x, y, w, max(x, y, w), False, layer.group == 1, layer.n, layer.c, layer.k,
                        layer.kh, float(layer.side), layer.stride, 4)  # fmt: skip


def compare(layers: list[Layer]) -> list[dict[str, Any]]:
    """Per layer: DLPerf's algorithm and workspace, uvmlab's family sizes and its largest candidate (the trial)."""
    from uvmlab.trace.cudnn_conv import candidate_workspaces

    rows = []
    for layer in layers:
        cands = candidate_workspaces(geometry(layer))
        rows.append({"layer": layer, "candidates": cands, "largest_candidate": max(cands.values())})
    return rows
