"""A Summary as printable tables (title, columns, rows); "n/a" is None here (uvmlab.console prints them as
tables or CSV)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from uvmlab.measure.nsys.stats import Summary
from uvmlab.stats.schema import cell_value
from uvmlab.units import format_bytes

Table = tuple[str, list[str], list[list[Any]]]


def summary_tables(s: Summary) -> list[Table]:
    """The tables `uvmlab nsys summarize` prints, in order."""
    e = s.export
    out: list[Table] = []
    out.append(
        (
            "Export",
            ["field", "value"],
            [
                ["path", str(e["path"])],
                ["nsys version", e["nsys_version"]],
                ["schema version", e["schema_version"]],
                ["version from", e["version_source"]],
                *[[f"rows in {t}", n if n is not None else "absent"] for t, n in e["tables"].items()],
            ],
        )
    )
    out.append(
        (
            "What was collected",
            ["source", "status", "reason"],
            [[k, v["status"], v["reason"]] for k, v in s.collection.items()],
        )
    )
    f = s.faults
    out.append(("Page faults", ["figure", "count"], [[k, v] for k, v in f.items()]))
    m = s.migrations
    rows: list[list[Any]] = [["all", "all", m["count"], m["bytes"], _fmt(m["bytes"])]]
    for r in m["by_direction_and_cause"] or []:
        rows.append([r["direction"], r["cause"], r["count"], r["bytes"], _fmt(r["bytes"])])
    out.append(("UM migrations (MEMCPY copyKind 11/12/13)", ["direction", "cause", "count", "bytes", "size"], rows))
    u = s.um_total_sum
    runs = (
        "yes"
        if u["nvidia_report_runs"]
        else "no (missing " + ", ".join(u["nvidia_report_refuses_because_missing"]) + ")"
    )
    out.append(
        (
            "um_total_sum figures (nsys stats -r um_total_sum)",
            ["figure", "value"],
            [["nsys stats would run", runs]] + [[k, v] for k, v in u.items() if k.startswith("total_")],
        )
    )
    if s.um_sum:
        cols = list(s.um_sum[0])
        rows = [[address_text(r[c]) if c == "address" else r[c] for c in cols] for r in s.um_sum]
        out.append(("um_sum top addresses (nsys stats -r um_sum)", cols, rows))
    a = s.attribution
    rows = [
        [
            "inside kernels",
            a["inside_kernels"]["fault_records"],
            a["inside_kernels"]["fault_count"],
            a["inside_kernels"]["htod_bytes"],
            a["inside_kernels"]["dtoh_bytes"],
        ]
    ]
    for name, b in a["outside_kernels"].items():
        rows.append(
            [f"outside kernels: {name}", b["fault_records"], b["fault_count"], b["htod_bytes"], b["dtoh_bytes"]]
        )
    nf = s.faults["gpu_fault_count"] is None
    nm = s.migrations["count"] is None
    rows = [
        [r[0], None if nf else r[1], None if nf else r[2], None if nm else r[3], None if nm else r[4]] for r in rows
    ]
    out.append(
        (
            f"Attribution over {a['kernels']} kernels (time overlap, same process and device)",
            ["bucket", "fault_records", "fault_count", "htod_bytes", "dtoh_bytes"],
            rows,
        )
    )
    if len(s.iterations):
        cols = [
            "iteration",
            "duration_ns",
            "fault_count",
            "read_fault_count",
            "write_fault_count",
            "htod_bytes",
            "dtoh_bytes",
        ]
        out.append(("Per iteration (NVTX)", cols, _rows(s.iterations, cols)))
    if len(s.top_kernels):
        cols = list(s.top_kernels.columns)
        out.append(("Top kernels by faults", cols, _rows(s.top_kernels, cols)))
    mem = s.memory
    out.append(("GPU memory usage events", ["figure", "value"], [[k, v] for k, v in mem.items()]))
    return out


def address_text(a: Any) -> str | None:
    """A virtual address as hex (``0x7f3a00000000``), as nsys and the CUDA tools print them; JSON keeps the int."""
    return None if a is None else f"0x{int(a):x}"


def _fmt(n: Any) -> str | None:
    return None if n is None else format_bytes(n)


def _rows(df: pd.DataFrame, cols: list[str]) -> list[list[Any]]:
    """Rows of ``df[cols]`` as plain values (itertuples keeps each column's dtype; iterrows would cast ints)."""
    return [[cell_value(v) for v in r] for r in df[cols].itertuples(index=False)]
