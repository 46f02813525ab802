"""Turn what the GPU steps left in RUNDIR/logs into the run directory simulation mode writes.

Inputs: ``<role>.worker.json`` and ``<role>.samples.parquet`` (uvmlab.measure.gpu.worker), ``<role>.alloc.bin`` (the
shim),
``profile.sqlite`` (nsys export, when ``--nsys``). Outputs:

* ``tables/iterations``: from the nsys export's NVTX ranges (``uvmlab.measure.nsys.measured.to_run_tables``) when
there is
  one, with fault and migration columns; otherwise from the worker's wall times, fault columns null
  (not collected).
* ``tables/kernels``, ``tables/migrations``: from the export only.
* ``tables/memory``: the export's alloc/free log (the balloon's allocations excluded), else the worker's samples
  (``allocated_bytes`` = torch.cuda.memory_allocated, ``reserved_bytes`` = memory_reserved; with the caching
  allocator off those read 0, so both are the shim log's live managed bytes at the sample's time;
  ``resident_bytes`` null: NVML's used memory includes the balloon and the context, it is kept as
  ``nvml_used_bytes``).
* ``tables/shim_allocations``: every shim log record of every step, with a ``role`` column.
* ``result.json``: RESULT_KEYS with ``mode = "gpu"``; ``native_time_ns`` = the ``--baseline`` run's iteration time
  (same job, same PCA setting, no UVM; mean over iterations after the first), ``slowdown_vs_native`` = iteration
  time / that; ``native_pca_time_ns`` / ``slowdown_vs_native_pca`` the same against the baseline with PCA on (the
  study's reference: set when this run has PCA on, else null: that baseline was not run). Peak allocated/reserved
  with the caching allocator off: the shim log's peak live managed bytes. Plus a ``gpu_run`` block with the
  balloon plan, what the shim actually reserved, and ``effective``: the factor the run really had
  (:func:`effective_factor`: the run's own peak of live managed bytes over the capacity UVM had).
"""

from __future__ import annotations

import bisect
import json
import math
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pandas as pd

from uvmlab.config import RunConfig
from uvmlab.errors import InputError
from uvmlab.measure.gpu.detect import GpuStatus
from uvmlab.measure.gpu.plan import dropped_from
from uvmlab.stats.schema import FAULT_COLUMNS, ITERATION_COLUMNS, MEMORY_COLUMNS, RESULT_KEYS, steady_mean

RESULT_SCHEMA_VERSION = 1


def tool_version(argv: list[str]) -> str | None:
    """First line of ``argv`` (e.g. ``nsys --version``); None if the program is absent or fails."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (proc.stdout or proc.stderr).strip()
    return text.splitlines()[0] if text and proc.returncode == 0 else None


def read_worker(logs: Path, role: str) -> dict[str, Any] | None:
    """The worker's JSON for ``role`` (None if that step did not run)."""
    path = logs / f"{role}.worker.json"
    if not path.is_file():
        return None
    try:
        return dict(json.loads(path.read_text()))
    except json.JSONDecodeError as exc:
        raise InputError(f"{path} is not valid JSON ({exc.msg}); the worker was interrupted") from None


def mean_iteration_ns(worker: dict[str, Any] | None) -> float | None:
    """Mean iteration wall time after the first (warm-up) iteration; the only one if there is one."""
    if not worker or not worker.get("iterations"):
        return None
    return steady_mean([it["duration_ns"] for it in worker["iterations"]])


def iterations_from_worker(worker: dict[str, Any]) -> pd.DataFrame:
    """The iterations table from wall times; fault and migration columns null (not collected without nsys)."""
    df = pd.DataFrame(worker.get("iterations") or [], columns=["iteration", "start_ns", "end_ns", "duration_ns"])
    for c in FAULT_COLUMNS:
        df[c] = pd.Series([float("nan")] * len(df), dtype="float64")
    return df[list(ITERATION_COLUMNS)]


