"""Native time of real cuDNN / cuBLAS layers against uvmlab's kernel classes: prints tables (docs/uvm-sim.md).

Real data: ``../shared/real-data/cudnn/rai-project_dlperf`` (rai-project/dlperf @ 88ce347, cuDNN 7.6.3, cuBLAS 10.1,
FP32 without tensor ops): per layer of VGG16, VGG19 and ResNet-50, forward inference at batch 8, 16 and 32 on a
Tesla V100-SXM2-16GB and a Tesla T4, the measured time (``RealTime``; for convolutions the fastest algorithm's).
Each distinct layer (GPU, batch, network, shape) counts once. Tables:

1. Convolutions per GPU and filter class: the achieved share of the FP32 peak (nominal FLOPs = 2 x multiply-adds
   over the measured time; Winograd and FFT do fewer multiplications, so a 3x3 layer may exceed 1).
2. Convolution rules, uvmlab's predicted time (``uvmlab.sim.uvm.kernel_class.native_times``, class ``conv``, the
   GPU's default costs, occupancy 1, the layer's input + filter + output bytes) over the measured one: per layer
   (median, share within 1.5x and 2x) and per network (sum over its layers). Rules: ``compute_efficiency`` (the
   default, not fitted here), and one efficiency fitted on the declared subset (batch 16, both GPUs: the
   FLOP-weighted share of the FP32 peak, capped at 1: a cost efficiency is a share of a peak), validated on batch 8
   and 32.
3. The other layers by kind, all validation (nothing fitted): cuBLAS SGEMMs (the fully connected layers; class
   ``gemm``, 2MNK FLOPs, A, B and C read, C written) and the memory-bound layers (class ``memory``: ReLU and pooling
   read their input and write their output, the tensor add reads two and writes one, batch-norm inference reads and
   writes one; the bias add ``cudnnAddTensor`` with beta 0 is taken as writing its output only).

Usage::

    python benchmarks/cudnn_layer_native_table.py [--data ../shared/real-data/cudnn/rai-project_dlperf]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from uvmlab.gpus import get_gpu
from uvmlab.sim.uvm.kernel_class import KernelWork, native_times
from uvmlab.sim.uvm.timing import CostParams

GPUS = {"Tesla_V100-SXM2-16GB": "V100-16GB", "Tesla_T4": "T4"}
"""The data's GPU folders and uvmlab's GPU names (the V100's datasheet row is the SXM2 one)."""
FIT_BATCH = 16
"""The declared fit subset: every layer at batch 16 (both GPUs); batch 8 and 32 validate."""
ELEM_BYTES = 4


KINDS = {
    "LAYER_CUDNN_CONV_FWD": "conv",
    "LAYER_CUBLAS_GEMM_FWD": "gemm",
    "LAYER_CUDNN_ACTIVATION_FWD": "relu",
    "LAYER_CUDNN_POOLING_FWD": "pool",
    "LAYER_CUDNN_OP_TENSOR_ADD_FWD": "add",
    "LAYER_CUDNN_ADD_TENSOR": "bias",
    "LAYER_CUDNN_BATCHNORM_FWD_INFERENCE": "batchnorm",
}
"""The data's layer names (before the algorithm / dtype suffix) and the kind each is tabulated as (dropout, launch
bound with its random-state work, is left out)."""
KERNEL_NAMES = {"conv": "aten::convolution", "gemm": "aten::addmm"}
"""The aten name each kind is timed as (the other kinds: an elementwise op, class ``memory``)."""


def kind_of(name: str) -> str | None:
    """The kind of a layer by its benchmark name (:data:`KINDS`), None for layers not tabulated."""
    for prefix, kind in KINDS.items():
        if name.startswith(prefix + "_"):
            return kind
    return None


def layer_work(kind: str, b: dict, macs: float) -> tuple[float, float, str]:
    """(FLOPs, bytes, filter class) of one layer (module docstring)."""
    if kind == "conv":
        filt = b["filter_count"] * b["input_channels"] * b["filter_height"] * b["filter_width"]
        size = f"{b['filter_height']}x{b['filter_width']}" if b["filter_height"] in (1, 3) else "other"
        return 2.0 * macs, float((b["input_size"] + b["output_size"] + filt) * ELEM_BYTES), size
    if kind == "gemm":
        m, n, k = b["M"], b["N"], b["K"]
        return 2.0 * m * n * k, float((m * k + k * n + 2 * m * n) * ELEM_BYTES), ""
    if kind in ("relu", "pool", "batchnorm"):
        return 0.0, float((b["input_size"] + b["output_size"]) * ELEM_BYTES), ""
    if kind == "add":
        return 0.0, float(3 * b["input_size"] * ELEM_BYTES), ""
    return 0.0, float(b["c_desc_0"] * b["c_desc_1"] * b["c_desc_2"] * b["c_desc_3"] * ELEM_BYTES), ""


def read_layers(root: Path) -> pd.DataFrame:
    """One row per distinct tabulated layer (GPU, batch, network, shape) of the ``benchinfo`` set."""
    rows = []
    for f in sorted((root / "assets" / "benchinfo").glob("batchsize_*/*/*.json")):
        gpu = GPUS.get(f.parent.name)
        if gpu is None:
            continue
        for entry in json.loads(f.read_text()):
            b = entry["benchmark"]
            kind = kind_of(b["Name"])
            if kind is None:
                continue
            flops, nbytes, size = layer_work(kind, b, entry["flops_information"]["multiply_adds"])
            rows.append(
                {
                    "gpu": gpu,
                    "batch": int(f.parent.parent.name.removeprefix("batchsize_")),
                    "model": f.stem,
                    "kind": kind,
                    "filter": size,
                    "flops": flops,
                    "nbytes": nbytes,
                    "measured_ns": float(b["RealTime"]),
                    "shape": b["Name"].split("/", 1)[1],
                }
            )
    df = pd.DataFrame(rows)
    return df.drop_duplicates(["gpu", "batch", "model", "kind", "shape"]).reset_index(drop=True)


def convolutions(df: pd.DataFrame) -> pd.DataFrame:
    """The convolution layers of :func:`read_layers`."""
    return df[df["kind"] == "conv"].reset_index(drop=True)


def predict(df: pd.DataFrame, efficiency: float | None = None) -> np.ndarray:
    """uvmlab's native time (ns) of every layer by its kind's class; ``efficiency`` replaces ``compute_efficiency``
    (the ``conv`` class's)."""
    df = df.reset_index(drop=True)
    out = np.zeros(len(df))
    for gpu_name, part in df.groupby("gpu"):
        gpu = get_gpu(gpu_name)
        costs = CostParams() if efficiency is None else replace(CostParams(), compute_efficiency=efficiency)
        n = len(part)
        work = KernelWork(
            names=[KERNEL_NAMES.get(k, "aten::relu") for k in part["kind"]],
            flops=part["flops"].to_numpy(),
            nbytes=part["nbytes"].to_numpy(),
            dtypes=["fp32"] * n,
            occupancy=np.ones(n),
            sector=np.zeros(n, dtype=bool),
            index=np.zeros(n, dtype=bool),
            threads=np.zeros(n, dtype=np.int64),
            native_ns=np.full(n, np.nan),
            efficiency=np.full(n, np.nan),
            api=[""] * n,
        )
        t, _ = native_times(work, gpu, costs, "fp32")
        out[part.index.to_numpy()] = t
    return out


def peak_shares(df: pd.DataFrame) -> pd.DataFrame:
    """Table 1: achieved share of the FP32 peak per GPU and filter class (convolutions)."""
    df = convolutions(df)
    peak = df["gpu"].map(lambda g: get_gpu(g).fp32_flops)
    d = df.assign(share=df["flops"] / (df["measured_ns"] * 1e-9) / peak, work_s=df["measured_ns"] * 1e-9 * peak)
    g = d.groupby(["gpu", "filter"])
    return pd.DataFrame(
        {"layers": g.size(), "flop_weighted": g["flops"].sum() / g["work_s"].sum(), "median": g["share"].median()}
    ).round(3)


def fitted_efficiency(df: pd.DataFrame) -> float:
    """The convolutions' FLOP-weighted share of the FP32 peak on the declared fit subset (batch :data:`FIT_BATCH`)."""
    df = convolutions(df)
    fit = df[df["batch"] == FIT_BATCH]
    peak = fit["gpu"].map(lambda g: get_gpu(g).fp32_flops)
    return float(fit["flops"].sum() / (fit["measured_ns"] * 1e-9 * peak).sum())


def rule_errors(df: pd.DataFrame, rules: dict[str, float | None]) -> pd.DataFrame:
    """Table 2: predicted / measured per rule on the validation convolutions (batch other than :data:`FIT_BATCH`)."""
    df = convolutions(df)
    val = df[df["batch"] != FIT_BATCH]
    rows = []
    for label, eff in rules.items():
        ratio = predict(val, eff) / val["measured_ns"].to_numpy()
        v = val.assign(pred=predict(val, eff))
        nets = v.groupby(["gpu", "model", "batch"]).apply(lambda x: x["pred"].sum() / x["measured_ns"].sum())
        rows.append(
            {
                "rule": label,
                "layers": len(val),
                "layer median": round(float(np.median(ratio)), 2),
                "within 1.5x": round(float(np.mean((ratio < 1.5) & (ratio > 1 / 1.5))), 2),
                "within 2x": round(float(np.mean((ratio < 2) & (ratio > 0.5))), 2),
                "networks min": round(float(nets.min()), 2),
                "networks max": round(float(nets.max()), 2),
            }
        )
    return pd.DataFrame(rows)


def class_errors(df: pd.DataFrame) -> pd.DataFrame:
    """Table 3: per GPU and kind other than convolutions, predicted / measured (median, within 1.5x) and the achieved
    share of the peak the class divides by (FP32 FLOP/s for GEMMs, DRAM bytes/s for the rest; median)."""
    rest = df[df["kind"] != "conv"].reset_index(drop=True)
    rest = rest.assign(ratio=predict(rest) / rest["measured_ns"].to_numpy())
    peak = np.array([get_gpu(g).fp32_flops if k == "gemm" else get_gpu(g).hbm_bytes_per_s
                     for g, k in zip(rest["gpu"], rest["kind"], strict=True)])  # fmt: skip
    work = np.where(rest["kind"] == "gemm", rest["flops"], rest["nbytes"])
    rest = rest.assign(share=work / (rest["measured_ns"].to_numpy() * 1e-9) / peak)
    g = rest.groupby(["gpu", "kind"])
    return pd.DataFrame(
        {
            "layers": g.size(),
            "median ratio": g["ratio"].median().round(2),
            "within 1.5x": g["ratio"].apply(lambda r: float(np.mean((r < 1.5) & (r > 1 / 1.5)))).round(2),
            "share of peak": g["share"].median().round(3),
        }
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(Path(__file__).parents[1] / "../shared/real-data/cudnn/rai-project_dlperf"))
    args = ap.parse_args()
    root = Path(args.data)
    if not root.is_dir():
        raise SystemExit(f"no cuDNN per-layer data at {root}")
    df = read_layers(root)
    print(f"{len(df)} distinct layers, {len(convolutions(df))} of them convolutions\n")
    print(peak_shares(df).to_string())
    fit = fitted_efficiency(df)
    print()
    rules = {"compute_efficiency (0.5)": None, f"fitted on batch 16 ({fit:.3f}, capped at 1)": min(fit, 1.0)}
    print(rule_errors(df, rules).to_string(index=False))
    print()
    print(class_errors(df).to_string())


if __name__ == "__main__":
    main()
