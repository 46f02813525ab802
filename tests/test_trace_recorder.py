"""The recorder's storage lifetime tracking, kernels and byte ranges on small hand-made programs."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from uvmlab.trace.recorder import Recorder
from uvmlab.trace.schema import NEVER_FREED


@pytest.mark.parametrize("device", ["meta", "cpu"])
def test_storage_weakref_fires_when_last_view_dies(device: str) -> None:
    """The mechanism capture relies on: PyTorch keeps a storage's Python object while the StorageImpl lives."""
    fired: list[int] = []
    t = torch.empty(16, device=device)
    ref = weakref.ref(t.untyped_storage(), lambda r: fired.append(1))
    gc.collect()
    assert fired == [] and ref() is not None  # the Python storage object outlives our reference to it
    v = t[4:]
    del t
    assert fired == []  # a view keeps the storage alive
    del v
    assert fired == [1]


def _run(fn, device: str = "meta") -> Recorder:
    rec = Recorder(device)
    with rec:
        rec.set_phase("forward", 0)
        fn()
    rec.close()
    return rec


def test_alloc_free_kernel_order_and_view_ranges() -> None:
    def prog() -> None:
        x = torch.empty(10, 4, device="meta")  # 160 B, no kernel
        y = x[2:5].mul(2.0)  # reads a view of x (offset 2*4*4 = 32 B, 48 B), writes y (48 B)
        y.add_(1.0)  # in-place: reads and writes y
        del x
        z = y.sum()
        del y, z

    rec = _run(prog)
    assert rec.a_size == [160, 48, 4]
    assert all(f != NEVER_FREED and f > a for a, f in zip(rec.a_alloc_seq, rec.a_free_seq, strict=True))
    assert rec.k_name == ["aten::mul", "aten::add_", "aten::sum"]
    # mul reads x[2:5] and writes y
    acc = list(zip(rec.x_kernel, rec.x_alloc, rec.x_offset, rec.x_size, rec.x_write, strict=True))
    assert (0, 0, 32, 48, False) in acc and (0, 1, 0, 48, True) in acc
    assert (1, 1, 0, 48, True) in acc and (1, 1, 0, 48, False) in acc
    # x is freed after mul ran, before sum
    assert rec.k_seq[1] < rec.a_free_seq[0] < rec.k_seq[2]
    # y is allocated before the kernel that writes it
    assert rec.a_alloc_seq[1] < rec.k_seq[0]
    seqs = rec.a_alloc_seq + [f for f in rec.a_free_seq if f != NEVER_FREED] + rec.k_seq
    assert len(seqs) == len(set(seqs))  # one global counter, every event distinct


def test_views_and_cpu_tensors_make_no_kernels() -> None:
    def prog() -> None:
        x = torch.empty(8, 8, device="meta")
        x.t().reshape(64)  # transpose is a view; reshape of the non-contiguous view copies (one kernel)
        x.view(64).unsqueeze(0)
        torch.ones(3).add_(1)  # CPU tensors are not capture-device memory

    rec = _run(prog)
    assert rec.k_name == ["aten::clone"]
    assert rec.a_size[0] == 256 and len(rec.a_size) == 2  # x and the reshape copy; nothing on the CPU


def test_out_argument_is_write_only_and_live_storage_stays_live() -> None:
    keep: list[torch.Tensor] = []

    def prog() -> None:
        a = torch.empty(4, device="meta")
        b = torch.empty(4, device="meta")
        torch.add(a, 1.0, out=b)
        keep.append(b)

    rec = _run(prog)
    acc = {(k, al, w) for k, al, w in zip(rec.x_kernel, rec.x_alloc, rec.x_write, strict=True)}
    assert acc == {(0, 0, False), (0, 1, True)}
    assert rec.a_free_seq[1] == NEVER_FREED  # still referenced at the end
    assert rec.a_free_seq[0] != NEVER_FREED


def test_flops_use_pytorch_formulas_for_matmul() -> None:
    def prog() -> None:
        a = torch.empty(8, 16, device="meta")
        b = torch.empty(16, 32, device="meta")
        (a @ b).relu()

    rec = _run(prog)
    assert rec.k_name == ["aten::mm", "aten::relu"]
    assert rec.k_flops == [2 * 8 * 16 * 32, 8 * 32]