def memory_from_samples(path: Path) -> pd.DataFrame:
    """The memory table from the worker's samples (resident_bytes null; NVML used memory kept as an extra)."""
    s = pd.read_parquet(path) if path.is_file() else pd.DataFrame()
    out = pd.DataFrame(
        {
            "time_ns": s.get("time_ns", pd.Series([], dtype="int64")),
            "allocated_bytes": s.get("allocated_bytes", pd.Series([], dtype="float64")),
            "reserved_bytes": s.get("reserved_bytes", pd.Series([], dtype="float64")),
            "resident_bytes": pd.Series([float("nan")] * len(s), dtype="float64"),
        }
    )
    if "nvml_used_bytes" in s:
        out["nvml_used_bytes"] = s["nvml_used_bytes"]
    return out[list(MEMORY_COLUMNS) + [c for c in out.columns if c not in MEMORY_COLUMNS]]


def live_bytes_at(log: pd.DataFrame, times_ns: Any, ops: tuple[str, ...] = ("malloc", "pluggable_malloc")) -> list[int]:
    """Live bytes of the ``ops`` allocations (minus their frees) at each of ``times_ns`` (the log's clock)."""
    ok = log[log["result"] == 0]
    live: dict[int, int] = {}
    t_events: list[int] = []
    level: list[int] = []
    current = 0
    for t, op, ptr, size in zip(ok["time_ns"], ok["op"], ok["ptr"], ok["size_bytes"], strict=True):
        if op in ops and size > 0:
            live[int(ptr)] = int(size)
            current += int(size)
        elif op in ("free", "pluggable_free"):
            current -= live.pop(int(ptr), 0)
        else:
            continue
        t_events.append(int(t))
        level.append(current)
    out = []
    for t in times_ns:
        i = bisect.bisect_right(t_events, int(t)) - 1
        out.append(level[i] if i >= 0 else 0)
    return out


def peak_live_bytes(log: pd.DataFrame, role: str, ops: tuple[str, ...]) -> int | None:
    """Peak live bytes of ``role``'s ``ops`` allocations in the shim log (None when the role left no log)."""
    from uvmlab.measure.gpu.shim import managed_footprint_bytes

    if log.empty or not (log["role"] == role).any():
        return None
    part = log[log["role"] == role]
    if ops != ("malloc", "pluggable_malloc"):
        part = part.assign(op=part["op"].replace({o: "malloc" for o in ops}))
    return managed_footprint_bytes(part)


