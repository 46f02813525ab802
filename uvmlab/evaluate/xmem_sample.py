"""Ground truth from xMem's 13-row sample (../shared/real-data/memory/xmem_rtx3060_sample), with the peers' own
estimates beside each row.

Rows come from Stone-ResearchLife/xMem (MIT) ``plot/data/001-Anova/**/evaluation_result.json``: an RTX 3060
12 GB (one row an RTX 4060 8 GB), PyTorch 2.6 / CUDA 12.4 (lazy module loading: PyTorch sets
``CUDA_MODULE_LOADING=LAZY``), torchvision models with ``weights=None``, CIFAR-10 resized to 86x86 (10 label
values), fp32, ``torch.optim.<optimizer>(lr=1e-3)`` (foreach on CUDA), cross entropy. ``ground_bytes`` is the
maximum NVML ``memory.used`` minus the first NVML sample. xMem compares its estimate with it directly while its
second validation round caps the job at ``M_init + M_fm + M_hat`` (seeds/000 section 4.1.4: ``M_fm`` "the amount
of memory used by a DL Framework ... constant during all experiments", recorded in round 1): estimates and
ground truth are both net of the framework memory (CUDA context and modules). So uvmlab is scored with its
peak reserved bytes (``device_peak_bytes - context_bytes``: ``target="reserved"``); ``xmem_est_bytes``,
``dnnmem_est_bytes`` and
``schedtune_est_bytes`` are the peers as xMem ran them (``RecordedEstimator``: xmem, dnnmem-reported, schedtune).

Rows uvmlab cannot rebuild are skipped with the reason (``read_xmem_sample``): the Adagrad row (uvmlab's
optimizers are SGD/Adam/AdamW) and GPT-Neo-125M (dynamic padding of WikiText-2 to at most 128 tokens: the
sequence length of each batch is not recorded).
"""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path

from uvmlab.config import OPTIMIZERS, WorkloadConfig
from uvmlab.errors import InputError
from uvmlab.evaluate.estimators import EvalCase
from uvmlab.units import GiB

CSV_NAME = "xmem_ground_truth_sample.csv"
MARKER_COLUMN = "xmem_est_bytes"
ITERATIONS = 3
"""xMem trains about 4 iterations; the peak is reached by the second (optimizer state from the first step)."""
MODELS = {"ConvNeXtTiny": ("convnext_tiny", 1000), "ConvNeXtBase": ("convnext_base", 1000),
          "ResNet50": ("resnet50", 1000)}  # fmt: skip
"""xMem model name -> (torchvision builder, classes): ``weights=None`` keeps torchvision's 1000 classes."""
GPUS = {"RTX 3060": ("RTX3060", 12 * GiB), "RTX 4060": ("RTX4060", 8 * GiB)}
PEERS = {"xmem": "xmem_est_bytes", "dnnmem-reported": "dnnmem_est_bytes", "schedtune": "schedtune_est_bytes"}


def _model(name: str) -> tuple[str, int] | None:
    if name in MODELS:
        return MODELS[name]
    m = re.fullmatch(r"MnasNet\(alpha=([0-9.]+);num_classes=(\d+)\)", name)
    builders = {0.5: "mnasnet0_5", 0.75: "mnasnet0_75", 1.0: "mnasnet1_0", 1.3: "mnasnet1_3"}
    if m and float(m[1]) in builders:
        return builders[float(m[1])], int(m[2])
    return None


def _float(text: str) -> float:
    return float(text) if text.strip() else math.nan


def csv_file(path: str | Path, csv_name: str) -> Path:
    """``path``, or ``path/csv_name`` when ``path`` is a folder (the readers take either)."""
    src = Path(path)
    return src / csv_name if src.is_dir() else src


def find_csv(path: str | Path, csv_name: str, what: str) -> Path:
    """:func:`csv_file`, or InputError("<what> <file> not found") when that file does not exist."""
    src = csv_file(path, csv_name)
    if not src.is_file():
        raise InputError(f"{what} {src} not found")
    return src


def read_xmem_sample(path: str | Path) -> tuple[list[EvalCase], list[tuple[str, str]]]:
    """EvalCases of the sample (a CSV, or the folder holding ``CSV_NAME``); (cases, skipped [(row, reason)])."""
    src = find_csv(path, CSV_NAME, "xMem sample")
    cases: list[EvalCase] = []
    skipped: list[tuple[str, str]] = []
    with src.open(newline="") as fh:
        for n, row in enumerate(csv.DictReader(fh), start=2):
            cid = f"{row['model']}_{row['optimizer']}_{row['batch_size']}"
            model = _model(row["model"])
            opt = row["optimizer"].lower()
            gpu = next((v for k, v in GPUS.items() if k in row["gpu"]), None)
            if model is None:
                why = "not a torchvision classifier (GPT-Neo: the sequence lengths of dynamic padding are unrecorded)"
                skipped.append((cid, f"line {n}: {row['model']} is {why}"))
                continue
            if opt not in OPTIMIZERS:
                skipped.append((cid, f"line {n}: optimizer {row['optimizer']} (uvmlab has {', '.join(OPTIMIZERS)})"))
                continue
            if gpu is None:
                skipped.append((cid, f"line {n}: GPU {row['gpu']!r} unknown"))
                continue
            arch, classes = model
            cfg = WorkloadConfig(
                workload=f"torchvision:{arch}",  # CIFAR-10's 10 label values change no allocation
                batch_size=int(row["batch_size"]),
                optimizer=opt,
                iterations=ITERATIONS,
                options={"image_size": int(row["input_hw"]), "num_classes": classes},
            )
            case = EvalCase(
                case_id=cid,
                gpu_memory_bytes=gpu[1],
                oom=False,
                measured_peak_bytes=float(row["ground_bytes"]),
                workload=cfg,
                group=row["model"],
                source=row["path"],
                target="reserved",
                gpu_name=gpu[0],
                module_loading="lazy",
                recorded={peer: _float(row[col]) for peer, col in PEERS.items()},
            )
            cases.append(case)
    return cases, skipped


def csv_header(path: str | Path, csv_name: str) -> str:
    """The first line of ``path`` (or of ``path/csv_name`` for a folder) when it is a text CSV, else ""."""
    src = csv_file(path, csv_name)
    if not src.is_file() or src.suffix != ".csv":
        return ""
    try:
        with src.open(newline="") as fh:
            return fh.readline()
    except UnicodeDecodeError:  # not text: not a known ground truth (the generic CSV reader says what is wrong)
        return ""


def is_xmem_sample(path: str | Path) -> bool:
    """True for the sample's CSV (or its folder): its header has ``MARKER_COLUMN``."""
    return MARKER_COLUMN in csv_header(path, CSV_NAME)
