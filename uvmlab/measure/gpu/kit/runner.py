"""Run the evidence kit's plan and assemble its data sets: :func:`collect_evidence` (``uvmlab collect``).

Order: check the output folder (never an input; a folder the kit wrote before needs ``--resume`` or ``--force``),
plan (``uvmlab.measure.gpu.kit.plan``: the steps in value order that fit the budget), refuse without a GPU (one
sentence), take the folder's writer's lock, build the shim when a step preloads it, then run the steps in value
order. Each step:

* is skipped with ``--resume`` when a previous collection finished it (``raw/progress.json``), and when less than
  ``MIN_STEP_S`` of the budget is left;
* runs in its own process group, stopped at ``min(its cap, the time left in the budget)``
  (uvmlab.measure.gpu.runner.execute_step: SIGTERM then SIGKILL to the group, exit code 124);
* writes into ``<its folder>.partial``, which replaces ``<its folder>`` only when the step succeeds: a failed or
  killed step never removes or replaces a finished step's output, ``--force`` included (it reruns every step);
* is recorded in ``raw/progress.json`` at once (status, exit code, seconds, cap);
* has its data set assembled from the finished steps' folders right after it (layout module docstring), checked by
  reading it back (:func:`check_set`), and ``collect.json`` rewritten (``complete`` false until the last step).

So a collection stopped anywhere (a step at its cap, the budget, the machine) leaves valid data sets for the steps
that finished, and ``--resume`` continues with the rest. Every data set's ``meta.json`` and ``collect.json`` record
the machine it came from (uvmlab.measure.gpu.machine: gVisor or Firecracker, kernel release).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from uvmlab.errors import InputError, UnavailableError
from uvmlab.files.atomic import atomic_write_json, atomic_write_text
from uvmlab.files.inputs import MAX_DATA_FILE_BYTES, read_json_file
from uvmlab.measure.gpu.detect import GpuStatus, gpu_status
from uvmlab.measure.gpu.kit import layout as L
from uvmlab.measure.gpu.kit.plan import (
    MIN_STEP_S,
    STAGING_SUFFIX,
    CollectOptions,
    KitPlan,
    KitStep,
    format_kit_plan,
    plan_collect,
)

Progress = Callable[[str, int, int], None]
"""``progress(step name, done, total)`` after each step."""
PROGRESS = "progress.json"
"""``raw/progress.json``: every step's outcome so far (what ``--resume`` reads)."""
SET_OF = {"memory": "memory", "cudnn": "cudnn", "uvm": "uvm", "link": "link"}


def check_out(out: Path, force: bool, resume: bool = False) -> None:
    """The output folder may hold anything but the kit's own names (continued with ``resume``, rerun with
    ``force``)."""
    from uvmlab.files.outputs import check_output_folder

    try:
        check_output_folder(out, L.OWNED, force=force or resume)
    except InputError as exc:
        raise InputError(f"{exc} or --resume to continue that collection") from None
    snaps = sorted((out / L.SNAPSHOTS_DIR).glob(f"{L.SNAPSHOT_PREFIX}*")) if (out / L.SNAPSHOTS_DIR).is_dir() else []
    if snaps and not (force or resume):
        raise InputError(f"-o {out} already holds {snaps[0].name}; pass --resume to continue or --force to rerun")


def dry_run(opts: CollectOptions, out: Path | str, status: GpuStatus | None = None) -> dict[str, Any]:
    """The plan as a dict (``plan``: the printable text); works without a GPU; nothing runs or is written."""
    plan = plan_collect(opts, out, status=status)
    return {"dry_run": True, "plan": format_kit_plan(plan), **_plan_dict(plan)}


def _step_dict(s: KitStep) -> dict[str, Any]:
    return {
        "name": s.step.name,
        "what": s.what,
        "argv": list(s.step.argv),
        "env": dict(s.step.env),
        "output": s.output,
        "seconds_estimate": s.seconds,
        "cap_s": s.cap_s,
        "value": s.value,
        "settles": s.settles,
        "without_nsys": s.needs_nsys,
    }


