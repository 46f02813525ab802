"""Which per-call cuDNN workspace model (``uvmlab.trace.cudnn_conv.WORKSPACE_MODELS``) each real data set supports.

The data (../shared/real-data/cudnn, nothing fitted, nothing from CARMA):

- DLPerf (rai-project/dlperf 88ce3475; cuDNN 7.6.3, V100-SXM2-16GB and T4, VGG16/19 and ResNet-50, batch 8/16/32,
  forward only): per layer the algorithm that measured fastest (``benchinfo``, what ``cudnn.benchmark`` picks) and
  the one cuDNN's heuristic advises (``cudnn_advised_benchinfo``, what the default picks), each with its workspace;
- the AlexNet API log (rai-project/lib_log_parser bdaa2ab0; cuDNN 7.5.1, batch 1, MXNet autotuning grouped AlexNet):
  every algorithm tried per convolution (forward, backward data, backward filter) with its workspace, then the
  chosen one repeated.

Two questions per data set and model: (1) family formulas: for every logged call of an algorithm a model
describes (GEMM -> ``gemm``, FFT -> ``fft``/``fft-pow2``, WINOGRAD_NONFUSED -> ``winograd``), the ratio of the
model's size to the real one; (2) what a run would allocate: per (network, batch, GPU), the largest workspace the
chosen algorithms need against the largest the model gives over the same layers (the per-call workspace is a
temporary; its largest instance is what can move a peak).

Usage: python tools/cudnn_model_support.py [REAL_DATA_DIR]   (default ../shared/real-data)
"""

from __future__ import annotations

import argparse
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path

from uvmlab.evaluate.dlperf import DLPERF_DIR, Layer, geometry, read_layers
from uvmlab.measure.gpu.kit.cudnn_log import parse_log
from uvmlab.trace.cudnn_conv import WORKSPACE_MODELS, ConvGeometry, candidate_workspaces, workspace_sizes

LOG = "cudnn/rai-project_lib_log_parser/_fixtures/alexnet_cudnn.log"
FAMILY_OF = {"GEMM": "gemm", "FFT": "fft", "WINOGRAD_NONFUSED": "winograd"}
"""Logged algorithm -> the model that claims its buffer layout (``fft-pow2`` is checked against FFT too)."""


def _dims(text: object) -> list[int]:
    return [int(v) for v in str(text).strip("[]").split(",")] if text is not None and str(text) != "nan" else []


def _log_calls(path: Path) -> list[tuple[str, str, int, ConvGeometry]]:
    """(direction, algorithm family, workspace bytes, geometry) of every convolution call of the AlexNet log."""
    df = parse_log(path)
    out = []
    for r in df[df["kind"].isin(["forward", "backward_data", "backward_filter"])].itertuples():
        x, w = _dims(r.x_dims), _dims(r.w_dims)
        if r.kind == "forward":
            y = _dims(r.y_dims)
        elif r.kind == "backward_data":  # the log's xDesc slot holds dy, its yDesc slot dx
            y, x = x, _dims(r.y_dims)
        else:  # backward filter: x and dy
            y = _dims(r.y_dims) or []
        if len(x) != 4 or len(w) != 4:
            continue
        n, c, side = x[0], x[1], x[2]
        k, kh = w[0], w[2]
        out_side = y[2] if len(y) == 4 else side - kh + 1
        stride = max(1, round((side - kh) / max(out_side - 1, 1))) if out_side > 1 else 1
        xb, yb, wb = n * c * side * side * 4, n * k * out_side**2 * 4, k * w[1] * kh * kh * 4
        g = ConvGeometry(0, r.kind != "forward", xb, yb, wb, max(xb, yb, wb), True, True, n, c, k, kh, float(side),
                         stride, 4)  # fmt: skip
        algo = str(r.algo).split("ALGO_")[-1]
        out.append((str(r.kind), algo, int(r.workspace_bytes or 0), g))
    return out


def _dlperf_files(real: Path) -> Iterator[tuple[bool, Path, list[Layer]]]:
    """(advised, file, layers) of every DLPerf file: the fastest choices, then the heuristic's."""
    for advised in (False, True):
        for f in sorted((real / DLPERF_DIR).glob("*/batchsize_*/*/*.json")):
            if ("advised" in f.parts[-4]) == advised:
                yield advised, f, read_layers(f, advised=advised)


