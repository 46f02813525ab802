"""Meta capture agrees with a real CPU run on configurations small enough for the CPU.

Matching (uvmlab.trace.compare): allocation sequences of (category, phase, size) aligned with difflib; agreement
is the Dice coefficient on bytes. CUDA emulation of SDPA is off for these comparisons (the CPU has no
memory-efficient attention kernel); foreach optimizers are used on both devices. The only expected difference:
Adam's 4-byte ``step`` counters, which are CPU tensors and therefore recorded only by the CPU capture.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from uvmlab.config import WorkloadConfig
from uvmlab.trace.capture import capture_trace
from uvmlab.trace.compare import compare_allocations

CASES = {
    "alexnet-b4-64px": WorkloadConfig("alexnet", batch_size=4, iterations=2, options={"image_size": 64}),
    "gpt2-2layer-b2-t128-v5000": WorkloadConfig(
        "gpt2",
        batch_size=2,
        iterations=2,
        attention="eager",
        options={"n_layer": 2, "seq_len": 128, "vocab_size": 5000},
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_meta_and_cpu_allocation_sequences_agree(case: str) -> None:
    cfg = CASES[case]
    meta = capture_trace(cfg, "meta", emulate_cuda=False)
    cpu = capture_trace(cfg, "cpu", emulate_cuda=False)
    r = compare_allocations(meta, cpu)
    assert r["agreement"] >= 0.99, r
    # what remains unmatched is only the CPU step counters of Adam (4-byte scalars)
    assert all(row["size_bytes"] <= 4 for row in r["only_a"] + r["only_b"]), r
    assert r["unmatched_bytes_a"] == 0


def test_compare_detects_a_difference() -> None:
    example = str(Path(__file__).resolve().parents[1] / "docs" / "examples" / "tiny_mlp.py")
    a = capture_trace(WorkloadConfig(example, batch_size=64, iterations=2, options={"hidden": 16}))
    b = capture_trace(WorkloadConfig(example, batch_size=128, iterations=2, options={"hidden": 16}))
    assert compare_allocations(a, a)["agreement"] == 1.0
    r = compare_allocations(a, b)
    assert r["agreement"] < 0.99 and r["only_a"] and r["only_b"]


def test_cpu_capture_refuses_what_does_not_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    import uvmlab.trace.capture as cap
    from uvmlab.errors import InputError

    monkeypatch.setattr(cap, "_mem_available_bytes", lambda: 100 * 2**20)  # pretend 100 MiB of free RAM
    with pytest.raises(InputError, match="capture on meta"):
        capture_trace(WorkloadConfig("gpt2", batch_size=2, iterations=1, options={"n_layer": 1}), "cpu")


def test_a_meta_capture_runs_its_cpu_ops_on_one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """The known-value mirrors of a meta capture run on one intra-op thread (META_CPU_THREADS) (a parallel region per
    small op costs more than it saves); the caller's thread count is restored, and a CPU capture keeps it."""
    import torch

    import uvmlab.trace.capture as capture_mod
    from uvmlab.evaluate.gpumemnet import WORKLOAD_FILE

    seen: list[int] = []
    real_step = capture_mod.train_step

    def spy(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return real_step(*args, **kwargs)

    monkeypatch.setattr(capture_mod, "train_step", spy)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        cfg = WorkloadConfig(str(WORKLOAD_FILE), batch_size=4, iterations=2, options={"layers": "linear:8,ReLU:8"})
        capture_trace(cfg, "meta")
        assert seen == [1, 1]
        assert torch.get_num_threads() == 2
        seen.clear()
        capture_trace(cfg, "cpu", emulate_cuda=False, check_memory=False)
        assert seen == [2, 2]
    finally:
        torch.set_num_threads(before)
