r"""Fit the native kernel-time classes on real Nsight Systems kernel tables (``uvmlab calibrate --kernels``).

An nsys export times every kernel (``CUPTI_ACTIVITY_KIND_KERNEL``: name, grid, block, start, end) and memset
(``CUPTI_ACTIVITY_KIND_MEMSET``), and names its GPU (``TARGET_INFO_GPU``: name, DRAM bandwidth, SMs). It does not say
what a kernel computes. A **kernel work file** (CSV, :data:`WORK_COLUMNS`) does, one row per kind of kernel:

``export``, ``kernel``
    the export's file name and a regular expression on the kernel's name (short or demangled; ``\[CUDA memset\]``
    for memsets); ``grid`` (optional, ``GXxGYxGZ``; for a memset its size, ``NB``) narrows it to one launch shape;
``class``
    the rule it tests (uvmlab.sim.uvm.kernel_class): ``gemm``, ``memory``, ``sector``, ``index``, ``serial``, or
    ``launch`` (a launch whose work is negligible: the floor ``kernel_min_ns``) and ``cta`` (a grid of mostly idle
    threads: ``cta_dispatch_ns``);
``flops``, ``bytes``, ``dtype``
    its work, from the program's source (the ``note`` says how);
``split``
    ``fit`` (the declared subset the class's constant is fitted on), ``validate`` (predicted with the fitted
    constants and compared) or ``exclude`` (reported with the ``note``, e.g. a kernel whose work is data-dependent);
``uvm``
    what to do with a kernel that has Unified Memory faults or migrations inside it (not a native time):
    ``exclude`` (default) or ``subtract`` (its UM migrations' durations are removed: a kernel that waits for every
    migration, such as a single-thread loop; an approximation).

Fits (median over the fit subset, each class on its own): ``gemm_efficiency`` = FLOPs / (peak of the dtype's math
unit x time); ``memory_efficiency`` / ``sector_memory_efficiency`` / ``index_memory_efficiency`` = bytes / (DRAM
peak x time); ``warp_trip_ns`` = time x resident warps x request bytes / bytes; ``kernel_min_ns`` = time;
``cta_dispatch_ns`` = time / ceil(CTAs / SMs). A row whose measured time is below what the GPU's peak allows for its
declared work is refused with that reason (the declared work is not what ran). Every fit and validation row is then
predicted through the simulator's own rules (``kernel_class.native_times``) with the fitted constants: one path.

The GPU of an export is the listed GPU its name matches (``uvmlab.gpus.known_gpu``) with the export's own DRAM
bandwidth and SM count; a GPU not in the list takes those two from the export and refuses the FLOP-bound classes.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import asdict, dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from uvmlab.errors import InputError
from uvmlab.files.atomic import atomic_write_json
from uvmlab.files.inputs import csv_text_rows, read_input_text
from uvmlab.gpus import DEFAULT_GPU, GPUS, GpuSpec, custom_gpu, known_gpu
from uvmlab.measure.nsys import schema as S
from uvmlab.measure.nsys.read import Export, open_export
from uvmlab.numbers import parse_float
from uvmlab.sim.uvm.kernel_class import KernelWork, math_peak, native_times, serial_rate
from uvmlab.sim.uvm.timing import PARAMS_SCHEMA_VERSION, CostParams

WORK_COLUMNS = ("export", "kernel", "grid", "class", "flops", "bytes", "dtype", "split", "uvm", "note")
FIT_CLASSES = ("gemm", "memory", "sector", "index", "serial", "launch", "cta")
CLASS_PARAM = {
    "gemm": "gemm_efficiency",
    "memory": "memory_efficiency",
    "sector": "sector_memory_efficiency",
    "index": "index_memory_efficiency",
    "serial": "warp_trip_ns",
    "launch": "kernel_min_ns",
    "cta": "cta_dispatch_ns",
}
"""The CostParams field each class's fit sets."""
MEMSET_NAME = "[CUDA memset]"
MAX_WORK_BYTES = 4 * 1024 * 1024
SHIPPED_WORK = "nsys_kernel_work.csv"
"""The work file of the real exports in ../shared/real-data/nsys (package data of uvmlab.measure)."""


@dataclass(frozen=True)
class WorkRow:
    """One row of a kernel work file (module docstring)."""

    export: str
    kernel: str
    grid: str
    cls: str
    flops: float
    nbytes: float
    dtype: str
    split: str
    uvm: str
    note: str