def family_checks(real: Path) -> None:
    """Question (1): the model's size over the real size, per algorithm the model describes."""
    ratios: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for advised, _f, layers in _dlperf_files(real):
        sub = "advised" if advised else "fastest"
        for layer in layers:
            cand = candidate_workspaces(geometry(layer))
            fams = [FAMILY_OF.get(layer.algo)] + (["fft-pow2"] if layer.algo == "FFT" else [])
            fams += ["fft", "fft-pow2"] if layer.algo == "FFT_TILING" else []
            for fam in filter(None, fams):
                if fam in cand and layer.workspace_bytes > 0:
                    ratios[(f"DLPerf {sub}", layer.algo, fam)].append(cand[fam] / layer.workspace_bytes)
    log = real / LOG
    if log.is_file():
        for kind, algo, ws, g in _log_calls(log):
            cand = candidate_workspaces(g)
            fams = [FAMILY_OF.get(algo)] + (["fft-pow2"] if algo == "FFT" else [])
            for fam in filter(None, fams):
                if fam in cand and ws > 0:
                    ratios[(f"AlexNet log {kind}", algo, fam)].append(cand[fam] / ws)
            if algo == "GEMM" and ws > 0:  # the im2col matrix at the call's own output size (the log's padding)
                im2col = g.c * g.kh * g.kh * g.n * (g.y_bytes // (4 * g.n * g.k)) * 4
                ratios[(f"AlexNet log {kind}", algo, "gemm exact")].append(im2col / ws)
    print("(1) model size / real size, per algorithm the model describes")
    print(f"{'data':28} {'algorithm':18} {'model':9} {'calls':>5} {'median':>7} {'min':>7} {'max':>7} {'exact':>6}")
    for (data, algo, fam), r in sorted(ratios.items()):
        exact = sum(abs(v - 1) <= 0.01 for v in r)
        print(f"{data:28} {algo:18} {fam:9} {len(r):5d} {statistics.median(r):7.2f} {min(r):7.2f} {max(r):7.2f} "
              f"{exact:6d}")  # fmt: skip


def largest_checks(real: Path) -> None:
    """Question (2): per (network, batch, GPU), the model's largest per-call workspace over the real largest."""
    groups: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for advised, f, layers in _dlperf_files(real):
        sub = "advised (default)" if advised else "fastest (benchmark)"
        real_max = max(layer.workspace_bytes for layer in layers)
        for m in WORKSPACE_MODELS:
            model_max = max(workspace_sizes(geometry(layer), m)[0] for layer in layers)
            groups[(f"DLPerf {sub}", f.stem, m)].append(model_max / max(real_max, 1))
    log = real / LOG
    if log.is_file():
        calls = _log_calls(log)
        chosen: dict[tuple[str, int, int, int], Counter] = defaultdict(Counter)
        for kind, algo, ws, g in calls:
            chosen[(kind, g.c, g.k, g.kh)][(algo, ws)] += 1
        picked = {key: c.most_common(1)[0][0] for key, c in chosen.items()}
        real_max = max(ws for (_algo, ws) in picked.values())
        for m in WORKSPACE_MODELS:
            model_max = max(max(workspace_sizes(g, m)) for _k, _a, _w, g in calls)
            groups[("AlexNet log (autotuned)", "AlexNet", m)].append(model_max / max(real_max, 1))
    print("\n(2) largest per-call workspace: model / real over (batch, GPU): median [min, max]")
    for (data, net, m), r in sorted(groups.items()):
        print(f"{data:28} {net:13} {m:9} n={len(r):2d} {statistics.median(r):8.2f} [{min(r):.2f}, {max(r):.2f}]")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("real", nargs="?", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "real-data")
    args = ap.parse_args()
    if not (args.real / DLPERF_DIR).is_dir():
        raise SystemExit(f"{args.real / DLPERF_DIR}: not found (the DLPerf files of ../shared/real-data/cudnn)")
    family_checks(args.real)
    largest_checks(args.real)


if __name__ == "__main__":
    main()
