"""Allocations CUDA kernels make inside themselves (uvmlab.trace.internal_rules / internal_allocs, orchestrator rule
``kernel_temporaries``): each rule on a tiny op captured on meta, its condition both ways, its size and its lifetime
in the orchestrated trace; the reduction rule against real snapshots' allocations; an LM forward + cross entropy
over permuted logits through the estimate."""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from uvmlab.config import WorkloadConfig
from uvmlab.errors import InputError
from uvmlab.gpus import get_gpu
from uvmlab.trace.emulate import ConvLayoutEmulation
from uvmlab.trace.internal_allocs import decode, embedding_final, gamma_beta_partials, reduce_buffers, resolve
from uvmlab.trace.internal_rules import efficient_attention_backward, reduction_layout, sum_like
from uvmlab.trace.orchestrate import OrchestrationRules, to_cuda
from uvmlab.trace.recorder import Recorder
from uvmlab.trace.schema import Trace

A100 = get_gpu("A100-80GB")
ONLY_TEMPS = OrchestrationRules(False, False, False, False, False, False, kernel_temporaries=True)
LABELLED = r"(?<!:):(?!:)"
"""An inserted temporary's op: ``<kernel>:<label>`` (a single colon; aten names use ``::``)."""
SNAPSHOTS = Path(__file__).resolve().parents[2] / "shared" / "real-data" / "snapshots"


def capture(fn: Callable[[], object], conv_layout: bool = False) -> Trace:
    """Run ``fn`` under the recorder on meta (phase forward) and return its trace (``conv_layout``: with CUDA's
    convolution memory formats, ``uvmlab.trace.emulate.ConvLayoutEmulation``, outside the recorder as in a capture)."""
    rec = Recorder("meta")
    with ConvLayoutEmulation() if conv_layout else contextlib.nullcontext(), rec:
        rec.set_phase("forward", 0)
        keep = fn()  # noqa: F841 (outputs stay alive until the capture ends)
        rec.close()
    tables = rec.tables(["temporary"] * len(rec.a_size))
    return Trace(header={"workload": "test"}, **tables)


def entries(trace: Trace, op: str) -> list[dict]:
    """The decoded ``temporaries`` of the (single) kernel ``op``."""
    k = trace.kernels
    rows = k.loc[k["name"] == op, "temporaries"].tolist()
    assert len(rows) == 1, rows
    return decode(rows[0])


def inserted(trace: Trace, gpu=A100) -> tuple[Trace, object]:
    """The orchestrated trace and its inserted temporaries (rows whose op has a ``:label``)."""
    out = to_cuda(trace, gpu, ONLY_TEMPS)
    a = out.allocations
    return out, a[a["op"].str.contains(LABELLED)]


def kernel_seq(trace: Trace, op: str) -> int:
    k = trace.kernels
    return int(k.loc[k["name"] == op, "seq"].iloc[0])


# ---- softmax family ----------------------------------------------------------------------------------------------
def test_log_softmax_copies_a_strided_input_and_frees_it_after_the_kernel() -> None:
    t = capture(lambda: torch.log_softmax(torch.randn(4, 10, 6, device="meta").permute(0, 2, 1), dim=1))
    assert entries(t, "aten::_log_softmax") == [{"l": "contiguous_input", "b": 4 * 10 * 6 * 4}]
    out, temps = inserted(t)
    assert temps["size_bytes"].tolist() == [960] and temps["category"].tolist() == ["temporary"]
    assert temps["op"].tolist() == ["aten::_log_softmax:contiguous_input"]
    seq = kernel_seq(out, "aten::_log_softmax")
    a = out.allocations
    output = a[a["op"] == "aten::_log_softmax"]
    # allocated after the structured output, before the kernel; freed right after the kernel
    assert int(output["alloc_seq"].iloc[0]) < int(temps["alloc_seq"].iloc[0]) < seq
    assert int(temps["free_seq"].iloc[0]) == seq + 1


def test_log_softmax_of_a_contiguous_input_allocates_nothing_inside() -> None:
    t = capture(lambda: torch.log_softmax(torch.randn(4, 6, 10, device="meta"), dim=-1))
    assert entries(t, "aten::_log_softmax") == []
    assert to_cuda(t, A100, ONLY_TEMPS).header["orchestration"]["changes"]["kernel_temporaries"] == 0