@dataclass
class Measured:
    """The launches of one work row in one export: their durations and launch shape."""

    row: WorkRow
    gpu: GpuSpec
    durations_ns: np.ndarray
    threads: int
    ctas: int
    excluded: int = 0
    """Launches left out (UM activity inside)."""


def read_work(path: str | os.PathLike[str] | None = None) -> list[WorkRow]:
    """The rows of a kernel work file (default: the shipped one for the real exports)."""
    if path is None:
        text = resources.files("uvmlab.measure").joinpath(SHIPPED_WORK).read_text()
        where = f"uvmlab/measure/{SHIPPED_WORK}"
    else:
        text = read_input_text(Path(path), MAX_WORK_BYTES, "a kernel work file (CSV)")
        where = str(path)
    header, numbered = csv_text_rows(text, where, "a kernel work file (CSV)", comment="#")
    missing = [c for c in ("export", "kernel", "class", "split") if c not in header]
    if missing:
        raise InputError(f"kernel work file {where} lacks columns {missing}; columns: {', '.join(WORK_COLUMNS)}")
    rows = []
    for n, r in numbered:
        cls, split, uvm = r["class"].strip(), r["split"].strip(), (r.get("uvm") or "exclude").strip()
        if cls not in FIT_CLASSES or split not in ("fit", "validate", "exclude") or uvm not in ("exclude", "subtract"):
            raise InputError(
                f"kernel work file {where} line {n}: class must be one of {', '.join(FIT_CLASSES)}, split fit / "
                f"validate / exclude, uvm exclude / subtract (got {cls!r}, {split!r}, {uvm!r})"
            )
        at = f"kernel work file {where} line {n}"
        flops = parse_float(r.get("flops") or 0, f"{at}: flops", lo=0.0)
        nbytes = parse_float(r.get("bytes") or 0, f"{at}: bytes", lo=0.0)
        try:
            re.compile(r["kernel"])
        except re.error as exc:
            raise InputError(f"{at}: {exc}") from None
        rows.append(
            WorkRow(
                r["export"].strip(), r["kernel"], (r.get("grid") or "").strip(), cls, flops, nbytes,
                (r.get("dtype") or "fp32").strip(), split, uvm, (r.get("note") or "").strip(),
            )
        )  # fmt: skip
    return rows


def export_gpu(ex: Export) -> GpuSpec:
    """The GPU of an export (module docstring)."""
    if not ex.has("TARGET_INFO_GPU"):
        raise InputError(f"{ex.path}: no TARGET_INFO_GPU table, so its GPU is unknown")
    name, bw, sms = ex.query("SELECT name, memoryBandwidth, smCount FROM TARGET_INFO_GPU LIMIT 1")[0]
    listed = known_gpu(str(name))
    fields: dict[str, Any] = {"name": str(name)}
    if bw:
        fields["hbm_bytes_per_s"] = float(bw)
    if sms:
        fields["sm_count"] = int(sms)
    base = GPUS[listed or DEFAULT_GPU]
    gpu = custom_gpu(base, fields)
    if listed is None:  # its FLOP rates are unknown: no FLOP-bound class on it
        gpu = replace(gpu, fp32_flops=math.nan, tensor_flops=math.nan, fp64_flops=math.nan, arch="")
    return gpu


def _launches(ex: Export) -> list[tuple[str, str, int, int, float, float]]:
    """(name, grid, threads, ctas, start, end) of every kernel and memset of the export."""
    out = []
    if ex.has(S.KERNEL):
        t = S.KERNEL
        rows = ex.query(
            f'SELECT start, "end", gridX, gridY, gridZ, blockX, blockY, blockZ, {ex.col(t, "shortName")}, '
            f'{ex.col(t, "demangledName")} FROM "{t}" ORDER BY start'
        )
        ids = [r[8] for r in rows] + [r[9] for r in rows]
        names = ex.strings([i for i in ids if i is not None])
        for r in rows:
            name = " ".join(x for x in (names.get(r[8]), names.get(r[9])) if x)
            ctas = int(r[2] * r[3] * r[4])
            out.append((name, f"{r[2]}x{r[3]}x{r[4]}", ctas * int(r[5] * r[6] * r[7]), ctas, float(r[0]), float(r[1])))
    if ex.has(S.MEMSET):
        for start, end, nbytes in ex.query(f'SELECT start, "end", bytes FROM "{S.MEMSET}" ORDER BY start'):
            out.append((MEMSET_NAME, f"{int(nbytes)}B", 0, 0, float(start), float(end)))
    return out


