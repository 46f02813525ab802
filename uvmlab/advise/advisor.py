"""Simulate a job under every candidate memory policy on one GPU and rank the policies by iteration time.

Every policy runs on the same physical memory: the GPU memory UVM has (``available_bytes``) is fixed once, from the
job as given (PCA on unless the job says otherwise): footprint / ``--oversub``, or the GPU's usable memory.
The reference for every slowdown is the job as given with every page resident and PCA on (the study's
reference, ``slowdown_vs_native_pca``).

Approximations (docs/advise.md): the job-shape search evaluates footprints, not times, to pick the micro-batch;
combinations are formed from the best single policy of each family (at most :data:`MAX_COMBINATIONS`), not from
all pairs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pandas as pd

from uvmlab.advise.policies import POLICIES, Policy, compose, get_policy
from uvmlab.config import RunConfig
from uvmlab.errors import InputError

MAX_COMBINATIONS = 3
"""At most this many combinations of single policies are simulated (issue 16: 'at most a handful')."""

ROW_COLUMNS = (
    "rank",
    "policy",
    "family",
    "outcome",
    "iteration_time_ns",
    "slowdown_vs_native_pca",
    "speedup_vs_given",
    "peak_resident_bytes",
    "footprint_bytes",
    "fault_count",
    "migrated_bytes",
    "htod_bytes",
    "dtoh_bytes",
    "batch_size",
    "accumulation_steps",
    "apply_how",
    "needs_code_change",
    "note",
)


@dataclass
class Advice:
    """The ranked table (:data:`ROW_COLUMNS`) and what every row was measured against."""

    rows: pd.DataFrame
    workload: str
    gpu: str
    available_bytes: int
    given_footprint_bytes: int
    given_policy: str
    native_pca_time_ns: float
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON form (``--format json``; docs/advise.md documents the keys)."""
        return {
            "workload": self.workload,
            "gpu": self.gpu,
            "available_bytes": self.available_bytes,
            "given_footprint_bytes": self.given_footprint_bytes,
            "given_oversub": self.given_footprint_bytes / self.available_bytes,
            "given_policy": self.given_policy,
            "native_pca_time_ns": self.native_pca_time_ns,
            "notes": self.notes,
            "policies": [
                {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}
                for row in self.rows.to_dict(orient="records")
            ],
        }


def _simulate(cfg: RunConfig, available: int) -> tuple[Any, dict[str, Any]]:
    from uvmlab.uvm.simulate import prepare, simulate_prepared

    prep = prepare(cfg, available_bytes=available)
    _, result = simulate_prepared(cfg, prep)
    return prep, result


def _row(policy: Policy, cfg: RunConfig, prep: Any, result: dict[str, Any], native: float) -> dict[str, Any]:
    t = float(result["iteration_time_ns"])
    return {
        "policy": policy.name,
        "family": policy.family,
        "outcome": result.get("outcome", "ok"),
        "iteration_time_ns": t,
        "slowdown_vs_native_pca": t / native,
        "peak_resident_bytes": int(result["peak_resident_bytes"]),
        "footprint_bytes": int(result["footprint_bytes"]),
        "fault_count": int(result["fault_count"]),
        "migrated_bytes": int(result["htod_bytes"]) + int(result["dtoh_bytes"]),
        "htod_bytes": int(result["htod_bytes"]),
        "dtoh_bytes": int(result["dtoh_bytes"]),
        "batch_size": int(prep.trace.header.get("batch_size") or 0) or None,
        "accumulation_steps": cfg.workload.accumulation_steps,
        "apply_how": policy.apply_how,
        "needs_code_change": policy.needs_code_change,
        "note": "",
    }


def _failed_row(policy: Policy, outcome: str, note: str) -> dict[str, Any]:
    return {
        "policy": policy.name,
        "family": policy.family,
        "outcome": outcome,
        "apply_how": policy.apply_how,
        "needs_code_change": policy.needs_code_change,
        "note": note,
    }


def _footprint(cfg: RunConfig) -> int:
    from uvmlab.uvm.simulate import prepare

    return prepare(cfg).footprint_bytes