def test_softmax_backward_always_makes_grad_times_output_and_copies_a_strided_output() -> None:
    g = torch.randn(2, 3, 5, device="meta")
    y = torch.randn(2, 3, 5, device="meta")
    t = capture(lambda: torch.ops.aten._softmax_backward_data(g, y, 2, torch.float32))
    assert entries(t, "aten::_softmax_backward_data") == [{"l": "grad_times_output", "b": 120}]
    yt = torch.randn(2, 5, 3, device="meta").transpose(1, 2)
    t = capture(lambda: torch.ops.aten._softmax_backward_data(g, yt, 2, torch.float32))
    labels = [e["l"] for e in entries(t, "aten::_softmax_backward_data")]
    assert labels == ["grad_times_output", "contiguous_grad", "contiguous_output"]


def test_log_softmax_backward_copies_only_strided_operands() -> None:
    g = torch.randn(8, 5, device="meta")
    y = torch.randn(8, 5, device="meta")
    t = capture(lambda: torch.ops.aten._log_softmax_backward_data(g, y, 1, torch.float32))
    assert entries(t, "aten::_log_softmax_backward_data") == []
    gt = torch.randn(5, 8, device="meta").t()
    t = capture(lambda: torch.ops.aten._log_softmax_backward_data(gt, y, 1, torch.float32))
    assert entries(t, "aten::_log_softmax_backward_data") == [{"l": "contiguous_grad", "b": 160}]


# ---- losses and norms --------------------------------------------------------------------------------------------
def test_nll_loss_copies_a_strided_target() -> None:
    x = torch.randn(6, 4, device="meta")
    tgt = torch.randint(0, 4, (6, 2), device="meta")
    t = capture(lambda: torch.ops.aten.nll_loss_forward(x, tgt[:, 0].contiguous(), None, 1, -100))
    assert entries(t, "aten::nll_loss_forward") == []
    t = capture(lambda: torch.ops.aten.nll_loss_forward(x, tgt[:, 0], None, 1, -100))
    assert entries(t, "aten::nll_loss_forward") == [{"l": "contiguous_target", "b": 6 * 8}]


def test_layer_norm_copies_a_strided_input_before_its_outputs() -> None:
    x = torch.randn(3, 8, 16, device="meta").transpose(0, 1)
    w, b = torch.ones(16, device="meta"), torch.zeros(16, device="meta")
    t = capture(lambda: torch.ops.aten.native_layer_norm(x, [16], w, b, 1e-5))
    assert entries(t, "aten::native_layer_norm") == [{"l": "contiguous_input", "b": 3 * 8 * 16 * 4, "pre": 1}]
    out, temps = inserted(t)
    a = out.allocations
    outputs = a[a["op"] == "aten::native_layer_norm"]
    # expect_contiguous runs before Y, mean and rstd are allocated; the copy lives until the op returns
    assert int(temps["alloc_seq"].iloc[0]) < int(outputs["alloc_seq"].min())
    assert int(temps["free_seq"].iloc[0]) == kernel_seq(out, "aten::native_layer_norm") + 1
    t = capture(lambda: torch.ops.aten.native_layer_norm(x.contiguous(), [16], w, b, 1e-5))
    assert entries(t, "aten::native_layer_norm") == []


def test_meta_convolutions_take_cudas_memory_format() -> None:
    """cudnn_conv_suggest_memory_format: channels-last operands give a channels-last output and input gradient."""
    x = torch.randn(2, 8, 16, 16, device="meta").contiguous(memory_format=torch.channels_last).requires_grad_()
    w = torch.randn(4, 8, 3, 3, device="meta", requires_grad=True)
    emu = ConvLayoutEmulation()
    with emu:
        y = F.conv2d(x, w, padding=1)
        y.sum().backward()
        z = F.conv2d(x.detach().contiguous(), w, padding=1)
    assert y.is_contiguous(memory_format=torch.channels_last) and not y.is_contiguous()
    assert x.grad is not None and x.grad.is_contiguous(memory_format=torch.channels_last)
    assert z.is_contiguous()
    assert emu.counts == {"convolution": 1, "convolution_backward": 1}


