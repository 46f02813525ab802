"""The steps of uvmlab.sim.uvm.replay.replay, each on its own (translate, statics, range events, API kernels)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd

from uvmlab.gpus import GPUS
from uvmlab.sim.uvm.replay import kernel_statics, range_events, replay, translate_accesses
from uvmlab.sim.uvm.timing import CostParams
from uvmlab.trace.schema import NEVER_FREED

GPU = GPUS["RTX5090"]


def test_range_events_put_frees_before_maps_at_one_seq() -> None:
    ranges = pd.DataFrame(
        {
            "range_id": [0, 1, 2],
            "address": [0, 0, 0],
            "size_bytes": [10, 20, 30],
            "alloc_seq": [1, 5, 7],
            "free_seq": [5, NEVER_FREED, 9],
        }
    )
    ev = range_events(ranges)
    assert ev == [(1, True, 0, 10), (5, False, 0, 10), (5, True, 1, 20), (7, True, 2, 30), (9, False, 2, 30)]


def test_translate_accesses_offsets_within_ranges() -> None:
    trace = SimpleNamespace(
        accesses=pd.DataFrame(
            {
                "kernel_id": [1, 0, 0, 1],
                "alloc_id": [0, 1, 9, 1],
                "offset_bytes": [4, 0, 0, 8],
                "size_bytes": [8, 16, 4, 0],
                "is_write": [False, True, False, True],
            }
        )
    )
    placement = SimpleNamespace(
        blocks=pd.DataFrame({"alloc_id": [0, 1], "range_id": [0, 0], "address": [1000, 1512]}),
        ranges=pd.DataFrame(
            {"range_id": [0], "address": [1000], "size_bytes": [4096], "alloc_seq": [0], "free_seq": [NEVER_FREED]}
        ),
    )
    acc = translate_accesses(trace, placement, np.array([0, 1]))
    assert acc.skipped == 1  # alloc 9 was not placed; the 0-byte access is dropped, not skipped
    assert acc.rows[acc.lo[0] : acc.hi[0]] == [(0, 512, 16, True)]
    assert acc.rows[acc.lo[1] : acc.hi[1]] == [(0, 4, 8, False)]


def _file_trace(name: str, options: dict, iterations: int = 2):
    """(trace, placement) of a shipped program file as ``uvmlab run FILE --pca off`` prepares them."""
    from uvmlab.uvm.simulate import prepare, shipped_config

    prep = prepare(shipped_config(name, options, "RTX5090", iterations=iterations))
    return prep.trace, prep.placement


def test_kernel_statics_honour_touched_bytes_and_api() -> None:
    tr, _ = _file_trace("gcn", {"nodes": 100_000, "prefetch": True}, iterations=1)
    kern = tr.kernels.sort_values("seq").reset_index(drop=True)
    st = kernel_statics(tr, kern, GPU, CostParams().for_gpu(GPU), "fp32")
    assert st.api.count("prefetch") == (kern["api"] == "prefetch").sum() > 0
    bench, _ = _file_trace("uvmbench", {"size_factor": 0.01})
    kern = bench.kernels.sort_values("seq").reset_index(drop=True)
    st = kernel_statics(bench, kern, GPU, CostParams().for_gpu(GPU), "fp32")
    st2 = kernel_statics(bench, kern.assign(touched_bytes=np.nan), GPU, CostParams().for_gpu(GPU), "fp32")
    launch = (kern["api"] == "").to_numpy()
    # a page-strided kernel's roofline uses the sectors it moves (touched_bytes), not the byte span of its arrays
    assert (st.native_ns[launch] < st2.native_ns[launch]).all()


def test_prefetch_kernels_remove_faults_and_host_writes_create_migrations() -> None:
    tr, pl = _file_trace("gcn", {"nodes": 100_000, "prefetch": True})
    cap = 1 << 34
    with_p = replay(tr, pl, cap, GPU)
    plain_tr, plain_pl = _file_trace("gcn", {"nodes": 100_000})
    without = replay(plain_tr, plain_pl, cap, GPU)
    assert with_p.totals.fault_count < 0.05 * without.totals.fault_count
    k = tr.kernels.copy()
    k.loc[k["name"] == "aten::randn", "api"] = "host_write"  # x written by the CPU instead of a kernel
    tr2 = type(tr)(tr.allocations, k, tr.accesses, tr.header)
    hw = replay(tr2, pl, cap, GPU)
    assert hw.totals.htod_bytes > with_p.totals.htod_bytes  # x now comes from the host on first GPU use