FIT_ITERATIONS = 3
"""Iterations of the traces the micro-batch search sizes (the peak is reached by the second iteration: the first
optimizer step creates the optimizer state, which every later iteration carries)."""


def fit_batch(cfg: RunConfig, available: int, batch: int) -> tuple[int, int] | None:
    """The smallest gradient-accumulation count k (and micro-batch ceil(batch / k)) whose footprint fits.

    Footprints come from traces of the accumulating loop itself (gradients stay alive across micro-batches),
    captured with :data:`FIT_ITERATIONS` iterations. A linear model of footprint in the micro-batch, from the given
    batch and batch / 2, gives the first k to try; then k grows until one fits and a bisection finds the smallest
    (a footprint that does not fall with k is taken as monotone). None when micro-batch 1 does not fit.
    """
    iterations = min(cfg.workload.iterations, FIT_ITERATIONS)
    cache: dict[int, int] = {}

    def fits(k: int) -> bool:
        if k not in cache:
            wl = replace(cfg.workload, batch_size=math.ceil(batch / k), accumulation_steps=k, iterations=iterations)
            cache[k] = _footprint(replace(cfg, workload=wl))  # cfg.policy kept: an offloaded job's footprint
        return cache[k] <= available

    if batch < 2:
        return None
    f1 = _footprint(replace(cfg, workload=replace(cfg.workload, iterations=iterations)))
    if f1 <= available:
        return batch, 1
    fits(2)
    slope = (f1 - cache[2]) / (batch - math.ceil(batch / 2))
    k = 2
    if slope > 0 and cache[2] > available:
        per = (available - (cache[2] - slope * math.ceil(batch / 2))) / slope  # micro-batch that would just fit
        k = batch if per < 1 else min(batch, max(2, math.ceil(batch / math.floor(per))))
    lo = 1  # the largest k known not to fit
    while not fits(k):
        if k >= batch:
            return None
        lo, k = k, min(batch, k * 2)
    hi = k  # fits
    lo = max([lo, *(j for j, fp in cache.items() if fp > available and j < hi)])
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid
    return math.ceil(batch / hi), hi


def _gc_oom(cfg: RunConfig, available: int) -> str | None:
    """The gc-threshold policy's OOM check: the allocator refuses memory past the per-process fraction."""
    from uvmlab.sim.allocator.placement import place
    from uvmlab.uvm.simulate import prepare, run_gpu_spec

    gpu = run_gpu_spec(cfg)
    prep = prepare(replace(cfg, policy=None), available_bytes=available)
    fraction = min(1.0, available / gpu.memory_bytes)
    conf = f"garbage_collection_threshold:0.8,per_process_memory_fraction:{fraction:.6f}"
    placed = place(prep.trace, "pca", settings=conf, capacity_bytes=gpu.memory_bytes)
    if placed.oom_seq is not None:
        return (
            f"OOM: with the memory fraction at {fraction:.3f} of the GPU the allocator refuses to grow past the "
            "memory UVM has, so oversubscription is impossible"
        )
    return None


