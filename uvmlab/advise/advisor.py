"""Simulate a job under every candidate memory policy on one GPU and rank the policies by iteration time.

Every policy runs on the same physical memory: the GPU memory UVM has (``available_bytes``) is fixed once, from the
job as given (PCA on unless the job says otherwise): footprint / ``--oversub``, or the GPU's usable memory.
The reference for every slowdown is the job as given with every page resident and PCA on (the study's
reference, ``slowdown_vs_native_pca``).

Each row carries the evidence for its mechanism and what applying it needs (``uvmlab.advise.evidence``); the
headline names the fastest row a user can apply now (no root, no module reload, no code change) and the fastest
validated one. Work is shared across candidates: one orchestrated trace per workload configuration, one placement
per allocator setting (:class:`_Session`).

Approximations (docs/advise.md): the micro-batch search sizes footprints, not times; an iteration of k
micro-batches is simulated as two micro-batches plus k - 2 repeats of the second one's simulated time (a
micro-batch that fits repeats exactly); combinations are formed from the best single policy of each family (at
most :data:`MAX_COMBINATIONS`), not from all pairs.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from uvmlab.advise.evidence import applicability_of, evidence_of
from uvmlab.advise.policies import POLICIES, Policy, compose, get_policy
from uvmlab.config import RunConfig
from uvmlab.errors import InputError
from uvmlab.uvm.regime import label_of as regime_label

MAX_COMBINATIONS = 3
"""At most this many combinations of single policies are simulated (issue 16: 'at most a handful')."""

ROW_KINDS: dict[str, type] = {
    "rank": int,
    "policy": object,
    "family": object,
    "outcome": object,
    "iteration_time_ns": object,
    "samples_per_iteration": int,
    "time_per_sample_ns": object,
    "slowdown_vs_native_pca": object,
    "regime": object,
    "speedup_vs_given": object,
    "peak_resident_bytes": int,
    "footprint_bytes": int,
    "fault_count": int,
    "migrated_bytes": int,
    "htod_bytes": int,
    "dtoh_bytes": int,
    "batch_size": int,
    "accumulation_steps": int,
    "evidence": object,
    "evidence_detail": object,
    "caveats": object,
    "uvmlab_gpu": object,
    "needs": object,
    "apply_now": object,
    "how_else": object,
    "apply_how": object,
    "needs_code_change": object,
    "note": object,
}
"""The advice table's columns in order, and which hold whole numbers (``int``: integers in the JSON, None where a
row has none)."""
ROW_COLUMNS = tuple(ROW_KINDS)
INT_COLUMNS = tuple(c for c, kind in ROW_KINDS.items() if kind is int)

BATCH_STAT_OPS = frozenset(
    {
        "native_batch_norm",
        "_native_batch_norm_legit",
        "_native_batch_norm_legit_functional",
        "_batch_norm_with_update",
        "cudnn_batch_norm",
        "miopen_batch_norm",
        "batch_norm_stats",
    }
)
"""aten ops that normalise with the statistics of the batch itself (BatchNorm in training, SyncBatchNorm); the eval
forms (running statistics) and per-sample norms (LayerNorm, GroupNorm, InstanceNorm) are not among them."""
MIN_BATCH_STAT_MICRO_BATCH = 8
"""A batch-statistics layer fed fewer samples than this gets a warning: Wu & He, Group Normalization (ECCV'18),
Figure 1: ResNet-50's ImageNet error with BatchNorm grows quickly as the batch per GPU falls below 16 and 8; the
threshold is issue 28's."""


@dataclass
class Advice:
    """The ranked table (:data:`ROW_COLUMNS`), what every row was measured against, and the headline."""

    rows: pd.DataFrame
    workload: str
    gpu: str
    available_bytes: int
    given_footprint_bytes: int
    given_policy: str
    native_pca_time_ns: float
    notes: list[str] = field(default_factory=list)
    headline: dict[str, Any] = field(default_factory=dict)
    """``fastest``, ``best_now`` (no root, module reload or code change) and ``best_validated``: each the policy
    name, its speedup over the job as given and its evidence level, or None when no row qualifies."""

    def records(self) -> list[dict[str, Any]]:
        """The rows as dicts with JSON types: whole-number columns as int, missing values as None."""
        out = []
        for row in self.rows.to_dict(orient="records"):
            rec = {}
            for k, v in row.items():
                if isinstance(v, float) and math.isnan(v):
                    v = None
                elif k in INT_COLUMNS and v is not None:
                    v = int(v)
                elif isinstance(v, np.generic):
                    v = v.item()
                rec[k] = v
            out.append(rec)
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON form (``--format json``; docs/advise.md documents the keys)."""
        return {
            "workload": self.workload,
            "gpu": self.gpu,
            "available_bytes": int(self.available_bytes),
            "given_footprint_bytes": int(self.given_footprint_bytes),
            "given_oversub": self.given_footprint_bytes / self.available_bytes,
            "given_policy": self.given_policy,
            "native_pca_time_ns": self.native_pca_time_ns,
            "notes": self.notes,
            "headline": self.headline,
            "policies": self.records(),
        }


def _facts(policy: Policy, extra_caveats: tuple[str, ...] = ()) -> dict[str, Any]:
    """The evidence and applicability columns of ``policy``'s row."""
    ev, ap = evidence_of(policy.name, extra_caveats), applicability_of(policy.name)
    return {
        "evidence": ev.level,
        "evidence_detail": ev.detail,
        "caveats": list(ev.caveats),
        "uvmlab_gpu": ap.uvmlab_gpu,
        "needs": list(ap.needs),
        "apply_now": ap.now,
        "how_else": ap.how_else,
        "apply_how": policy.apply_how,
        "needs_code_change": policy.needs_code_change,
    }


def _row(policy: Policy, cfg: RunConfig, prep: Any, result: dict[str, Any], native: float) -> dict[str, Any]:
    t = float(result["iteration_time_ns"])
    batch = int(prep.trace.header.get("batch_size") or 0) or None
    steps = cfg.workload.accumulation_steps
    samples = batch * steps if batch else None
    return {
        "policy": policy.name,
        "family": policy.family,
        "outcome": result.get("outcome", "ok"),
        "iteration_time_ns": t,
        "samples_per_iteration": samples,
        "time_per_sample_ns": t / samples if samples else None,
        "slowdown_vs_native_pca": t / native,
        "regime": regime_label(result.get("regime")),
        "peak_resident_bytes": int(result["peak_resident_bytes"]),
        "footprint_bytes": int(result["footprint_bytes"]),
        "fault_count": int(result["fault_count"]),
        "migrated_bytes": int(result["htod_bytes"]) + int(result["dtoh_bytes"]),
        "htod_bytes": int(result["htod_bytes"]),
        "dtoh_bytes": int(result["dtoh_bytes"]),
        "batch_size": batch,
        "accumulation_steps": steps,
        **_facts(policy),
        "note": "",
    }


def _failed_row(policy: Policy, outcome: str, note: str) -> dict[str, Any]:
    return {"policy": policy.name, "family": policy.family, "outcome": outcome, **_facts(policy), "note": note}


FIT_ITERATIONS = 3
"""Iterations of the traces the micro-batch search sizes (the peak is reached by the second iteration: the first
optimizer step creates the optimizer state, which every later iteration carries)."""
FIT_STEPS = 2
"""Micro-batches per iteration in the traces the search sizes and the advisor replays: from the second micro-batch
on, each one repeats the same kernels and allocations (gradients stay alive between them), so a loop of k >= 2
micro-batches has the footprint of 2 and, when the micro-batch fits, 2 micro-batches' time plus k - 2 repeats of
the second one's (``tests/test_advise_shape_fit.py`` checks both against real k-step captures)."""


def fit_margin(footprint: int) -> int:
    """Slack the micro-batch search keeps free: ``uvmlab estimate``'s margin (``default_margin``: max(5 % of the
    peak, 256 MiB)), so that "fits" means the same in both commands."""
    from uvmlab.memory.estimate import default_margin

    return default_margin(footprint)


def fit_batch(
    cfg: RunConfig, available: int, batch: int, footprint: Callable[[RunConfig], int] | None = None
) -> tuple[int, int] | None:
    """The smallest gradient-accumulation count k dividing ``batch`` whose micro-batch ``batch // k`` fits with
    ``estimate``'s margin (:func:`fit_margin`): the effective batch stays exactly ``batch``. None when micro-batch 1
    does not fit.

    Footprints come from traces of the accumulating loop itself (``min(k, FIT_STEPS)`` micro-batches, gradients
    alive between them, :data:`FIT_ITERATIONS` iterations). A binary search over the divisors of ``batch`` (the
    footprint falls as the micro-batch shrinks).
    """
    if footprint is None:

        def footprint(c: RunConfig) -> int:
            from uvmlab.uvm.simulate import prepare

            return prepare(c).footprint_bytes

    iterations = min(cfg.workload.iterations, FIT_ITERATIONS)
    cache: dict[int, bool] = {}

    def fits(k: int) -> bool:
        if k not in cache:
            wl = replace(
                cfg.workload, batch_size=batch // k, accumulation_steps=min(k, FIT_STEPS), iterations=iterations
            )
            fp = footprint(replace(cfg, workload=wl))  # cfg.policy kept: an offloaded job's footprint
            cache[k] = fp + fit_margin(fp) <= available
        return cache[k]

    if batch < 1:
        return None
    divisors = [d for d in range(1, batch + 1) if batch % d == 0]
    if not fits(divisors[-1]):
        return None
    lo, hi = -1, len(divisors) - 1  # divisors[hi] fits; divisors[lo] (if any) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(divisors[mid]):
            hi = mid
        else:
            lo = mid
    k = divisors[hi]
    return batch // k, k


def batch_stat_ops(trace: Any) -> list[str]:
    """The batch-statistics ops (:data:`BATCH_STAT_OPS`) the trace's forward runs."""
    from uvmlab.trace.orchestrate import op_base

    k = trace.kernels
    names = k.loc[k["phase"] == "forward", "name"].map(op_base)
    return sorted(set(names) & BATCH_STAT_OPS)


def batch_stat_warning(ops: list[str], micro: int) -> str:
    """The warning of a micro-batch below :data:`MIN_BATCH_STAT_MICRO_BATCH` under batch-statistics layers, or ''."""
    if not ops or micro >= MIN_BATCH_STAT_MICRO_BATCH:
        return ""
    return (
        f"BatchNorm ({', '.join(ops)}) would normalise over micro-batches of {micro} (< "
        f"{MIN_BATCH_STAT_MICRO_BATCH}): its statistics get noisy and accuracy can drop (Wu & He, ECCV'18); "
        "consider GroupNorm, SyncBatchNorm or a larger micro-batch"
    )


def last_micro_batch(kernels: pd.DataFrame, columns: tuple[str, ...] = ()) -> pd.DataFrame:
    """Per iteration >= 0 of a replay's kernels table: the simulated time (``time_ns``) of its last micro-batch
    before the optimizer step, from the end of the previous micro-batch's last backward kernel to the end of its own
    (allocator calls in between included), and the sums of ``columns`` over that micro-batch's kernels."""
    rows = []
    for it, g in kernels[kernels["iteration"] >= 0].sort_values("start_ns").groupby("iteration", sort=True):
        bwd = np.flatnonzero(g["phase"].to_numpy() == "backward")
        ends = g["end_ns"].to_numpy()
        row: dict[str, Any] = {"iteration": int(it), "time_ns": 0.0, **{c: 0.0 for c in columns}}
        if bwd.size:
            runs = np.split(bwd, np.flatnonzero(np.diff(bwd) > 1) + 1)
            first = runs[-2][-1] + 1 if len(runs) > 1 else 0
            last = runs[-1][-1]
            row["time_ns"] = float(ends[last] - (ends[first - 1] if first else g["start_ns"].iloc[0]))
            for c in columns:
                row[c] = float(g[c].to_numpy()[first : last + 1].sum())
        rows.append(row)
    return pd.DataFrame(rows, columns=["iteration", "time_ns", *columns])


class _Session:
    """The job as given, the memory every policy gets, and the work shared across candidates."""

    def __init__(self, cfg: RunConfig, available_bytes: int | None) -> None:
        from uvmlab.uvm.simulate import prepare, simulate_prepared

        self.given = replace(cfg, policy=None, applied=None)
        self._cuda: dict[str, Any] = {}
        self._preps: dict[str, Any] = {}
        self.given_prep = prepare(self.given, available_bytes=available_bytes, cuda_trace=self.cuda(self.given))
        self.available = self.given_prep.available_bytes
        self._preps[self._prep_key(self.given)] = self.given_prep
        self.batch = int(self.given_prep.trace.header.get("batch_size") or 0)
        _, self.given_result = simulate_prepared(self.given, self.given_prep)
        self.native = float(self.given_result["native_pca_time_ns"])  # all-resident, PCA on: also for a PCA-off job
        self.batch_stats = batch_stat_ops(self.given_prep.trace)

    @staticmethod
    def _wl_key(cfg: RunConfig) -> str:
        return json.dumps([cfg.workload.to_dict(), cfg.gpu, cfg.gpu_memory_bytes], sort_keys=True, default=str)

    def _prep_key(self, cfg: RunConfig) -> str:
        a = cfg.applied
        shape = None
        if a is not None:
            shape = [a.alloc_conf, a.release_each_iteration, a.offload_optimizer, a.overlap_step]
            shape += [a.offload_activations, a.optimizer_8bit]
        return json.dumps([self._wl_key(cfg), cfg.pca, shape], default=str)

    def cuda(self, cfg: RunConfig) -> Any:
        """The orchestrated trace of ``cfg``'s workload (one per workload configuration)."""
        from uvmlab.uvm.simulate import cuda_trace_of

        key = self._wl_key(cfg)
        if key not in self._cuda:
            self._cuda[key] = cuda_trace_of(cfg)
        return self._cuda[key]

    def prepare(self, cfg: RunConfig, available: int | None = None) -> Any:
        """``uvmlab.uvm.simulate.prepare`` of ``cfg`` (one per trace and allocator setting)."""
        from uvmlab.uvm.simulate import prepare

        key = self._prep_key(cfg)
        if available is not None:
            return prepare(cfg, available_bytes=available, cuda_trace=self.cuda(cfg))
        if key not in self._preps:
            self._preps[key] = prepare(cfg, available_bytes=self.available, cuda_trace=self.cuda(cfg))
        return self._preps[key]

    def footprint(self, cfg: RunConfig) -> int:
        """The footprint of ``cfg`` (its own memory, for the micro-batch search)."""
        return int(self.prepare(cfg).footprint_bytes)

    def simulate(self, cfg: RunConfig) -> tuple[Any, Any, dict[str, Any]]:
        from uvmlab.uvm.simulate import simulate_prepared

        prep = self.prepare(cfg)
        res, result = simulate_prepared(cfg, prep)
        return prep, res, result


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
    from workloads.registry import load_workload

    say = progress or (lambda _msg: None)

    names = policies if policies is not None else list(POLICIES)
    unknown = [n for n in names if n not in POLICIES]
    if unknown:  # bad input is one sentence before anything is simulated or printed
        raise InputError(f"unknown policy {unknown[0]!r}; policies: {', '.join(POLICIES)}")
    load_workload(cfg.workload.workload)  # an unknown workload, likewise
    say("the job as given")
    ss = _Session(cfg, available_bytes)
    rows: list[dict[str, Any]] = []
    singles: dict[str, float] = {}
    for name in names:
        pol = POLICIES[name]
        say(pol.name)
        if pol.changes_nothing_for(ss.given):
            rows.append(_row(pol, ss.given, ss.given_prep, ss.given_result, ss.native))  # already simulated
        else:
            rows.append(_evaluate(pol, ss))
        if rows[-1]["outcome"] == "ok":
            singles[name] = rows[-1]["iteration_time_ns"]
    if combine:
        shape_fit = shape_fit_combination(rows, ss.available)
        for combo in _combinations(singles, ss.given_result) + ([shape_fit] if shape_fit else []):
            pol = compose([POLICIES[n] for n in combo])
            say(pol.name)
            rows.append(_evaluate(pol, ss))
    table = _rank(pd.DataFrame(rows), float(ss.given_result["iteration_time_ns"]))
    return Advice(
        rows=table,
        workload=cfg.workload.workload,
        gpu=ss.given_prep.gpu.name,
        available_bytes=ss.available,
        given_footprint_bytes=ss.given_prep.footprint_bytes,
        given_policy="pca-on" if ss.given.pca else "pca-off",
        native_pca_time_ns=ss.native,
        notes=_notes(table, ss),
        headline=headline(table, "pca-on" if ss.given.pca else "pca-off"),
    )


def _notes(table: pd.DataFrame, ss: _Session) -> list[str]:
    """Notes under the table: no oversubscription (and what still differs then)."""
    notes = []
    fp, avail = ss.given_prep.footprint_bytes, ss.available
    if fp <= avail:
        ok = table[table["outcome"] == "ok"]
        slow = ok.loc[ok["slowdown_vs_native_pca"].idxmax()] if len(ok) else None
        spread = ""
        if slow is not None and slow["slowdown_vs_native_pca"] > 1.05:
            spread = (
                f"; the spread in this table is the allocator's and the job shape's (slowest: {slow['policy']}, "
                f"{slow['slowdown_vs_native_pca']:.2f}x the all-resident time; the seed study measured PCA off "
                "7.22x slower than PCA on without oversubscription)"
            )
        notes.append(
            f"the job as given fits in the GPU memory (x{fp / avail:.2f}): no oversubscription, so driver settings "
            f"and UVM hints have no evictions to act on{spread}"
        )
    return notes


HEADLINE_LABELS = {
    "best_now": "best you can apply now (no root, module reload or code change)",
    "best_validated": "best validated on real hardware",
    "fastest": "fastest predicted",
    "fastest_calm": "fastest that does not thrash (fits or pages: docs/uvm-sim.md, The regime)",
}
"""The headline's lines in order, by :func:`headline` key."""
NOTHING_FASTER = "nothing is predicted faster than the job as given: keep it"
"""The headline's words where no row a user can apply now beats the job as given (``best_now`` None)."""


def headline_lines(h: dict[str, Any]) -> list[str]:
    """The headline as printed by ``uvmlab advise`` and docs/advise-tables.md: one 'label: policy (#rank, speedup;
    evidence; needs)' line per :data:`HEADLINE_LABELS` key."""
    out = []
    for key, label in HEADLINE_LABELS.items():
        r = h.get(key)
        if r is None:
            what = NOTHING_FASTER if key == "best_now" else "none of the candidates"
        else:
            what = (
                f"{r['policy']} (#{r['rank']}, {r['speedup_vs_given']:.2f}x the job as given; {r['evidence']}; "
                f"needs {', '.join(r['needs']) or 'nothing'})"
            )
        out.append(f"{label}: {what}")
    return out


def headline(table: pd.DataFrame, given_policy: str = "") -> dict[str, Any]:
    """The fastest row, the fastest a user can apply now (no root, module reload or code change) that is predicted
    faster than the job as given (``given_policy`` itself does not count: it changes nothing; None when no such row
    beats it, so that the headline never recommends a slowdown), the fastest validated one, and the fastest whose
    regime is not thrashing (uvmlab.uvm.regime: a job that pages slows with the bytes it moves, one that thrashes
    can crawl; rows are in rank order)."""
    ok = table[table["outcome"] == "ok"]

    def pick(mask: Any) -> dict[str, Any] | None:
        sel = ok[mask]
        if sel.empty:
            return None
        r = sel.iloc[0]
        return {
            "policy": r["policy"],
            "rank": int(r["rank"]),
            "speedup_vs_given": float(r["speedup_vs_given"]),
            "evidence": r["evidence"],
            "needs": list(r["needs"]),
        }

    return {
        "fastest": pick(np.ones(len(ok), dtype=bool)),
        "best_now": pick(
            ok["apply_now"].astype(bool).to_numpy()
            & (ok["policy"] != given_policy).to_numpy()
            & (ok["speedup_vs_given"].to_numpy(dtype=float) > 1.0)
        ),
        "best_validated": pick((ok["evidence"] == "validated").to_numpy()),
        "fastest_calm": pick(ok["regime"].isin(("fits", "paging")).to_numpy()),
    }


def _evaluate(pol: Policy, ss: _Session) -> dict[str, Any]:
    """One policy's row (an OOM or a policy that cannot apply is a row too, with the reason)."""
    given = ss.given
    cfg = pol.apply(given)
    steps = 1
    try:
        if "garbage_collection_threshold" in pol.alloc_conf:
            oom = _gc_oom(given, ss.available)
            if oom:
                return _failed_row(pol, "oom", oom)
        if pol.fit_batch:
            fit = fit_batch(_fit_base(pol, given), ss.available, ss.batch, ss.footprint)
            if fit is None:
                return _failed_row(
                    pol,
                    "n/a",
                    "does not fit even at micro-batch 1 with estimate's margin (parameters and optimizer state)",
                )
            micro, steps = fit
            wl = replace(cfg.workload, batch_size=micro, accumulation_steps=min(steps, FIT_STEPS))
            cfg = replace(cfg, workload=wl)
        prep, res, result = ss.simulate(cfg)
    except InputError as exc:
        return _failed_row(pol, "n/a", str(exc))
    extra_caveats: list[str] = []
    if steps > FIT_STEPS:  # k micro-batches: 2 simulated, the second repeated k - 2 times
        _repeat_micro_batches(result, res, steps)
        cfg = replace(cfg, workload=replace(cfg.workload, accumulation_steps=steps))
    row = _row(pol, cfg, prep, result, ss.native)
    if pol.checkpoint or pol.offload_optimizer or pol.optimizer_8bit or pol.offload_activations:
        from uvmlab.advise.shape import shape_note

        row["note"] = shape_note(pol, prep, ss.given_prep)
    if pol.fit_batch:
        micro = int(row["batch_size"])
        fit = (
            f"micro-batch {micro} x {steps} steps = effective batch {micro * steps} (the given {ss.batch}, kept "
            f"exactly); fits with {_mib(ss.available - row['footprint_bytes'])} free, estimate's margin "
            f"{_mib(fit_margin(row['footprint_bytes']))}"
        )
        row["note"] = "; ".join(n for n in (fit, row["note"]) if n)
        warn = batch_stat_warning(ss.batch_stats, micro)
        if warn:
            extra_caveats.append(warn)
    if extra_caveats:
        row["caveats"] = [*row["caveats"], *extra_caveats]
    return row


def _mib(n: float) -> str:
    from uvmlab.units import format_bytes

    return format_bytes(n)


def _repeat_micro_batches(result: dict[str, Any], res: Any, steps: int) -> None:
    """``result`` of a 2-micro-batch replay turned into that of ``steps`` micro-batches: each iteration gains
    ``steps - 2`` repeats of the steady micro-batch (the last iteration's last one): its simulated time, faults and
    migrations (see :data:`FIT_STEPS`)."""
    from uvmlab.stats.schema import steady_mean

    cols = ("fault_count", "htod_bytes", "dtoh_bytes")
    last = last_micro_batch(res.kernels, cols)
    if last.empty:
        return
    rep = last.iloc[-1]  # the last iteration's: a micro-batch of iteration 1 can still carry one-time allocator work
    its = res.iterations
    result["iteration_time_ns"] = steady_mean(its["duration_ns"].to_numpy() + rep["time_ns"] * (steps - FIT_STEPS))
    for c in cols:
        result[c] = int(result[c] + rep[c] * len(its) * (steps - FIT_STEPS))


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


def _combination_family(name: str) -> str:
    """The family a single policy competes in for combinations (each UVM hint and most job-shape policies are
    their own; the three optimizer-state policies are one: they replace each other)."""
    pol = POLICIES[name]
    if pol.family == "job-shape":
        return "job-shape:optimizer" if (pol.offload_optimizer or pol.optimizer_8bit) else name
    if pol.family == "uvm-hint":  # each hint acts on other tensors or events (uvmlab.sim.uvm.hints): they compose
        return f"uvm-hint:{name}"
    return pol.family


def _combinations(singles: dict[str, float], given_result: dict[str, Any]) -> list[tuple[str, ...]]:
    """The best improving single policy of each family, combined: best pairs first, then all of them.

    The micro-batch policy is not combined: a micro-batch that fits removes the oversubscription, so a UVM policy
    added to it changes nothing that matters and would only take the job-shape policy's rank. Checkpointing, CPU
    offload and the other job-shape policies only shrink the footprint, so each competes as its own family.
    """
    given_t = float(given_result["iteration_time_ns"])
    best: dict[str, tuple[float, str]] = {}
    for name, t in singles.items():
        if POLICIES[name].fit_batch:
            continue
        fam = _combination_family(name)
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
    df["rank"] = pd.array([i + 1 if o else None for i, o in enumerate(df["outcome"] == "ok")], dtype="Int64")
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
    eff: RunConfig = pol.apply(given)
    if pol.fit_batch:
        batch = int(given_prep.trace.header.get("batch_size") or 0)
        fit = fit_batch(_fit_base(pol, given), available, batch)
        if fit is None:
            raise InputError(f"policy {pol.name}: the job does not fit in {available} bytes even at micro-batch 1")
        eff = replace(eff, workload=replace(eff.workload, batch_size=fit[0], accumulation_steps=fit[1]))
    return replace(eff, applied=pol.resolved(available))


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
