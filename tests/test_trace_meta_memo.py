"""Memoized meta kernels (uvmlab.trace.meta_memo): a capture with the memo equals one without it, table by table;
each rule of what may be replayed, on its own; and a random-program property over the rules' edge cases."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from uvmlab.config import WorkloadConfig
from uvmlab.trace import meta_memo
from uvmlab.trace.capture import capture_trace

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = ROOT / "docs" / "examples" / "programs"
MLP = ROOT / "workloads" / "gpumemnet_mlp.py"
TINY_GPT2 = {"n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 64, "n_positions": 16, "seq_len": 16}


@pytest.fixture
def memo_state():
    """Restore the module's switch and start from an empty memo (a test sees only its own entries)."""
    was = meta_memo.enabled
    meta_memo.clear()
    yield
    meta_memo.enabled = was
    meta_memo.clear()


def _capture(cfg: WorkloadConfig, memo: bool) -> Any:
    meta_memo.enabled = memo
    meta_memo.clear()
    return capture_trace(cfg)


CASES = {
    "gpt2 (SDPA, dropout, AdamW)": WorkloadConfig("gpt2", batch_size=2, iterations=3, options=TINY_GPT2),
    "gpt2 bf16 autocast, checkpointed": WorkloadConfig(
        "gpt2", batch_size=2, iterations=3, options=TINY_GPT2, dtype="bf16", checkpoint="auto"
    ),
    "resnet18 (conv, BatchNorm, SGD)": WorkloadConfig(
        "torchvision:resnet18", batch_size=2, iterations=3, options={"image_size": 32, "num_classes": 10}
    ),
    "GPUMemNet MLP (BatchNorm1d, dropout, Adam)": WorkloadConfig(
        str(MLP),
        batch_size=16,
        optimizer="adam",
        iterations=3,
        options={
            "layers": "linear:64,batch_normalization:64,ReLU:64,dropout:64,linear:32,Softmax:32",
            "input_size": 48,
            "dropout": 0.2,
        },
    ),
    "program: host data": WorkloadConfig(str(PROGRAMS / "host_data.py"), iterations=3, options={"mb": 1}),
    "program: hints": WorkloadConfig(str(PROGRAMS / "hints.py"), iterations=3),
    "program: custom kernels": WorkloadConfig(str(PROGRAMS / "custom_kernels.py"), iterations=2),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_capture_with_the_memo_equals_one_without(name: str, memo_state: None) -> None:
    cfg = CASES[name]
    off = _capture(cfg, memo=False)
    on = _capture(cfg, memo=True)
    keys, always_run = meta_memo.counts()
    assert keys > always_run  # some keys were replayed (later iterations), not all bypassed
    for table in ("allocations", "kernels", "accesses"):
        a, b = getattr(off, table), getattr(on, table)
        pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True), obj=f"{name}: {table}")


