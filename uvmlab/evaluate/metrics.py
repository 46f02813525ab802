"""xMem's estimator metrics: relative error, MRE, PEF with the two-round rule, and MCP (xMem section 4.1.4-4.1.5).

Notation of xMem (seeds/000, Eqs. 1-8), for a run n of configuration j on device d with estimator e:

- Eq. 1  ``oom_hat = [M_hat > M_max]``: the estimator predicts an OOM when its peak exceeds the device memory.
- Eq. 4  ``C1 = [oom_hat == OOM1]``: round 1 passes when the OOM prediction matches the real full-memory run.
- Round 2 runs only when ``C1 = 1 and OOM1 = 0``: the job runs again capped at ``M_init + M_fm + M_hat``
  (CUDA context + framework memory + the estimate) and records ``OOM2`` and ``M_peak2``.
- Eq. 5  ``C2 = [C1 = 1 and (OOM2 = 0 or OOM1 = 1)]``.
- Eq. 2  ``error_i = |M_hat - M_peak_i| / M_peak_i`` (only for OOM1 = 0: no ground truth peak after a real OOM).
- Eq. 3  ``MRE = median(error2 if OOM2 = 0 else error1)`` over runs with OOM1 = 0.
- Eq. 6  ``PEF = (N - sum C2) / N`` (we also report the round-1 rate ``(N - sum C1) / N`` as ``pef_round1``).
- Eq. 7  ``save = M_max - M_hat`` if ``C1 = 1 and OOM2 = 0``; ``M_max`` if ``C1 = 1 and OOM1 = 1``; else
  ``-M_max``.  (The prose of xMem says the *estimate* is deducted on failure; Eq. 7 deducts ``M_max``. We follow
  the equation and say so in docs/evaluation.md.)
- Eq. 8  ``MCP = mean(save)``.

Round 2 without a GPU: when the ground truth has no second-round measurement (columns ``round2_oom`` /
``round2_peak_bytes`` empty) we *model* it: ``M_init + M_fm`` cancel on both sides of the cap, so the capped run
fails exactly when the estimate is below the measured peak (``OOM2 = [M_hat < M_peak1]``) and, when it passes,
``M_peak2 = M_peak1``. This ignores that PyTorch's caching allocator can free its cache and retry under a cap, so a
run capped slightly below its uncapped reserved peak may still pass (the model is pessimistic for estimators that
underestimate by less than the cache). Documented in docs/evaluation.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from uvmlab.errors import InputError

QUADRANT_THRESHOLD = 0.20
"""xMem Fig. 8 splits the PEF-MRE plane at 20 % on both axes (section 4.3)."""

PER_RUN_COLUMNS = (
    "case_id",
    "estimator",
    "group",
    "estimate_bytes",
    "gpu_memory_bytes",
    "measured_peak_bytes",
    "oom",
    "oom_hat",
    "c1",
    "round2_ran",
    "round2_oom",
    "round2_peak_bytes",
    "error1",
    "error2",
    "error_mre",
    "c2",
    "save_bytes",
)


def _isnan(x: float | None) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def relative_error(estimate_bytes: float, peak_bytes: float) -> float:
    """xMem Eq. 2: ``|estimate - peak| / peak``; NaN when the peak is unknown (a real OOM) or not positive."""
    if _isnan(peak_bytes) or _isnan(estimate_bytes) or peak_bytes <= 0:
        return math.nan
    return abs(float(estimate_bytes) - float(peak_bytes)) / float(peak_bytes)


def two_round(
    estimate_bytes: float,
    gpu_memory_bytes: float,
    oom: bool,
    measured_peak_bytes: float,
    round2_oom: bool | None = None,
    round2_peak_bytes: float | None = None,
) -> dict[str, object]:
    """One run through xMem's two-round validation (Eqs. 1, 2, 4, 5, 7); see the module docstring.

    ``oom`` is OOM1 (the real full-memory run failed); ``measured_peak_bytes`` is M_peak1 (NaN when ``oom``).
    ``round2_oom``/``round2_peak_bytes`` are a measured second round; None means "model it" (module docstring).
    """
    oom = bool(oom)
    oom_hat = bool(estimate_bytes > gpu_memory_bytes)  # Eq. 1
    c1 = oom_hat == oom  # Eq. 4
    round2_ran = c1 and not oom
    oom2: bool | None = None
    peak2 = math.nan
    if round2_ran:
        if round2_oom is None:  # modelled second round: the cap M_init + M_fm + M_hat against M_init + M_fm + M_peak1
            oom2 = bool(estimate_bytes < measured_peak_bytes)
            peak2 = math.nan if oom2 else float(measured_peak_bytes)
        else:
            oom2 = bool(round2_oom)
            peak2 = math.nan if oom2 or round2_peak_bytes is None else float(round2_peak_bytes)
    error1 = math.nan if oom else relative_error(estimate_bytes, measured_peak_bytes)
    error2 = relative_error(estimate_bytes, peak2) if oom2 is False else math.nan
    error_mre = error2 if oom2 is False else error1  # Eq. 3's case split
    c2 = c1 and (oom2 is False or oom)  # Eq. 5
    if c1 and oom2 is False:  # Eq. 7
        save = float(gpu_memory_bytes) - float(estimate_bytes)
    elif c1 and oom:
        save = float(gpu_memory_bytes)
    else:
        save = -float(gpu_memory_bytes)
    return {
        "oom_hat": oom_hat,
        "c1": bool(c1),
        "round2_ran": bool(round2_ran),
        "round2_oom": oom2,
        "round2_peak_bytes": peak2,
        "error1": error1,
        "error2": error2,
        "error_mre": error_mre,
        "c2": bool(c2),
        "save_bytes": save,
    }


def evaluate_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """Apply :func:`two_round` to every row of ``runs``.

    ``runs`` columns: case_id, estimator, group, estimate_bytes, gpu_memory_bytes, oom, measured_peak_bytes and
    optionally round2_oom, round2_peak_bytes (NaN/None: modelled). Returns one row per run with PER_RUN_COLUMNS.
    """
    need = ("case_id", "estimator", "estimate_bytes", "gpu_memory_bytes", "oom", "measured_peak_bytes")
    missing = [c for c in need if c not in runs.columns]
    if missing:
        raise InputError(f"evaluation runs lack columns {missing}")
    rows = []
    for r in runs.itertuples(index=False):
        d = r._asdict()
        r2o = d.get("round2_oom")
        r2p = d.get("round2_peak_bytes")
        out = two_round(
            float(d["estimate_bytes"]),
            float(d["gpu_memory_bytes"]),
            bool(d["oom"]),
            float(d["measured_peak_bytes"]) if not _isnan(d["measured_peak_bytes"]) else math.nan,
            None if r2o is None or (isinstance(r2o, float) and math.isnan(r2o)) or r2o is pd.NA else bool(r2o),
            None if r2p is None or _isnan(r2p) or r2p is pd.NA else float(r2p),
        )
        rows.append(
            {
                "case_id": d["case_id"],
                "estimator": d["estimator"],
                "group": d.get("group", d["case_id"]),
                "estimate_bytes": float(d["estimate_bytes"]),
                "gpu_memory_bytes": float(d["gpu_memory_bytes"]),
                "measured_peak_bytes": float(d["measured_peak_bytes"]),
                "oom": bool(d["oom"]),
                **out,
            }
        )
    return pd.DataFrame(rows, columns=list(PER_RUN_COLUMNS))


def summarize(per_run: pd.DataFrame, by: Sequence[str] = ("estimator",)) -> pd.DataFrame:
    """MRE (Eq. 3), PEF (Eq. 6, round 2), PEF after round 1, MCP (Eq. 8) per group of ``by``.

    ``n`` counts all runs; ``n_mre`` the runs with OOM1 = 0 that enter the median (NaN MRE when there are none).
    """
    out = []
    for key, g in per_run.groupby(list(by), sort=True):
        key = key if isinstance(key, tuple) else (key,)
        n = len(g)
        errs = g.loc[~g["oom"], "error_mre"].dropna()
        out.append(
            {
                **dict(zip(by, key, strict=True)),
                "n": n,
                "n_mre": len(errs),
                "mre": float(np.median(errs)) if len(errs) else math.nan,
                "pef": (n - int(g["c2"].sum())) / n,
                "pef_round1": (n - int(g["c1"].sum())) / n,
                "mcp_bytes": float(g["save_bytes"].mean()),
            }
        )
    return pd.DataFrame(out)


def quadrant(pef: float, mre: float, threshold: float = QUADRANT_THRESHOLD) -> str:
    """xMem Fig. 8 quadrant name: optimal, overestimation (high MRE, low PEF), underestimation, worst."""
    if _isnan(pef) or _isnan(mre):
        return "n/a"
    hi_pef, hi_mre = pef > threshold, mre > threshold
    if not hi_pef and not hi_mre:
        return "optimal"
    if hi_mre and not hi_pef:
        return "overestimation"
    if hi_pef and not hi_mre:
        return "underestimation"
    return "worst"
