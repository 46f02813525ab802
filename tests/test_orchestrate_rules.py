"""The orchestrator's rules, one by one, on small synthetic traces; invariants with hypothesis."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from uvmlab.errors import InputError
from uvmlab.gpus import get_gpu
from uvmlab.trace.orchestrate import (
    CUBLAS_DEFAULT_WORKSPACE_BYTES,
    CUBLAS_SM90_WORKSPACE_BYTES,
    OrchestrationRules,
    cublas_workspace_bytes,
    op_base,
    parse_cublas_workspace_config,
    to_cuda,
)
from uvmlab.trace.schema import NEVER_FREED, Trace

A100 = get_gpu("A100-80GB")
H100 = get_gpu("H100-80GB")
MiB = 1024 * 1024


class TraceMaker:
    """Builds a Trace event by event (one global seq)."""

    def __init__(self) -> None:
        self.seq = 0
        self.allocs: list[dict[str, Any]] = []
        self.kernels: list[dict[str, Any]] = []
        self.accesses: list[dict[str, Any]] = []

    def alloc(self, size: int, category: str, phase: str, it: int, stream: int = 0) -> int:
        aid = len(self.allocs)
        self.allocs.append(
            {
                "alloc_id": aid,
                "size_bytes": size,
                "alloc_seq": self.seq,
                "free_seq": NEVER_FREED,
                "category": category,
                "phase": phase,
                "iteration": it,
                "op": "aten::empty",
                "stream": stream,
            }
        )
        self.seq += 1
        return aid

    def free(self, aid: int) -> None:
        self.allocs[aid]["free_seq"] = self.seq
        self.seq += 1

    def kernel(self, name: str, phase: str, it: int, touches: list[int], stream: int = 0) -> int:
        kid = len(self.kernels)
        self.kernels.append(
            {"kernel_id": kid, "seq": self.seq, "name": name, "phase": phase, "iteration": it, "flops": 1.0,
             "stream": stream}
        )  # fmt: skip
        for aid in touches:
            size = self.allocs[aid]["size_bytes"]
            self.accesses.append(
                {"kernel_id": kid, "alloc_id": aid, "offset_bytes": 0, "size_bytes": size, "is_write": False}
            )
        self.seq += 1
        return kid

    def trace(self, **header: Any) -> Trace:
        return Trace(
            allocations=pd.DataFrame(self.allocs),
            kernels=pd.DataFrame(self.kernels),
            accesses=pd.DataFrame(self.accesses),
            header=header,
        )


def training_trace(iterations: int = 2, grad_freed_in_optimizer: bool = False, conv: bool = False) -> Trace:
    """params -> per iteration: data, forward (mm / conv), backward (grads), optimizer (state at it 0)."""
    m = TraceMaker()
    w = m.alloc(4 * MiB, "parameter", "setup", -1)
    grads: list[int] = []
    state: list[int] = []
    for it in range(iterations):
        for g in grads:
            m.free(g)  # zero_grad(set_to_none) at iteration start
        grads = []
        x = m.alloc(1 * MiB, "input", "data", it)
        act = m.alloc(2 * MiB, "activation", "forward", it)
        m.kernel("aten::convolution" if conv else "aten::mm", "forward", it, [x, w, act])
        m.kernel("aten::addmm", "forward", it, [act, w])
        m.free(x)
        ga = m.alloc(2 * MiB, "gradient", "backward", it)  # gradient of the activation: dies in backward
        gw = m.alloc(4 * MiB, "gradient", "backward", it)
        m.kernel("aten::mm", "backward", it, [ga, act, gw])
        m.free(ga)
        m.free(act)
        grads.append(gw)
        if it == 0:
            state += [m.alloc(4 * MiB, "optimizer_state", "optimizer", it) for _ in range(2)]
        tmp = m.alloc(4 * MiB, "temporary", "optimizer", it)
        m.kernel("aten::_foreach_add_", "optimizer", it, [w, gw, *state, tmp])
        m.free(tmp)
        if grad_freed_in_optimizer:  # freed too early: before the optimizer's last kernel
            m.free(gw)
            grads = []
            m.kernel("aten::_foreach_mul_", "optimizer", it, [w])
    return m.trace(config={"zero_grad": "iteration_start"})


def test_op_base() -> None:
    assert op_base("aten::mm") == "mm"
    assert op_base("aten.addmm.default") == "addmm"
    assert op_base("convolution") == "convolution"


def test_cublas_workspace_sizes() -> None:
    assert cublas_workspace_bytes(A100) == CUBLAS_DEFAULT_WORKSPACE_BYTES == 8_519_680
    assert cublas_workspace_bytes(H100) == CUBLAS_SM90_WORKSPACE_BYTES == 32 * MiB
    assert cublas_workspace_bytes(H100.with_memory(40 * 1024 * MiB)) == 32 * MiB  # renamed, still sm90
    assert parse_cublas_workspace_config(":4096:8") == 32 * MiB
    assert parse_cublas_workspace_config(":4096:2:16:8") == CUBLAS_DEFAULT_WORKSPACE_BYTES
    with pytest.raises(InputError, match="CUBLAS_WORKSPACE_CONFIG"):
        parse_cublas_workspace_config("4096")


def test_workspaces_added_once_per_stream_before_first_matmul() -> None:
    t = training_trace()
    out = to_cuda(t, A100)
    ws = out.allocations[out.allocations["category"] == "workspace"]
    assert sorted(ws["op"]) == ["cublas_workspace", "cublaslt_workspace"]
    cublas = ws[ws["op"] == "cublas_workspace"].iloc[0]
    assert cublas["size_bytes"] == CUBLAS_DEFAULT_WORKSPACE_BYTES and cublas["free_seq"] == NEVER_FREED
    first_mm = out.kernels[out.kernels["name"] == "aten::mm"]["seq"].min()
    assert cublas["alloc_seq"] == first_mm - 1
    lt = ws[ws["op"] == "cublaslt_workspace"].iloc[0]
    first_addmm = out.kernels[out.kernels["name"] == "aten::addmm"]["seq"].min()
    assert lt["alloc_seq"] == first_addmm - 1 and lt["size_bytes"] == 1024 * 1024
    assert out.header["orchestration"]["context_bytes"] == A100.context_bytes
    # H100: 32 MiB
    out_h = to_cuda(t, H100)
    assert out_h.allocations.query("op == 'cublas_workspace'")["size_bytes"].item() == 32 * MiB


def test_second_stream_gets_its_own_workspace() -> None:
    m = TraceMaker()
    a = m.alloc(MiB, "activation", "forward", 0)
    m.kernel("aten::mm", "forward", 0, [a])
    m.kernel("aten::mm", "forward", 0, [a], stream=7)
    m.kernel("aten::mm", "forward", 0, [a], stream=7)
    out = to_cuda(m.trace(), A100)
    ws = out.allocations.query("op == 'cublas_workspace'")
    assert sorted(ws["stream"]) == [0, 7]


def test_cudnn_workspace_is_temporary_around_each_conv() -> None:
    t = training_trace(conv=True)
    out = to_cuda(t, A100)
    cw = out.allocations.query("op == 'cudnn_workspace'")
    convs = out.kernels[out.kernels["name"] == "aten::convolution"]
    assert len(cw) == len(convs) == 2
    for (_, w), (_, k) in zip(cw.sort_values("alloc_seq").iterrows(), convs.sort_values("seq").iterrows(), strict=True):
        assert w["alloc_seq"] == k["seq"] - 1 and w["free_seq"] == k["seq"] + 1
        assert w["size_bytes"] == 4 * MiB  # the largest operand (the weight)
    capped = to_cuda(t, A100, OrchestrationRules(cudnn_workspace_cap_bytes=MiB))
    assert (capped.allocations.query("op == 'cudnn_workspace'")["size_bytes"] == MiB).all()
    off = to_cuda(t, A100, OrchestrationRules(cudnn_workspace=False))
    assert off.allocations.query("op == 'cudnn_workspace'").empty


def test_gradients_extended_to_zero_grad_but_activation_grads_untouched() -> None:
    t = training_trace(grad_freed_in_optimizer=True)
    out = to_cuda(t, A100, replace(OrchestrationRules.none(), gradients_until_zero_grad=True))
    assert out.header["orchestration"]["changes"]["gradients_until_zero_grad"] == 1  # it-0 grad; it-1 has no next
    a = out.allocations
    gw0 = a[(a["category"] == "gradient") & (a["size_bytes"] == 4 * MiB) & (a["iteration"] == 0)].iloc[0]
    first_it1 = min(a.loc[a["iteration"] == 1, "alloc_seq"].min(), out.kernels.query("iteration == 1")["seq"].min())
    assert gw0["free_seq"] == first_it1 - 1  # freed right at the zero_grad of iteration 1
    ga0 = a[(a["category"] == "gradient") & (a["size_bytes"] == 2 * MiB) & (a["iteration"] == 0)].iloc[0]
    orig = t.allocations.set_index("alloc_id")
    # the activation gradient keeps its order relative to the original events
    assert (
        ga0["free_seq"] - ga0["alloc_seq"]
        == orig.loc[ga0["alloc_id"], "free_seq"] - orig.loc[ga0["alloc_id"], "alloc_seq"]
    )


def test_rules_change_nothing_on_a_well_formed_trace() -> None:
    t = training_trace()
    out = to_cuda(t, A100, replace(OrchestrationRules(), cublas_workspace=False, cublaslt_workspace=False))
    assert out.header["orchestration"]["changes"] == {
        "persist_parameters": 0,
        "optimizer_state_persists": 0,
        "gradients_until_zero_grad": 0,
        "kernel_temporaries": 0,
        "cudnn_workspace": 0,
    }
    pd.testing.assert_frame_equal(out.allocations, t.allocations)
    pd.testing.assert_frame_equal(out.kernels, t.kernels)


def test_params_and_optimizer_state_persist() -> None:
    t2 = training_trace()
    end = t2.kernels["seq"].max()
    t2.allocations.loc[t2.allocations["category"] == "optimizer_state", "free_seq"] = [end + 1, end + 2]
    t2.allocations.loc[t2.allocations["category"] == "parameter", "free_seq"] = end + 3
    out = to_cuda(t2, A100)
    assert out.header["orchestration"]["changes"]["optimizer_state_persists"] == 2
    assert out.header["orchestration"]["changes"]["persist_parameters"] == 1
    assert (out.allocations.query("category == 'parameter'")["free_seq"] == NEVER_FREED).all()
    assert (out.allocations.query("category == 'optimizer_state'")["free_seq"] == NEVER_FREED).all()
    off = to_cuda(t2, A100, replace(OrchestrationRules(), optimizer_state_persists=False))
    assert (off.allocations.query("category == 'optimizer_state'")["free_seq"] != NEVER_FREED).all()


def test_input_not_modified_and_output_valid() -> None:
    t = training_trace(conv=True)
    before = t.allocations.copy()
    out = to_cuda(t, A100)
    pd.testing.assert_frame_equal(t.allocations, before)
    out.validate("orchestrated")
    seqs = pd.concat(
        [out.allocations["alloc_seq"], out.allocations.query("free_seq != -1")["free_seq"], out.kernels["seq"]]
    )
    assert seqs.is_unique and sorted(seqs) == list(range(len(seqs)))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.booleans(), st.booleans())
def test_order_of_original_events_is_preserved(iterations: int, grad_opt: bool, conv: bool) -> None:
    t = training_trace(iterations, grad_freed_in_optimizer=grad_opt, conv=conv)
    out = to_cuda(t, A100, replace(OrchestrationRules(), gradients_until_zero_grad=False))
    orig = t.allocations.set_index("alloc_id")["alloc_seq"]
    new = out.allocations.set_index("alloc_id")["alloc_seq"].reindex(orig.index)
    assert (orig.rank() == new.rank()).all()
    k_old, k_new = t.kernels["seq"].rank(), out.kernels["seq"].rank()
    assert (k_old == k_new).all()
    # live bytes never lower than the capture's at the same original event (workspaces only add)
    assert out.live_bytes().max() >= t.live_bytes().max()


def test_snapshot_orchestrate_estimate_are_torch_free() -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import uvmlab.trace.snapshot, uvmlab.trace.safe_pickle, uvmlab.trace.orchestrate, uvmlab.memory.estimate\n"
        "import uvmlab.cli.estimate_cmds\n"
        "sys.exit(1 if 'torch' in sys.modules else 0)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, f"torch was imported: {proc.stderr}"