def effective_factor(
    run: dict[str, Any],
    balloon_plan: Any,
    tolerance: float,
    footprint_bytes: int | None = None,
    left_bytes: int | None = None,
) -> dict[str, Any]:
    """The UVM capacity the run really had and the factor that gives, from the worker's capacity probe.

    ``capacity = free + live managed``, measured after the job's memory was released (worker docstring): UVM fills
    every free 2 MiB root chunk before it evicts one of its own (uvmlab.measure.gpu.balloon, "What UVM can use":
    ``block_alloc_gpu_chunk`` in uvm_va_block.c, best-effort PMA batches in uvm_pmm_gpu.c ``alloc_root_chunk``), so
    the free memory the balloon left, reserve included, is UVM's, less what non-UVM allocations took after the
    balloon; managed bytes still live are counted as usable (they may be resident). ``achieved = footprint /
    capacity`` where the footprint is ``footprint_bytes``, the peak of live managed bytes the run's own shim log
    measured (the job's real size), or, without a log, the plan's footprint (the estimate: said in
    ``footprint_source``). ``ok`` is False when it is more than ``tolerance`` (relative) from the requested factor.
    ``left_bytes`` (free memory the shim measured minus its balloon) gives ``non_uvm_after_balloon_bytes`` =
    ``left - capacity``: what the process took outside UVM after the balloon.
    [approximation] Freed managed memory shows as free because UVM returns free 2 MiB root chunks to PMA
    (open-gpu-kernel-modules df1c9a3, uvm_pmm_gpu.c ``free_chunk`` -> ``free_next_available_root_chunk``); chunks
    it kept would bias the measured capacity down: the probe reads free memory until two reads agree
    (``free_settled`` says whether they did, and the message says so when not).
    Bounds, not one number, when managed bytes are still live at the probe: only resident ones occupy the GPU, and
    no CUDA call says how many are, so the capacity lies between ``free`` (all of them resident) and ``free +
    live`` (none): ``measured_available_lower_bytes`` / ``measured_available_bytes``, ``achieved_oversub_bounds``;
    ``ok`` is True when both ends are within the tolerance, False when both are off on the same side, else None
    (the message says the factor is bounded, not measured). Before, every live byte was counted as resident.
    """
    probes = run.get("capacity_probe") or []
    final = probes[-1] if probes else None
    measured_fp = footprint_bytes is not None and footprint_bytes > 0
    footprint = int(footprint_bytes) if measured_fp else int(balloon_plan.footprint_bytes)
    out: dict[str, Any] = {
        "requested_oversub": balloon_plan.oversub,
        "planned_available_bytes": balloon_plan.available_bytes,
        "measured_available_bytes": None,
        "footprint_bytes": footprint,
        "planned_footprint_bytes": balloon_plan.footprint_bytes,
        "footprint_source": "the run's shim log (peak live managed bytes)"
        if measured_fp
        else "the plan (no shim log of the run: not measured)",
        "non_uvm_after_balloon_bytes": None,
        "achieved_oversub": None,
        "deviation": None,
        "tolerance": tolerance,
        "ok": None,
        "probes": probes,
        "method": "footprint / (free + live managed), after the job's memory was released (uvmlab.measure.gpu.worker)",
        "message": None,
    }
    if final is None or final.get("live_managed_bytes") is None:
        out["message"] = "not measured: the run left no capacity probe with the shim's counters"
        return out
    free, live = int(final["free_bytes"]), int(final["live_managed_bytes"])
    capacity = free + live
    out["measured_available_bytes"] = capacity
    out["measured_available_lower_bytes"] = free
    out["capacity_bounded"] = live > 0
    out["free_settled"] = final.get("settled")
    if left_bytes is not None:
        out["non_uvm_after_balloon_bytes"] = int(left_bytes) - capacity
    if capacity <= 0:
        out.update(ok=False, achieved_oversub=math.inf)
        out["message"] = (
            f"WARNING: the run had no UVM capacity left ({capacity} B) instead of "
            f"{balloon_plan.available_bytes} B: its figures are not those of factor {balloon_plan.oversub:g}"
        )
        return out
    achieved = footprint / capacity
    deviation = achieved / balloon_plan.oversub - 1.0
    out.update(achieved_oversub=achieved, deviation=deviation, ok=abs(deviation) <= tolerance)
    unsettled = (
        ""
        if final.get("settled") is not False
        else f"; free memory was still changing over {len(final.get('free_reads') or [])} reads (freed chunks may not "
        "all be back: the capacity may be higher)"
    )
    if live > 0:  # live managed bytes may or may not occupy the GPU: the capacity is bounded, not measured
        high = footprint / free if free > 0 else math.inf
        out["achieved_oversub_bounds"] = [achieved, high]
        dev_high = high / balloon_plan.oversub - 1.0
        inside = abs(deviation) <= tolerance and abs(dev_high) <= tolerance
        same_side = (deviation > tolerance and dev_high > tolerance) or (
            deviation < -tolerance and dev_high < -tolerance
        )
        out["ok"] = True if inside else (False if same_side else None)
        if out["ok"] is None:
            out["message"] = (
                f"the run's factor lies between {achieved:.3f} and {high:.3f} (requested {balloon_plan.oversub:g}): "
                f"{live} B of managed memory were still live at the probe and may or may not occupy the GPU "
                f"(capacity between {free} and {capacity} B){unsettled}"
            )
            return out
    if out["ok"] and unsettled:
        out["message"] = f"the run's factor {achieved:.3f} was read before free memory settled{unsettled}"
    if not out["ok"]:
        out["message"] = (
            f"WARNING: the run's measured factor is {achieved:.3f}, not the requested {balloon_plan.oversub:g} "
            f"({deviation:+.1%}; footprint {footprint} B, UVM had {capacity} B instead of "
            f"{balloon_plan.available_bytes} B): its figures are those of the measured factor"
        )
    return out