def test_layer_norm_after_a_channels_last_convolution_copies_only_what_cuda_copies() -> None:
    """ConvNeXt's pattern: a convolution, a permute to NHWC, a layer norm. CUDA's convolution keeps a channels-last
    input channels-last, so the permuted output is contiguous and the layer norm copies nothing; from an NCHW input
    (ConvNeXt's stem) the permuted tensor is strided and the layer norm copies it. The meta kernel returns NCHW
    either way: without the convolution-layout emulation the first case would get a copy CUDA does not make."""
    w = torch.randn(8, 1, 7, 7, device="meta")
    g, b = torch.ones(8, device="meta"), torch.zeros(8, device="meta")

    def block(x: torch.Tensor) -> Callable[[], object]:
        return lambda: F.layer_norm(F.conv2d(x, w, padding=3, groups=8).permute(0, 2, 3, 1), [8], g, b)

    nhwc = torch.randn(2, 8, 16, 16, device="meta").contiguous(memory_format=torch.channels_last)
    nchw = torch.randn(2, 8, 16, 16, device="meta")
    assert entries(capture(block(nhwc), conv_layout=True), "aten::native_layer_norm") == []
    assert entries(capture(block(nchw), conv_layout=True), "aten::native_layer_norm") == [
        {"l": "contiguous_input", "b": 2 * 8 * 16 * 16 * 4, "pre": 1}
    ]
    # the meta kernel alone (no emulation) would copy in both cases
    assert entries(capture(block(nhwc)), "aten::native_layer_norm") != []