def advise(
    cfg: RunConfig,
    available_bytes: int | None = None,
    policies: list[str] | None = None,
    combine: bool = True,
    progress: Callable[[str], None] | None = None,
) -> Advice:
    """Rank the policies for ``cfg`` (the job as given) on ``available_bytes`` of GPU memory (see module doc).

    ``available_bytes`` None: footprint of the job as given / ``cfg.oversub``, at most the GPU's usable memory.
    """
    from uvmlab.uvm.simulate import prepare, simulate_prepared
    from workloads.registry import load_workload

    say = progress or (lambda _msg: None)

    names = policies if policies is not None else list(POLICIES)
    unknown = [n for n in names if n not in POLICIES]
    if unknown:  # bad input is one sentence before anything is simulated or printed
        raise InputError(f"unknown policy {unknown[0]!r}; policies: {', '.join(POLICIES)}")
    load_workload(cfg.workload.workload)  # an unknown workload, likewise
    given = replace(cfg, policy=None, applied=None)
    say("the job as given")
    given_prep = prepare(given, available_bytes=available_bytes)
    available = given_prep.available_bytes
    batch = int(given_prep.trace.header.get("batch_size") or 0)
    _, given_result = simulate_prepared(given, given_prep)
    native = float(given_result["native_pca_time_ns"])  # all-resident, PCA on: also given for a PCA-off job
    rows: list[dict[str, Any]] = []
    singles: dict[str, float] = {}
    for name in names:
        pol = POLICIES[name]
        say(pol.name)
        if pol.changes_nothing_for(given):
            rows.append(_row(pol, given, given_prep, given_result, native))  # the job as given: already simulated
        else:
            rows.append(_evaluate(pol, given, available, batch, native, given_prep))
        if rows[-1]["outcome"] == "ok":
            singles[name] = rows[-1]["iteration_time_ns"]
    if combine:
        shape_fit = shape_fit_combination(rows, available)
        for combo in _combinations(singles, given_result) + ([shape_fit] if shape_fit else []):
            pol = compose([POLICIES[n] for n in combo])
            say(pol.name)
            rows.append(_evaluate(pol, given, available, batch, native, given_prep))
    table = _rank(pd.DataFrame(rows), float(given_result["iteration_time_ns"]))
    notes = []
    if given_prep.footprint_bytes <= available:
        notes.append("the job as given fits in the GPU memory: no oversubscription, every policy is about equal")
    return Advice(
        rows=table,
        workload=cfg.workload.workload,
        gpu=given_prep.gpu.name,
        available_bytes=available,
        given_footprint_bytes=given_prep.footprint_bytes,
        given_policy="pca-on" if given.pca else "pca-off",
        native_pca_time_ns=native,
        notes=notes,
    )


def _evaluate(
    pol: Policy, given: RunConfig, available: int, batch: int, native: float, given_prep: Any = None
) -> dict[str, Any]:
    """One policy's row (an OOM or a policy that cannot apply is a row too, with the reason)."""
    cfg = pol.apply(given)
    try:
        if "garbage_collection_threshold" in pol.alloc_conf:
            oom = _gc_oom(given, available)
            if oom:
                return _failed_row(pol, "oom", oom)
        if pol.fit_batch:
            cfg = _with_fit(cfg, pol, given, available, batch)
            if cfg is None:
                return _failed_row(pol, "n/a", "does not fit even at micro-batch 1 (parameters and optimizer state)")
        prep, result = _simulate(cfg, available)
    except InputError as exc:
        return _failed_row(pol, "n/a", str(exc))
    row = _row(pol, cfg, prep, result, native)
    if pol.checkpoint or pol.offload_optimizer:
        from uvmlab.advise.shape import shape_note
        from uvmlab.uvm.simulate import prepare

        row["note"] = shape_note(pol, prep, given_prep or prepare(given, available_bytes=available))
    if pol.sim_options.get("discard_min_bytes"):
        discard = "upper bound: one remap fault per 64 KiB page assumed on reuse (docs/advise.md)"
        row["note"] = "; ".join(n for n in (row["note"], discard) if n)
    if pol.fit_batch:
        fit = f"micro-batch {row['batch_size']} x {row['accumulation_steps']} steps (given batch {batch})"
        row["note"] = "; ".join(n for n in (fit, row["note"]) if n)
    return row


def _combinations(singles: dict[str, float], given_result: dict[str, Any]) -> list[tuple[str, ...]]:
    """The best improving single policy of each family, combined: best pairs first, then all of them.

    The micro-batch policy is not combined: a micro-batch that fits removes the oversubscription, so a UVM policy
    added to it changes nothing that matters and would only take the job-shape policy's rank. Checkpointing and
    CPU offload only shrink the footprint, so each competes as its own family.
    """
    given_t = float(given_result["iteration_time_ns"])
    best: dict[str, tuple[float, str]] = {}
    for name, t in singles.items():
        fam = POLICIES[name].family
        if POLICIES[name].fit_batch:
            continue
        if fam == "job-shape":  # checkpointing and CPU offload shrink different things: each may pair
            fam = name
        if fam == "uvm-hint":  # each hint acts on other tensors or events (uvmlab.sim.uvm.hints): they compose
            fam = f"uvm-hint:{name}"
        if t < given_t and name != "pca-on" and (fam not in best or t < best[fam][0]):
            best[fam] = (t, name)
    ranked = [name for _, name in sorted(best.values())]
    combos: list[tuple[str, ...]] = []
    for i in range(len(ranked)):
        for j in range(i + 1, len(ranked)):
            combos.append((ranked[i], ranked[j]))
    if len(ranked) > 2:
        combos.append(tuple(ranked))
    valid = []
    for combo in combos:
        try:
            compose([POLICIES[n] for n in combo])
        except InputError:
            continue
        valid.append(combo)
    return valid[:MAX_COMBINATIONS]