def _um_intervals(ex: Export) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the export's UM fault records and migrations."""
    spans: list[tuple[float, float]] = []
    if ex.has(S.GPU_FAULTS):
        spans += ex.query(f'SELECT start, "end" FROM "{S.GPU_FAULTS}"')
    if ex.has(S.MEMCPY):
        kinds = ",".join(str(k) for k in S.UM_COPY_KINDS)
        spans += ex.query(f'SELECT start, "end" FROM "{S.MEMCPY}" WHERE copyKind IN ({kinds})')
    a = np.array(spans, dtype=float).reshape(-1, 2)
    return a[:, 0], a[:, 1]


def measure(exports: list[str | os.PathLike[str]], work: list[WorkRow]) -> tuple[list[Measured], list[str]]:
    """The launches of every work row in the given exports, and notes on kernels no row describes."""
    out: list[Measured] = []
    notes: list[str] = []
    for path in exports:
        name = Path(path).name
        rows = [w for w in work if w.export == name]
        if not rows:
            notes.append(f"{name}: no kernel work rows name this export (module uvmlab.measure.kernel_fit)")
            continue
        with open_export(path) as ex:
            gpu = export_gpu(ex)
            launches = _launches(ex)
            um_s, um_e = _um_intervals(ex)
        groups: dict[int, list[tuple[float, float, int, int]]] = {}
        excluded: dict[int, int] = {}
        unmatched: dict[str, int] = {}
        for kname, grid, threads, ctas, start, end in launches:
            j = next(
                (i for i, w in enumerate(rows) if re.search(w.kernel, kname) and (not w.grid or w.grid == grid)), None
            )
            if j is None:
                short = kname if kname.startswith("[") else kname.split(" ")[0]
                unmatched[short] = unmatched.get(short, 0) + 1
                continue
            inside = (um_s < end) & (um_e > start)
            dur = end - start
            if inside.any():
                if rows[j].uvm == "exclude":
                    excluded[j] = excluded.get(j, 0) + 1
                    continue
                dur -= float(np.minimum(um_e[inside], end).sum() - np.maximum(um_s[inside], start).sum())
            groups.setdefault(j, []).append((dur, 0.0, threads, ctas))
        for j, w in enumerate(rows):
            got = groups.get(j, [])
            if not got and not excluded.get(j):
                notes.append(f"{name}: no launch matches work row {w.kernel!r} {w.grid}".rstrip())
                continue
            d = np.array([g[0] for g in got], dtype=float)
            threads = got[0][2] if got else 0
            ctas = got[0][3] if got else 0
            out.append(Measured(w, gpu, d, threads, ctas, excluded.get(j, 0)))
        for k, n in unmatched.items():
            notes.append(f"{name}: {n} launches of {k} have no work row (not used)")
    return out, notes


def _work(m: Measured, costs: CostParams) -> KernelWork:
    """The KernelWork of one measured row, so that its prediction goes through ``native_times``."""
    cls = m.row.cls
    threads = m.threads if cls in ("serial", "cta", "launch") else 0
    return KernelWork(
        names=["mm" if cls == "gemm" else m.row.kernel],
        flops=np.array([m.row.flops]),
        nbytes=np.array([m.row.nbytes]),
        dtypes=[m.row.dtype],
        occupancy=np.ones(1),
        sector=np.array([cls == "sector"]),
        index=np.array([cls == "index"]),
        threads=np.array([threads], dtype=np.int64),
        native_ns=np.full(1, np.nan),
        efficiency=np.full(1, np.nan),
        api=[""],
    )


