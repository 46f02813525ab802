"""GPUs, driver generations and the profile rule (issue 24 step 4): every number sourced, no derived value above the
hardware's own limit, and the closed-driver fault path checked against the GTX 1080 traces it was not fitted on."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from uvmlab.errors import InputError
from uvmlab.gpus import GPUS, LINKS, get_gpu
from uvmlab.measure.generation_fit import fit_closed, fit_link
from uvmlab.sim.uvm.driver import UvmSim
from uvmlab.sim.uvm.generations import FAULT_PATH_FIELDS, GENERATIONS, generation
from uvmlab.sim.uvm.knobs import PAGE_BYTES, VA_BLOCK_BYTES
from uvmlab.sim.uvm.profile import PROFILE_DIR, load_profile, pick_profile, profile_docs
from uvmlab.sim.uvm.timing import CostParams

DRIVERS = ("384.81", "418.67", "460.27.04", "470.82", "515.43.04", "535.104.05", "575.57.08", "595.45.04")


def test_pascal_volta_turing_parts_are_listed_with_sources() -> None:
    archs = {g.arch for g in GPUS.values()}
    assert {"Pascal", "Volta", "Turing"} <= archs
    for name in ("P100-PCIe", "GTX1080Ti", "V100-PCIe", "V100-SXM2-P9", "TitanV", "T4", "RTX2080Ti"):
        g = GPUS[name]
        what = dict(g.sources)
        assert {"memory, FP32, tensor, memory bandwidth", "host link"} <= set(what), name
        assert all(len(s) > 10 for s in what.values()), name
    assert GPUS["V100-SXM2-P9"].host_page_bytes == 64 * 1024 and GPUS["V100-SXM2-P9"].coherent
    assert GPUS["GH200"].host_page_bytes == 64 * 1024 and GPUS["T4"].host_page_bytes == PAGE_BYTES


def test_a_driver_is_given_after_the_gpu_name() -> None:
    g = get_gpu("v100-pcie@418.67", "16GiB")
    assert g.driver == "418.67" and g.name.startswith("V100-PCIe")
    assert generation(g.driver).profile_gpu == "GTX1080"
    assert generation(get_gpu("V100-PCIe").driver).profile_gpu == "RTX5090"
    for bad in ("V100-PCIe@foo", "V100-PCIe@340.29", "V100-PCIe@4186"):
        with pytest.raises(InputError):
            get_gpu(bad)


def test_the_fault_path_follows_the_driver_not_the_gpu() -> None:
    """The explicit rule (uvmlab.sim.uvm.profile): the generation's profile gives the fault path; A100-40GB no longer
    takes the A100-80GB profile because it sorts first."""
    closed, opened = load_profile("GTX1080"), load_profile("RTX5090")
    for name in ("V100-PCIe", "P100-PCIe", "T4", "A100-40GB", "H100-PCIe"):
        for driver, ref in (("418.67", closed), ("535.104.05", opened)):
            c, why = pick_profile(GPUS[name].with_driver(driver))
            assert all(getattr(c, f) == getattr(ref, f) for f in FAULT_PATH_FIELDS), (name, driver)
            assert generation(driver).name in why
            assert c.link_bytes_per_s is None or c.link_bytes_per_s <= GPUS[name].link_limit_bytes_per_s
    c, why = pick_profile(GPUS["RTX5090"])
    assert c == load_profile("RTX5090") and "profile RTX5090" in why
    c, _ = pick_profile(GPUS["A100-80GB"].with_driver("460.27.04"))  # its own link, the closed fault path
    assert c.link_bytes_per_s == load_profile("A100-80GB").link_bytes_per_s
    assert c.block_service_ns == closed.block_service_ns != opened.block_service_ns


def test_every_profile_names_its_driver_and_generation() -> None:
    docs = profile_docs()
    assert {g.profile_gpu for g in GENERATIONS} <= set(docs)
    for doc in docs.values():
        assert doc["fitted_on"] and doc["validated_on"] and doc["gpu"] in GPUS


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(sorted(GPUS)),
    st.sampled_from(DRIVERS),
    st.sampled_from([None, *sorted(p.name for p in PROFILE_DIR.glob("*.json"))]),
    st.floats(0.1, 10.0),
)
def test_no_derived_value_exceeds_the_hardwares_limit(gpu_name: str, driver: str, forced: str | None, k: float) -> None:
    """Property over all GPUs, drivers and profiles (also a profile forced onto another GPU, and a link scaled by
    any factor through the rule's cap): the simulator never uses a link rate above the GPU's link peak, a zero-fill
    rate above its memory bandwidth, or an efficiency above 1."""
    gpu = GPUS[gpu_name].with_driver(driver)
    costs, _ = pick_profile(gpu)
    candidates = [costs]
    if forced is not None:
        from uvmlab.sim.uvm.profile import cap_link

        other = CostParams.from_file(PROFILE_DIR / forced)
        if other.link_bytes_per_s:
            other = CostParams(**{**other.to_dict(), "link_bytes_per_s": other.link_bytes_per_s * k})
        candidates.append(cap_link(other, gpu))
    for c in candidates:
        sim = UvmSim(4 * VA_BLOCK_BYTES, costs=c, gpu=gpu)
        used = sim.costs
        for f in ("link_bytes_per_s", "remote_read_bytes_per_s", "remote_write_bytes_per_s"):
            assert getattr(used, f) <= gpu.link_limit_bytes_per_s * (1 + 1e-12), f
        assert used.zero_fill_bytes_per_s <= gpu.hbm_bytes_per_s
        for f in ("compute_efficiency", "memory_efficiency", "sector_memory_efficiency"):
            v = getattr(used, f)
            assert v is None or 0 < v <= 1, f
    assert gpu.link_bytes_per_s <= gpu.link_limit_bytes_per_s
    assert LINKS[gpu.link].sustained_bytes_per_s <= LINKS[gpu.link].peak_bytes_per_s


def test_a_link_above_the_peak_is_refused() -> None:
    gpu = GPUS["T4"]
    with pytest.raises(InputError, match="exceeds the peak"):
        UvmSim(4 * VA_BLOCK_BYTES, costs=CostParams(link_bytes_per_s=2 * gpu.link_limit_bytes_per_s), gpu=gpu)


# -- the closed-driver profile (uvmlab.measure.generation_fit) ---------------------------------------------------
def test_the_shipped_closed_profile_is_what_the_fit_gives() -> None:
    shipped = json.loads((PROFILE_DIR / "gtx1080_closed.json").read_text())
    costs, details = fit_closed(newer=load_profile("RTX5090"))
    assert shipped["params"] == pytest.approx(costs.to_dict())
    assert shipped["fit"]["per_fault"]["migrate_page_us"] == pytest.approx(details["per_fault"]["migrate_page_us"])


def test_the_link_fit_reproduces_the_gtx1080_transfers() -> None:
    link, info = fit_link()
    assert 11e9 < link < 13e9  # PCIe 3.0 x16, within its 15.75 GB/s peak
    assert info["max_abs_error_us"] < 1.0  # the atan curve fits 4 KiB-1 MiB records within 1 us


KiB = 1024
VALIDATION = {
    # file: (accessed 64 KiB steps, their nvprof "GPU page faults" durations in us); fresh process first faults
    # excluded (the page-directory setup the model does not have)
    "getHWPrefetcherP2.cu (lines 112-125)": ((1, 3, 0, 4, 8, 16), (None, 25.568, 47.84, 50.272, 84.8, 156.42)),
    "getHWPrefetcherP3.cu (lines 115-133)": (
        (1, 3, 5, 7, 0, 8, 16),
        (None, 24.608, 23.616, 23.552, 58.528, 84.384, 158.24),
    ),
    "managedAllocRoundUp.cu (lines 116-141)": (
        (0, 1, 2, 4, 8, 16, 32, 33, 34),
        (None, 25.504, 32.032, 49.248, 96.384, 158.88, 93.568, 25.664, 34.336),
    ),
}


@pytest.mark.parametrize("name", sorted(VALIDATION))
def test_closed_profile_predicts_the_gtx1080_faults_it_was_not_fitted_on(name: str) -> None:
    """Validation: every single-fault batch of the held-out traces within 2x and at least 4 in 5 within 1.5x (GTX
    1080, closed driver). Known misses (docs/uvm-sim.md): a fault whose migration is two separate runs (P2's step 0,
    0.67x) and, outside the 2x band, the first fault of managedAllocRoundUp's 256 KiB tail block (93.6 us measured,
    0.28x: its 64 CPU pages' mapping is timed, not the 64 KiB GPU chunks a block shorter than 2 MiB is populated
    with, ``block_gpu_chunk_size``; 0.59x before CPU chunks, when every block's first touch paid the 2 MiB block's
    cost)."""
    steps, measured = VALIDATION[name]
    costs = load_profile("GTX1080")
    sim = UvmSim(64 * VA_BLOCK_BYTES, costs=costs, gpu=GPUS["GTX1080"].with_driver("410"))
    size = VA_BLOCK_BYTES + 192 * KiB if "RoundUp" in name else VA_BLOCK_BYTES
    sim.map_range(0, size)
    sim.host_write(0, 0, size)
    ratios = []
    for step, m in zip(steps, measured, strict=True):
        c = sim.access([(0, step * 64 * KiB, 1, True)])
        if m is not None:
            ratios.append(c.stall_ns / 1e3 / m)
    if "RoundUp" in name:
        tail = ratios.pop(steps.index(32) - 1)  # the tail block's first fault (no ratio for the process's first)
        assert 0.2 < tail < 0.4, tail
    assert all(1 / 2 <= r <= 2 for r in ratios), np.round(ratios, 2)
    assert sum(1 / 1.5 <= r <= 1.5 for r in ratios) >= 0.8 * len(ratios), np.round(ratios, 2)
