"""Run the evidence kit's plan and assemble its data sets: :func:`collect_evidence` (``uvmlab collect``).

Order: check the output folder (never an input; only the kit's own names are replaced, with ``force``), plan
(``uvmlab.measure.gpu.kit.plan``), refuse without a GPU (one sentence), take the folder's writer's lock, build the
shim when
the GCN runs under UVM, run every step (a failed step is recorded and the others still run), then assemble each data
set in the layout of ``uvmlab.measure.gpu.kit.layout`` from the steps' raw outputs, and write ``collect.json`` last.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from uvmlab.errors import InputError, UnavailableError
from uvmlab.files.atomic import atomic_write_json, atomic_write_text
from uvmlab.measure.gpu.detect import GpuStatus, gpu_status
from uvmlab.measure.gpu.kit import layout as L
from uvmlab.measure.gpu.kit.plan import CollectOptions, KitPlan, format_kit_plan, plan_collect

Progress = Callable[[str, int, int], None]
"""``progress(step name, done, total)`` after each step."""


def check_out(out: Path, force: bool) -> None:
    """The output folder may hold anything but the kit's own names (replaced only with ``force``)."""
    from uvmlab.files.outputs import check_output_folder

    check_output_folder(out, L.OWNED, force=force)
    snaps = sorted((out / L.SNAPSHOTS_DIR).glob(f"{L.SNAPSHOT_PREFIX}*")) if (out / L.SNAPSHOTS_DIR).is_dir() else []
    if snaps and not force:
        raise InputError(f"-o {out} already holds {snaps[0].name}; pass --force to replace the kit's files")


def _remove_owned(out: Path) -> None:
    from uvmlab.files.rundir import remove_owned

    for name in L.OWNED:
        p = out / name
        if p.exists() or p.is_symlink():
            remove_owned(p)
    if (out / L.SNAPSHOTS_DIR).is_dir():
        for p in (out / L.SNAPSHOTS_DIR).glob(f"{L.SNAPSHOT_PREFIX}*"):
            remove_owned(p)


def dry_run(opts: CollectOptions, out: Path | str, status: GpuStatus | None = None) -> dict[str, Any]:
    """The plan as a dict (``plan``: the printable text); works without a GPU; nothing runs or is written."""
    plan = plan_collect(opts, out, status=status)
    return {"dry_run": True, "plan": format_kit_plan(plan), **_plan_dict(plan)}


def _plan_dict(plan: KitPlan) -> dict[str, Any]:
    return {
        "gpu": plan.gpu_name,
        "gpu_source": plan.gpu_source,
        "total_bytes": plan.total_bytes,
        "free_bytes": plan.free_bytes,
        "factors": list(plan.factors),
        "nsys": plan.nsys,
        "notes": list(plan.notes),
        "seconds_estimate": plan.seconds,
        "steps": [
            {
                "name": s.step.name,
                "what": s.what,
                "argv": list(s.step.argv),
                "env": dict(s.step.env),
                "output": s.output,
            }
            for s in plan.steps
        ],
    }


def collect_evidence(
    opts: CollectOptions, out: Path | str, *, progress: Progress | None = None, status: GpuStatus | None = None
) -> dict[str, Any]:
    """Run the kit on this machine's GPU into ``out``; return collect.json's content (see the module docstring)."""
    from uvmlab.measure.gpu.runner import execute_step

    out = Path(out)
    check_out(out, opts.force)
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
        if opts.force:
            _remove_owned(out)
        if any(s.step.name.startswith("gcn-uvm") for s in plan.steps):
            from uvmlab.measure.gpu.shim import build_shim

            build_shim()
        logs = out / L.RAW / "logs"
        outcomes = []
        for i, ks in enumerate(plan.steps, 1):
            Path(ks.output).mkdir(parents=True, exist_ok=True)
            t0 = time.monotonic()
            try:
                rc = execute_step(ks.step, logs)
                error = None if rc == 0 else _tail(logs / f"{ks.step.name}.err")
            except UnavailableError as exc:
                rc, error = 127, str(exc)
            outcomes.append(
                {"name": ks.step.name, "what": ks.what, "rc": rc, "seconds": time.monotonic() - t0, "error": error}
            )
            if progress is not None:
                progress(ks.step.name, i, len(plan.steps))
        record = assemble(out, plan, status, outcomes)
    finally:
        lock.release()
    return record


def _tail(path: Path, lines: int = 3) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""