def cudnn_engines(logs: Path, roles: tuple[str, ...] = ("baseline", "run")) -> dict[str, Any] | None:
    """The cuDNN engines (or legacy algorithms) each step's warm-up chose, from ``logs/<role>.cudnn.log``
    (uvmlab.measure.gpu.kit.cudnn_log), in call order, and whether the steps chose the same; None without logs."""
    from uvmlab.measure.gpu.kit.cudnn_log import parse_log

    found: dict[str, list[str]] = {}
    for role in roles:
        path = logs / f"{role}.cudnn.log"
        if path.is_file():
            calls = parse_log(path, role)
            found[role] = [str(a) for a in calls["algo"].dropna()]
    if not found:
        return None
    out: dict[str, Any] = {r: {"choices": len(v), "distinct": sorted(set(v))} for r, v in found.items()}
    if len(found) == len(roles):
        a, b = (found[r] for r in roles)
        first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
        out["same"] = a == b
        out["first_difference"] = first if first is not None or len(a) == len(b) else min(len(a), len(b))
    return out


def shim_allocations(logs: Path) -> pd.DataFrame:
    """Every step's shim log, with a ``role`` column."""
    from uvmlab.measure.gpu.shim import read_alloc_log

    frames = []
    for path in sorted(logs.glob("*.alloc.bin")):
        df = read_alloc_log(path)
        df.insert(0, "role", path.name.split(".")[0])
        frames.append(df)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def balloon_pieces(allocs: pd.DataFrame, role: str = "run") -> list[tuple[int, int]]:
    """(address, bytes) of the balloon allocations the shim made in ``role``: not the job's memory, so an nsys
    export of the run must not count them (uvmlab.measure.nsys.read.Export ``exclude_allocations``)."""
    if allocs.empty:
        return []
    b = allocs[(allocs["role"] == role) & (allocs["op"] == "balloon_alloc") & (allocs["result"] == 0)]
    return [(int(p), int(n)) for p, n in zip(b["ptr"], b["size_bytes"], strict=True) if int(n) > 0]


def balloon_actual(allocs: pd.DataFrame, role: str = "run") -> dict[str, Any]:
    """What the shim reserved in ``role``: balloon bytes, free memory it measured before, and the CUDA result."""
    if allocs.empty:
        return {"balloon_bytes": None, "free_before_bytes": None, "result": None}
    b = allocs[(allocs["role"] == role) & (allocs["op"] == "balloon_alloc")]
    if b.empty:
        return {"balloon_bytes": 0, "free_before_bytes": None, "result": None}
    ok = b[b["result"] == 0]
    free_before = int(b["arg"].iloc[0])
    return {
        "balloon_bytes": int(ok["size_bytes"].sum()),
        "free_before_bytes": free_before if free_before >= 0 else None,
        "result": int(b["result"].iloc[0]),
    }


