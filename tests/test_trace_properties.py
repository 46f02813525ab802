"""Property tests: trace invariants over random small configurations of the example MLP workload."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from uvmlab.config import WorkloadConfig
from uvmlab.trace.capture import capture_trace
from uvmlab.trace.schema import NEVER_FREED

EXAMPLE = str(Path(__file__).resolve().parents[1] / "docs" / "examples" / "tiny_mlp.py")


@settings(max_examples=15, deadline=None)
@given(
    batch=st.integers(1, 33),
    hidden=st.integers(1, 64),
    optimizer=st.sampled_from(["sgd", "adam", "adamw"]),
    zero_grad=st.sampled_from(["iteration_start", "before_backward"]),
    iterations=st.integers(1, 3),
)
def test_invariants_hold_for_any_small_config(
    batch: int, hidden: int, optimizer: str, zero_grad: str, iterations: int
) -> None:
    cfg = WorkloadConfig(
        EXAMPLE,
        batch_size=batch,
        optimizer=optimizer,
        zero_grad=zero_grad,
        iterations=iterations,
        options={"hidden": hidden},
    )
    t = capture_trace(cfg)
    a = t.allocations
    freed = a["free_seq"] != NEVER_FREED
    assert (a.loc[freed, "free_seq"] > a.loc[freed, "alloc_seq"]).all()
    assert t.live_bytes().min() >= 0
    pbytes = t.header["parameter_bytes"]
    assert pbytes == 4 * (256 * hidden + hidden + hidden * hidden + hidden + hidden * 10 + 10)
    by_cat = a.groupby("category")["size_bytes"].sum()
    assert by_cat["parameter"] == pbytes
    assert by_cat.get("optimizer_state", 0) == (0 if optimizer == "sgd" else 2 * pbytes)
    assert by_cat["gradient"] == iterations * pbytes
    assert by_cat["input"] == iterations * batch * (256 * 4 + 8)  # fp32 features + int64 labels
    # at the end only parameters, optimizer state and the last gradients remain (zero_grad set them to None
    # at the start of the iteration, so the final ones are still live)
    live_end = a[~freed]
    assert set(live_end["category"]) <= {"parameter", "optimizer_state", "gradient", "other"}
    assert live_end.loc[live_end["category"] == "gradient", "size_bytes"].sum() == pbytes
    for it in range(1, iterations - 1):
        s1 = a[a["iteration"] == it][["size_bytes", "category", "phase"]].to_numpy().tolist()
        s2 = a[a["iteration"] == it + 1][["size_bytes", "category", "phase"]].to_numpy().tolist()
        assert s1 == s2
