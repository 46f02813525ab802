"""Scorecard check: the uvm-eval Titan V driver logs (real-data/uvm/uvm-eval_titanv_460.27.04) through the UVM model.

abc.cu (real-data/uvm README section 1): three managed 2 MiB arrays a, b, c; the CPU initialises the first 32
pages of each; one warp of 32 threads does ``c[p] = a[p] + b[p]``, one page per thread; prefetcher off. Each of
the four logs shows 96 faults: 56 + 8 reads (two VA blocks, then one) and 32 writes (one block). The shipped
program file ``workloads/files/abc.py``, run as ``uvmlab run`` runs it (:func:`simulate_abc`), must give the same
totals, read/write split and VA blocks (band 1.0). The model has no
arrival times: its warp faults one access per step (a's 32 pages, b's, then c's: three batches), where the log
splits the 64 reads 56 + 8 by arrival; consecutive same-kind batches are merged on both sides before the batch
count is compared (docs/uvm-sim.md). The wall time of the fault handling is tabulated as a
fitted point: the fault-path cost defaults come from these logs (a consistency check, not a validation). So is
the default ``batch_unique_pages``: 256 entries minus the mean duplicate faults per batch of the cuBLAS log.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from uvmlab.files.inputs import MAX_DATA_FILE_BYTES, read_input_text
from uvmlab.validate.points import Point, check

DATASET = "uvm/uvm-eval_titanv_460.27.04"
ACCESS = {1: "read", 2: "write"}  # access_type of the f, lines (real-data/uvm README section 1)
LOG_GLOB = "abc_short_log_32_ts_abc_*.kmsg"
CUBLAS_LOG = "cublas_wq256-3.dmesg"
FAULT_BUFFER_ENTRIES = 256  # entries per fault batch (reference/uvm.md 1.4; the log's "wq256")


def parse_abc(path: Path) -> dict[str, Any]:
    """Batches (access kind, faults, distinct VA blocks), distinct VA blocks per access kind, destroyed ranges and
    wall time (us) of one abc log."""
    from uvmlab.sim.uvm.knobs import VA_BLOCK_BYTES

    batches: list[dict[str, Any]] = []
    destroyed: list[tuple[int, int]] = []
    t_first = t_last = None
    for line in read_input_text(path, MAX_DATA_FILE_BYTES, "a UVM driver log").splitlines():
        head, _, msg = line.partition(";")
        t_us = int(head.split(",")[2])
        if msg.startswith("s,"):
            batches.append({"faults": [], "kinds": set()})
            t_first = t_us if t_first is None else t_first
        elif msg.startswith("f,"):
            f = msg.split(",")
            batches[-1]["faults"].append(int(f[1], 16))
            batches[-1]["kinds"].add(ACCESS[int(f[4])])
        elif msg.startswith("b,"):
            t_last = t_us
        elif "range destroy" in msg:
            start, size = msg.split(":")[1].split(",")
            destroyed.append((int(start, 16), int(size)))
    out = []
    blocks: dict[str, set[int]] = {}
    for b in batches:
        (kind,) = b["kinds"]
        out.append((kind, len(b["faults"]), len({a // VA_BLOCK_BYTES for a in b["faults"]})))
        blocks.setdefault(kind, set()).update(a // VA_BLOCK_BYTES for a in b["faults"])
    wall = (t_last - t_first) if t_first is not None and t_last is not None else 0
    return {"batches": out, "blocks": {k: len(v) for k, v in blocks.items()}, "destroyed": destroyed, "wall_us": wall}


ABC_SIM_OPTIONS = {"batch_unique_pages": FAULT_BUFFER_ENTRIES}
"""One warp: all its 64 loads are in flight together, so the batch is not limited by concurrency
(``batch_unique_pages`` = the 256-entry batch); ``workloads/files/abc.py`` docstring."""


def simulate_abc(
    sim_options: dict[str, Any] | None = None, costs: Any = None
) -> tuple[dict[str, Any], list[tuple[str, int, int]]]:
    """``uvmlab run workloads/files/abc.py --gpu TitanV --pca off --no-prefetch --iterations 1 --sim-option
    batch_unique_pages=256``: (result.json content, the fault batches (kind, faults, VA blocks) of its kernel).

    The logged driver ran with the prefetcher off (``uvm_perf_prefetch_enable=0`` in genabcfaults.sh). The result's
    fault counts and ``stall_ns`` are the kernel's (iteration 0): the logs time the GPU's fault handling, not the
    host's initialisation (setup). ``costs``: cost parameters instead of the Titan V's profile (``--params``); the
    scorecard passes the defaults of ``CostParams``, whose fault-path constants come from these logs."""
    from uvmlab.uvm.simulate import card_bytes, shipped_config, simulate

    opts = ABC_SIM_OPTIONS if sim_options is None else sim_options
    cfg = shipped_config("abc", {}, "TitanV", iterations=1, prefetch=False, sim_options=opts)
    _, res, result = simulate(cfg, costs=costs, record_events=True, available_bytes=card_bytes(cfg))
    timed = set(res.kernels.loc[res.kernels["iteration"] >= 0, "kernel_id"].tolist())
    batches = [(e[2], e[3], e[4]) for e in res.events or [] if e[1] == "batch" and e[0] in timed]
    result["stall_ns"] = float(res.iterations["stall_ns"].sum())
    return result, batches


def merge_same_kind(batches: list[tuple[str, int, int]]) -> list[tuple[str, int]]:
    """Consecutive batches of the same access kind merged into one (kind, faults)."""
    merged: list[tuple[str, int]] = []
    for kind, n, _ in batches:
        if merged and merged[-1][0] == kind:
            merged[-1] = (kind, merged[-1][1] + n)
        else:
            merged.append((kind, n))
    return merged


def _sim_blocks(batches: list[tuple[str, int, int]], kind: str) -> int:
    """VA blocks the simulated batches of ``kind`` fault (the model has one batch per kind here: distinct)."""
    return sum(b for k, _, b in batches if k == kind)


@check("titanv-abc", needs="uvm/uvm-eval_titanv_460.27.04", fast=True)
def check_titanv(data_dir: Path) -> list[Point]:
    """The four abc logs against one simulated abc run."""
    from uvmlab.sim.uvm.timing import CostParams

    t, sim_batches = simulate_abc(costs=CostParams())
    points: list[Point] = []
    for log in sorted((data_dir / "uvm" / "uvm-eval_titanv_460.27.04").glob(LOG_GLOB)):
        real = parse_abc(log)
        rb = real["batches"]
        pairs = [
            ("GPU faults", sum(n for _, n, _ in rb), t["fault_count"]),
            ("read faults", sum(n for k, n, _ in rb if k == "read"), t["read_fault_count"]),
            ("write faults", sum(n for k, n, _ in rb if k == "write"), t["write_fault_count"]),
            ("VA blocks faulted by reads", real["blocks"].get("read", 0), _sim_blocks(sim_batches, "read")),
            ("VA blocks faulted by writes", real["blocks"].get("write", 0), _sim_blocks(sim_batches, "write")),
            ("fault batches (same-kind batches merged)", len(merge_same_kind(rb)), len(merge_same_kind(sim_batches))),
        ]
        points += [Point(DATASET, log.stem, q, "count", float(m), float(p), band=1.0) for q, m, p in pairs]
        points.append(
            Point(
                DATASET,
                log.stem,
                "fault handling wall time",
                "s",
                real["wall_us"] / 1e6,
                t["stall_ns"] / 1e9,
                fitted=True,
                note="the fault-path cost defaults come from these logs (printk of every fault inflates them)",
            )
        )
    return points


def cublas_unique_pages(path: Path) -> float:
    """256 minus the mean duplicate faults per batch of the cuBLAS log (``BC:a:dups:...`` lines)."""
    text = read_input_text(path, MAX_DATA_FILE_BYTES, "a UVM driver log")
    dups = [int(line.split("BC:")[1].split(":")[1]) for line in text.splitlines() if "BC:" in line]
    return FAULT_BUFFER_ENTRIES - sum(dups) / len(dups)


@check("titanv-cublas", needs="uvm/uvm-eval_titanv_460.27.04", fast=True)
def check_cublas(data_dir: Path) -> list[Point]:
    """The default distinct pages per fault batch against the cuBLAS log it was fitted on."""
    from uvmlab.sim.uvm.knobs import UvmKnobs

    path = data_dir / "uvm" / "uvm-eval_titanv_460.27.04" / CUBLAS_LOG
    if not path.exists():
        return []
    return [
        Point(
            DATASET,
            path.stem,
            "distinct pages per fault batch (256 - mean duplicates)",
            "count",
            cublas_unique_pages(path),
            float(UvmKnobs().batch_unique_pages),
            fitted=True,
            note="the default batch_unique_pages is fitted on this log (uvmlab.sim.uvm.knobs)",
        )
    ]
