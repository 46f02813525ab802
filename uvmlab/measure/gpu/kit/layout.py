"""The folder ``uvmlab collect -o DIR`` writes: the real-data layout ``uvmlab validate DIR`` reads.

::

    DIR/collect.json                     the kit's record: uvmlab version, the GPU, the machine (runtime: gVisor or
                                         Firecracker), the plan, each step's outcome, the facts and probe records;
                                         rewritten after every step, ``complete`` true once the last step has run
    DIR/README.md                        what each folder holds and how it was made (like real-data's READMEs)
    DIR/raw/<set>/<step>/                each step's own output (written as ``<step>.partial``, renamed when the
                                         step succeeds) and, in ``raw/logs``, its stdout/stderr
    DIR/raw/progress.json                every step's status so far (what ``uvmlab collect --resume`` reads)
    DIR/memory/uvmlab_collect/runs.csv   one row per training case (RUN_COLUMNS): PyTorch's peaks, NVML's peak
    DIR/snapshots/MANIFEST.tsv           the memory snapshots (``file`` column first, like real-data/snapshots)
    DIR/snapshots/uvmlab_collect_*.pickle  torch.cuda.memory._snapshot() with frames, one per case
    DIR/cudnn/uvmlab_collect/calls.csv   the parsed cuDNN API log (uvmlab.measure.gpu.kit.cudnn_log.CALL_COLUMNS), per
    case
    DIR/cudnn/uvmlab_collect/workspaces.csv  per case, every allocation of the logged iteration made by a cuDNN call
                                         (stack frames in the snapshot) with its size
    DIR/cudnn/uvmlab_collect/<case>.log  the raw cuDNN API log
    DIR/uvm/uvmlab_collect/streams.csv   uvmbench's CSV columns (real-data/uvm README section 2) plus free/total
    DIR/uvm/uvmlab_collect/gcn/<variant>/<nodes>.json  noob512's GCN result JSON keys (avg_epoch_time_s, ...)
    DIR/uvm/uvmlab_collect/streams.sqlite  the nsys export of the streams step (when nsys exists): input of
                                         ``uvmlab calibrate``
    DIR/link/uvmlab_collect/timings.csv  microbenchmark timings (uvmlab.measure.gpu.microbench.TIMING_COLUMNS): input of
                                         ``uvmlab calibrate --microbench-timings``
    DIR/<set>/uvmlab_collect/meta.json   the GPU (name, total and free memory), driver, CUDA, versions

``OWNED`` lists what the kit writes; ``--force`` replaces only those, never another file of DIR.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from uvmlab.errors import InputError
from uvmlab.files.atomic import atomic_write_json, atomic_write_text, atomic_write_with
from uvmlab.files.inputs import MAX_DATA_FILE_BYTES, read_csv_frame, read_csv_rows, read_json_file

DATASET = "uvmlab_collect"
MEMORY_DIR = f"memory/{DATASET}"
CUDNN_DIR = f"cudnn/{DATASET}"
UVM_DIR = f"uvm/{DATASET}"
LINK_DIR = f"link/{DATASET}"
SNAPSHOTS_DIR = "snapshots"
MANIFEST = "MANIFEST.tsv"
SNAPSHOT_PREFIX = f"{DATASET}_"
RECORD = "collect.json"
RAW = "raw"
OWNED = (RECORD, "README.md", RAW, MEMORY_DIR, CUDNN_DIR, UVM_DIR, LINK_DIR)
"""What the kit writes in DIR, with the snapshots named ``SNAPSHOT_PREFIX*`` and their rows of
``snapshots/MANIFEST.tsv`` (the manifest's other rows are kept: :func:`write_manifest`)."""

RUN_COLUMNS = (
    "case",
    "workload",
    "batch_size",
    "optimizer",
    "cudnn_benchmark",
    "options",
    "iterations",
    "outcome",
    "max_memory_reserved_bytes",
    "max_memory_allocated_bytes",
    "nvml_process_peak_bytes",
    "nvml_used_peak_bytes",
    "nvml_used_before_bytes",
    "nvml_source",
    "snapshot",
    "gpu_name",
    "gpu_total_bytes",
    "torch",
    "cuda",
    "cudnn",
    "cublas",
    "driver",
    "error",
)
"""``runs.csv``: one training case. ``max_memory_*``: torch.cuda.max_memory_reserved/allocated after the case;
``nvml_process_peak_bytes``: the process's usedGpuMemory peak (nvmlDeviceGetComputeRunningProcesses), sampled by a
thread; ``nvml_used_peak_bytes`` the device's used memory peak and ``nvml_used_before_bytes`` its value before
CUDA was initialised (their difference is the process's whole footprint where the process list is not readable,
e.g. in a container); ``options``: the workload options as JSON."""
STREAM_COLUMNS = (
    "kernel",
    "mode",
    "size_factor",
    "working_set_bytes",
    "bytes_accessed",
    "iterations",
    "median_ms",
    "min_ms",
    "max_ms",
    "bw_GBps",
    "free_factor",
    "free_bytes",
    "total_bytes",
    "cold_ms",
    "limited_by_margin",
)
"""``streams.csv``: uvmbench's columns (``size_factor`` = working set / total memory, as uvmbench's ``W = size_factor
x total``), plus ``free_factor`` (working set / free memory: what the kit asked), the memory it measured, ``cold_ms``
(the first launch: migration of the host-written input and first touch of the output, uvm_step docstring) and
``limited_by_margin`` (the working set was cut to the managed limit, uvmlab.measure.gpu.kit.sizing)."""
WORKSPACE_COLUMNS = ("case", "index", "size_bytes", "frame")


def write_csv(path: Path, rows: list[dict[str, Any]], columns: tuple[str, ...]) -> None:
    """``rows`` as a CSV with ``columns`` (missing keys empty), written atomically."""
    df = pd.DataFrame(rows, columns=list(columns))
    atomic_write_with(path, lambda tmp: df.to_csv(tmp, index=False))


def read_csv(path: Path, columns: tuple[str, ...]) -> pd.DataFrame:
    """A kit CSV; InputError naming the file when it lacks a column."""
    df = read_csv_frame(path, MAX_DATA_FILE_BYTES, "a CSV written by uvmlab collect")
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise InputError(f"{path} lacks columns {missing}: is it written by uvmlab collect?")
    return df


def write_manifest(folder: Path, rows: list[dict[str, Any]]) -> None:
    """``snapshots/MANIFEST.tsv``: the kit's snapshots, ``file`` first (the column uvmlab.validate reads); rows of
    an existing manifest that name other files are kept."""
    path = folder / MANIFEST
    kept: list[dict[str, Any]] = []
    if path.exists():
        _, old = read_csv_rows(path, MAX_DATA_FILE_BYTES, "a snapshot MANIFEST.tsv", delimiter="\t")
        kept = [r for r in old if not str(r.get("file", "")).startswith(SNAPSHOT_PREFIX)]
    every = [*kept, *rows]
    columns = ["file", *sorted({k for r in every for k in r} - {"file"})]
    lines = ["\t".join(columns)]
    for r in every:
        lines.append("\t".join(str(r.get(c, "")).replace("\t", " ") for c in columns))
    atomic_write_text(path, "\n".join(lines) + "\n")


def write_meta(folder: Path, meta: dict[str, Any]) -> None:
    atomic_write_json(folder / "meta.json", meta)


def read_meta(folder: Path) -> dict[str, Any]:
    """``meta.json`` of a data set ({} when absent)."""
    path = folder / "meta.json"
    if not (path.exists() or path.is_symlink()):
        return {}
    doc = read_json_file(path, MAX_DATA_FILE_BYTES, "a meta.json written by uvmlab collect")
    if not isinstance(doc, dict):
        raise InputError(f"{path} holds a JSON {type(doc).__name__}, not the object uvmlab collect writes")
    return doc


README = """# Data recorded by `uvmlab collect`

Recorded on {gpu} (driver {driver}, CUDA {cuda}) with uvmlab {version} on {date}. Nothing here was simulated.
`collect.json` lists every step, its command and its outcome; `raw/` keeps each step's own output.

- `memory/uvmlab_collect/runs.csv`: per training case, `torch.cuda.max_memory_reserved/allocated` and the NVML
  whole-process peak sampled by a thread every {interval_ms:g} ms; `meta.json`: versions.
- `snapshots/`: a PyTorch memory snapshot (`torch.cuda.memory._snapshot()`, `_record_memory_history` with Python
  and C++ frames) per case, listed in `MANIFEST.tsv`.
- `cudnn/uvmlab_collect/`: the cuDNN API log of one training iteration per convolutional case, parsed into
  `calls.csv`; `workspaces.csv`: the allocations cuDNN calls made in that iteration (from the snapshot's frames).
- `uvm/uvmlab_collect/`: uvmbench-style streams (`streams.csv`, uvmbench's columns) and the noob512 GCN
  (`gcn/`, its result JSON keys) at factors {factors} of the free memory; `streams.sqlite` when nsys ran.
- `link/uvmlab_collect/timings.csv`: `cudaMemPrefetchAsync` bandwidth by size and page-touch costs
  (uvmlab.measure.gpu.microbench); `uvmlab calibrate --microbench-timings` fits CostParams to it.

Read it with `uvmlab validate DIR` (checks `collect-*` and `snapshots-replay`); see docs/gpu.md "The first GPU run".
"""
