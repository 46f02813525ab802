"""The program examples of docs/workloads.md ("Programs: more than a training loop") run under ``uvmlab run FILE
-n 2`` and ``uvmlab trace FILE``, and record what their text says they do."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from uvmlab.cli import main
from uvmlab.files.rundir import RunDir
from uvmlab.sim.uvm.advice import ADVICE
from uvmlab.trace.schema import read_trace

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "docs" / "examples" / "programs"
NAMES = sorted(p.stem for p in EXAMPLES.glob("*.py"))


pytestmark = pytest.mark.usefixtures("module_trace_cache")


def test_every_example_is_in_the_docs() -> None:
    doc = (REPO / "docs" / "workloads.md").read_text()
    assert "## Programs: more than a training loop" in doc
    linked = set(re.findall(r"examples/programs/(\w+)\.py", doc))
    assert set(NAMES) == linked and len(NAMES) == 12


@pytest.mark.parametrize("name", NAMES)
def test_the_docs_show_each_example_as_it_is(name: str) -> None:
    """docs/workloads.md shows each file from its first constant (docstring left out) to its end, verbatim."""
    doc = (REPO / "docs" / "workloads.md").read_text()
    text = (EXAMPLES / f"{name}.py").read_text()
    start = min(i for i in (text.find("DEFAULT_BATCH_SIZE"), text.find("OPTIONS")) if i >= 0)
    assert f"```python\n{text[start:].rstrip()}\n```" in doc


@pytest.mark.parametrize("name", NAMES)
def test_example_runs_and_traces(name: str, tmp_path: Path) -> None:
    f = str(EXAMPLES / f"{name}.py")
    out = tmp_path / "run"
    assert main(["run", f, "-n", "2", "--mode", "sim", "-o", str(out)]) == 0
    result = RunDir(out).read_result()
    assert result["outcome"] == "ok" and result["iterations"] == 2
    assert main(["trace", f, "-n", "2", "-o", str(tmp_path / "trace")]) == 0
    trace = read_trace(tmp_path / "trace")
    k = trace.kernels
    assert set(k.loc[k["phase"] != "setup", "iteration"]) == {0, 1}
    CHECKS[name](k, result)


def _host_data(k, result) -> None:
    assert result["hint_api_calls"] == {"host_write": 3, "host_read": 3}
    assert result["dtoh_bytes"] > 0 and result["htod_bytes"] > 0


def _hints(k, result) -> None:
    advised = set(k.loc[k["api"] == "advise", "api_arg"])
    assert advised == set(ADVICE)  # every cudaMemAdvise, set and unset
    assert (k.loc[k["api"] == "advise", "phase"] == "compute").sum() == 4  # the mid-run ones
    assert result["remote_bytes"] > 0  # staging read over the link


def _inference(k, result) -> None:
    assert "aten::addmm" in set(k["name"]) and not k["name"].str.contains("backward").any()
    assert result["hint_api_calls"]["cudaMemPrefetchAsync"] == 8  # 4 layers, weight and bias each


def _solver(k, result) -> None:
    assert result["hint_api_calls"]["cudaMemAdvise"] == 1
    # the residual each step, then x after the loop (labelled with the last iteration)
    assert (k.loc[k["phase"] == "compute", "api"] == "host_read").sum() == 3


def _custom_kernels(k, result) -> None:
    orders = set(k.loc[k["api"] == "", "order"]) - {""}
    assert orders == {"sequential", "strided", "random", "lcg", "gather", "scatter", "tiled"}
    seq = k[k["name"] == "seq_stream"].iloc[0]
    assert (seq["threads"], seq["stride_bytes"]) == (65536, 4096)


def _prefetching_allocator(k, result) -> None:
    pf = k[k["api"] == "prefetch"]
    assert len(pf) > 0 and set(pf["phase"]) == {"compute"}  # the activations of the loop, not features/scratch


def _streams_overlap(k, result) -> None:
    assert set(k["stream"]) == {0, 1}  # uvm.stream(): the copy stream's prefetches
    assert set(k.loc[k["stream"] == 1, "api"]) == {"prefetch", "event_record"}
    assert (k["api"] == "event_wait").sum() == 3 * 2 and (k["api"] == "synchronize").sum() == 2
    assert result["time_breakdown_ns"]["other_ns"] < 0  # overlap: the parts add up to more than the iteration


def _device_memory(k, result) -> None:
    assert result["device_bytes"] == 64 << 20
    assert set(k.loc[k["api"] != "", "api"]) == {"memcpy_htod", "memcpy_dtoh", "host_write"}


def _inplace_gemm(k, result) -> None:
    gemms = k[k["name"].isin(["aten::addmm_", "aten::mm", "aten::baddbmm_"])]
    assert len(gemms) == 6 and (gemms["flops"] > 2 * 2048**3 * 0.99).all()
    assert set(result["native_by_class_ns"]) == {"gemm"}


def _gather_index(k, result) -> None:
    idx = set(k["index"]) - {""}
    assert idx == {f"zipf:1.1;rows={1 << 18};lookups={1 << 16}"}


def _declared_time(k, result) -> None:
    assert k.loc[k["name"] == "stencil", "native_ns"].tolist() == [1.5e6, 1.5e6]
    assert (k.loc[k["name"] == "naive_gemm", "efficiency"] == 0.05).all()
    assert set(result["native_by_class_ns"]) >= {"declared", "compute", "serial"}


def _row_per_thread(k, result) -> None:
    row = k[k["name"] == "row_sum"].iloc[0]
    assert (row["order"], row["threads"], row["stride_bytes"]) == ("sequential", 65536, 4)
    assert result["slowdown_vs_native"] == pytest.approx(1.0, abs=0.01)  # --oversub 1: the matrix fits


CHECKS = {
    "streams_overlap": _streams_overlap,
    "device_memory": _device_memory,
    "inplace_gemm": _inplace_gemm,
    "gather_index": _gather_index,
    "declared_time": _declared_time,
    "host_data": _host_data,
    "hints": _hints,
    "inference": _inference,
    "solver": _solver,
    "custom_kernels": _custom_kernels,
    "prefetching_allocator": _prefetching_allocator,
    "row_per_thread": _row_per_thread,
}
