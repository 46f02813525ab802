"""Ground truth from the GPUMemNet A100 MLP set (../shared/real-data/memory/gpumemnet_mlp_a100).

Each of the 3,000 rows is a random MLP trained for ~60 s by itu-rad/GPUMemNet's
``NeuroNetGen_scripts/MLP/mlp_next.py`` (commit f01eb0592e1b2030d3bceb73441747912b6652a6) on an
A100-SXM4-40GB; the measured value is the maximum of nvidia-smi ``memory.used`` sampled every second
(``Max GPU Memory (MiB)``): whole-process device memory, so it is compared with ``device_peak_bytes``.

Rebuilding a row: the layer list (kind, width) is the row's ``Activations-Params`` column (a Python literal
read with ``ast.literal_eval``), the input width, batch size and dropout rate are in its ``Filename``. The model
is the workload file ``workloads/gpumemnet_mlp.py`` with those options (one trace per row, cached on disk by
``uvmlab.trace.cache``).

The stack's CUDA version is not recorded. Its smallest models sit at 1,443-1,451 MiB, about 1 GiB above a lazily
loaded A100 context (uvmlab.memory.devicemem: 429 MiB), so the runs loaded modules eagerly: rows are estimated with
``module_loading="eager"``. The eager module size of this stack is the one calibrated constant
(``uvmlab.memory.devicemem.EAGER_MODULES_A100_BYTES``): calibrated on the rows whose index is a multiple of
``CALIBRATION_STRIDE`` (``calibration_rows``), validated on the others (``fitted`` in the results).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from uvmlab.config import WorkloadConfig
from uvmlab.errors import InputError
from uvmlab.evaluate.xmem_sample import find_csv
from uvmlab.files.inputs import MAX_CSV_BYTES, read_csv_rows
from uvmlab.units import MiB

CSV_NAME = "mlp_data_step2.csv"
MEASURED_COLUMN = "Max GPU Memory (MiB)"
CALIBRATION_STRIDE = 5
"""Rows 0, 5, 10, ... (20 %) calibrate the eager module size; the other 80 % validate it."""
GPU_NAME = "A100-40GB"
ITERATIONS = 2
"""Iterations traced per row: the first allocates Adam's state, the second is the steady state (mlp_next.py
trains ~60 s; every later iteration repeats the second)."""
WORKLOAD_FILE = Path(__file__).resolve().parents[2] / "workloads" / "gpumemnet_mlp.py"
_NAME_RE = re.compile(
    r"input:(?P<input>\d+)_output:(?P<output>\d+)_depth:(?P<depth>\d+)_arch:(?P<arch>\w+?)_batch:(?P<batch>\d+)"
    r"_act:(?P<act>\w+?)_dropout:(?P<rate>[0-9.eE-]+)_dropout:(?P<use_dropout>True|False)"
    r"_batchnorm:(?P<bn>True|False)"
)
KNOWN_KINDS = frozenset(
    {"linear", "batch_normalization", "dropout", "Softmax", "Sigmoid", "Identity", "ReLU", "LeakyReLU", "PReLU",
     "ELU", "SELU", "Tanh", "Softplus", "SiLU", "Mish", "GELU"}
)  # fmt: skip


@dataclass(frozen=True)
class MlpRow:
    """One GPUMemNet row: what to rebuild and what was measured."""

    index: int
    name: str
    input_size: int
    batch_size: int
    dropout: float
    layers: tuple[tuple[str, int], ...]
    measured_bytes: int

    @property
    def fitted(self) -> bool:
        """True for the calibration rows (``CALIBRATION_STRIDE``)."""
        return self.index % CALIBRATION_STRIDE == 0

    def config(self) -> WorkloadConfig:
        """The WorkloadConfig of this row (Adam, fp32, ``ITERATIONS`` iterations)."""
        layers = ",".join(f"{k}:{w}" for k, w in self.layers)
        return WorkloadConfig(
            workload=str(WORKLOAD_FILE),
            batch_size=self.batch_size,
            optimizer="adam",
            iterations=ITERATIONS,
            options={"layers": layers, "input_size": self.input_size, "dropout": round(self.dropout, 6)},
        )


def parse_row(index: int, row: dict[str, str]) -> MlpRow:
    """A CSV row -> MlpRow; InputError names the row when it cannot be rebuilt."""
    where = f"GPUMemNet row {index}"
    m = _NAME_RE.search(row.get("Filename", ""))
    if m is None:
        raise InputError(f"{where}: file name {row.get('Filename')!r} does not follow mlp_next.py's pattern")
    try:
        items = ast.literal_eval(row["Activations-Params"])
        layers = tuple((str(k), int(w)) for k, w, _params in items)
        measured = int(float(row[MEASURED_COLUMN]) * MiB)
    except (ValueError, SyntaxError, KeyError, TypeError) as exc:
        raise InputError(f"{where}: unreadable layer list or measurement ({exc})") from None
    unknown = {k for k, _ in layers} - KNOWN_KINDS
    if unknown:
        raise InputError(f"{where}: layer kinds {sorted(unknown)} are not ones mlp_next.py makes")
    return MlpRow(
        index=index,
        name=row["Filename"],
        input_size=int(m["input"]),
        batch_size=int(m["batch"]),
        dropout=float(m["rate"]),
        layers=layers,
        measured_bytes=measured,
    )


def read_mlp_set(path: str | Path) -> tuple[list[MlpRow], list[tuple[int, str]]]:
    """All rows of the CSV (a file, or the folder holding ``CSV_NAME``): (rows, skipped [(index, reason)])."""
    src = find_csv(path, CSV_NAME, "GPUMemNet MLP set")
    rows, skipped = [], []
    for i, raw in enumerate(read_csv_rows(src, MAX_CSV_BYTES, "a GPUMemNet MLP CSV")[1]):
        try:
            rows.append(parse_row(i, raw))
        except InputError as exc:
            skipped.append((i, str(exc)))
    return rows, skipped


def calibration_rows(rows: list[MlpRow]) -> list[MlpRow]:
    """The declared calibration subset (``MlpRow.fitted``)."""
    return [r for r in rows if r.fitted]


def estimate_row(row: MlpRow, module_loading: str = "eager") -> dict[str, Any]:
    """Trace (cached), orchestrate and simulate one row on an A100-40GB; returns the figures per row."""
    from uvmlab.gpus import get_gpu
    from uvmlab.memory.devicemem import context_model
    from uvmlab.memory.estimate import estimate
    from uvmlab.trace.cache import get_trace

    cfg = row.config()
    trace = get_trace(cfg)
    est = estimate(cfg, get_gpu(GPU_NAME), trace=trace, context=context_model(GPU_NAME, module_loading))
    return {
        "index": row.index,
        "fitted": row.fitted,
        "measured_bytes": row.measured_bytes,
        "peak_reserved_bytes": est.peak_reserved_bytes,
        "context_bytes": est.context_bytes,
        "device_peak_bytes": est.device_peak_bytes,
    }


ROWS_PER_TASK = 10
"""Rows one worker estimates per task (about 1.5 s of work: small enough to balance, large enough that the
inter-process traffic is noise)."""
MIN_ROWS_PER_WORKER = 2 * ROWS_PER_TASK
"""Below this many rows per extra worker the pool costs more than it saves (each worker imports torch once,
about 3 s of CPU): the rows run in this process."""


def estimate_rows(
    rows: list[MlpRow], jobs: int = 1, progress: Callable[[int], None] | None = None
) -> list[dict[str, Any]]:
    """:func:`estimate_row` of every row, in row order, in this process or in ``jobs`` worker processes.

    Each row is one independent trace + simulation, so the results do not depend on where they run (the test
    compares both paths). ``progress(n)`` is called as each batch of ``n`` rows finishes. Workers are spawned
    (not forked: the parent may hold threads, e.g. a progress bar) and each imports torch once for all its rows.
    """
    workers = max(1, min(jobs, len(rows) // MIN_ROWS_PER_WORKER))
    if workers == 1:
        return estimate_chunk(rows, progress)
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    chunks = [rows[i : i + ROWS_PER_TASK] for i in range(0, len(rows), ROWS_PER_TASK)]
    results: list[list[dict[str, Any]]] = [[] for _ in chunks]
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        futures = {pool.submit(estimate_chunk, chunk): i for i, chunk in enumerate(chunks)}
        for fut in as_completed(futures):
            i = futures[fut]
            results[i] = fut.result()
            if progress is not None:
                progress(len(chunks[i]))
    return [r for chunk in results for r in chunk]


def estimate_chunk(rows: list[MlpRow], progress: Callable[[int], None] | None = None) -> list[dict[str, Any]]:
    """:func:`estimate_row` of each row; a capture gc.collect()s at each iteration end, which scans the whole
    heap: freezing what is alive before each row keeps that to the row's own objects (uvmlab.trace.heap)."""
    import gc

    from uvmlab.trace.heap import frozen_heap

    out = []
    with frozen_heap():
        for r in rows:
            gc.freeze()  # the earlier rows' results too
            out.append(estimate_row(r))
            if progress is not None:
                progress(1)
    return out


def mlp_cases(rows: list[MlpRow]) -> list[Any]:
    """EvalCases of the rows: whole-device measurements on an A100-40GB, eager module loading."""
    from uvmlab.evaluate.estimators import EvalCase
    from uvmlab.units import GiB

    return [
        EvalCase(
            case_id=f"mlp{r.index:04d}",
            gpu_memory_bytes=40 * GiB,
            oom=False,
            measured_peak_bytes=float(r.measured_bytes),
            workload=r.config(),
            group=next((k for k, _ in r.layers if k not in ("linear", "batch_normalization", "dropout")), "mlp"),
            source=r.name,
            target="device",
            gpu_name=GPU_NAME,
            module_loading="eager",
            fitted=r.fitted,
        )
        for r in rows
    ]


def is_mlp_set(path: str | Path) -> bool:
    """True for the GPUMemNet CSV or the folder holding it."""
    src = Path(path)
    return (src / CSV_NAME).is_file() if src.is_dir() else src.name == CSV_NAME