def _plan_dict(plan: KitPlan) -> dict[str, Any]:
    return {
        "gpu": plan.gpu_name,
        "gpu_source": plan.gpu_source,
        "spec": plan.spec_name,
        "total_bytes": plan.total_bytes,
        "free_bytes": plan.free_bytes,
        "factors": list(plan.factors),
        "nsys": plan.nsys,
        "notes": list(plan.notes),
        "budget_s": plan.budget_s,
        "seconds_estimate": plan.seconds,
        "steps": [_step_dict(s) for s in plan.steps],
        "left_out": [_step_dict(s) for s in plan.left_out],
    }


def _read_progress(raw: Path) -> dict[str, Any]:
    path = raw / PROGRESS
    if not path.is_file():
        return {}
    doc = _json_of(path)
    return dict(doc.get("steps") or {}) if isinstance(doc, dict) else {}


def _finish_output(ks: KitStep) -> None:
    """The step succeeded: its staging folder replaces its output folder (the old one is removed only now)."""
    final, staging = Path(ks.output), Path(ks.staging)
    if not staging.is_dir():
        staging.mkdir(parents=True)
    old = final.with_name(final.name + ".replaced")
    if old.exists():
        shutil.rmtree(old)
    if final.exists():
        final.rename(old)
    staging.rename(final)
    if old.exists():
        shutil.rmtree(old)


