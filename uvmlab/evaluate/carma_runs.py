"""Ground truth from CARMA's measured CNN trainings on an A100-40GB (itu-rad/CARMA ``workloads/ehsan-summary.csv``).

itu-rad/CARMA (commit e044017801fe740f8b977c2d4120d75026ef2d85) ran each workload script of ``workloads/`` alone
on one A100-40GB of a DGX Station A100 (README) under ``workloads/ehsan-experimenter.py``, which samples
``nvidia-smi --query-gpu=uuid,memory.used`` every second; ``workloads/ehsan-extractor.py`` writes the maximum
``memory.used`` (MiB) of that GPU per run to ``ehsan-summary.csv`` (column ``Max memory.used [MB]``, MiB despite
the name). That is the whole device's memory: compared with ``device_peak_bytes`` (``target="device"``).

What each script trains (read from the scripts at that commit; none sets AMP, ``cudnn.benchmark`` or
``CUDA_MODULE_LOADING``; the stack's versions are not recorded):

- ``*_cifar100.py``: ``timm.create_model(NAME, pretrained=False, num_classes=100)`` on CIFAR-100 (32x32,
  RandomCrop(32, padding=4)), ``optim.AdamW(lr=1e-3, weight_decay=1e-4)``, fp32. ``resnet50_cifar100.py``
  builds ``efficientnet_b0`` (its ``create_model`` line), so its rows repeat ``efficientNet_cifar100.py``.
- ImageNet scripts (``mobilenet.py``, ``efficientNet.py``, ``resnet50.py``, ``vgg.py``, ``Xception.py``):
  torchvision ``mobilenet_v2``, ``efficientnet_b0``, ``resnet50``, ``vgg16`` (``weights=None``/``pretrained=False``,
  1000 classes) and ``timm.create_model('xception')`` (timm's ``legacy_xception`` since timm 0.9), 224x224
  (Resize(256) + CenterCrop(224)), ``optim.Adam(lr=1e-3)``, fp32.

Skipped with the reason: ``Inception.py`` (``inception_v3(aux_logits=False)``; uvmlab's ``torchvision:inception_v3``
trains the auxiliary head) and every non-CNN or custom script (BERT, GPT-2, XLNet, UNet, DLRM, Mask R-CNN).
Rows are estimated with lazy module loading: see docs/estimate.md "Validation: CARMA A100-40GB CNN runs".
The 15 ``*_cifar100.py`` rows calibrate ``uvmlab.memory.devicemem.LAZY_CONV_MODULES_BYTES`` (``fitted=True``); the
ImageNet rows validate it (``uvmlab evaluate`` adds a "(validation runs)" score).
"""

from __future__ import annotations

import re
from pathlib import Path

from uvmlab.config import WorkloadConfig
from uvmlab.errors import InputError
from uvmlab.evaluate.estimators import EvalCase
from uvmlab.evaluate.xmem_sample import csv_header, find_csv
from uvmlab.files.inputs import MAX_CSV_BYTES, read_csv_rows
from uvmlab.units import GiB, MiB

CSV_NAME = "ehsan-summary.csv"
MEASURED_COLUMN = "Max memory.used [MB]"
MARKER_COLUMN = "Faketensor Estimate [MB]"
GPU_NAME = "A100-40GB"
GPU_BYTES = 40 * GiB
ITERATIONS = 3
"""The peak is reached by the second iteration (AdamW's state exists from the first step)."""
SCRIPTS: dict[str, tuple[str, str, int, int]] = {
    "resnet18_cifar100.py": ("timm:resnet18", "adamw", 32, 100),
    "resnet34_cifar100.py": ("timm:resnet34", "adamw", 32, 100),
    "mobilenet_cifar100.py": ("timm:mobilenetv3_small_100", "adamw", 32, 100),
    "efficientNet_cifar100.py": ("timm:efficientnet_b0", "adamw", 32, 100),
    "resnet50_cifar100.py": ("timm:efficientnet_b0", "adamw", 32, 100),
    "mobilenet.py": ("torchvision:mobilenet_v2", "adam", 224, 1000),
    "efficientNet.py": ("torchvision:efficientnet_b0", "adam", 224, 1000),
    "resnet50.py": ("torchvision:resnet50", "adam", 224, 1000),
    "vgg.py": ("torchvision:vgg16", "adam", 224, 1000),
    "Xception.py": ("timm:legacy_xception", "adam", 224, 1000),
}
"""CARMA script -> (uvmlab workload, optimizer, image side, classes) (module docstring)."""
SKIP_REASONS = {
    "Inception.py": "inception_v3(aux_logits=False): uvmlab's torchvision:inception_v3 trains the auxiliary head",
}
_BATCH_RE = re.compile(r"--batch_size_(\d+)")


def _measured(text: str, line: int) -> float:
    try:
        value = float(text)
    except ValueError:
        raise InputError(f"CARMA summary line {line}: {MEASURED_COLUMN} {text!r} is not a number") from None
    if not value > 0:
        raise InputError(f"CARMA summary line {line}: {MEASURED_COLUMN} {text!r} is not positive")
    return value * MiB


def read_carma_summary(path: str | Path) -> tuple[list[EvalCase], list[tuple[str, str]]]:
    """EvalCases of CARMA's summary (the CSV, or the folder holding ``CSV_NAME``); (cases, skipped [(row, reason)])."""
    src = find_csv(path, CSV_NAME, "CARMA summary")
    cases: list[EvalCase] = []
    skipped: list[tuple[str, str]] = []
    fields, rows = read_csv_rows(src, MAX_CSV_BYTES, "CARMA's run summary CSV")
    missing = {"Script", "Run folder", MEASURED_COLUMN} - set(fields)
    if missing:
        raise InputError(f"CARMA summary {src} lacks the column(s) {', '.join(sorted(missing))}")
    for n, row in enumerate(rows, start=2):
        script = Path(row["Script"].strip()).name
        batch = _BATCH_RE.search(row["Run folder"])
        rid = f"{script}_bs{batch[1]}" if batch else f"{script}_line{n}"
        if script not in SCRIPTS:
            why = SKIP_REASONS.get(script, "not one of the CNN classification scripts uvmlab rebuilds")
            skipped.append((rid, f"line {n}: {script}: {why}"))
            continue
        if batch is None:
            skipped.append((rid, f"line {n}: no --batch_size in the run folder name"))
            continue
        workload, opt, size, classes = SCRIPTS[script]
        cfg = WorkloadConfig(
            workload=workload,
            batch_size=int(batch[1]),
            optimizer=opt,
            iterations=ITERATIONS,
            options={"image_size": size, "num_classes": classes},
        )
        cases.append(
            EvalCase(
                case_id=rid,
                gpu_memory_bytes=GPU_BYTES,
                oom=False,
                measured_peak_bytes=_measured(row[MEASURED_COLUMN], n),
                workload=cfg,
                group=script,
                source=row["Run folder"],
                target="device",
                gpu_name=GPU_NAME,
                module_loading="lazy",
                fitted=script.endswith("_cifar100.py"),
            )
        )
    return cases, skipped


def is_carma_summary(path: str | Path) -> bool:
    """True for CARMA's summary CSV (or its folder): its header has ``MARKER_COLUMN`` and ``MEASURED_COLUMN``."""
    header = csv_header(path, CSV_NAME)
    return MARKER_COLUMN in header and MEASURED_COLUMN in header