class _Calls(TorchDispatchMode):
    """Runs every op through meta_memo.call (as the recorder does) and keeps its outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.outs: list[Any] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        out = meta_memo.call(func, args, kwargs or {})
        self.outs.append(out)
        return out


def _meta(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


def test_a_repeated_functional_op_is_replayed_with_fresh_outputs(memo_state: None) -> None:
    meta_memo.enabled = True
    a, b, c, d = _meta(4, 8), _meta(8, 3), _meta(4, 8), _meta(8, 3)
    with _Calls():
        first = torch.mm(a, b)
    assert meta_memo.counts() == (1, 0)
    with _Calls():
        second = torch.mm(c, d)
    assert meta_memo.counts() == (1, 0)  # a hit: no new key
    assert second.shape == first.shape and second.stride() == first.stride() and second.dtype == first.dtype
    assert second.untyped_storage()._cdata != first.untyped_storage()._cdata  # a new storage (a new allocation)
    assert second.untyped_storage().nbytes() == first.untyped_storage().nbytes() == 4 * 3 * 4


def test_an_in_place_op_returns_its_own_argument_on_a_hit(memo_state: None) -> None:
    meta_memo.enabled = True
    w, x = _meta(5, 5), _meta(5, 5)
    with _Calls():
        w.add_(1.0)
    with _Calls() as calls:
        y = x.add_(1.0)
    assert y is x and calls.outs[-1] is x


def test_a_foreach_op_is_keyed_by_its_float_arguments_type_not_value(memo_state: None) -> None:
    """Adam's step sizes change every iteration: ``_foreach_addcdiv_`` with other floats is a hit. The type still
    counts: an int scalar list on int tensors keeps their dtype, a float one promotes them to the default dtype."""
    meta_memo.enabled = True
    params = [_meta(3, 4), _meta(5)]
    num, den = [_meta(3, 4), _meta(5)], [_meta(3, 4), _meta(5)]
    with _Calls():
        torch._foreach_addcdiv_(params, num, den, [0.1, 0.2])
    assert meta_memo.counts() == (1, 0)
    with _Calls() as calls:
        torch._foreach_addcdiv_(params, num, den, [0.3, 0.4])
    assert meta_memo.counts() == (1, 0) and calls.outs[-1] is None  # a hit; in place, nothing returned
    ints = [_meta(2, 2, dtype=torch.int64), _meta(3, dtype=torch.int64)]
    with _Calls():
        as_int = torch._foreach_mul(ints, [2, 3])
        as_float = torch._foreach_mul(ints, [2.0, 3.0])
        again = torch._foreach_mul(ints, [0.5, 7.0])
    assert [t.dtype for t in as_int] == [torch.int64] * 2
    assert [t.dtype for t in as_float] == [t.dtype for t in again] == [torch.get_default_dtype()] * 2
    assert [t.shape for t in again] == [(2, 2), (3,)]
    assert meta_memo.counts() == (3, 0)  # addcdiv_, mul with ints, mul with floats (the last call was a hit)


def test_other_ops_keep_float_values_in_their_key(memo_state: None) -> None:
    """Outside the foreach ops a float can decide a shape (``arange``'s end): each value is its own key."""
    meta_memo.enabled = True
    with _Calls():
        a = torch.arange(0.0, 4.0, device="meta")
        b = torch.arange(0.0, 6.0, device="meta")
    assert a.shape == (4,) and b.shape == (6,)


def test_views_resizes_and_sliced_outputs_are_never_replayed(memo_state: None) -> None:
    """A view op is passed through without a key; an op whose first call changed its argument is always run."""
    meta_memo.enabled = True
    for _ in range(2):  # the second round would be a hit if they had been memoized
        x, r = _meta(6, 4), _meta(2)
        with _Calls():
            v = torch.ops.aten.alias.default(x)  # a view: shares x's storage
            torch.ops.aten.resize_.default(r, [10])  # changes its argument's metadata
        assert v.untyped_storage()._cdata == x.untyped_storage()._cdata
        assert tuple(r.shape) == (10,)
    assert meta_memo.counts() == (1, 1)  # resize_ only


def test_an_output_sharing_an_argument_storage_is_never_replayed(memo_state: None) -> None:
    """An op whose schema does not declare a view but whose output shares an argument's storage (seen on the first
    call) always runs: a replay would give the output a storage of its own."""
    meta_memo.enabled = True
    for _ in range(2):
        x = _meta(6, 4)
        with _Calls():
            y = torch.ops.uvmlab_memo_test.aliased(x)
        assert y.untyped_storage()._cdata == x.untyped_storage()._cdata
    assert meta_memo.counts() == (1, 1)


_LIB = torch.library.Library("uvmlab_memo_test", "DEF")
_LIB.define("cut(Tensor x) -> Tensor")
_LIB.define("padded(Tensor x) -> Tensor")
_LIB.define("aliased(Tensor x) -> Tensor")
_LIB.impl("cut", lambda x: torch.empty(8, device="meta")[2:6], "Meta")  # offset 2 into a fresh 32-byte buffer
_LIB.impl("padded", lambda x: torch.empty(8, device="meta")[:4], "Meta")  # offset 0, storage past the extent
_LIB.impl("aliased", lambda x: x.view(-1), "Meta")  # undeclared alias of its argument


def test_outputs_cut_from_a_larger_fresh_buffer_are_never_replayed(memo_state: None) -> None:
    """An output at an offset, or with storage beyond its extent, would be rebuilt smaller: such keys always run
    (the recorder allocates the whole storage)."""
    meta_memo.enabled = True
    for _ in range(2):
        x = _meta(1)
        with _Calls():
            cut = torch.ops.uvmlab_memo_test.cut(x)
            padded = torch.ops.uvmlab_memo_test.padded(x)
        assert (cut.storage_offset(), cut.untyped_storage().nbytes()) == (2, 32)
        assert (padded.storage_offset(), padded.untyped_storage().nbytes()) == (0, 32)
    assert meta_memo.counts() == (2, 2)


def test_non_tensor_argument_types_are_part_of_the_key(memo_state: None) -> None:
    """1, 1.0 and True are equal in Python but give outputs of other dtypes: the key tells them apart."""
    meta_memo.enabled = True
    x = _meta(3, dtype=torch.int64)
    with _Calls():
        dtypes = [torch.add(x, v).dtype for v in (1, 1.0, True, 1, 1.0, True)]
    assert dtypes == [torch.int64, torch.float32, torch.int64] * 2


def test_the_default_dtype_is_part_of_the_key(memo_state: None) -> None:
    meta_memo.enabled = True
    old = torch.get_default_dtype()
    try:
        with _Calls():
            a = torch.ones(3, device="meta")
        torch.set_default_dtype(torch.float64)
        with _Calls():
            b = torch.ones(3, device="meta")
    finally:
        torch.set_default_dtype(old)
    assert (a.dtype, b.dtype) == (torch.float32, torch.float64)


def test_arguments_that_cannot_be_keyed_run_the_kernel(memo_state: None) -> None:
    """A CPU tensor among the arguments: no key, the kernel runs, nothing is stored; a CPU factory call is keyed
    but its output is not a meta tensor, so it always runs."""
    meta_memo.enabled = True
    x, y = _meta(3), torch.ones(())
    with _Calls():
        torch.ops.aten.add.Tensor(x, y)
    assert meta_memo.counts() == (0, 0)
    with _Calls():
        for _ in range(2):
            assert torch.ops.aten.empty.memory_format([2], device="cpu").device.type == "cpu"
    assert meta_memo.counts() == (1, 1)


UNARY = ("relu", "neg", "exp", "sum0", "sum_last", "t", "contiguous", "clone", "softmax", "add_", "mul_scalar")
BINARY = ("add", "mul", "mm", "cat0", "where")


def _apply(op: str, xs: list[torch.Tensor], i: int, j: int) -> torch.Tensor | None:
    a, b = xs[i % len(xs)], xs[j % len(xs)]
    try:
        if op == "relu":
            return torch.relu(a)
        if op == "neg":
            return torch.neg(a)
        if op == "exp":
            return torch.exp(a)
        if op == "sum0":
            return a.sum(0) if a.dim() else a.sum()
        if op == "sum_last":
            return a.sum(-1, keepdim=True) if a.dim() else a.sum()
        if op == "t":
            return a.t() if a.dim() == 2 else a.unsqueeze(0)
        if op == "contiguous":
            return a.contiguous()
        if op == "clone":
            return a.clone(memory_format=torch.preserve_format)
        if op == "softmax":
            return torch.softmax(a, -1) if a.dim() else a
        if op == "add_":
            return a.add_(1.0)
        if op == "mul_scalar":
            return a * 2
        if op == "add":
            return a + b
        if op == "mul":
            return a * b
        if op == "mm":
            return a @ b
        if op == "cat0":
            return torch.cat([a, b], 0)
        if op == "where":
            return torch.where(a > 0, a, b)
    except RuntimeError:  # shapes that do not fit: the same error with and without the memo
        return None
    raise AssertionError(op)


def _describe(t: torch.Tensor, storages: dict[int, int]) -> tuple[Any, ...]:
    sid = storages.setdefault(t.untyped_storage()._cdata, len(storages))
    nbytes = t.untyped_storage().nbytes()
    return (tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, nbytes, sid)


def _run_program(ops: list[tuple[str, int, int]], shapes: list[tuple[int, ...]], memo: bool) -> list[Any]:
    meta_memo.enabled = memo
    meta_memo.clear()
    out: list[Any] = []
    for _ in range(2):  # twice: the second pass replays what the first stored
        xs = [_meta(*s) for s in shapes]
        storages: dict[int, int] = {}
        with _Calls():
            for op, i, j in ops:
                r = _apply(op, xs, i, j)
                out.append(None if r is None else _describe(r, storages))
                if r is not None:
                    xs.append(r)
    return out


@settings(max_examples=60, deadline=None)
@given(
    shapes=st.lists(st.lists(st.integers(0, 4), min_size=0, max_size=3).map(tuple), min_size=1, max_size=3),
    ops=st.lists(
        st.tuples(st.sampled_from(UNARY + BINARY), st.integers(0, 20), st.integers(0, 20)), min_size=1, max_size=12
    ),
)
def test_random_programs_give_the_same_metadata_with_and_without_the_memo(
    shapes: list[tuple[int, ...]], ops: list[tuple[str, int, int]]
) -> None:
    """Shape, strides, offset, dtype, storage size and which results share a storage: equal either way (empty
    and 0-d tensors, views, in-place ops and failing shapes included)."""
    was = meta_memo.enabled
    try:
        assert _run_program(ops, shapes, memo=True) == _run_program(ops, shapes, memo=False)
    finally:
        meta_memo.enabled = was
        meta_memo.clear()


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 5), st.integers(0, 7)), min_size=0, max_size=4),
)
def test_the_extent_is_the_storage_empty_strided_makes(dims: list[tuple[int, int]]) -> None:
    """uvmlab.trace.strides.extent_elements equals the elements of the storage PyTorch allocates for a strided
    tensor (empty, 0-d and overlapping strides included): the memo's fresh-storage rule rests on it."""
    from uvmlab.trace.strides import extent_elements

    shape, stride = tuple(d[0] for d in dims), tuple(d[1] for d in dims)
    t = torch.empty_strided(shape, stride, dtype=torch.float32, device="meta")
    assert extent_elements(shape, stride) * 4 == t.untyped_storage().nbytes()