def _rank(df: pd.DataFrame, given_time_ns: float) -> pd.DataFrame:
    for col in ROW_COLUMNS:
        if col not in df.columns:
            df[col] = None
    df["speedup_vs_given"] = given_time_ns / df["iteration_time_ns"].astype(float)
    ok = df["outcome"] == "ok"
    df = pd.concat(
        [df[ok].sort_values("iteration_time_ns", kind="stable"), df[~ok]],
        ignore_index=True,
    )
    df["rank"] = [i + 1 if o else None for i, o in enumerate(df["outcome"] == "ok")]
    return df[list(ROW_COLUMNS)]


def resolve_policy(cfg: RunConfig, progress: Any = None) -> RunConfig:
    """``cfg`` with its named policy resolved into ``RunConfig.applied``, on the GPU memory the job as given has.

    The memory is that of the job as given (without the policy): its footprint / ``cfg.oversub``, so that
    ``uvmlab run --policy P --oversub F`` answers "the same job on the same GPU, with P applied". This is the one
    place a run's policy name is looked up; everything below reads ``cfg.applied``.
    """
    from uvmlab.uvm.simulate import prepare

    if not cfg.policy:
        raise InputError("no policy given")
    pol = get_policy(cfg.policy)
    given = replace(cfg, policy=None, applied=None)
    given_prep = prepare(given, progress=progress)
    available = given_prep.available_bytes
    eff: RunConfig | None = pol.apply(given)
    if pol.fit_batch:
        eff = _with_fit(eff, pol, given, available, int(given_prep.trace.header.get("batch_size") or 0))
        if eff is None:
            raise InputError(f"policy {pol.name}: the job does not fit in {available} bytes even at micro-batch 1")
    return replace(eff, applied=pol.resolved(available))


def _with_fit(cfg: RunConfig, pol: Policy, given: RunConfig, available: int, batch: int) -> RunConfig | None:
    """``cfg`` with the micro-batch and accumulation steps :func:`fit_batch` finds for ``given`` (None: none fits)."""
    fit = fit_batch(_fit_base(pol, given), available, batch)
    if fit is None:
        return None
    return replace(cfg, workload=replace(cfg.workload, batch_size=fit[0], accumulation_steps=fit[1]))


def _fit_base(pol: Policy, given: RunConfig) -> RunConfig:
    """The job whose footprints the micro-batch search measures: the given job, or, composed with a job-shape
    policy, the job that policy makes (optimizer state on the host, or checkpointed segments: a larger micro-batch
    may fit; with checkpointing each micro-batch tried is its own capture)."""
    if not (pol.offload_optimizer or pol.checkpoint):
        return given
    workload = replace(given.workload, checkpoint=given.workload.checkpoint or pol.checkpoint)
    if pol.offload_optimizer:
        offload = POLICIES["offload-optimizer"]
        return replace(given, workload=workload, policy=offload.name, applied=offload.resolved())
    return replace(given, workload=workload)


def shape_fit_combination(rows: list[dict[str, Any]], available: int) -> tuple[str, ...] | None:
    """``offload-optimizer+fit-batch-accumulate`` when no micro-batch fits alone and the offloaded job does not
    fit either: with the optimizer state on the host a micro-batch may fit (AlexNet, whose parameters and Adam
    state alone exceed the memory). None otherwise."""
    by = {r["policy"]: r for r in rows}
    fit, off = by.get("fit-batch-accumulate"), by.get("offload-optimizer")
    if fit and off and fit["outcome"] == "n/a" and off["outcome"] == "ok" and off["footprint_bytes"] > available:
        return ("offload-optimizer", "fit-batch-accumulate")
    return None