def collect_evidence(
    opts: CollectOptions, out: Path | str, *, progress: Progress | None = None, status: GpuStatus | None = None
) -> dict[str, Any]:
    """Run the kit on this machine's GPU into ``out``; return collect.json's content (see the module docstring)."""
    from uvmlab.measure.gpu.machine import machine_facts
    from uvmlab.measure.gpu.runner import TIMED_OUT, execute_step

    out = Path(out)
    check_out(out, opts.force, opts.resume)
    if opts.dry_run:
        return dry_run(opts, out, status)
    status = gpu_status() if status is None else status
    if not status.available:
        raise UnavailableError(f"uvmlab collect needs an NVIDIA GPU: {status.reason}")
    plan = plan_collect(opts, out, status=status)
    out.mkdir(parents=True, exist_ok=True)
    from filelock import FileLock, Timeout

    lock = FileLock(str(out / ".uvmlab.lock"), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise InputError(f"another uvmlab process is writing {out}; wait for it or choose another folder") from None
    try:
        machine = machine_facts()
        if any("LD_PRELOAD" in s.step.env for s in plan.steps):
            from uvmlab.measure.gpu.shim import build_shim

            build_shim()
        raw = out / L.RAW
        logs = raw / "logs"
        raw.mkdir(parents=True, exist_ok=True)
        previous = _read_progress(raw) if opts.resume else {}
        record: dict[str, Any] = {}
        steps: dict[str, Any] = dict(previous)
        t0 = time.monotonic()
        deadline = t0 + opts.budget_s if opts.budget_s is not None else None
        for i, ks in enumerate(plan.steps, 1):
            name = ks.step.name
            done_before = previous.get(name, {}).get("status") == "done" and Path(ks.output).is_dir()
            left = None if deadline is None else deadline - time.monotonic()
            if done_before:
                steps[name] = {**previous[name], "resumed": "kept from the previous collection"}
            elif left is not None and left < MIN_STEP_S:
                steps[name] = {"status": "skipped: budget spent", "rc": None, "seconds": 0.0, "cap_s": ks.cap_s}
            else:
                cap = ks.cap_s if left is None else min(ks.cap_s, left)
                staging = Path(ks.staging)
                if staging.exists():
                    shutil.rmtree(staging)  # a killed earlier attempt's leftovers (the kit's own .partial folder)
                staging.mkdir(parents=True)
                t = time.monotonic()
                try:
                    rc = execute_step(ks.step, logs, timeout_s=cap)
                    error = None if rc == 0 else _tail(logs / f"{name}.err")
                except UnavailableError as exc:
                    rc, error = 127, str(exc)
                status_ = "done" if rc == 0 else ("killed at its cap" if rc == TIMED_OUT else "failed")
                if rc == 0:
                    _finish_output(ks)
                steps[name] = {"status": status_, "rc": rc, "seconds": round(time.monotonic() - t, 3),
                               "cap_s": round(cap, 1), "error": error}  # fmt: skip
            atomic_write_json(raw / PROGRESS, {"budget_s": opts.budget_s, "steps": steps})
            record = assemble(out, plan, status, steps, machine, sets_of=(ks.what,), complete=i == len(plan.steps))
            if progress is not None:
                progress(name, i, len(plan.steps))
        if not plan.steps:
            record = assemble(out, plan, status, steps, machine, sets_of=(), complete=True)
    finally:
        lock.release()
    return record


def _tail(path: Path, lines: int = 3) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""


def _case_records(folder: Path) -> list[tuple[Path, dict[str, Any]]]:
    """(folder, case.json) of every finished case under ``folder`` (never a step's ``.partial`` folder)."""
    found = []
    for case_json in sorted(folder.glob("*/case.json")):
        if case_json.parent.name.endswith((STAGING_SUFFIX, ".replaced")):
            continue
        doc = _json_of(case_json)
        if isinstance(doc, dict):
            found.append((case_json.parent, doc))
    return found


def _meta(status: GpuStatus, plan: KitPlan, records: list[dict[str, Any]], machine: dict[str, Any]) -> dict[str, Any]:
    first = records[0] if records else {}
    return {
        "gpu": status.name,
        "gpu_total_bytes": status.memory_bytes,
        "gpu_free_bytes_at_plan": plan.free_bytes,
        "driver": status.driver,
        "cuda_driver": status.cuda,
        **{k: first.get(k) for k in ("torch", "cuda", "cudnn", "cublas")},
        "runtime": (machine.get("virtualization") or {}).get("runtime"),
        "kernel_release": machine.get("kernel_release"),
    }


def _json_of(path: Path) -> Any:
    """The JSON in ``path`` (a file a step wrote; read through the one input reader), None when it cannot be read."""
    try:
        return read_json_file(path, MAX_DATA_FILE_BYTES, "a JSON file written by uvmlab collect")
    except InputError:
        return None


def check_set(out: Path, what: str) -> dict[str, Any]:
    """Read an assembled data set back as ``uvmlab validate`` will (its columns, its files): ``{"valid", "why"}``."""
    from uvmlab.measure.gpu.kit.cudnn_log import CALL_COLUMNS
    from uvmlab.measure.gpu.microbench import TIMING_COLUMNS, check_timings

    try:
        if what == "memory":
            runs = L.read_csv(out / L.MEMORY_DIR / "runs.csv", L.RUN_COLUMNS)
            missing = [f for f in runs["snapshot"].dropna() if not (out / L.SNAPSHOTS_DIR / str(f)).is_file()]
            if missing:
                return {"valid": False, "why": f"snapshot {missing[0]} is missing"}
        elif what == "cudnn":
            L.read_csv(out / L.CUDNN_DIR / "calls.csv", CALL_COLUMNS)
            L.read_csv(out / L.CUDNN_DIR / "workspaces.csv", L.WORKSPACE_COLUMNS)
        elif what == "uvm":
            if (out / L.UVM_DIR / "streams.csv").is_file():
                L.read_csv(out / L.UVM_DIR / "streams.csv", L.STREAM_COLUMNS)
        elif what == "link":
            check_timings(L.read_csv(out / L.LINK_DIR / "timings.csv", TIMING_COLUMNS))
    except InputError as exc:
        return {"valid": False, "why": str(exc)}
    return {"valid": True, "why": None}


def assemble(
    out: Path,
    plan: KitPlan,
    status: GpuStatus,
    steps: dict[str, Any],
    machine: dict[str, Any],
    sets_of: tuple[str, ...] = ("memory", "cudnn", "uvm", "link"),
    complete: bool = True,
) -> dict[str, Any]:
    """Turn the finished steps' raw outputs of the sets ``sets_of`` into their data sets (layout module docstring),
    read each back (:func:`check_set`), and rewrite collect.json (``complete``: the last step has run)."""
    from uvmlab import __version__

    raw = out / L.RAW
    previous = _json_of(out / L.RECORD) or {}
    sets: dict[str, Any] = dict(previous.get("sets") or {})
    for what in sets_of:
        built = None
        if what == "memory" and _case_records(raw / "memory"):
            built = _assemble_memory(out, raw / "memory", status, plan, machine)
        elif what == "cudnn" and _case_records(raw / "cudnn"):
            built = _assemble_cudnn(out, raw / "cudnn", status, plan, machine)
        elif what == "uvm" and (raw / "uvm").is_dir():
            built = _assemble_uvm(out, raw / "uvm", status, plan, machine)
        elif what == "link" and (raw / "link" / "timings.csv").is_file():
            d = out / L.LINK_DIR
            d.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(raw / "link" / "timings.csv", d / "timings.csv")
            L.write_meta(d, _meta(status, plan, [], machine))
            built = {"timings": len(pd.read_csv(d / "timings.csv"))}
        if built is not None:
            sets[what] = {**built, **check_set(out, what)}
    atomic_write_text(
        out / "README.md",
        L.README.format(
            gpu=status.name,
            driver=status.driver,
            cuda=status.cuda,
            version=__version__,
            date=time.strftime("%Y-%m-%d"),
            interval_ms=5,
            factors=", ".join(f"{f:g}" for f in plan.factors),
        ),
    )
    run_dirs = sorted((raw / "run").glob("*")) if (raw / "run").is_dir() else []
    runs = {
        p.name: _json_of(p / "result.json") or _json_of(p / "refused.json")
        for p in run_dirs
        if p.is_dir() and not p.name.endswith((STAGING_SUFFIX, ".replaced"))
    }
    record = {
        "uvmlab": __version__,
        "complete": complete,
        "gpu": status.to_dict(),
        "machine": machine,
        "runtime": (machine.get("virtualization") or {}).get("runtime"),
        "plan": _plan_dict(plan),
        "steps": [{"name": n, **v} for n, v in steps.items()],
        "failed_steps": [n for n, v in steps.items() if v.get("status") not in ("done", None)],
        "sets": sets,
        "facts": _json_of(raw / "facts" / "facts.json"),
        "probe": _json_of(raw / "probe" / "probe.json"),
        "runs": runs,
    }
    atomic_write_json(out / L.RECORD, record)
    return record


def _assemble_memory(
    out: Path, folder: Path, status: GpuStatus, plan: KitPlan, machine: dict[str, Any]
) -> dict[str, Any]:
    rows, manifest = [], []
    snaps = out / L.SNAPSHOTS_DIR
    for case_dir, r in _case_records(folder):
        r = {**r, "driver": status.driver}
        if r.get("snapshot") and (case_dir / r["snapshot"]).is_file():
            name = f"{L.SNAPSHOT_PREFIX}{r['case']}.pickle"
            snaps.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(case_dir / r["snapshot"], snaps / name)
            r["snapshot"] = name
            manifest.append(
                {
                    "file": name,
                    "source": "uvmlab collect",
                    "workload": r["workload"],
                    "batch_size": r["batch_size"],
                    "optimizer": r["optimizer"],
                    "cudnn_benchmark": r["cudnn_benchmark"],
                    "gpu": r.get("gpu_name"),
                    "torch": r.get("torch"),
                }
            )
        rows.append(r)
    d = out / L.MEMORY_DIR
    d.mkdir(parents=True, exist_ok=True)
    L.write_csv(d / "runs.csv", rows, L.RUN_COLUMNS)
    L.write_meta(d, _meta(status, plan, rows, machine))
    if manifest:
        L.write_manifest(snaps, manifest)
    return {"cases": len(rows), "snapshots": len(manifest), "oom": sum(r.get("outcome") == "oom" for r in rows)}


def _assemble_cudnn(
    out: Path, folder: Path, status: GpuStatus, plan: KitPlan, machine: dict[str, Any]
) -> dict[str, Any]:
    from uvmlab.measure.gpu.kit.cudnn_log import CALL_COLUMNS, parse_log

    d = out / L.CUDNN_DIR
    d.mkdir(parents=True, exist_ok=True)
    calls, spaces, records = [], [], []
    for case_dir, r in _case_records(folder):
        records.append(r)
        log = case_dir / "cudnn.log"
        if log.is_file():
            shutil.copyfile(log, d / f"{r['case']}.log")
            calls.append(parse_log(log, r["case"]))
        if (case_dir / "workspaces.csv").is_file():
            spaces.append(pd.read_csv(case_dir / "workspaces.csv"))
    df = pd.concat(calls, ignore_index=True) if calls else pd.DataFrame(columns=list(CALL_COLUMNS))
    L.write_csv(d / "calls.csv", df.to_dict("records"), CALL_COLUMNS)
    ws = pd.concat(spaces, ignore_index=True) if spaces else pd.DataFrame(columns=list(L.WORKSPACE_COLUMNS))
    L.write_csv(d / "workspaces.csv", ws.to_dict("records"), L.WORKSPACE_COLUMNS)
    L.write_csv(d / "runs.csv", [{**r, "driver": status.driver} for r in records], L.RUN_COLUMNS)
    L.write_meta(d, _meta(status, plan, records, machine))
    return {"cases": len(records), "calls": len(df), "workspace_allocations": len(ws)}


def _assemble_uvm(out: Path, folder: Path, status: GpuStatus, plan: KitPlan, machine: dict[str, Any]) -> dict[str, Any]:
    from uvmlab.measure.gpu.shim import managed_footprint_bytes, read_alloc_log

    d = out / L.UVM_DIR
    d.mkdir(parents=True, exist_ok=True)
    done: dict[str, Any] = {}
    if (folder / "streams" / "streams.csv").is_file():
        shutil.copyfile(folder / "streams" / "streams.csv", d / "streams.csv")
        done["streams"] = len(pd.read_csv(d / "streams.csv"))
    if (folder / "streams-export" / "streams.sqlite").is_file():
        shutil.copyfile(folder / "streams-export" / "streams.sqlite", d / "streams.sqlite")
        done["nsys_export"] = "streams.sqlite"
    gcn = 0
    for run in sorted((folder / "gcn").glob("*-f*")) if (folder / "gcn").is_dir() else []:
        variant = run.name.split("-f")[0]
        if run.name.endswith((STAGING_SUFFIX, ".replaced")) or variant not in ("uvm", "native"):
            continue
        for js in sorted(run.glob("[0-9]*.json")):
            doc = read_json_file(js, MAX_DATA_FILE_BYTES, "a GCN result of uvmlab collect (JSON)")
            if not isinstance(doc, dict):
                raise InputError(f"{js} holds no JSON object; is it a GCN result of uvmlab collect?")
            log = run / "gcn.alloc.bin"
            if variant == "uvm" and log.is_file():  # every tensor one managed allocation: the peak of live bytes
                doc["uvm_stats"] = {
                    **(doc.get("uvm_stats") or {}),
                    "peak_allocated_GB": managed_footprint_bytes(read_alloc_log(log)) / 1e9,
                }
            doc["sizing"] = _json_of(run / "sizing.json")
            atomic_write_json(d / "gcn" / variant / js.name, doc)
            gcn += 1
    done["gcn_runs"] = gcn
    L.write_meta(d, {**_meta(status, plan, [], machine), "factors_of_free_memory": list(plan.factors)})
    return done
