"""Fit the simulator's cost parameters (``uvmlab.sim.uvm.timing.CostParams``) from a measured nsys export.

Only what the export supports is fitted; every other parameter keeps its default (or the ``--base`` file's value),
and the parameter file lists which is which (``fitted`` / ``kept``), with the data behind each fit (``details``).

Fits (approximations, also in docs/nsys.md):

``link_bytes_per_s``
    From UM migrations (MEMCPY copyKind 11/12 with positive duration). The simulator's transfer model is
    ``t = bytes / BW(bytes)`` with ``BW(s) = L * atan(k s_KiB) / atan(k 2048)`` (uvmlab.sim.uvm.timing); ``L`` is fitted
    by least squares on the transfer *times*: ``1/L = Σ c_i t_i / Σ c_i²`` with ``c_i = bytes_i / shape(bytes_i)``.
    Needs at least ``MIN_SAMPLES`` migrations. The per-size median bandwidths are reported next to the model's.
``batch_turnaround_ns``
    From GPU fault records (first ``MAX_FAULT_ROWS`` by time). Records on one device whose time intervals overlap
    are taken as one fault batch (nsys gives no batch ids: an approximation). Per batch, the measured duration
    minus the model's other terms (fault entries × ``fault_entry_ns`` × ``raw_entries_per_fault``, distinct 2 MiB
    VA blocks × ``block_service_ns``, and the transfer time of the UM migrations that start inside the batch at the
    fitted link bandwidth); the median over batches, floored at 0, is the fitted turnaround.
``cpu_fault_ns``
    From the device-to-host UM migrations CPU page faults cause (:func:`fit_cpu_fault_ns`): a CPU fault migrates
    its faulted page (a record of cause "fault") and what the CPU-side prefetcher adds (the "prefetch" records
    that follow it before the next fault record). Between two such groups in one 2 MiB block the CPU returns from
    the first fault, runs the program over the pages it brought, and takes the next fault up to its first copy, so
    the gap is ``a + b x KiB`` brought by the first group: ``a`` is the fault path outside the copies (the model's
    ``cpu_fault_ns``; it adds the transfers itself) and ``b`` the program's own work. Least squares over the
    within-block gaps; needs ``MIN_SAMPLES`` of them over at least two sizes. Approximations: the program's work is
    linear in the bytes a fault brings (a pass over them), and the fault cost does not depend on its size.
``cpu_unmap_chunk_ns`` and ``cpu_chunk_map_ns``
    Only from an export whose kernels all run one thread (:func:`fit_serial_refaults`): the per-page latency before
    the copies of its back-to-back faults over CPU-initialised memory (per CPU chunk: a page before driver R530),
    and what a block's first such fault costs beyond a later one, per CPU chunk of the block.
``compute_efficiency``, ``gemm_efficiency`` and ``memory_efficiency`` (the kernel time scale)
    Only with a simulated run of the same job (``--sim-run``): kernels matched as in ``uvmlab compare``; over the
    matched kernels without faults on either side, ``scale = median(measured duration / simulated native time)``
    (the kernels table's ``native_ns`` where present, else ``duration_ns``); the three efficiencies (a None one:
    the run's resolved value) are divided by ``scale`` (capped at 1). One scale for every class is coarse: ``uvmlab
    calibrate --kernels`` fits each class on its own (uvmlab.measure.kernel_fit).
"""

from __future__ import annotations

import itertools
import math
import os
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from uvmlab.errors import InputError
from uvmlab.files.atomic import atomic_write_json
from uvmlab.files.inputs import MAX_DATA_FILE_BYTES, read_csv_frame
from uvmlab.gpus import DEFAULT_GPU, GpuSpec
from uvmlab.measure.nsys import schema as S
from uvmlab.measure.nsys.read import Export, open_export
from uvmlab.sim.uvm.cpu_chunks import page_sized_cpu_chunks
from uvmlab.sim.uvm.knobs import PAGE_BYTES, PAGES_PER_BLOCK, VA_BLOCK_BYTES
from uvmlab.sim.uvm.timing import PARAMS_SCHEMA_VERSION, STREAM_EFFICIENCY, CostParams, transfer_bandwidth

