"""Ground truth from xMem's 13-row sample (../shared/real-data/memory/xmem_rtx3060_sample), with the peers' own
estimates beside each row.

Rows come from Stone-ResearchLife/xMem (MIT) ``plot/data/001-Anova/**/evaluation_result.json``: an RTX 3060
12 GB (one row an RTX 4060 8 GB), PyTorch 2.6 / CUDA 12.4 (lazy module loading: PyTorch sets
``CUDA_MODULE_LOADING=LAZY``), torchvision models with ``weights=None``, CIFAR-10 resized to 86x86 (10 label
values), fp32, cross entropy. How xMem's trainer made each measured run (Stone-ResearchLife/xMem; file versions
as stored by the code index, commit of each file in brackets; the sample's data commit is d61e076):

- ``exp/trainer/__init__.py`` [0715122] ``FastRunner.train_on_gpu``: ``iterations=3``; ``exp/trainer/train_loop.py``
  [0fa57ba] ``conv_train_loop`` breaks after the step when ``index >= iterations``: **4 iterations**
  (``ITERATIONS``). Each iteration: ``optimizer.zero_grad()`` first (``zero_grad_mode`` None/0; PyTorch 2.x
  defaults to ``set_to_none=True``), batch ``.to(device)``, forward, loss, backward, ``optimizer.step()``,
  ``torch.max(outputs, 1)``, ``StepLR.step()``: uvmlab's ``workloads/train.py`` with ``zero_grad=iteration_start``.
- The optimizer: ``optimizer(params=model.parameters(), lr=lr)`` with ``lr=0.001`` (``perf_estimator/config.py``):
  PyTorch's defaults (foreach on CUDA; SGD without momentum, so no state): what ``make_optimizer`` builds.
- Data (``perf_estimator/dataset.py`` [08f757e]): CIFAR-10 ``Resize(86)``, ``ToTensor``, ``Normalize``: fp32
  ``[B, 3, 86, 86]`` inputs, int64 labels, ``DataLoader(batch_size=B, shuffle=True)`` (no workers, no pinning).
  ``cudnn.benchmark`` is never set (PyTorch's default False).
- Models (``perf_estimator/models.py`` [08f757e]): torchvision ``convnext_tiny/convnext_base/resnet50(weights=None)``
  (1000 classes), ``MNASNet(alpha=1.0, num_classes=10)``.
- ``ground_bytes`` (``_get_ground_truth`` in xMem's experiment runner): max NVML ``memory.used`` minus the
  run's first sample. ``FastRunner.train_on_gpu`` calls ``torch.cuda.set_per_process_memory_fraction`` before it
  starts the 1 ms NVML monitor thread; PyTorch's ``setMemoryFraction`` sets the device (``cudaSetDevice``
  initialises the primary context since CUDA 12) and calls ``cudaMemGetInfo`` (c10/cuda/CUDACachingAllocator.cpp,
  ``DeviceCachingAllocator::setMemoryFraction``), so the context exists at the first sample: ``ground_bytes`` is
  net of the context as created, but holds what the run loads later (lazy module loading: the kernels and
  library handles of cuDNN/cuBLAS on first use). So these cases are ``target="after_context"``: uvmlab's reserved
  peak plus ``uvmlab.memory.devicemem.LAZY_CONV_MODULES_BYTES`` (``estimators.after_context_bytes``).

``xmem_est_bytes``, ``dnnmem_est_bytes`` and ``schedtune_est_bytes`` are the peers as xMem ran them
(``RecordedEstimator``: xmem, dnnmem-reported, schedtune).

Rows uvmlab cannot rebuild are skipped with the reason (``read_xmem_sample``): the Adagrad row (uvmlab's
optimizers are SGD/Adam/AdamW) and GPT-Neo-125M (dynamic padding of WikiText-2 to at most 128 tokens: the
sequence length of each batch is not recorded).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from uvmlab.config import OPTIMIZERS, WorkloadConfig
from uvmlab.errors import InputError
from uvmlab.evaluate.estimators import EvalCase
from uvmlab.files.inputs import MAX_CSV_BYTES, open_input, read_csv_rows
from uvmlab.units import GiB

CSV_NAME = "xmem_ground_truth_sample.csv"
MARKER_COLUMN = "xmem_est_bytes"
ITERATIONS = 4
"""xMem's ``FastRunner.train_on_gpu(iterations=3)`` with ``conv_train_loop``'s ``if index >= iterations: break``
after the step: iterations 0..3 (module docstring)."""
TARGET = "after_context"
"""``ground_bytes`` is NVML growth over a first sample taken after the CUDA context was created (module docstring)."""
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
    for n, row in enumerate(read_csv_rows(src, MAX_CSV_BYTES, "an xMem sample CSV")[1], start=2):
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
            dtype="fp32",  # xMem's trainer: fp32 inputs and weights, no autocast
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
            target=TARGET,
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
        with open_input(src, MAX_CSV_BYTES, "a CSV file") as fh:
            return fh.readline(1 << 16).decode("utf-8")
    except UnicodeDecodeError:  # not text: not a known ground truth (the generic CSV reader says what is wrong)
        return ""


def is_xmem_sample(path: str | Path) -> bool:
    """True for the sample's CSV (or its folder): its header has ``MARKER_COLUMN``."""
    return MARKER_COLUMN in csv_header(path, CSV_NAME)
