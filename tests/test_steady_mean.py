"""One steady-state mean (iterations after the warm-up) shared by the simulated, GPU and measured sides."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from uvmlab.measure.gpu.collect import mean_iteration_ns
from uvmlab.stats.schema import steady_mean


def test_first_iteration_is_warm_up_unless_it_is_the_only_one() -> None:
    assert steady_mean([100, 2, 4]) == 3.0
    assert steady_mean([7]) == 7.0
    assert math.isnan(steady_mean([]))
    assert steady_mean(pd.Series([9.0, 1.0, 2.0, 3.0])) == 2.0
    assert steady_mean(np.array([5, 5], dtype=np.int64)) == 5.0


@settings(deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=10**13), min_size=1, max_size=20))
def test_gpu_side_uses_the_same_mean(durations: list[int]) -> None:
    worker = {"iterations": [{"duration_ns": d} for d in durations]}
    assert mean_iteration_ns(worker) == steady_mean(durations)
    rest = durations[1:] or durations
    assert math.isclose(steady_mean(durations), sum(rest) / len(rest), rel_tol=1e-12)


def test_gpu_side_without_iterations_is_none() -> None:
    assert mean_iteration_ns(None) is None and mean_iteration_ns({"iterations": []}) is None
