"""Ground truth for the estimator evaluation: a CSV of measured runs, or real PyTorch memory snapshots.

Safety: a CSV is data, so a ``source`` naming a workload FILE (Python code) is refused unless the caller passes
``allow_code=True`` (``uvmlab evaluate --allow-code``); built-in workload names, snapshots and trace folders
never run code from the CSV.

CSV format (one row per real run; header required; extra columns are ignored):

=====================  ===================================================================================
column                 meaning
=====================  ===================================================================================
``id``                 unique name of the run
``source``             a built-in workload name or workload file, a snapshot pickle (``.pickle``/``.pkl``),
                       or a uvmlab trace directory
``config``             JSON object of workload settings (``{"batch_size": 8, "optimizer": "adamw"}``, any
                       WorkloadConfig field; ``options`` nested); for a snapshot ``{"device": 1}``; may be empty
``gpu_memory``         device memory M_max: bytes or a size such as ``80GiB``
``measured_peak_bytes`` the run's measured peak (PyTorch ``max_memory_reserved()``); empty when it went OOM
``oom``                1/0 (true/false, yes/no): the full-memory run failed with out-of-memory
``group`` (optional)   the model, for per-model points in the quadrant figure (default: the source)
``alloc_conf`` (opt.)  PYTORCH_CUDA_ALLOC_CONF of the run (default: empty; snapshots: their own setting)
``round2_oom``,        a measured second round of xMem's validation (the run capped at the estimate);
``round2_peak_bytes``  empty: modelled (see uvmlab.evaluate.metrics)
=====================  ===================================================================================

Snapshots as ground truth (:func:`snapshot_case`): the measured peak is the peak reserved bytes over the
snapshot's trace (reserved at the end walked back through segment_alloc/free/map/unmap); the trace the
estimators see is the snapshot's own alloc / free_completed stream (:func:`snapshot_trace`). A trace that starts
mid-run (the ring buffer began after memory was reserved) hides the cache that was built before it; such
"warm" snapshots are admitted only when the reserved bytes at the trace start are at most
``MAX_WARM_FRACTION`` of the peak (:func:`admissible`), and blocks live at the trace start are rebuilt as
allocations made first, in address order. A snapshot with an ``oom`` event is a run with OOM1 = 1: the failing
request is added as an allocation that is never freed and the trace ends there.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from uvmlab.config import WorkloadConfig
from uvmlab.errors import InputError
from uvmlab.evaluate.estimators import EvalCase
from uvmlab.files.inputs import MAX_CSV_BYTES, check_input_file, loads_json, read_csv_rows, short
from uvmlab.trace.schema import NEVER_FREED, Trace
from uvmlab.units import GiB, parse_bytes

REQUIRED_COLUMNS = ("id", "source", "config", "gpu_memory", "measured_peak_bytes", "oom")
SNAPSHOT_SUFFIXES = (".pickle", ".pkl")
DEFAULT_SNAPSHOT_GPU_BYTES = 80 * GiB
"""Device memory assumed for real snapshots: their GPU is unrecorded; reference/allocator.md section 4.2 calls the
biggest ones 80 GB-class. Overridable with the ``gpu_memory`` column."""
MAX_WARM_FRACTION = 0.05
"""A snapshot whose trace starts with more reserved bytes than this fraction of its peak is not ground truth."""
_TRUE = {"1", "true", "yes", "y", "t"}
_FALSE = {"0", "false", "no", "n", "f", ""}


def _parse_bool(value: str, where: str) -> bool:
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise InputError(f"{where}: {short(value)} is not a yes/no value; write 1 or 0")


def _parse_number(value: str, where: str) -> float:
    v = value.strip()
    if not v:
        return math.nan
    try:
        return float(parse_bytes(v))
    except InputError:
        raise InputError(f"{where}: {short(value)} is not a byte count; write e.g. 8589934592 or 8GiB") from None


# -- snapshots ------------------------------------------------------------------------------------------------------


def _alloc_row(alloc_id: int, size: int, seq: int, phase: str, iteration: int, stream: int) -> dict[str, Any]:
    return {
        "alloc_id": alloc_id,
        "size_bytes": int(size),
        "alloc_seq": seq,
        "free_seq": NEVER_FREED,
        "category": "other",
        "phase": phase,
        "iteration": iteration,
        "op": "snapshot",
        "stream": int(stream),
    }


def snapshot_trace(snap: Any, device: int) -> tuple[Trace, dict[str, Any]]:
    """The Trace of ``device``'s alloc/free stream (see the module docstring) and facts about it.

    Facts: ``initial_blocks`` (live at the trace start, rebuilt), ``oom`` (an oom event was seen),
    ``oom_request_bytes``, ``events_after_oom`` (ignored).
    """
    ev = snap.events[snap.events["device"] == device].sort_values("index", kind="stable")
    actions = ev["action"].to_numpy()
    addrs = ev["address"].to_numpy()
    sizes = ev["size"].to_numpy()
    streams = ev["stream"].fillna(0).to_numpy()
    oom_pos = next((i for i, a in enumerate(actions) if a == "oom"), None)
    stop = len(actions) if oom_pos is None else oom_pos

    # pass 1: blocks live at the trace start (freed before being allocated in the trace, or live at the end
    # and never allocated in the trace)
    live: dict[int, int] = {}
    initial: dict[int, tuple[int, int]] = {}  # address -> (size, stream)
    for i in range(stop):
        a = actions[i]
        if a == "alloc":
            live[int(addrs[i])] = int(sizes[i])
        elif a == "free_completed":
            addr = int(addrs[i])
            if addr in live:
                del live[addr]
            elif addr not in initial:
                initial[addr] = (int(sizes[i]), int(streams[i]))
    if oom_pos is None:
        blocks = snap.blocks
        end_active = blocks[(blocks["device"] == device) & (blocks["state"] != "inactive")]
        for b in end_active.itertuples(index=False):
            addr = int(b.address)
            if addr not in live and addr not in initial:
                req = b.requested_size if not pd.isna(b.requested_size) else b.size
                initial[addr] = (int(req), 0)

    # pass 2: the trace
    rows: list[dict[str, Any]] = []
    by_addr: dict[int, int] = {}  # address -> row index of the live allocation
    seq = 0
    for addr in sorted(initial):
        size, stream = initial[addr]
        by_addr[addr] = len(rows)
        rows.append(_alloc_row(len(rows), size, seq, "setup", -1, stream))
        seq += 1
    for i in range(stop):
        a = actions[i]
        if a == "alloc":
            by_addr[int(addrs[i])] = len(rows)
            rows.append(_alloc_row(len(rows), int(sizes[i]), seq, "unknown", 0, int(streams[i])))
            seq += 1
        elif a == "free_completed":
            idx = by_addr.pop(int(addrs[i]), None)
            if idx is not None:
                rows[idx]["free_seq"] = seq
                seq += 1
    oom_request = None
    if oom_pos is not None:
        oom_request = int(sizes[oom_pos])
        rows.append(_alloc_row(len(rows), oom_request, seq, "unknown", 0, int(streams[oom_pos])))
    alloc = pd.DataFrame(rows, columns=list(_alloc_row(0, 0, 0, "", 0, 0)))
    if alloc.empty:
        from uvmlab.trace.schema import empty_table

        alloc = empty_table("allocations")
    header = {
        "workload": Path(snap.path).name,
        "source": "snapshot",
        "device": device,
        "notes": ["phases unknown for snapshot traces (phase 'unknown'; rebuilt start-of-trace blocks are 'setup')"],
    }
    trace = Trace(allocations=alloc.astype({"iteration": "int32", "stream": "int32"}), header=header)
    facts = {
        "initial_blocks": len(initial),
        "oom": oom_pos is not None,
        "oom_request_bytes": oom_request,
        "events_after_oom": 0 if oom_pos is None else len(actions) - oom_pos - 1,
    }
    return trace, facts


def snapshot_alloc_conf(snap: Any) -> str:
    """PYTORCH_CUDA_ALLOC_CONF recorded in the snapshot ('' when absent)."""
    settings = snap.allocator_settings or {}
    conf = settings.get("PYTORCH_CUDA_ALLOC_CONF") or ""
    if not conf and settings.get("expandable_segments"):
        conf = "expandable_segments:True"
    return str(conf)


def admissible(summary_row: dict[str, Any], max_warm: float = MAX_WARM_FRACTION) -> tuple[bool, str]:
    """Whether a snapshot device can be ground truth, and why not (``max_warm``: see ``MAX_WARM_FRACTION``)."""
    actions = summary_row["actions"]
    if not actions.get("alloc"):
        return False, "no alloc events in the trace (state-only snapshot)"
    peak = summary_row["peak_reserved_in_trace_bytes"]
    start = summary_row["reserved_at_trace_start_bytes"]
    if peak <= 0:
        return False, "nothing reserved"
    if start > max_warm * peak:
        return False, f"trace starts mid-run ({start / peak:.0%} of the peak already reserved)"
    return True, ""


def snapshot_case(
    path: str | Path,
    device: int | None = None,
    gpu_memory_bytes: int = DEFAULT_SNAPSHOT_GPU_BYTES,
    case_id: str | None = None,
    group: str = "",
) -> EvalCase:
    """An EvalCase from a real snapshot (one device; default: the device with the most trace events)."""
    from uvmlab.trace.snapshot import read_snapshot

    snap = read_snapshot(path)
    summary = {row["device"]: row for row in snap.summary()}
    if not summary:
        raise InputError(f"{path}: the snapshot has no devices")
    if device is None:
        device = max(summary, key=lambda d: (summary[d]["events"], -d))
    if device not in summary:
        raise InputError(f"{path}: no device {device} in the snapshot (devices: {sorted(summary)})")
    trace, facts = snapshot_trace(snap, device)
    row = summary[device]
    oom = bool(facts["oom"])
    peak = math.nan if oom else float(row["peak_reserved_in_trace_bytes"])
    name = Path(path).name
    case = EvalCase(
        case_id=case_id or f"{name}:{device}",
        gpu_memory_bytes=int(gpu_memory_bytes),
        oom=oom,
        measured_peak_bytes=peak,
        trace=trace,
        alloc_conf=snapshot_alloc_conf(snap),
        group=group or name.split("__")[0],
        source=str(path),
    )
    case.notes.append(f"{facts['initial_blocks']} blocks live at the trace start rebuilt")
    if oom:
        case.notes.append(
            f"oom request {facts['oom_request_bytes']} B; {facts['events_after_oom']} later events ignored"
        )
    return case


def snapshot_cases(
    directory: str | Path, gpu_memory_bytes: int = DEFAULT_SNAPSHOT_GPU_BYTES, max_warm: float = MAX_WARM_FRACTION
) -> tuple[list, list]:
    """Every admissible (snapshot, device) in ``directory``; returns (cases, skipped [(file:device, reason)]).

    ``max_warm`` (0-1) is the largest share of the peak already reserved when the trace began."""
    if not 0 <= max_warm <= 1:
        raise InputError(f"the warm-trace limit must be between 0 and 1, not {max_warm}")
    from uvmlab.trace.snapshot import read_snapshot

    folder = Path(directory)
    files = sorted(p for p in folder.iterdir() if p.suffix in SNAPSHOT_SUFFIXES)
    if not files:
        raise InputError(f"{folder} holds no snapshot files ({', '.join(SNAPSHOT_SUFFIXES)})")
    cases, skipped = [], []
    for f in files:
        try:
            snap = read_snapshot(f)
        except InputError as exc:
            skipped.append((f.name, str(exc)))
            continue
        for row in snap.summary():
            ok, why = admissible(row, max_warm)
            if not ok:
                skipped.append((f"{f.name}:{row['device']}", why))
                continue
            cases.append(snapshot_case(f, row["device"], gpu_memory_bytes))
    if not cases:
        first = f" (e.g. {skipped[0][0]}: {skipped[0][1]})" if skipped else ""
        raise InputError(f"{folder}: none of its {len(files)} snapshot files is usable ground truth{first}")
    return cases, skipped


# -- CSV ------------------------------------------------------------------------------------------------------------


def _workload_config(source: str, config: dict[str, Any], where: str) -> WorkloadConfig:
    known = set(WorkloadConfig.__dataclass_fields__) - {"workload"}
    unknown = set(config) - known
    if unknown:
        raise InputError(f"{where}: unknown config keys {sorted(unknown)}; known: {sorted(known)}")
    return WorkloadConfig(workload=source, **config)


def read_ground_truth(path: str | Path, allow_code: bool = False) -> list[EvalCase]:
    """Read a ground-truth CSV (module docstring) into EvalCases; errors name the row and the column.

    A ``source`` that is a workload file (Python) is refused unless ``allow_code`` (the CSV may come from anyone).
    """
    src = Path(path)
    if not src.exists():
        raise InputError(f"ground truth {src} not found; give a CSV file (columns: {', '.join(REQUIRED_COLUMNS)})")
    header, rows = read_csv_rows(
        src, MAX_CSV_BYTES, f"a ground-truth CSV file (columns: {', '.join(REQUIRED_COLUMNS)})"
    )
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise InputError(f"{src}: missing columns {missing}; required: {', '.join(REQUIRED_COLUMNS)}")
    if not rows:
        raise InputError(f"{src}: no runs (the CSV has a header but no rows)")
    cases: list[EvalCase] = []
    seen: set[str] = set()
    for n, row in enumerate(rows, start=2):
        where = f"{src} line {n}"
        cid = (row["id"] or "").strip()
        if not cid:
            raise InputError(f"{where}: empty id")
        if cid in seen:
            raise InputError(f"{where}: duplicate id {short(cid)}")
        seen.add(cid)
        source = (row["source"] or "").strip()
        if not source:
            raise InputError(f"{where}: empty source (a workload name, workload file, snapshot or trace directory)")
        raw = (row["config"] or "").strip()
        try:
            config = loads_json(raw, f"{where}: config") if raw else {}
        except json.JSONDecodeError as exc:
            raise InputError(f'{where}: config is not JSON ({exc.msg}); write e.g. {{"batch_size": 8}}') from None
        if not isinstance(config, dict):
            raise InputError(f"{where}: config must be a JSON object, not {short(raw)}")
        gpu_raw = (row["gpu_memory"] or "").strip()
        if not gpu_raw:
            raise InputError(f"{where}: gpu_memory is empty; write the device memory, e.g. 80GiB")
        gpu = int(_parse_number(gpu_raw, f"{where} column gpu_memory"))
        if gpu <= 0:
            raise InputError(f"{where}: gpu_memory must be > 0")
        oom = _parse_bool(row["oom"] or "", f"{where} column oom")
        peak = _parse_number(row["measured_peak_bytes"] or "", f"{where} column measured_peak_bytes")
        if not oom and (math.isnan(peak) or peak <= 0):
            raise InputError(f"{where}: measured_peak_bytes is required (> 0) for a run that did not go OOM")
        if oom:
            peak = math.nan  # xMem: no ground-truth peak after a real OOM
        r2o_raw = (row.get("round2_oom") or "").strip()
        r2o = _parse_bool(r2o_raw, f"{where} column round2_oom") if r2o_raw else None
        r2p = _parse_number(row.get("round2_peak_bytes") or "", f"{where} column round2_peak_bytes")
        group = (row.get("group") or "").strip()
        alloc_conf = (row.get("alloc_conf") or "").strip()
        src_path = Path(source)
        if not src_path.is_absolute():
            rel = src.parent / source
            if rel.exists():
                src_path = rel
        if src_path.suffix in SNAPSHOT_SUFFIXES:
            if not src_path.exists():  # anything but a regular file is refused by the reader, in its words
                raise InputError(f"{where}: snapshot {source} not found")
            dev = config.get("device")
            case = snapshot_case(src_path, None if dev is None else int(dev), gpu, case_id=cid, group=group)
            case.oom, case.measured_peak_bytes = oom, peak  # the CSV's measurement wins over the snapshot's
            if alloc_conf:
                case.alloc_conf = alloc_conf
        elif src_path.is_dir():
            from uvmlab.trace.schema import read_trace

            case = EvalCase(cid, gpu, oom, peak, trace=read_trace(src_path), alloc_conf=alloc_conf)
        else:
            from workloads.registry import WORKLOADS, is_path

            if source not in WORKLOADS and is_path(source) and not allow_code:
                raise InputError(
                    f"{where}: source {short(source)} is a Python workload file, and running code named by a CSV needs "
                    "--allow-code (pass it only if you trust this CSV)"
                )
            cfg = _workload_config(source, config, where)
            case = EvalCase(cid, gpu, oom, peak, workload=cfg, alloc_conf=alloc_conf)
        case.group = group or case.group or source
        case.source = source
        case.round2_oom = r2o
        case.round2_peak_bytes = None if math.isnan(r2p) else r2p
        cases.append(case)
    return cases


def write_ground_truth(cases: list[EvalCase], path: str | Path) -> None:
    """Write cases (e.g. from snapshots) as a ground-truth CSV that :func:`read_ground_truth` reads back."""
    from uvmlab.files.atomic import atomic_write_text

    lines = [",".join((*REQUIRED_COLUMNS, "group", "alloc_conf"))]
    for c in cases:
        device = c.trace.header.get("device") if c.trace is not None else None
        config = json.dumps({"device": device}) if device is not None else ""
        peak = "" if math.isnan(c.measured_peak_bytes) else str(int(c.measured_peak_bytes))
        oom = "1" if c.oom else "0"
        fields = [c.case_id, c.source, config, str(c.gpu_memory_bytes), peak, oom, c.group, c.alloc_conf]
        lines.append(",".join(_csv_field(f) for f in fields))
    atomic_write_text(path, "\n".join(lines) + "\n")


def _csv_field(value: str) -> str:
    if any(ch in value for ch in ',"\n'):
        return '"' + value.replace('"', '""') + '"'
    return value


def load_ground_truth(
    path: str | Path,
    gpu_memory_bytes: int = DEFAULT_SNAPSHOT_GPU_BYTES,
    max_warm: float = MAX_WARM_FRACTION,
    allow_code: bool = False,
) -> tuple[list[EvalCase], list[tuple[str, str]]]:
    """A CSV file (:func:`read_ground_truth`), a folder of snapshots (:func:`snapshot_cases`), the GPUMemNet A100
    MLP set (``uvmlab.evaluate.gpumemnet``), xMem's sample (``uvmlab.evaluate.xmem_sample``) or CARMA's A100 run
    summary (``uvmlab.evaluate.carma_runs``): (cases, skipped)."""
    from uvmlab.evaluate import carma_runs, gpumemnet, xmem_sample

    src = Path(path)
    if src.exists() and not src.is_dir():  # every file format here is a CSV: regular and bounded, before reading
        check_input_file(src, MAX_CSV_BYTES, "a ground-truth CSV file")
    if gpumemnet.is_mlp_set(src):
        rows, bad = gpumemnet.read_mlp_set(src)
        return gpumemnet.mlp_cases(rows), [(f"row {i}", why) for i, why in bad]
    if xmem_sample.is_xmem_sample(src):
        return xmem_sample.read_xmem_sample(src)
    if carma_runs.is_carma_summary(src):
        return carma_runs.read_carma_summary(src)
    if src.is_dir():
        return snapshot_cases(src, gpu_memory_bytes, max_warm)
    return read_ground_truth(src, allow_code=allow_code), []