MIN_SAMPLES = 10  # fewest migrations / batches / kernels a fit uses
MAX_FAULT_ROWS = 2_000_000  # fault records read for the batch fit (bounded memory)
SIZE_BUCKETS = (4 << 10, 64 << 10, 256 << 10, 1 << 20, 2 << 20)


def _shape(nbytes: np.ndarray) -> np.ndarray:
    """The simulator's bandwidth curve normalised to 1 at 2 MiB (uvmlab.sim.uvm.timing.transfer_bandwidth)."""
    return np.asarray(transfer_bandwidth(np.asarray(nbytes, dtype=float), 1.0), dtype=float)


def fit_link_bandwidth(
    ex: Export, copy_kinds: tuple[int, ...] = (S.COPY_KIND_UVM_HTOD, S.COPY_KIND_UVM_DTOH)
) -> tuple[float | None, dict[str, Any]]:
    """Fitted 2 MiB link bandwidth (bytes/s) from UM migrations of ``copy_kinds``, or None with the reason."""
    if not ex.has(S.MEMCPY):
        return None, {"reason": "no copy table in the export"}
    kinds = ", ".join(str(int(k)) for k in copy_kinds)
    rows = ex.query(
        f'SELECT bytes, "end" - start FROM {S.MEMCPY} WHERE copyKind IN ({kinds}) AND "end" > start AND bytes > 0'
    )
    if len(rows) < MIN_SAMPLES:
        return None, {"reason": f"{len(rows)} UM migrations with a duration (< {MIN_SAMPLES})"}
    a = np.array(rows, dtype=float)
    b, t = a[:, 0], a[:, 1] / 1e9
    c = b / _shape(b)
    inv = float((c * t).sum() / (c * c).sum())
    link = 1.0 / inv
    buckets = []
    edges = (0, *SIZE_BUCKETS, math.inf)
    for lo, hi in itertools.pairwise(edges):
        m = (b > lo) & (b <= hi)
        if m.any():
            buckets.append(
                {
                    "size_bytes_max": None if hi == math.inf else int(hi),
                    "count": int(m.sum()),
                    "median_measured_bytes_per_s": float(np.median(b[m] / t[m])),
                    "model_bytes_per_s_at_median_size": float(link * _shape(np.median(b[m]))),
                }
            )
    return link, {"migrations": len(rows), "by_size": buckets}


def fault_groups(ex: Export, copy_kind: int) -> tuple[np.ndarray, ...] | None:
    """The UM migrations of ``copy_kind`` grouped by fault: each group is a record of cause "fault" and the
    "prefetch" records after it, up to the next fault record. (start ns, end ns, bytes, faulted page's address) per
    group, in time order; None when the export's copies have no cause or address."""
    t = S.MEMCPY
    if not {"migrationCause", "virtualAddress"} <= set(ex.columns(t)):
        return None
    rows = ex.query(
        f'SELECT start, "end", bytes, migrationCause, virtualAddress FROM {t} '
        f"WHERE copyKind = {copy_kind} AND migrationCause IS NOT NULL AND virtualAddress IS NOT NULL "
        f"ORDER BY start LIMIT {MAX_FAULT_ROWS}"
    )
    a = np.array(rows, dtype=np.int64).reshape(-1, 5)
    first = np.flatnonzero(a[:, 3] == S.MIGRATION_CAUSE_FAULT)
    if not len(first):
        return tuple(np.empty(0, dtype=np.int64) for _ in range(4))
    a, first = a[first[0] :], first - first[0]
    return a[first, 0], np.maximum.reduceat(a[:, 1], first), np.add.reduceat(a[:, 2], first), a[first, 4]


