"""Meta-device fidelity: CUDA's fused dropout mask, and sizes for data-dependent ops instead of failures."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import uvmlab.trace.capture as capture_mod
from uvmlab.config import WorkloadConfig
from uvmlab.errors import InputError
from uvmlab.trace.capture import capture_trace
from uvmlab.trace.emulate import DataDependentEmulation, DropoutEmulation

TINY_GPT2 = {"n_layer": 1, "n_head": 2, "n_embd": 32, "vocab_size": 64, "n_positions": 16, "seq_len": 16}

DATA_DEPENDENT = """
import torch
import torch.nn.functional as F
from workloads.base import Workload

OPTIONS = {"features": 8}
DEFAULT_BATCH_SIZE = 4


class Net(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.lin = torch.nn.Linear(n, n)

    def forward(self, x):
        h = self.lin(x)
        picked = h[x > 0]                          # boolean-mask indexing (nonzero inside)
        idx = torch.nonzero(x > 0)                 # nonzero
        counts = torch.bincount(idx[:, 1], minlength=x.shape[1])
        uniq = torch.unique(x)
        sel = torch.masked_select(h, x > 0)
        return picked.sum() + sel.sum() + counts.sum() * 0 + uniq.sum() * 0


def build(cfg, device, options):
    dev = torch.device(device)
    n = options["features"]
    with dev:
        model = Net(n)
    batch = cfg.batch_size

    def make_batch():  # every element > 0 and distinct: the upper bounds are the real sizes
        return torch.arange(1, batch * n + 1, dtype=torch.float32, device=dev).reshape(batch, n)

    return Workload("datadep", model, make_batch, lambda m, x: m(x), dev)
"""


def _sizes_by_op(trace, phase: str = "forward") -> dict[str, list[int]]:
    a = trace.allocations
    a = a[(a.phase == phase) & (a.iteration == 0)]
    return {op: sorted(g.size_bytes.tolist()) for op, g in a.groupby("op")}


class _NoDropoutEmulation(DropoutEmulation):
    """The capture without the dropout rule (everything else emulated): the unfused meta/CPU path."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_dropout_keeps_a_one_byte_mask_like_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = WorkloadConfig("gpt2", batch_size=2, iterations=1, options=TINY_GPT2)
    emulated = capture_trace(cfg)
    monkeypatch.setattr(capture_mod, "DropoutEmulation", _NoDropoutEmulation)
    plain = capture_trace(cfg)
    elems = 2 * 16 * 32  # batch x seq x n_embd: the residual dropouts' size
    masks = [s for s in _sizes_by_op(emulated).get("aten::native_dropout", []) if s == elems]
    # embd dropout + attn/mlp residual dropouts of the one layer: three (output, mask) pairs of this size
    assert masks.count(elems) == 3
    assert "aten::bernoulli_" not in {k for k in emulated.kernels.name}
    assert any("native_dropout" in n for n in emulated.header["notes"])
    # the unfused path keeps an fp32 noise tensor per dropout instead: 3 bytes more per element (the attention
    # dropout is inside the emulated SDPA kernel either way)
    assert "aten::bernoulli_" in set(plain.kernels.name)
    act = {
        name: t.allocations[(t.allocations.category == "activation") & (t.allocations.iteration == 0)].size_bytes.sum()
        for name, t in (("emulated", emulated), ("plain", plain))
    }
    assert act["plain"] - act["emulated"] == 3 * 3 * elems


def test_dropout_emulation_leaves_unfused_cases_alone() -> None:
    x = torch.randn(3, 4, device="meta")
    with DropoutEmulation() as emu:
        torch.nn.functional.dropout(x, 0.0, True)
        torch.nn.functional.dropout(x, 0.5, False)
        torch.nn.functional.dropout(x.clone(), 0.5, True, inplace=True)
        torch.nn.functional.dropout(x, 0.5, True)
    assert emu.counts == {"unfused": 3, "fused": 1}


def test_data_dependent_ops_get_their_upper_bound_on_meta(tmp_path: Path) -> None:
    f = tmp_path / "datadep.py"
    f.write_text(DATA_DEPENDENT)
    cfg = WorkloadConfig(str(f), iterations=1)
    meta = capture_trace(cfg)
    cpu = capture_trace(cfg, device="cpu", emulate_cuda=False, check_memory=False)
    # with every element selected and distinct, the real (CPU) sizes are the upper bounds the meta rules give;
    # the boolean-mask index adds its own nonzero (CUDA allocates it; inside the CPU kernel a capture misses it)
    meta_sizes, cpu_sizes = _sizes_by_op(meta), _sizes_by_op(cpu)
    assert meta_sizes.pop("aten::nonzero") == 2 * cpu_sizes.pop("aten::nonzero")
    assert meta_sizes == cpu_sizes
    assert any("data-dependent ops sized by rule" in n for n in meta.header["notes"])
    half = capture_trace(WorkloadConfig(str(f), iterations=1, options={"data_dependent_fraction": 0.5}))
    assert half.allocations.size_bytes.sum() < meta.allocations.size_bytes.sum()
    with pytest.raises(InputError, match="data_dependent_fraction must be in"):
        capture_trace(WorkloadConfig(str(f), iterations=1, options={"data_dependent_fraction": 0}))


def test_data_dependent_rules_unit() -> None:
    x = torch.empty(4, 6, device="meta")
    mask = torch.empty(4, 6, dtype=torch.bool, device="meta")
    with DataDependentEmulation(0.5):
        assert torch.nonzero(x).shape == (12, 2)
        assert x[mask].shape == (12,)
        assert torch.masked_select(x, mask).shape == (12,)
        values, inverse, counts = torch.unique(x, return_inverse=True, return_counts=True)
        assert values.shape == (12,) and inverse.shape == (4, 6) and counts.shape == (12,)
        assert torch.unique(x, dim=0).shape == (2, 6)
        ids = torch.empty(7, dtype=torch.long, device="meta")
        assert torch.bincount(ids).shape == (7,) and torch.bincount(ids, minlength=3).shape == (3,)
        assert torch.bincount(ids, weights=torch.empty(7, device="meta")).dtype == torch.float
    with pytest.raises(NotImplementedError):
        torch.nonzero(x)  # without the emulation meta cannot size it


@settings(max_examples=40, deadline=None)
@given(
    shape=st.lists(st.integers(0, 6), min_size=1, max_size=3),
    f1=st.floats(0.01, 1.0),
    f2=st.floats(0.01, 1.0),
)
def test_data_dependent_sizes_are_bounded_and_monotone_in_the_fraction(shape: list[int], f1: float, f2: float) -> None:
    """Never more than the upper bound (every element selected / distinct), never less for a larger fraction."""
    lo, hi = sorted((f1, f2))
    x = torch.empty(shape, device="meta")
    sizes = {}
    for f in (lo, hi, 1.0):
        with DataDependentEmulation(f):
            sizes[f] = (torch.nonzero(x).shape[0], x[x > 0].numel(), torch.unique(x).numel())
    n = x.numel()
    assert sizes[1.0] == (n, n, n)
    assert all(a <= b <= n for a, b in zip(sizes[lo], sizes[hi], strict=True))
