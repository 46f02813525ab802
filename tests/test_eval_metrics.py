"""xMem's metrics (seeds/000 section 4.1.5, Eqs. 1-8) on hand-made runs whose answers are written out below."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from uvmlab.evaluate.metrics import evaluate_runs, quadrant, relative_error, summarize, two_round

NAN = math.nan

# Device memory M_max = 100 bytes. Five runs of one estimator:
#  1. peak 50, no OOM, estimate 55: oom_hat=0=OOM1 -> C1=1; round 2 capped at 55 >= 50 passes (OOM2=0);
#     error2 = |55-50|/50 = 0.10; C2=1; save = 100-55 = 45.
#  2. peak 80, no OOM, estimate 60: C1=1; round 2 capped at 60 < 80 fails (OOM2=1) -> MRE uses
#     error1 = 20/80 = 0.25; C2=0; save = -100.
#  3. real OOM, estimate 120 > 100: oom_hat=1=OOM1 -> C1=1, no round 2; C2=1; save = +100; no error.
#  4. real OOM, estimate 90: oom_hat=0 != 1 -> C1=0; C2=0; save = -100; no error.
#  5. peak 40, no OOM, estimate 110 > 100: oom_hat=1 != 0 -> C1=0, no round 2; error1 = 70/40 = 1.75;
#     C2=0; save = -100.
# MRE = median(0.10, 0.25, 1.75) = 0.25; PEF = (5 - 2)/5 = 0.6; round-1 failure rate = (5 - 3)/5 = 0.4;
# MCP = (45 - 100 + 100 - 100 - 100)/5 = -155/5 = -31.
RUNS = pd.DataFrame(
    {
        "case_id": ["r1", "r2", "r3", "r4", "r5"],
        "estimator": ["e"] * 5,
        "group": ["m"] * 5,
        "estimate_bytes": [55, 60, 120, 90, 110],
        "gpu_memory_bytes": [100] * 5,
        "oom": [False, False, True, True, False],
        "measured_peak_bytes": [50, 80, NAN, NAN, 40],
    }
)


def test_per_run_arithmetic() -> None:
    pr = evaluate_runs(RUNS).set_index("case_id")
    assert list(pr["oom_hat"]) == [False, False, True, False, True]
    assert list(pr["c1"]) == [True, True, True, False, False]
    assert list(pr["round2_ran"]) == [True, True, False, False, False]
    assert pr.loc["r1", "round2_oom"] is False and pr.loc["r2", "round2_oom"] is True
    assert list(pr["c2"]) == [True, False, True, False, False]
    assert list(pr["save_bytes"]) == [45.0, -100.0, 100.0, -100.0, -100.0]
    assert pr.loc["r1", "error_mre"] == pytest.approx(0.10)
    assert pr.loc["r2", "error_mre"] == pytest.approx(0.25)
    assert math.isnan(pr.loc["r3", "error_mre"]) and math.isnan(pr.loc["r4", "error_mre"])
    assert pr.loc["r5", "error_mre"] == pytest.approx(1.75)


def test_summary_mre_pef_mcp() -> None:
    s = summarize(evaluate_runs(RUNS)).iloc[0]
    assert s["n"] == 5 and s["n_mre"] == 3
    assert s["mre"] == pytest.approx(0.25)
    assert s["pef"] == pytest.approx(0.6)
    assert s["pef_round1"] == pytest.approx(0.4)
    assert s["mcp_bytes"] == pytest.approx(-31.0)


def test_measured_round_two_is_used() -> None:
    # peak1 50, estimate 48: modelled round 2 fails (48 < 50); a measured round 2 that passed with peak 47 wins:
    # error2 = |48-47|/47, C2 = 1, save = 100 - 48 = 52.
    modelled = two_round(48, 100, False, 50)
    assert modelled["round2_oom"] is True and modelled["c2"] is False and modelled["save_bytes"] == -100
    measured = two_round(48, 100, False, 50, round2_oom=False, round2_peak_bytes=47)
    assert measured["c2"] is True and measured["save_bytes"] == 52
    assert measured["error_mre"] == pytest.approx(1 / 47)


def test_relative_error_and_quadrants() -> None:
    assert relative_error(110, 100) == pytest.approx(0.1)
    assert relative_error(90, 100) == pytest.approx(0.1)
    assert math.isnan(relative_error(90, NAN))
    assert quadrant(0.1, 0.1) == "optimal"
    assert quadrant(0.1, 0.5) == "overestimation"
    assert quadrant(0.5, 0.1) == "underestimation"
    assert quadrant(0.5, 0.5) == "worst"


@settings(max_examples=60, deadline=None)
@given(
    est=st.integers(1, 10**6),
    peak=st.integers(1, 10**6),
    cap=st.integers(1, 10**6),
    oom=st.booleans(),
)
def test_two_round_properties(est: int, peak: int, cap: int, oom: bool) -> None:
    r = two_round(est, cap, oom, NAN if oom else peak)
    # passing round 2 implies passing round 1; savings are bounded by the device memory
    assert not r["c2"] or r["c1"]
    assert -cap <= r["save_bytes"] <= cap
    # a modelled second round passes exactly when the estimate covers the measured peak
    if r["round2_ran"]:
        assert r["round2_oom"] == (est < peak)