def _line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line through (x, y)."""
    (a, b), *_ = np.linalg.lstsq(np.vstack([np.ones(len(x)), x]).T, y, rcond=None)
    return float(a), float(b)


def fit_cpu_fault_ns(ex: Export) -> tuple[float | None, dict[str, Any]]:
    """Fitted host cost of one CPU page fault besides its transfers (ns), from the device-to-host migrations of the
    CPU faults (module docstring), or None with the reason."""
    groups = fault_groups(ex, S.COPY_KIND_UVM_DTOH)
    if groups is None:
        return None, {"reason": "no UM migrations with a cause and an address in the export"}
    start, end, nbytes, addr = groups
    if len(start) < 2:
        return None, {"reason": f"{len(start)} device-to-host migrations caused by a CPU fault (< 2)"}
    kib = nbytes / 1024.0
    block = addr // VA_BLOCK_BYTES
    same = block[1:] == block[:-1]  # the next fault in the same 2 MiB block
    gap_us, size = (start[1:] - end[:-1])[same] / 1e3, kib[:-1][same]
    if len(gap_us) < MIN_SAMPLES or len(np.unique(size)) < 2:
        return None, {"reason": f"{len(gap_us)} gaps between CPU faults in one block over {len(np.unique(size))} sizes"}
    fixed_us, per_kib_us = _line(size, gap_us)
    info = {
        "cpu_faults": len(start),
        "gaps": len(gap_us),
        "fixed_us": float(fixed_us),
        "program_us_per_kib": float(per_kib_us),
        "median_gap_us_by_kib": {f"{k:g}": float(np.median(gap_us[size == k])) for k in np.unique(size)},
    }
    if fixed_us <= 0:
        return None, {**info, "reason": "the gaps give no positive fixed cost per fault"}
    return float(fixed_us) * 1e3, info


SERIAL_GAP_SPLIT_MIN_SHARE = 0.1
"""Each of the two kinds of gaps of a one-thread kernel (back to back; after the kernel's own work) must hold at least
this share of the gaps for :func:`fit_serial_refaults` to split them."""


BATCH_GAP_MIN_JUMP = 2.0
"""The longest short gap times this must stay below the shortest long one (easycuda: 4.6 vs 15.5 us), else the
gaps are one population (the GH200 export's 72-75 ms between faults)."""


def _kernel_threads(ex: Export) -> list[int]:
    """Threads per launch of each kernel of the export (none without a kernel table)."""
    if not ex.has(S.KERNEL):
        return []
    return [int(t) for (t,) in ex.query(f"SELECT gridX * gridY * gridZ * blockX * blockY * blockZ FROM {S.KERNEL}")]


def first_touches(addr: np.ndarray) -> np.ndarray:
    """For fault groups at ``addr`` (in time order): True where the group is the first in its 2 MiB block, the GPU's
    first touch of the block in the export."""
    _, first_of, inverse = np.unique(addr // VA_BLOCK_BYTES, return_index=True, return_inverse=True)
    return first_of[inverse] == np.arange(len(addr))


def _gap_split_us(gap_us: np.ndarray) -> float:
    """The gap (us) between short and long gaps: the widest jump of the sorted log gaps, each side holding at least
    ``SERIAL_GAP_SPLIT_MIN_SHARE`` of them."""
    logs = np.sort(np.log(np.maximum(gap_us, 1e-3)))
    lo, hi = int(len(logs) * SERIAL_GAP_SPLIT_MIN_SHARE), int(len(logs) * (1 - SERIAL_GAP_SPLIT_MIN_SHARE))
    cut = lo + int(np.argmax(np.diff(logs[lo:hi])))
    return float(np.exp((logs[cut] + logs[cut + 1]) / 2))


def batch_block_gaps(ex: Export) -> dict[str, Any]:
    """How long the driver takes between two blocks serviced in one fault batch, from an export whose kernels run
    more than one thread (their faults in several blocks share batches: easycuda's 256 threads over ``x`` and
    ``y``): the gap from one fault group's last HtoD copy to the next group's first, where the gap is short (split
    as in :func:`fit_serial_refaults`: the long ones hold the kernel's work and the next batch's round trip). Such
    a gap is the next block's service up to its copy: its CPU pages' unmapping and, for a block's first GPU
    touch, its CPU chunks' DMA mapping. Returns the medians for blocks the GPU touched before (``later``) and for
    blocks' first touches (``first``), with their pages and counts, or ``reason``."""
    kernels = _kernel_threads(ex)
    if not kernels or min(kernels) <= 1:
        return {"reason": "the export's kernels do not all run more than one thread"}
    groups = fault_groups(ex, S.COPY_KIND_UVM_HTOD)
    if groups is None or len(groups[0]) < MIN_SAMPLES:
        return {"reason": "fewer than 10 HtoD fault migrations with a cause and an address"}
    start, end, nbytes, addr = groups
    gap_us = (start[1:] - end[:-1]) / 1e3
    threshold_us = _gap_split_us(gap_us)
    seen = ~first_touches(addr)[1:]  # the GPU touched the group's block before
    short = gap_us < threshold_us
    if short.all() or gap_us[short].max() * BATCH_GAP_MIN_JUMP > gap_us[~short].min():
        return {"reason": "the gaps between fault groups do not fall into short and long ones"}
    info: dict[str, Any] = {"groups": len(start), "split_us": threshold_us, "driver": ex.driver_version()}
    for name, sel in (("later", short & seen), ("first", short & ~seen)):
        info[name] = {
            "count": int(sel.sum()),
            "median_us": float(np.median(gap_us[sel])) if sel.any() else None,
            "gaps_us": gap_us[sel].round(3).tolist(),
            "pages": (nbytes[1:][sel] // PAGE_BYTES).tolist(),
        }
    if info["later"]["count"] < MIN_SAMPLES // 2:
        info["reason"] = f"{info['later']['count']} short gaps between blocks (< {MIN_SAMPLES // 2})"
    return info


def _chunk_map_ns(
    firsts_us: np.ndarray, pages: float | None, base_us: float, slope_us: float, driver: str | None
) -> float | None:
    """``cpu_chunk_map_ns`` from a one-thread kernel's block-first faults over CPU-initialised blocks: their median
    latency minus the fitted line at their pages (the same fault later in the block), over the CPU chunks a whole
    CPU-populated block holds on the export's driver (uvmlab.sim.uvm.cpu_chunks: 512 before R530, 1 from R530);
    None without such faults, a known driver, or a positive excess."""
    if pages is None or driver is None or not len(firsts_us):
        return None
    chunks = PAGES_PER_BLOCK if page_sized_cpu_chunks(driver) else 1
    excess_us = float(np.median(firsts_us)) - (base_us + slope_us * pages)
    return excess_us * 1e3 / chunks if excess_us > 0 else None


def fit_serial_refaults(ex: Export) -> tuple[float | None, dict[str, Any]]:
    """Fitted ``cpu_unmap_chunk_ns`` from an export whose only kernels run one thread over CPU-initialised managed
    arrays (csc746's ``add<<<1, 1>>>``), or None with the reason.

    Such a kernel faults one page at a time, so each fault is its own batch and its migration one group of HtoD
    records (a 4 KiB record of cause "fault", then the prefetched rest). When the thread touches the next array right
    after a migration, the gap from that group's last copy to the next group's first is the GPU fault path's latency
    before the copy; after the kernel's own work over the migrated pages the gap is far longer. The two kinds are
    split at the widest jump of the sorted log gaps (each must hold ``SERIAL_GAP_SPLIT_MIN_SHARE`` of them). Over
    the back-to-back faults that are not a block's first, least squares gives ``latency = base + slope x pages``:
    ``slope`` is the per-page work before the copy, which the model charges per CPU chunk unmapped and copied (the
    arrays are CPU-initialised: every migrated page was CPU-mapped): a fit only where a chunk is a page, drivers
    before R530 (uvmlab.sim.uvm.cpu_chunks; an export that does not record its driver is taken as one). ``base`` is
    returned for validation; a block's first fault (:func:`first_touches`) gives ``cpu_chunk_map_ns`` in the details
    (:func:`_chunk_map_ns`). Approximation: all the per-page work is taken as the CPU side's (no export separates it
    from GPU-side per-page work; the same kernel over evicted, CPU-unmapped pages would)."""
    kernels = _kernel_threads(ex)
    if not kernels or set(kernels) != {1}:
        return None, {"reason": "the export's kernels do not all run one thread"}
    groups = fault_groups(ex, S.COPY_KIND_UVM_HTOD)
    if groups is None:
        return None, {"reason": "no UM migrations with a cause and an address"}
    start, end, nbytes, addr = groups
    if len(start) < 2 * MIN_SAMPLES:
        return None, {"reason": f"{len(start)} HtoD fault migrations"}
    pages = nbytes[1:] / PAGE_BYTES
    block_first = first_touches(addr)[1:]
    gap_us = (start[1:] - end[:-1]) / 1e3
    threshold_us = _gap_split_us(gap_us)
    back = gap_us < threshold_us
    fit = back & ~block_first
    if fit.sum() < MIN_SAMPLES or len(np.unique(pages[fit])) < 2:
        return None, {"reason": f"{int(fit.sum())} back-to-back faults over {len(np.unique(pages[fit]))} sizes"}
    base_us, slope_us = _line(pages[fit], gap_us[fit])
    firsts = gap_us[back & block_first]
    driver = ex.driver_version()
    first_pages = float(np.median(pages[back & block_first])) if len(firsts) else None
    info = {
        "faults": len(start),
        "back_to_back": int(back.sum()),
        "split_us": threshold_us,
        "fitted_faults": int(fit.sum()),
        "base_us": float(base_us),
        "per_page_us": float(slope_us),
        "median_us_by_pages": {f"{p:g}": float(np.median(gap_us[fit & (pages == p)])) for p in np.unique(pages[fit])},
        "block_first_median_us": float(np.median(firsts)) if len(firsts) else None,
        "block_first_pages": first_pages,
        "driver": driver,
        "cpu_chunk_map_ns": _chunk_map_ns(firsts, first_pages, base_us, slope_us, driver),
    }
    if slope_us <= 0:
        return None, {**info, "reason": "no positive per-page latency"}
    if driver is not None and not page_sized_cpu_chunks(driver):
        return None, {**info, "reason": f"driver {driver} holds a block's CPU pages in one chunk: no per-chunk slope"}
    return float(slope_us) * 1e3, info


SERIAL_COSTS_WHAT = {
    "cpu_unmap_chunk_ns": "its one-thread kernel's faults",
    "cpu_chunk_map_ns": "its blocks' first faults",
}
"""The costs :func:`serial_refault_costs` can fit, and what of the export each comes from."""


def serial_refault_costs(ex: Export) -> tuple[dict[str, float], dict[str, Any]]:
    """The costs a one-thread kernel's faults give (:func:`fit_serial_refaults`: ``cpu_unmap_chunk_ns`` where its
    per-page slope is a per-chunk cost, ``cpu_chunk_map_ns`` where its blocks' first faults give it) and the fit's
    details; no cost when the export has no such kernel."""
    unmap, info = fit_serial_refaults(ex)
    costs = {} if unmap is None else {"cpu_unmap_chunk_ns": unmap}
    if info.get("cpu_chunk_map_ns") is not None:
        costs["cpu_chunk_map_ns"] = info["cpu_chunk_map_ns"]
    return costs, info


def fit_batch_turnaround(ex: Export, base: CostParams, link: float | None) -> tuple[float | None, dict[str, Any]]:
    """Fitted per-batch fault cost (ns) from GPU fault records, or None with the reason."""
    if not ex.row_count(S.GPU_FAULTS):
        status, why = ex.status(S.GPU_FAULTS)
        return None, {"reason": f"no GPU fault records ({status}: {why})"}
    t = S.GPU_FAULTS
    rows = ex.query(
        f"SELECT deviceId, start, {ex.col(t, 'end', 'start')}, {ex.col(t, 'address', '0')}, numberOfPageFaults "
        f"FROM {t} ORDER BY deviceId, start LIMIT {MAX_FAULT_ROWS}"
    )
    f = pd.DataFrame(rows, columns=["dev", "s", "e", "addr", "n"]).fillna(0)
    # batches: union of overlapping intervals per device
    prev_end = f.groupby("dev")["e"].transform(lambda x: x.cummax().shift(1))
    new = (f["s"] >= prev_end) | prev_end.isna()
    f["batch"] = new.cumsum()
    f["block"] = f["addr"].astype("int64") // VA_BLOCK_BYTES
    g = f.groupby("batch").agg(s=("s", "min"), e=("e", "max"), n=("n", "sum"), blocks=("block", "nunique"))
    if len(g) < MIN_SAMPLES:
        return None, {"reason": f"{len(g)} fault batches (< {MIN_SAMPLES})"}
    dur = (g["e"] - g["s"]).to_numpy(float)
    other = (
        g["n"].to_numpy(float) * base.fault_entry_ns * base.raw_entries_per_fault
        + g["blocks"].to_numpy(float) * base.block_service_ns
    )
    transfer = np.zeros(len(g))
    if link and ex.has(S.MEMCPY):
        mig = np.array(
            ex.query(f"SELECT start, bytes FROM {S.MEMCPY} WHERE copyKind = {S.COPY_KIND_UVM_HTOD} ORDER BY start")
            or [(0, 0)],
            dtype=float,
        )
        sec = mig[:, 1] / (link * np.maximum(_shape(mig[:, 1]), 1e-12))
        csum = np.concatenate([[0.0], np.cumsum(sec)])
        lo = np.searchsorted(mig[:, 0], g["s"].to_numpy(float), side="left")
        hi = np.searchsorted(mig[:, 0], g["e"].to_numpy(float), side="right")
        transfer = (csum[hi] - csum[lo]) * 1e9
    residual = dur - other - transfer
    value = max(0.0, float(np.median(residual)))
    return value, {
        "fault_records_used": len(f),
        "batches": len(g),
        "median_batch_duration_ns": float(np.median(dur)),
        "median_modelled_other_terms_ns": float(np.median(other + transfer)),
        "floored_at_zero": bool(np.median(residual) < 0),
    }


def fit_kernel_scale(ex: Export, sim_run: str | os.PathLike[str]) -> tuple[float | None, dict[str, Any]]:
    """median(measured / simulated kernel time) over matched fault-free kernels, or None with the reason."""
    from uvmlab.measure.compare import load_run, match_kernels
    from uvmlab.measure.nsys.measured import to_run_tables

    sim = load_run(sim_run)
    if "kernels" not in sim.tables:
        return None, {"reason": f"{sim_run} has no kernels table"}
    sk = sim.tables["kernels"]
    if "native_ns" in sk.columns:  # the simulator's all-resident time, without its fault stalls
        sk = sk.assign(duration_ns=sk["native_ns"])
    meas = to_run_tables(ex)["kernels"]
    m, how = match_kernels(sk, meas)
    if m is None:
        return None, {"reason": how}
    ok = m["duration_ns_a"].notna() & m["duration_ns_b"].notna() & (m["duration_ns_a"] > 0)
    for side in ("a", "b"):
        col = f"fault_count_{side}"
        if col in m:
            ok &= m[col].fillna(0) == 0
    if ok.sum() < MIN_SAMPLES:
        return None, {"reason": f"{int(ok.sum())} matched fault-free kernels (< {MIN_SAMPLES}); {how}"}
    ratio = m.loc[ok, "duration_ns_b"].astype(float) / m.loc[ok, "duration_ns_a"].astype(float)
    return float(ratio.median()), {
        "matched_kernels": int(ok.sum()),
        "match": how,
        "ratio_p10": float(ratio.quantile(0.1)),
        "ratio_p90": float(ratio.quantile(0.9)),
    }


def _run_cost_params(run: str | os.PathLike[str]) -> dict[str, Any]:
    """The cost parameters a simulated run used (result.json ``cost_params``, resolved for its GPU), or {}; read by
    the run directory's own reader (limits, numbers checked; a damaged file is one sentence)."""
    from uvmlab.files.rundir import RunDir

    used = RunDir(run).read_result().get("cost_params")
    return used if isinstance(used, dict) else {}


def costs_against(
    gpu: str | GpuSpec | None, base: str | os.PathLike[str] | None, sim_run: str | os.PathLike[str] | None
) -> tuple[CostParams, dict[str, Any], str]:
    """(the costs a fit is made against, the ``base`` file's values, what they are): the costs a run of the fitted
    file combines the fits with, so that fitted and kept values belong together.

    With ``sim_run`` (a uvmlab run directory): the costs that run simulated with (its config.json through
    uvmlab.uvm.simulate's one rule), so that its kernel time scale divides the efficiencies it used; else the profile
    of ``gpu`` (uvmlab run's default GPU when None). The ``base`` file's costs go over either, as a run reads them."""
    from uvmlab.config import RunConfig
    from uvmlab.files.rundir import RunDir
    from uvmlab.gpus import get_gpu
    from uvmlab.sim.uvm.profile import cap_link, pick_profile
    from uvmlab.sim.uvm.timing import read_params_file
    from uvmlab.uvm.simulate import costs_and_source

    given = read_params_file(base) if base is not None else None
    values = dict(given.values) if given is not None else {}
    rd = RunDir(sim_run) if sim_run is not None else None
    run_cfg = None
    if rd is not None and rd.config_json.is_file():
        try:
            record = rd.read_json(rd.config_json)  # uvmlab run writes {"run": RunConfig dict, ...}
            run_cfg = RunConfig.from_dict(record["run"] if isinstance(record, dict) and "run" in record else record)
        except (InputError, TypeError):  # not a simulated run's configuration: the GPU's profile, as without --sim-run
            run_cfg = None
    if run_cfg is not None:
        costs, why = costs_and_source(run_cfg)
        why = f"the costs of --sim-run {sim_run}: {why}"
        spec = get_gpu(run_cfg.gpu)
    else:
        spec = gpu if isinstance(gpu, GpuSpec) else get_gpu(gpu or DEFAULT_GPU)
        costs, why = pick_profile(spec)
    if given is None:
        return costs, values, why
    return cap_link(replace(costs, **values), spec), values, given.describe(why)


def calibrate(
    report: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    sim_run: str | os.PathLike[str] | None = None,
    base: str | os.PathLike[str] | None = None,
    gpu: str | GpuSpec | None = None,
) -> dict[str, Any]:
    """Fit what the export supports, write the parameter file ``out``, return its content.

    The file sets only the fitted costs (and those of ``base``); a run takes every other cost from its GPU's profile
    (``uvmlab.uvm.simulate.costs_and_source``). The fits are made against the same costs (:func:`costs_against`):
    the other fault terms of the batch fit and the efficiencies the kernel scale divides. ``fitted`` names the
    fitted costs, ``kept`` those a run takes from its GPU. A fit no hardware gives (outside
    ``uvmlab.sim.uvm.timing.cost_limits``) is refused in one sentence, and nothing is written."""
    params, base_values, against = costs_against(gpu, base, sim_run)
    fitted: dict[str, Any] = {}
    details: dict[str, Any] = {}
    notes: list[str] = []
    with open_export(report) as ex:
        link, details["link_bytes_per_s"] = fit_link_bandwidth(ex)
        if link is not None and math.isfinite(link) and link > 0:
            fitted["link_bytes_per_s"] = link
        cpu_fault, details["cpu_fault_ns"] = fit_cpu_fault_ns(ex)
        if cpu_fault is not None:
            fitted["cpu_fault_ns"] = cpu_fault
        serial, details["serial_refaults"] = serial_refault_costs(ex)
        fitted.update(serial)
        turnaround, details["batch_turnaround_ns"] = fit_batch_turnaround(ex, params, fitted.get("link_bytes_per_s"))
        if turnaround is not None:
            fitted["batch_turnaround_ns"] = turnaround
            if details["batch_turnaround_ns"].get("floored_at_zero"):
                notes.append(
                    "batch_turnaround_ns: the other modelled terms exceed the measured batch time; floored at 0"
                )
        if sim_run is not None:
            scale, details["kernel_time_scale"] = fit_kernel_scale(ex, sim_run)
            if scale is not None and scale > 0:
                used = _run_cost_params(sim_run)
                for f in ("compute_efficiency", "gemm_efficiency", "memory_efficiency"):
                    value = getattr(params, f) or used.get(f) or STREAM_EFFICIENCY["HBM"]
                    fitted[f] = min(1.0, float(value) / scale)
                if any(v == 1.0 for v in fitted.values()):
                    notes.append(
                        "kernel time scale: an efficiency would exceed 1 (the run is faster than peak); capped"
                    )
        else:
            details["kernel_time_scale"] = {"reason": "no --sim-run given"}
        source = f"uvmlab calibrate from nsys export {Path(report).resolve()} (nsys {ex.version.nsys_version})"
    _refuse_impossible(fitted, details, report)
    values = {**base_values, **fitted}
    kept = [f.name for f in fields(CostParams) if f.name not in values]
    for name, d in details.items():
        if "reason" in d:
            notes.append(f"{name}: kept ({d['reason']})")
    doc = {
        "schema_version": PARAMS_SCHEMA_VERSION,
        "source": source,
        "params": values,
        "fitted": sorted(fitted),
        "kept": kept,
        "fitted_against": against,
        "details": details,
        "notes": notes,
    }
    atomic_write_json(Path(out), doc)
    return doc


def _refuse_impossible(fitted: dict[str, Any], details: dict[str, Any], report: str | os.PathLike[str]) -> None:
    """One sentence (InputError) for fitted costs outside ``uvmlab.sim.uvm.timing.cost_limits``, naming the fit and
    the data behind it; nothing is written then (a run would refuse the file)."""
    from uvmlab.sim.uvm.timing import check_cost_values

    try:
        check_cost_values(fitted, f"{report}: the fit")
    except InputError as exc:
        used = {
            k: {n: v for n, v in d.items() if n in ("migrations", "batches", "matched_kernels")}
            for k, d in details.items()
            if k in fitted or k == "kernel_time_scale"
        }
        raise InputError(f"{exc} (data: {used}); no parameter file written") from None


def calibrate_microbench(out: str | os.PathLike[str]) -> dict[str, Any]:
    """Measure the parameters on this machine's GPU and write them
    (``uvmlab.measure.gpu.microbench.calibrate_microbench``;
    refuses with UnavailableError without a GPU or CuPy)."""
    from uvmlab.measure.gpu.microbench import calibrate_microbench as measure

    return measure(Path(out))


def calibrate_from_timings(timings: str | os.PathLike[str], out: str | os.PathLike[str]) -> dict[str, Any]:
    """Fit CostParams to recorded microbenchmark timings (a CSV with uvmlab.measure.gpu.microbench.TIMING_COLUMNS, e.g.
    ``link/uvmlab_collect/timings.csv`` of ``uvmlab collect``), write them to ``out`` and return the file's content
    (``fitted``, ``notes``, ``timings`` as ``uvmlab calibrate --microbench``). Needs no GPU."""
    from uvmlab.measure.gpu.microbench import fit, write_fit

    path = Path(timings)
    table = read_csv_frame(path, MAX_DATA_FILE_BYTES, "microbenchmark timings (a CSV of uvmlab collect)")
    return write_fit(fit(table), table, out, f"uvmlab calibrate --microbench-timings {path.resolve()}")
