"""Property tests: trace invariants over random small configurations of the example MLP workload."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from uvmlab.config import WorkloadConfig
from uvmlab.trace.capture import capture_trace
from uvmlab.trace.schema import NEVER_FREED

EXAMPLE = str(Path(__file__).resolve().parents[1] / "docs" / "examples" / "tiny_mlp.py")


@settings(max_examples=10, deadline=None)
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


OPS = st.lists(
    st.tuples(st.sampled_from(["new", "view", "add", "inplace", "del", "cat"]), st.integers(0, 50), st.integers(1, 64)),
    min_size=1,
    max_size=40,
)


@settings(max_examples=40, deadline=None)
@given(program=OPS)
def test_recorder_live_set_matches_the_live_tensors(program: list[tuple[str, int, int]]) -> None:
    """After every step of a random program, the recorder's live allocations are exactly the storages that the
    program's live tensors hold (views share storage; in-place ops allocate nothing)."""
    import torch

    from uvmlab.trace.recorder import Recorder

    rec = Recorder("meta")
    handles: list[torch.Tensor] = []
    with rec:
        rec.set_phase("forward", 0)
        for op, pick, n in program:
            if op == "new" or not handles:
                handles.append(torch.empty(n, device="meta"))
                continue
            t = handles[pick % len(handles)]
            if op == "view":
                handles.append(t[: max(1, t.numel() // 2)])
            elif op == "add":
                handles.append(t + 1.0)
            elif op == "inplace":
                t.mul_(2.0)
            elif op == "cat":
                handles.append(torch.cat([t, handles[n % len(handles)]]))
            else:
                handles.pop(pick % len(handles))
            del t
            expected = {h.untyped_storage()._cdata: h.untyped_storage().nbytes() for h in handles}
            live = {aid for aid, f in enumerate(rec.a_free_seq) if f == NEVER_FREED}
            assert sorted(rec.a_size[a] for a in live) == sorted(expected.values())
            assert {rec.alloc_id(h) for h in handles} == live
        handles.clear()
    assert all(f != NEVER_FREED for f in rec.a_free_seq)
    assert all(f > a for a, f in zip(rec.a_alloc_seq, rec.a_free_seq, strict=True))