def _case_records(folder: Path) -> list[tuple[Path, dict[str, Any]]]:
    found = []
    for case_json in sorted(folder.glob("*/case.json")):
        try:
            found.append((case_json.parent, dict(json.loads(case_json.read_text()))))
        except json.JSONDecodeError:
            continue
    return found


def _meta(status: GpuStatus, plan: KitPlan, records: list[dict[str, Any]]) -> dict[str, Any]:
    first = records[0] if records else {}
    return {
        "gpu": status.name,
        "gpu_total_bytes": status.memory_bytes,
        "gpu_free_bytes_at_plan": plan.free_bytes,
        "driver": status.driver,
        "cuda_driver": status.cuda,
        **{k: first.get(k) for k in ("torch", "cuda", "cudnn", "cublas")},
    }


def assemble(out: Path, plan: KitPlan, status: GpuStatus, outcomes: list[dict[str, Any]]) -> dict[str, Any]:
    """Turn the steps' raw outputs into the data sets (layout module docstring) and write collect.json last."""
    from uvmlab import __version__

    raw = out / L.RAW
    sets: dict[str, Any] = {}
    records = [r for _d, r in _case_records(raw / "memory")]
    if records:
        sets["memory"] = _assemble_memory(out, raw / "memory", status, plan)
    if (raw / "cudnn").is_dir() and _case_records(raw / "cudnn"):
        sets["cudnn"] = _assemble_cudnn(out, raw / "cudnn", status, plan)
    if (raw / "uvm").is_dir():
        sets["uvm"] = _assemble_uvm(out, raw / "uvm", status, plan)
    if (raw / "link" / "timings.csv").is_file():
        d = out / L.LINK_DIR
        d.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(raw / "link" / "timings.csv", d / "timings.csv")
        L.write_meta(d, _meta(status, plan, []))
        sets["link"] = {"timings": len(pd.read_csv(d / "timings.csv"))}
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
    record = {
        "uvmlab": __version__,
        "gpu": status.to_dict(),
        "plan": _plan_dict(plan),
        "steps": outcomes,
        "failed_steps": [o["name"] for o in outcomes if o["rc"] != 0],
        "sets": sets,
    }
    atomic_write_json(out / L.RECORD, record)
    return record


def _assemble_memory(out: Path, folder: Path, status: GpuStatus, plan: KitPlan) -> dict[str, Any]:
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
    L.write_meta(d, _meta(status, plan, rows))
    if manifest:
        L.write_manifest(snaps, manifest)
    return {"cases": len(rows), "snapshots": len(manifest), "oom": sum(r.get("outcome") == "oom" for r in rows)}


def _assemble_cudnn(out: Path, folder: Path, status: GpuStatus, plan: KitPlan) -> dict[str, Any]:
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
    L.write_meta(d, _meta(status, plan, records))
    return {"cases": len(records), "calls": len(df), "workspace_allocations": len(ws)}


def _assemble_uvm(out: Path, folder: Path, status: GpuStatus, plan: KitPlan) -> dict[str, Any]:
    from uvmlab.measure.gpu.shim import managed_footprint_bytes, read_alloc_log

    d = out / L.UVM_DIR
    d.mkdir(parents=True, exist_ok=True)
    done: dict[str, Any] = {}
    if (folder / "streams.csv").is_file():
        shutil.copyfile(folder / "streams.csv", d / "streams.csv")
        done["streams"] = len(pd.read_csv(d / "streams.csv"))
    if (folder / "streams.sqlite").is_file():
        shutil.copyfile(folder / "streams.sqlite", d / "streams.sqlite")
        done["nsys_export"] = "streams.sqlite"
    gcn = 0
    for variant in ("uvm", "native"):
        for js in sorted((folder / "gcn" / variant).glob("*.json")):
            doc = json.loads(js.read_text())
            log = js.with_suffix(".alloc.bin")
            if variant == "uvm" and log.is_file():  # every tensor one managed allocation: the peak of live bytes
                doc["uvm_stats"] = {
                    **(doc.get("uvm_stats") or {}),
                    "peak_allocated_GB": managed_footprint_bytes(read_alloc_log(log)) / 1e9,
                }
            atomic_write_json(d / "gcn" / variant / js.name, doc)
            gcn += 1
    done["gcn_runs"] = gcn
    L.write_meta(d, {**_meta(status, plan, []), "factors_of_free_memory": list(plan.factors)})
    return done