def _implied(m: Measured, costs: CostParams) -> tuple[float | None, str]:
    """The class constant one launch group implies (median launch), or None with the reason."""
    t = float(np.median(m.durations_ns)) if m.durations_ns.size else math.nan
    g, cls, w = m.gpu, m.row.cls, m.row
    if not t > 0:
        return None, "no usable launch"
    if cls == "gemm":
        peak = math_peak(g, w.dtype)
        if not peak > 0:
            return None, f"the FLOP rate of {g.name} is unknown"
        v = w.flops / (peak * t * 1e-9)
    elif cls in ("memory", "sector", "index"):
        v = w.nbytes / (g.hbm_bytes_per_s * t * 1e-9)
    elif cls == "serial":
        rate_at_1ns = serial_rate(m.threads, g, replace(costs, warp_trip_ns=1.0), scattered=False)
        return rate_at_1ns * 1e-9 * t / w.nbytes if w.nbytes > 0 else None, "serial"
    elif cls == "launch":
        return t, "launch"
    else:  # cta
        waves = -(-max(1, m.ctas) // g.sms)
        return t / waves, "cta"
    if v > 1.0:
        return None, f"measured {t / 1e3:.1f} us is below the GPU's peak for the declared work ({v:.2f}x of peak)"
    return v, cls


def fit_kernels(
    exports: list[str | os.PathLike[str]], work: list[WorkRow] | None = None, base: CostParams | None = None
) -> dict[str, Any]:
    """Fit the class constants on the fit rows, predict every row; return the fit document (module docstring)."""
    work = read_work() if work is None else work
    base = base or CostParams()
    measured, notes = measure(exports, work)
    implied: dict[str, list[float]] = {}
    reasons: dict[int, str] = {}
    for i, m in enumerate(measured):
        if m.row.split == "exclude":
            continue
        v, why = _implied(m, base)
        if v is None:
            reasons[i] = why
        elif m.row.split == "fit":
            implied.setdefault(m.row.cls, []).append(v)
    fitted = {CLASS_PARAM[c]: float(np.median(v)) for c, v in implied.items()}
    costs = replace(base, **fitted)
    rows = []
    for i, m in enumerate(measured):
        t = float(np.median(m.durations_ns)) if m.durations_ns.size else math.nan
        pred = math.nan
        if m.row.split != "exclude" and i not in reasons:
            ns, _ = native_times(_work(m, costs), m.gpu, costs, m.row.dtype)
            pred = float(ns[0])
        rows.append(
            {
                "export": m.row.export,
                "kernel": m.row.kernel,
                "grid": m.row.grid,
                "class": m.row.cls,
                "split": m.row.split if i not in reasons else "refused",
                "gpu": m.gpu.name,
                "launches": int(m.durations_ns.size),
                "launches_with_um_excluded": m.excluded,
                "measured_us": t / 1e3,
                "predicted_us": pred / 1e3,
                "ratio": pred / t if t > 0 and pred == pred else None,
                "note": reasons.get(i, m.row.note),
            }
        )
    return {"params": costs, "fitted": fitted, "rows": rows, "notes": notes}


def calibrate_kernels(
    exports: list[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    work_file: str | os.PathLike[str] | None = None,
    base: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """``uvmlab calibrate --kernels``: fit, write the parameter file ``out`` (with the error table), return it. At least
    one export the user names must be named by a work row (else nothing is fitted); the others are listed in the
    notes (``--kernels real-data/nsys/*.sqlite`` gives exports without kernel work)."""
    work = read_work(work_file)
    named = {w.export for w in work}
    unused = [Path(e).name for e in exports if Path(e).name not in named]
    if len(unused) == len(exports):
        where = str(work_file) if work_file else f"the shipped work file (uvmlab/measure/{SHIPPED_WORK})"
        raise InputError(
            f"no kernel work row of {where} names {', '.join(unused)}: give --work FILE with rows for their kernels "
            "(docs/uvm-sim.md 'Native kernel time by class')"
        )
    res = fit_kernels(exports, work, CostParams.from_file(base) if base else None)
    params: CostParams = res["params"]
    doc = {
        "schema_version": PARAMS_SCHEMA_VERSION,
        "source": "uvmlab calibrate --kernels "
        + " ".join(str(Path(p).name) for p in exports)
        + f" (work: {work_file or 'uvmlab/measure/' + SHIPPED_WORK})",
        "params": asdict(params),
        "fitted": sorted(res["fitted"]),
        "kept": [f for f in asdict(params) if f not in res["fitted"]],
        "details": {"kernels": res["rows"], "fitted_values": res["fitted"]},
        "notes": res["notes"],
    }
    atomic_write_json(Path(out), doc)
    CostParams.from_file(out)  # the file must read back
    return doc


__all__ = ["CLASS_PARAM", "WORK_COLUMNS", "calibrate_kernels", "export_gpu", "fit_kernels", "measure", "read_work"]