def collect_run(cfg: RunConfig, opts: Any, plan: Any, rundir: Any, status: GpuStatus) -> dict[str, Any]:
    """Write tables, env.json and (last) result.json of a finished GPU run; return the result."""
    logs: Path = rundir.logs
    run = read_worker(logs, "run")
    if run is None:
        raise InputError(f"{logs}/run.worker.json is missing: the run step did not finish")
    baseline = read_worker(logs, "baseline")
    allocs = shim_allocations(logs)
    if not allocs.empty:
        rundir.write_table("shim_allocations", allocs)
    export = logs / "profile.sqlite"
    nsys_result: dict[str, Any] = {}
    if export.is_file():
        from uvmlab.measure.nsys.measured import result_of, to_run_tables
        from uvmlab.measure.nsys.read import open_export
        from uvmlab.measure.nsys.stats import summarize

        with open_export(export, exclude_allocations=balloon_pieces(allocs)) as ex:
            summary = summarize(ex)
            tables = to_run_tables(ex, summary=summary)
            nsys_result = result_of(ex, summary, tables)
        for name, df in tables.items():
            rundir.write_table(name, df)
    else:
        rundir.write_table("iterations", iterations_from_worker(run))
        memory = memory_from_samples(logs / "run.samples.parquet")
        if not cfg.pca and not allocs.empty and len(memory):
            # caching allocator off: PyTorch's counters read 0; every tensor is one managed allocation in the log
            live = live_bytes_at(allocs[allocs["role"] == "run"], memory["time_ns"])
            memory["allocated_bytes"] = pd.Series(live, dtype="float64")
            memory["reserved_bytes"] = pd.Series(live, dtype="float64")
        rundir.write_table("memory", memory)

    b = plan.balloon
    it_ns = mean_iteration_ns(run)
    base_ns = mean_iteration_ns(baseline)
    peak_alloc, peak_res = run.get("peak_allocated_bytes"), run.get("peak_reserved_bytes")
    measured = peak_live_bytes(allocs, "run", ("malloc", "pluggable_malloc"))  # the run's own footprint
    if not cfg.pca:
        peak_alloc = peak_res = measured  # unknown (null) without a shim log, never PyTorch's 0
    from uvmlab.measure.gpu.plan import FACTOR_TOLERANCE

    actual = balloon_actual(allocs)
    left = None
    if actual["free_before_bytes"] is not None and actual["balloon_bytes"] is not None:
        left = actual["free_before_bytes"] - actual["balloon_bytes"]
    effective = effective_factor(run, b, FACTOR_TOLERANCE, footprint_bytes=measured, left_bytes=left)
    res: dict[str, Any] = dict.fromkeys(RESULT_KEYS)
    res.update(
        schema_version=RESULT_SCHEMA_VERSION,
        mode="gpu",
        outcome=run["outcome"],
        error=run["error"],
        workload=cfg.workload.workload,
        pca=cfg.pca,
        oversub=cfg.oversub,
        gpu=plan.gpu_name,
        footprint_bytes=b.footprint_bytes,
        available_bytes=b.available_bytes,
        peak_allocated_bytes=peak_alloc,
        peak_reserved_bytes=peak_res,
        iterations=len(run.get("iterations") or []),
        iteration_time_ns=it_ns,
        total_time_ns=sum(i["duration_ns"] for i in run.get("iterations") or []) or None,
        native_time_ns=base_ns,
        slowdown_vs_native=(it_ns / base_ns) if it_ns and base_ns else None,
        native_pca_time_ns=base_ns if cfg.pca else None,
        slowdown_vs_native_pca=(it_ns / base_ns) if it_ns and base_ns and cfg.pca else None,
    )
    achieved = effective["achieved_oversub"]
    # the factor the run really had (simulation mode writes the same key: the factor it simulated)
    res["effective_oversub"] = achieved if achieved is not None and math.isfinite(achieved) else None
    for c in FAULT_COLUMNS:
        res[c] = nsys_result.get(c)
    res["regime"] = nsys_result.get("regime")  # from the export's UM migrations (uvmlab.uvm.regime); null without
    res["gpu_run"] = {
        "footprint_source": plan.footprint_source,
        "balloon_plan": b.to_dict(),
        "balloon_actual": actual,
        "effective": effective,
        "nsys": nsys_result.get("nsys"),
        "cudnn_engines": cudnn_engines(logs),
        "reported_free_bytes": (run.get("env") or {}).get("UVMLAB_REPORT_FREE_BYTES"),
        "balloon_after_warmup": run.get("balloon_after_warmup"),
        "nvtx_ranges": run.get("nvtx_ranges"),
        "machine": run.get("machine"),
        "timing_note": "iteration times include nsys tracing overhead (UM fault tracing is costly); the baseline "
        "ran without nsys: for timing and slowdown, run without --nsys"
        if opts.nsys
        else None,
    }
    rundir.write_json(
        rundir.env_json,
        {
            "gpu": status.to_dict(),
            "torch": run.get("torch"),
            "torch_cuda": run.get("torch_cuda"),
            "device_name": run.get("device_name"),
            "worker_env": run.get("env"),
            "PYTORCH_CUDA_ALLOC_CONF": plan.alloc_conf,
            "dropped_env": dropped_from(os.environ),
            "nsys_version": tool_version([opts.nsys_path, "--version"]) if opts.nsys else None,
        },
    )
    rundir.write_json(rundir.result_json, res)
    return res