def test_layer_norm_backward_partials_only_on_the_two_pass_path_and_by_sm_count() -> None:
    # M > 64 Ki and N / 32 < SMs / 2 (LaunchGammaBetaBackwardCUDAKernel): 70,000 rows of 1,024
    assert gamma_beta_partials([70_000, 1024, 4, 2], sms=108) == [min(32768 // 32, 2188) * 1024 * 4] * 2
    assert gamma_beta_partials([60_000, 1024, 4, 2], sms=108) == []  # M not above 64 Ki
    assert gamma_beta_partials([70_000, 1024, 4, 2], sms=28) == []  # RTX 3060: 32 >= 14
    x = torch.randn(70_000, 64, device="meta")
    w, b = torch.ones(64, device="meta"), torch.zeros(64, device="meta")
    mean, rstd = torch.zeros(70_000, 1, device="meta"), torch.ones(70_000, 1, device="meta")
    t = capture(lambda: torch.ops.aten.native_layer_norm_backward(x, x, [64], mean, rstd, w, b, [True, True, True]))
    (e,) = entries(t, "aten::native_layer_norm_backward")
    assert e == {"l": "gamma_beta_partials", "gamma_beta": [70_000, 64, 4, 2]}
    blocks_y = min(32768 // 2, -(-70_000 // 32))
    assert [tm.size_bytes for tm in resolve([e], 108, 2048)] == [blocks_y * 64 * 4] * 2


# ---- reductions --------------------------------------------------------------------------------------------------
def test_column_sum_allocates_reduce_staging_and_semaphores() -> None:
    """grad.sum((0, 1)) of a (4, 1024, 1024) fp32 tensor (an RMSNorm weight gradient of a 1,024-wide model at
    batch 4 x 1,024 tokens): 64 CTAs per output, 32 MiB of staging and 8 blocks' semaphores."""
    x = torch.randn(4, 1024, 1024, device="meta")
    t = capture(lambda: x.sum((0, 1)))
    (e,) = entries(t, "aten::sum")
    assert [(tm.label, tm.size_bytes) for tm in resolve([e], 108, 2048)] == [
        ("reduce_partials", 32 * 1024 * 1024),
        ("reduce_partials_semaphores", 32),
    ]
    out, temps = inserted(t)
    assert sorted(temps["size_bytes"].tolist()) == [32, 32 * 1024 * 1024]
    acc = out.accesses.merge(temps[["alloc_id", "size_bytes"]], on="alloc_id", suffixes=("", "_alloc"))
    # the UVM simulator sees what the blocks write: 8 x 64 CTAs x 32 threads x 16 B of the 32 MiB
    assert sorted(acc["size_bytes"].tolist()) == [32, 8 * 64 * 32 * 16]
    seq = kernel_seq(out, "aten::sum")
    assert (temps["alloc_seq"] < seq).all() and sorted(temps["free_seq"]) == [seq + 1, seq + 2]


def test_temporaries_made_under_the_prefetching_allocator_are_prefetched_right_after_allocation() -> None:
    """``uvm.prefetch_new_allocations``: the shim prefetches every managed allocation, and a reduction's staging
    buffer and semaphores come from the same allocator as its output, so each gets a cudaMemPrefetchAsync of its
    whole block between its allocation and the kernel; the same sum made with prefetching off gets none."""
    x = torch.randn(4, 1024, 1024, device="meta")

    def both() -> object:
        a = x.sum((0, 1))
        rec.prefetch_new_allocations = True
        return a, x.sum((0, 1))

    rec = Recorder("meta")
    with rec:
        rec.set_phase("forward", 0)
        keep = both()  # noqa: F841
        rec.close()
    t = Trace(header={"workload": "test"}, **rec.tables(["temporary"] * len(rec.a_size)))
    out, temps = inserted(t)
    k = out.kernels
    pre = k[k["api"] == "prefetch"]
    sums = k.loc[k["name"] == "aten::sum", "seq"].sort_values().tolist()
    hit = out.accesses[out.accesses["kernel_id"].isin(pre["kernel_id"])]
    prefetched = temps[temps["alloc_id"].isin(hit["alloc_id"])]
    assert len(temps) == 4 and len(prefetched) == 2  # the second sum's two temporaries only
    assert (prefetched["alloc_seq"] > sums[0]).all() and (prefetched["alloc_seq"] < sums[1]).all()
    for row in prefetched.itertuples():
        call = hit[hit["alloc_id"] == row.alloc_id]
        (kid,) = call["kernel_id"].tolist()
        seq = int(k.loc[k["kernel_id"] == kid, "seq"].iloc[0])
        assert row.alloc_seq < seq < sums[1] and int(call["size_bytes"].iloc[0]) == row.size_bytes
    assert k["kernel_id"].is_unique and k["seq"].is_unique


def test_reductions_that_fit_one_block_per_output_allocate_nothing() -> None:
    t = capture(lambda: torch.randn(64, 1024, device="meta").sum(-1))  # 1,024 values per row: one CTA each
    assert resolve(entries(t, "aten::sum"), 108, 2048) == []
    t = capture(lambda: torch.randn(64, 1024, device="meta").sum(0))  # 64 rows per column: no global reduce
    assert resolve(entries(t, "aten::sum"), 108, 2048) == []


def test_reduce_staging_follows_the_sm_count_when_the_grid_bounds_it() -> None:
    """A (8192, 3072) bias gradient: CTAs per output = ceil(SMs x 16 / 24) (clamped to [8, 128]): 72 on an A100,
    88 on an H100, 14 on an RTX 3060 (28 x 12); staging = 4 B x 3072 x CTAs x 32 x 4."""
    spec = [4, *reduction_layout((8192, 3072), (3072, 1), {0}, (0, 1), 4), 4, 512]
    for sms, threads, ctas in ((108, 2048, 72), (132, 2048, 88), (28, 1536, 14)):
        # written: 24 blocks x CTAs x 32 threads, one 4-float slot each: 1/128 of the staging buffer
        assert reduce_buffers(spec, sms, threads) == (4 * 3072 * ctas * 32 * 4, 4 * 24, 4 * 4 * 24 * ctas * 32)


def test_reduction_layout_coalesces_and_orders_like_tensor_iterator() -> None:
    # (4, 1024, 1024) over (0, 1) is one reduced dim of 4,096 behind the 1,024 contiguous outputs
    assert reduction_layout((4, 1024, 1024), (1 << 20, 1024, 1), {0, 1}, (0, 0, 1), 4) == (
        1024, 4096, 2, False, True, True, 4,
    )  # fmt: skip
    # a full reduction of a contiguous tensor: one dim, on the fastest stride
    assert reduction_layout((8, 16), (16, 1), {0, 1}, (0, 0), 4)[:4] == (1, 128, 1, True)


@pytest.mark.parametrize(
    "name, op, arg_bytes",
    [
        ("aten::mean", lambda x: x.mean(0), 4),
        ("aten::amax", lambda x: x.amax(0), 4),
        ("aten::max", lambda x: x.max(0), 16),
        ("aten::argmax", lambda x: x.argmax(0), 16),
        ("aten::var", lambda x: x.var(0), 16),
        ("aten::linalg_vector_norm", lambda x: torch.linalg.vector_norm(x, dim=0), 4),
        ("aten::any", lambda x: (x > 0).any(0), 1),
    ],
)
def test_every_reduction_op_stages_its_own_accumulator(name: str, op: Callable, arg_bytes: int) -> None:
    """Column reductions of (8192, 3072): 72 CTAs per output on an A100 for every op; the staging buffer holds the
    op's accumulator (fp32 4 B, value+index pair 16 B, Welford 16 B, bool 1 B). Over 64 rows: nothing."""
    big, small = torch.randn(8192, 3072, device="meta"), torch.randn(64, 3072, device="meta")
    (e,) = entries(capture(lambda: op(big)), name)
    assert e["reduce"][0] == arg_bytes
    temps = resolve([e], 108, 2048)
    assert temps[0].size_bytes == arg_bytes * 3072 * 72 * 32 * 4
    assert resolve(entries(capture(lambda: op(small)), name), 108, 2048) == []


def test_full_reductions_read_no_dim_from_the_dtype_argument() -> None:
    """``sum.default(self, *, dtype)``: a full reduction over every element (a full sum stages
    at most a few KiB: one value per CTA)."""
    x = torch.randn(4096, 4096, device="meta")
    (e,) = entries(capture(lambda: torch.ops.aten.sum.default(x, dtype=torch.float32)), "aten::sum")
    assert e["reduce"][1:3] == [1, 4096 * 4096]  # one output, every element
    assert 0 < resolve([e], 108, 2048)[0].size_bytes <= 4 * 108 * 4


def test_nll_loss_backward_copies_a_strided_grad_and_target() -> None:
    x = torch.randn(6, 4, device="meta")
    tgt = torch.randint(0, 4, (6, 2), device="meta")
    g, w = torch.ones((), device="meta"), torch.ones((), device="meta")
    t = capture(lambda: torch.ops.aten.nll_loss_backward(g, x, tgt[:, 0].contiguous(), None, 1, -100, w))
    assert entries(t, "aten::nll_loss_backward") == []
    t = capture(lambda: torch.ops.aten.nll_loss_backward(g, x.t().contiguous().t(), tgt[:, 0], None, 1, -100, w))
    assert [e["l"] for e in entries(t, "aten::nll_loss_backward")] == ["contiguous_input", "contiguous_target"]


@pytest.mark.skipif(not SNAPSHOTS.is_dir(), reason="../shared/real-data/snapshots absent")
@pytest.mark.parametrize("ctx, buffer", [(256, 8 * 2**20), (512, 16 * 2**20), (1024, 32 * 2**20)])
def test_reduce_rule_reproduces_a_real_runs_staging_buffers(ctx: int, buffer: int) -> None:
    """Wedsonlin/assignment2-systems 87b08641 trains the CS336 'medium' LM (d_model 1,024, 24 layers, batch 4): its
    snapshot holds 49 ``gpu_reduce_kernel`` staging buffers and 49 semaphore blocks per backward (the RMSNorm weight
    gradients); the rule gives exactly those sizes for a (4, ctx, 1024) fp32 sum over (0, 1) on an A100 or an H100
    (64 CTAs per output at most: ``ceil(values per thread / 16)`` bounds them, not the SM count), and fewer on an
    RTX 3060 at 1,024 tokens (42 CTAs: its 336 resident blocks bound them)."""
    from uvmlab.trace.safe_pickle import safe_load_file

    path = SNAPSHOTS / f"Wedsonlin__assignment2-systems__87b08641__results_medium_{ctx}_training_memory_snapshot.pickle"
    if not path.is_file():
        pytest.skip(f"{path.name} absent")
    sizes: Counter[int] = Counter()
    for device in safe_load_file(path)["device_traces"]:
        for e in device:
            names = [f.get("name", "") for f in e.get("frames") or []]
            if e.get("action") == "alloc" and any("gpu_reduce_kernel" in n for n in names):
                sizes[int(e["size"])] += 1
    assert sizes == {buffer: 49, 32: 49}
    x = torch.randn(4, ctx, 1024, device="meta")
    spec = sum_like((x, [0, 1]), {}, [torch.empty(1024, device="meta")])
    for sms, threads in ((108, 2048), (132, 2048)):
        assert [tm.size_bytes for tm in resolve(spec, sms, threads)] == [buffer, 32]
    rtx3060 = [tm.size_bytes for tm in resolve(spec, 28, 1536)]
    assert rtx3060 == ([4 * 1024 * 42 * 128, 32] if ctx == 1024 else [buffer, 32])


@pytest.mark.skipif(not SNAPSHOTS.is_dir(), reason="../shared/real-data/snapshots absent")
@pytest.mark.parametrize("ctx", [128, 256, 512])
def test_reduce_rule_reproduces_every_staging_block_of_an_h100_run(ctx: int) -> None:
    """kkaitlyn111/cs336-a2-systems c1272e18: the CS336 2.7B LM (d_model 2,560, 32 layers, vocabulary 10,000,
    batch 4; benchmark.py ``profile_memory_forward_fullstep``) on an H100 (its frames name ``compute_90``). Its
    einsum layers leave gradients and logits with the token dimension fastest, so the 65 RMSNorm ``rms`` gradients
    (``_sum_to`` over 2,560 features) and the loss's ``max`` and ``sum`` over the vocabulary are column
    reductions. Every ``gpu_reduce_kernel`` block of the snapshot (134 per run) is reproduced, including the
    512-token run's, where the H100's 132 SMs bound the CTAs (132, not the 157 the values per thread allow)."""
    from uvmlab.trace.safe_pickle import safe_load_file

    name = f"kkaitlyn111__cs336-a2-systems__c1272e18__memory_files_memory_ctx{ctx}_fullstep_.pickle"
    if not (SNAPSHOTS / name).is_file():
        pytest.skip(f"{name} absent")
    real: Counter[int] = Counter()
    for device in safe_load_file(SNAPSHOTS / name)["device_traces"]:
        for e in device:
            names = [f.get("name", "") for f in e.get("frames") or []]
            if e.get("action") == "alloc" and any("gpu_reduce_kernel" in n for n in names):
                real[int(e["size"])] += 1
    tokens = 4 * ctx
    predicted: Counter[int] = Counter()
    for arg_bytes, reduced, count in ((4, 2560, 65), (16, 10_000, 1), (4, 10_000, 1)):  # rms grads, max, sum
        spec = [arg_bytes, *reduction_layout((tokens, reduced), (1, tokens), {1}, (1, 0), 4), 4, 512]
        for tm in resolve([{"l": "reduce_partials", "reduce": spec}], 132, 2048):
            predicted[tm.size_bytes] += count
    assert real == predicted


# ---- embedding backward ------------------------------------------------------------------------------------------
def test_embedding_backward_sorts_only_above_3072_indices() -> None:
    grad = torch.randn(2048, 32, device="meta")
    idx = torch.randint(0, 1000, (2048,), device="meta")
    t = capture(lambda: torch.ops.aten.embedding_dense_backward(grad, idx, 1000, -1, False))
    assert entries(t, "aten::embedding_dense_backward") == []
    grad, idx = torch.randn(8192, 32, device="meta"), torch.randint(0, 1000, (8192,), device="meta")
    t = capture(lambda: torch.ops.aten.embedding_dense_backward(grad, idx, 1000, -1, False))
    e = entries(t, "aten::embedding_dense_backward")
    by = {x["l"]: x for x in e}
    assert by["sorted_indices"]["b"] == by["orig_indices"]["b"] == 8192 * 8
    assert by["partial_segment_offset"]["b"] == (8192 // 10 + 1000) * 8
    out, temps = inserted(t)
    a = out.allocations
    first_out = int(a.loc[a["op"] == "aten::embedding_dense_backward", "alloc_seq"].min())
    rng = temps[temps["op"].str.endswith(":sort_range")]
    assert int(rng["free_seq"].iloc[0]) < first_out  # the arange dies with the sort, before grad_weight


def test_embedding_backward_last_step_depends_on_the_sm_count() -> None:
    # (max_segments, max_partial, stride, index bytes, accumulate bytes, num_weights, 16-bit)
    few = [100, 919, 768, 8, 4, 50257, 0]  # 100 distinct tokens: fused atomics on an A100 (grid 75 < 432)
    assert embedding_final(few, 108) == [("partial_to_segment_idx", 919 * 8)]
    many = [8192, 9011, 768, 8, 4, 50257, 0]  # 8,192 distinct tokens: the two-pass path
    assert embedding_final(many, 108) == [("grad_weight_per_segment", 9011 * 768 * 4)]
    assert embedding_final([100, 919, 768, 8, 4, 50257, 1], 108)[1] == ("grad_weight_fp32", 50257 * 768 * 4)


# ---- attention ---------------------------------------------------------------------------------------------------
def test_efficient_attention_backward_matches_a_real_runs_temporaries() -> None:
    """cranberrii/ftcourse 9f4902cf (fp32 SDPA, 8 x 4 heads of 1,000 tokens x 64): its snapshot's
    ``_efficient_attention_backward`` allocates 8,192,000 B (grad_out * out), 128,000 B twice (the sum and
    ``delta``) and an 8,396,800 B workspace; the rule gives these sizes (tests/test_kernel_temporaries.py reads the
    numbers; the snapshot's frames were read with uvmlab.trace.safe_pickle)."""
    q = torch.randn(8, 4, 1000, 64, device="meta")
    g = torch.randn(8, 1000, 4, 64, device="meta").transpose(1, 2)  # the gradient of a (B, M, nH, K) reshape
    spec = efficient_attention_backward((g, q, q, q, None, q, torch.empty(8, 4, 1000)), {}, [])
    assert {e["l"]: e["b"] for e in spec} == {
        "grad_out_times_out": 8_192_000, "delta_sum": 128_000, "delta": 128_000, "workspace_grad_q": 8_396_800,
    }  # fmt: skip
    spec = efficient_attention_backward((q, q, q, q, None, q, torch.empty(8, 4, 1000)), {}, [])
    assert spec[0] == {"l": "contiguous_grad_out", "b": 8_192_000, "pre": 1}  # (B, nH, M, K) given: copied
    temps = resolve(spec, 108, 2048)
    assert temps[1].label == "grad_out_times_out" and temps[1].until == 2  # freed once summed
    assert temps[2].until == 3  # the sum: freed once copied into delta


def test_flash_attention_backward_keeps_softmax_d_and_dq_accum() -> None:
    q = torch.randn(2, 8, 1000, 64, device="meta", dtype=torch.bfloat16)
    g = torch.randn(2, 8, 1000, 64, device="meta", dtype=torch.bfloat16)
    lse = torch.randn(2, 8, 1000, device="meta")
    s = torch.empty((), dtype=torch.int64, device="meta")

    def run() -> object:
        return torch.ops.aten._scaled_dot_product_flash_attention_backward(
            g, q, q, q, g, lse, s, s, 1000, 1000, 0.0, False, s, s
        )

    t = capture(run)
    e = entries(t, "aten::_scaled_dot_product_flash_attention_backward")
    assert e == [{"l": "softmax_d", "b": 2 * 8 * 1024 * 4}, {"l": "dq_accum", "b": 2 * 1024 * 8 * 64 * 4}]


# ---- convolution backward ----------------------------------------------------------------------------------------
def test_convolution_backward_copies_a_strided_grad_output() -> None:
    x = torch.randn(2, 3, 16, device="meta")
    w = torch.randn(4, 3, 3, device="meta")
    g = torch.randn(2, 14, 4, device="meta").transpose(1, 2)  # (B, C, T) view of (B, T, C)

    def run(grad: torch.Tensor) -> Callable[[], object]:
        return lambda: torch.ops.aten.convolution_backward(
            grad, x, w, [4], [1], [0], [1], False, [0], 1, [True, True, True]
        )

    t = capture(run(g))
    assert entries(t, "aten::convolution_backward") == [{"l": "contiguous_grad_output", "b": 2 * 14 * 4 * 4}]
    t = capture(run(g.contiguous()))
    assert entries(t, "aten::convolution_backward") == []


def test_convolution_backward_copies_in_the_format_cudnn_suggests() -> None:
    """ConvNeXt's stem: an NCHW image, a gradient in channels-last memory (its LayerNorm2d permutes back). cuDNN's
    weight-gradient call works in channels-last (``cudnn_conv_suggest_memory_format(input, grad_output)``): it copies
    the input, not the gradient; with an NCHW gradient nothing is copied."""
    x = torch.randn(2, 3, 32, 32, device="meta")
    w = torch.randn(8, 3, 4, 4, device="meta")
    g_cl = torch.randn(2, 8, 8, 8, device="meta").contiguous(memory_format=torch.channels_last)

    def run(grad: torch.Tensor) -> Callable[[], object]:
        return lambda: torch.ops.aten.convolution_backward(
            grad, x, w, [8], [4, 4], [0, 0], [1, 1], False, [0, 0], 1, [False, True, True]
        )

    assert entries(capture(run(g_cl)), "aten::convolution_backward") == [
        {"l": "contiguous_input", "b": 2 * 3 * 32 * 32 * 4}
    ]
    assert entries(capture(run(g_cl.contiguous())), "aten::convolution_backward") == []


# ---- the rule switch, old traces, the acceptance LM --------------------------------------------------------------
def test_rule_off_and_traces_without_the_column_add_nothing() -> None:
    t = capture(lambda: torch.log_softmax(torch.randn(4, 10, 6, device="meta").permute(0, 2, 1), dim=1))
    off = to_cuda(t, A100, OrchestrationRules(kernel_temporaries=False))
    assert not off.allocations["op"].str.contains(LABELLED).any()
    old = Trace(header=t.header, allocations=t.allocations, kernels=t.kernels.drop(columns=["temporaries"]),
                accesses=t.accesses)  # fmt: skip
    assert to_cuda(old, A100, ONLY_TEMPS).header["orchestration"]["changes"]["kernel_temporaries"] == 0
    assert to_cuda(t, A100, OrchestrationRules.none()).header["orchestration"]["changes"] == {}


def test_unknown_entries_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown kernel temporary"):
        resolve([{"l": "x", "mystery": 1}], 108, 2048)


LM_FILE = '''
import torch
import torch.nn.functional as F
from workloads.base import Workload

DEFAULT_BATCH_SIZE = 4
OPTIONS = {"vocab": 4096, "seq": 128, "hidden": 64, "permute": 1}


class FrozenLM(torch.nn.Module):
    """A frozen LM: the step is a forward, the loss and the gradient of one loss scale."""

    def __init__(self, vocab, hidden):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, hidden).requires_grad_(False)
        self.head = torch.nn.Linear(hidden, vocab, bias=False).requires_grad_(False)
        self.scale = torch.nn.Parameter(torch.ones(()))

    def forward(self, x):
        return self.head(self.emb(x))


def build(cfg, device, options):
    dev = torch.device(device)
    with dev:
        model = FrozenLM(options["vocab"], options["hidden"])

    def make_batch():
        return torch.randint(0, options["vocab"], (cfg.batch_size, options["seq"]), device=dev)

    def loss_fn(m, x):
        logits = m(x)
        if options["permute"]:
            return m.scale * F.cross_entropy(logits.permute(0, 2, 1), x)
        return m.scale * F.cross_entropy(logits.reshape(-1, options["vocab"]), x.reshape(-1))

    return Workload("frozen_lm", model, make_batch, loss_fn, dev)
'''


def test_lm_cross_entropy_over_permuted_logits_counts_the_logits_copy(tmp_path: Path) -> None:
    """The issue's case: a language model's forward + cross entropy over (B, V, T) logits. CUDA's log_softmax makes
    the logits contiguous first (SoftMax.cu ``host_softmax``): the trace carries the copy (fp32 logits, 8 MiB) and
    the estimate's allocated peak grows by it; with the logits in (B*T, V) layout nothing changes."""
    from uvmlab.memory.estimate import estimate

    path = tmp_path / "frozen_lm.py"
    path.write_text(LM_FILE)
    logits = 4 * 128 * 4096 * 4
    for permute, extra in ((1, logits), (0, 0)):
        cfg = WorkloadConfig(workload=str(path), iterations=1, options={"permute": permute})
        from uvmlab.trace.capture import capture_trace

        trace = capture_trace(cfg)
        k = trace.kernels
        temps = [json.loads(v) for v in k.loc[k["name"] == "aten::_log_softmax", "temporaries"] if v]
        assert temps == ([[{"l": "contiguous_input", "b": logits}]] if permute else [])
        on = estimate(cfg, A100, trace=trace)
        off = estimate(cfg, A100, trace=trace, rules=OrchestrationRules(kernel_temporaries=False))
        grown = on.peak_allocated_bytes - off.peak_allocated_bytes
        assert (grown >= logits - 2048) if extra else grown == 0  # one 8 MiB block more at the forward's peak
        assert on.peak_allocated_bytes - off.peak_allocated_bytes <= extra


def test_a_failing_rule_leaves_the_capture_going_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rule that raises on arguments it did not foresee costs that op its temporaries, not the capture: the
    header's notes name the op and count."""
    from uvmlab.trace import internal_rules
    from uvmlab.trace.capture import capture_trace

    def broken(args: tuple, kwargs: dict, outs: list) -> list:
        raise TypeError("unforeseen")

    monkeypatch.setitem(internal_rules.RULES, torch.ops.aten._log_softmax.default, broken)
    path = tmp_path / "frozen_lm.py"
    path.write_text(LM_FILE)
    trace = capture_trace(WorkloadConfig(workload=str(path), iterations=1, options={"permute": 1}))
    k = trace.kernels
    assert (k.loc[k["name"] == "aten::_log_softmax", "temporaries"] == "").all()
    assert any("kernel temporaries not derived" in n and "aten::_log_softmax x1" in n for n in trace.header["notes"])


@pytest.mark.parametrize(
    "cell",
    ["[" * 100_000, "[1]", '[{"l": "x"}]', '[{"b": 1}]', '{"l": "x", "b": 1}', '[{"l": "x", "b": 1e999}]'],
)
def test_a_crafted_temporaries_cell_is_one_sentence(cell: str) -> None:
    """A trace folder is an input: a temporaries cell that is not uvmlab's format (nested beyond the decoder, entries
    of the wrong shape, an infinite size) stops the orchestration with one InputError, not a traceback."""
    x = torch.randn(4, 1024, 1024, device="meta")
    t = capture(lambda: x.sum((0, 1)))
    k = t.kernels.copy()
    k.loc[k["name"] == "aten::sum", "temporaries"] = cell
    crafted = Trace(header=t.header, allocations=t.allocations, kernels=k, accesses=t.accesses)
    with pytest.raises(InputError) as err:
        to_cuda(crafted, A100, ONLY_TEMPS)
    assert "\n" not in str(err.value) and len(str(err.value)) < 400
