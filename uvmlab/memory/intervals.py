"""Honest intervals for a memory estimate, and the ``required_mb`` rule, from validation residuals.

Every estimate belongs to a model family (:func:`family_of`: ``cnn``, ``transformer``, ``mlp``). For each family,
with and without a stack calibration (``uvmlab.memory.stack``), ``residuals.json`` (beside this module, written by
``python tools/memory_residuals.py --write``) holds the relative residuals ``measured / predicted - 1`` of the
validation rows of every whole-device data set (``uvmlab.evaluate.memory_validation``): their 10th, 50th and 90th
percentiles, and ``cover``, the **rule** for ``required_mb``:

    cover = max over the family's data sets of the 95th percentile (nearest rank, rounded up) of its residuals

so that ``required = device_peak x (1 + cover)`` covers the measured peak on at least 95 % of the validation rows
of EVERY data set of the family (not only of their union); ``cover`` is never below 0. A family without any
validation data (today: ``transformer``: no whole-device measurement of a transformer is held) takes the
largest ``cover`` and the widest percentiles of the families that have data, and says so in ``source``.

The interval of an estimate is ``device_peak x (1 + p10)`` to ``device_peak x (1 + p90)``: where the validation
rows put the measurement 80 % of the time. It describes the data sets held, not a guarantee for other stacks.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path
from typing import Any

RESIDUALS_FILE = Path(__file__).with_name("residuals.json")
RESIDUALS_SCHEMA = "uvmlab.memory.residuals/1"
FAMILIES = ("cnn", "transformer", "mlp")
COVERAGE = 0.95
ATTENTION_OPS = frozenset(
    {"scaled_dot_product_attention", "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
     "_efficient_attention_forward", "_flash_attention_forward", "_scaled_dot_product_cudnn_attention"}
)  # fmt: skip


def family_of(trace: Any) -> str:
    """``transformer`` when the trace runs attention (SDPA, or a softmax beside batched matmuls), ``cnn`` when it
    runs convolutions, else ``mlp``."""
    from uvmlab.trace.orchestrate import CONV_OPS, op_base

    ops = {op_base(name) for name in trace.kernels["name"].unique()}
    if ops & ATTENTION_OPS or ("bmm" in ops and ops & {"_softmax", "softmax"}):
        return "transformer"
    return "cnn" if ops & CONV_OPS else "mlp"


def _quantile(values: list[float], q: float) -> float:
    """Nearest-rank quantile, rounded up (the value at or above which ``1 - q`` of ``values`` lie)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _stats(by_set: dict[str, list[float]]) -> dict[str, Any]:
    pooled = [v for vals in by_set.values() for v in vals]
    return {
        "rows": len(pooled),
        "datasets": sorted(by_set),
        "p10": _quantile(pooled, 0.10),
        "p50": _quantile(pooled, 0.50),
        "p90": _quantile(pooled, 0.90),
        "cover": max(0.0, max(_quantile(v, COVERAGE) for v in by_set.values())),
    }


def build_table(
    plain: dict[str, list[float]], stacked: dict[str, list[float]], families: dict[str, list[str]]
) -> dict[str, Any]:
    """The residual table (module docstring) from per-data-set residuals without and with a stack calibration.

    ``families[dataset]`` lists the families of a data set; a data set's residuals count for each of them (the
    sets hold one family each today)."""
    table: dict[str, Any] = {"schema": RESIDUALS_SCHEMA, "coverage": COVERAGE, "families": {}}
    for fam in FAMILIES:
        entry = {}
        for key, res in (("no_stack", plain), ("stack", stacked)):
            mine = {d: v for d, v in res.items() if v and fam in families.get(d, [])}
            if mine:
                entry[key] = {**_stats(mine), "source": "validation rows of this family"}
            else:
                allsets = {d: v for d, v in res.items() if v}
                st = _stats(allsets)
                st["p10"] = min(_quantile(v, 0.10) for v in allsets.values())
                st["p90"] = max(_quantile(v, 0.90) for v in allsets.values())
                entry[key] = {**st, "source": "no validation data for this family: the widest of all families"}
        table["families"][fam] = entry
    return table


@lru_cache(maxsize=1)
def load_table(path: str = str(RESIDUALS_FILE)) -> dict[str, Any]:
    """The residual table shipped with uvmlab (``residuals.json``)."""
    return json.loads(Path(path).read_text())


def family_stats(family: str, stack: bool, table: dict[str, Any] | None = None) -> dict[str, Any]:
    """The residual statistics of one family, with or without a stack calibration."""
    tab = table if table is not None else load_table()
    return tab["families"][family]["stack" if stack else "no_stack"]


def interval(device_peak_bytes: int, family: str, stack: bool, table: dict[str, Any] | None = None) -> dict[str, Any]:
    """The estimate's interval and ``required`` bytes (module docstring), as the estimate JSON reports them."""
    st = family_stats(family, stack, table)
    return {
        "family": family,
        "stack_calibrated": stack,
        "p10_bytes": int(device_peak_bytes * (1 + st["p10"])),
        "p90_bytes": int(device_peak_bytes * (1 + st["p90"])),
        "cover": st["cover"],
        "required_bytes": math.ceil(device_peak_bytes * (1 + st["cover"])),
        "validation_rows": st["rows"],
        "source": st["source"],
    }


def coverage(rows: list[Any], table: dict[str, Any], stack: bool) -> dict[str, float]:
    """Share of a data set's validation rows whose measurement ``required`` covers, and the median overshoot
    (``required / measured - 1``, and in bytes); ``rows`` are ``uvmlab.evaluate.memory_validation.Row``."""
    val = [r for r in rows if not r.calibration and not r.stack_fit]
    req = [r.predicted * (1 + family_stats(r.family, stack, table)["cover"]) for r in val]
    if not val:
        return {"rows": 0, "coverage": float("nan"), "median_overshoot": float("nan"), "median_overshoot_bytes": 0.0}
    over = sorted(q / r.measured - 1 for q, r in zip(req, val, strict=True))
    over_b = sorted(q - r.measured for q, r in zip(req, val, strict=True))
    return {
        "rows": len(val),
        "coverage": sum(q >= r.measured for q, r in zip(req, val, strict=True)) / len(val),
        "median_overshoot": over[len(over) // 2],
        "median_overshoot_bytes": over_b[len(over_b) // 2],
    }
