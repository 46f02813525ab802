"""``uvmlab collect`` (the evidence kit): the plan and its safety rule, the cuDNN log parser on real logs, the NVML
peak sampler, and the whole kit end to end against the stub CUDA runtime, then ``uvmlab validate`` on its output.

No GPU here. What runs for real in the end-to-end test: the plan, every step as a child process with the step
environment of a GPU run, the link and streams steps (their real code, against tests/stubs/site/cupy.py, a fake
CuPy with CuPy's signatures and static linking, and the stub runtime loaded by path for the host prefetch), the GCN
step (its real code, on the CPU: ``--device cpu``), the assembly into the real-data layout, and validate. What a
stand-in plays (the GPU's part, as tests/test_gpu_shim.py's fake worker does for ``uvmlab run``): the memory and
cuDNN steps, which need torch on a CUDA device. The stand-in allocates through the stub runtime, writes a snapshot
with uvmlab's PyTorch-format writer and a cuDNN log in the documented block format, and uses the real step's
helpers for the rest (``memory_step.workspace_rows``, ``layout.RUN_COLUMNS``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from tests.cuda_stub import build_cudart
from uvmlab.errors import InputError, UnavailableError
from uvmlab.measure.gpu.detect import GpuStatus
from uvmlab.measure.gpu.kit import layout as L
from uvmlab.measure.gpu.kit.cudnn_log import parse_log, summarize
from uvmlab.measure.gpu.kit.plan import (
    DEFAULT_CASES,
    CollectOptions,
    MemoryCase,
    format_kit_plan,
    parse_workloads,
    plan_collect,
)
from uvmlab.units import GiB, MiB

STUBS = Path(__file__).parent / "stubs"
SITE = STUBS / "site"
REPO = Path(__file__).resolve().parents[1]
NO_GPU = GpuStatus(False, "no NVIDIA driver (test)")
TINY_GPT2 = {"seq_len": 16, "n_layer": 1, "n_head": 2, "n_embd": 32, "vocab_size": 128, "n_positions": 16}
TINY_CNN = {"image_size": 64, "num_classes": 10}


# ---- the plan ---------------------------------------------------------------------------------------------------
def test_the_full_plan_covers_the_issue_cases_and_never_asks_more_than_0_9_of_free() -> None:
    names = {c.name for c in DEFAULT_CASES}
    assert {"resnet50_b32_sgd_bench-off", "torchvision-vgg16_b64_adam_bench-on", "gpt2_b8_adam_bench-off"} <= names
    assert len(DEFAULT_CASES) == 3 * 2 * 2 * 2 + 2 * 2  # 3 CNNs x 2 batches x 2 optimizers x bench on/off; gpt2
    opts = CollectOptions(budget_s=None, factors=(0.25, 0.5, 0.9))
    plan = plan_collect(opts, "/OUT", status=NO_GPU, nsys_available=True)
    assert plan.gpu_source == "assumed" and max(plan.factors) <= 0.9 and not plan.left_out
    streams = next(s for s in plan.steps if s.step.name == "uvm-streams").step
    assert streams.argv[:2] == ("nsys", "profile") and "--cuda-um-gpu-page-faults=true" in streams.argv
    assert "0.25,0.5,0.9" in streams.argv and any(s.step.name == "uvm-export" for s in plan.steps)
    link = next(s for s in plan.steps if s.step.name == "link").step
    assert "--factors" not in link.argv  # the oversubscribed microbenchmark rows need the flag
    cudnn = [s.step for s in plan.steps if s.what == "cudnn"]
    assert len(cudnn) == 3 * 2 * 2 and all(s.env["CUDNN_LOGLEVEL_DBG"] == "3" for s in cudnn)
    assert all(s.env["CUDNN_LOGDEST_DBG"].endswith(".partial/cudnn.log") and "--snapshot" in s.argv for s in cudnn)
    assert all(s.env["TORCH_SYMBOLIZE_MODE"] == "fast" for s in cudnn)  # C++ frames without addr2line
    gcn = [s.step for s in plan.steps if s.step.name.startswith("gcn-uvm")]
    assert gcn and all(s.env["PYTORCH_NO_CUDA_MEMORY_CACHING"] == "1" and "LD_PRELOAD" in s.env for s in gcn)
    assert all("--fraction-of-free" in s.argv and "--nodes" not in s.argv for s in gcn)  # sized on the GPU
    assert 20 * 60 < plan.seconds < 4 * 3600  # the documented order of magnitude


def test_the_default_plan_on_an_h200_fits_540_seconds_with_a_cap_per_step() -> None:
    """Issue 43 blocker 2: the default plan was 48 steps (its own estimate 84 min). By default the plan now takes
    the steps in value order whose estimates fit 540 s, each with a time cap; the first ones are the machine facts,
    the shim/balloon probe, the ImageNet CNN snapshots and cuDNN logs, then the link."""
    from uvmlab.measure.gpu.kit.plan import DEFAULT_BUDGET_S

    plan = plan_collect(CollectOptions(gpu="H200"), "/OUT", status=NO_GPU, nsys_available=False)
    assert DEFAULT_BUDGET_S == 540 and plan.budget_s == 540
    assert plan.spec_name == "H200" and plan.seconds <= 540
    assert [s.step.name for s in plan.steps[:6]] == [
        "facts",
        "probe",
        "memory-torchvision-vgg16_b64_sgd_bench-off",
        "cudnn-torchvision-vgg16_b64_sgd_bench-off",
        "memory-resnet50_b64_sgd_bench-off",
        "link",
    ]
    assert all(0 < s.seconds < s.cap_s <= 600 for s in plan.steps)
    assert [s.value for s in plan.steps] == sorted(s.value for s in plan.steps)
    assert plan.left_out and all(s.step.name not in {k.step.name for k in plan.steps} for s in plan.left_out)
    assert all(s.settles and s.needs_nsys for s in plan.steps)  # what it settles, with or without nsys
    text = format_kit_plan(plan)
    assert f"estimates sum to {plan.seconds:.0f} s (budget 540 s)" in text and "settled without nsys" in text


@pytest.mark.parametrize("factors", [(0.95,), (0.5, 1.5)])
def test_more_than_0_9_of_free_memory_needs_the_flag(factors: tuple[float, ...]) -> None:
    with pytest.raises(InputError, match="--allow-oversubscription"):
        CollectOptions(factors=factors)
    opts = CollectOptions(factors=factors, allow_oversubscription=True, what=("uvm", "link"), gcn=False, budget_s=None)
    plan = plan_collect(opts, "/OUT", status=NO_GPU, nsys_available=False)
    assert next(s for s in plan.steps if s.step.name == "link").step.argv[-2:] == ("--factors", "1.5,2,4")


def test_bad_options_are_one_sentence() -> None:
    with pytest.raises(InputError, match="--what takes"):
        CollectOptions(what=("memory", "disk"))
    with pytest.raises(InputError, match="must be > 0"):
        CollectOptions(factors=(0.0,))
    with pytest.raises(InputError, match="NAME@B1,B2"):
        parse_workloads(("resnet50@x",))
    assert [c.name for c in parse_workloads(("gpt2@4",))] == ["gpt2_b4_sgd_bench-off", "gpt2_b4_adam_bench-off"]


def test_collect_dry_run_prints_the_plan_on_this_machine(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from uvmlab.cli import main

    argv = ["collect", "-o", str(tmp_path / "kit"), "--dry-run", "--what", "memory,uvm,link", "--no-gcn"]
    assert main([*argv, "--budget", "none"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("GPU: ") and "memory-resnet50_b32_sgd_bench-off" in out and "uvm-streams" in out
    assert "env -u PYTORCH_NO_CUDA_MEMORY_CACHING" in out and "estimates sum to" in out
    assert main(["collect", "-o", str(tmp_path / "kit"), "--dry-run", "--gpu", "H200"]) == 0
    out = capsys.readouterr().out
    total = float(out.rsplit("estimates sum to ", 1)[1].split(" s")[0])
    assert total <= 540 and "(budget 540 s)" in out
    assert not (tmp_path / "kit").exists()  # a dry run writes nothing
    assert main(["collect", "-o", str(tmp_path / "kit"), "--factors", "1.5"]) == 2
    assert "--allow-oversubscription" in capsys.readouterr().err


def test_collect_without_a_gpu_is_one_sentence(tmp_path: Path) -> None:
    from uvmlab.measure.gpu.kit.runner import collect_evidence

    with pytest.raises(UnavailableError, match=r"^uvmlab collect needs an NVIDIA GPU: no NVIDIA driver"):
        collect_evidence(CollectOptions(what=("link",)), tmp_path / "kit", status=NO_GPU)
    assert not (tmp_path / "kit").exists()


# ---- the cuDNN log parser -------------------------------------------------------------------------------------------
def test_the_parser_reads_a_real_cudnn_7_log(real_data: Path) -> None:
    """rai-project/lib_log_parser's AlexNet log (cuDNN 7.5.1, CUDNN_LOGINFO_DBG): 95 forward, 30 backward-data and 28
    backward-filter convolution calls (real-data/cudnn README), algorithms and workspaces as logged (by hand: grep
    workSpaceSizeInBytes of the convolution calls)."""
    log = real_data / "cudnn" / "rai-project_lib_log_parser" / "_fixtures" / "alexnet_cudnn.log"
    df = parse_log(log, "alexnet")
    s = summarize(df)
    assert (s["forward"]["calls"], s["backward_data"]["calls"], s["backward_filter"]["calls"]) == (95, 30, 28)
    assert (
        s["forward"]["max_workspace_bytes"] == 430_628_864
        and s["backward_filter"]["max_workspace_bytes"] == 226_713_600
    )
    first = df[df["kind"] == "forward"].iloc[0]
    assert first["algo"] == "CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM" and first["workspace_bytes"] == 0
    assert (first["x_dims"], first["w_dims"], first["y_dims"]) == ("[1,3,224,224]", "[96,3,11,11]", "[1,96,54,54]")
    assert first["cudnn_version"] == 7501 and first["process"] == 18690


V9_BLOCKS = """\
I! CuDNN (v91200 46) function cudnnBackendSetAttribute() called:
i!     descriptor: type=CUDNN_BACKEND_ENGINE_DESCRIPTOR:
i!         globalIndex: type=int64_t; val=-1;
i!     attributeName: type=cudnnBackendAttributeName_t; val=CUDNN_ATTR_ENGINE_GLOBAL_INDEX (201);
i!     attributeType: type=cudnnBackendAttributeType_t; val=CUDNN_TYPE_INT64 (3);
i!     elementCount: type=int64_t; val=1;
i!     [0]: type=int64_t; val=28;
i! Time: 2025-11-14T23:49:41.702901 (0d+0h+1m+39s since start)
i! Process=3600; Thread=10156; GPU=NULL; Handle=NULL; StreamId=NULL.


I! CuDNN (v91200 46) function cudnnBackendExecute() called:
i!     handle: type=cudnnHandle_t; streamId=0x0;
i!     executionPlan: type=CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR:
i!         engineConfig: type=CUDNN_BACKEND_ENGINECFG_DESCRIPTOR:
i!             engine: type=CUDNN_BACKEND_ENGINE_DESCRIPTOR:
i!                 globalIndex: type=int64_t; val=28;
i!         workspaceSize: type=int64_t; val=1048576;
i! Time: 2025-11-14T23:49:41.802901 (0d+0h+1m+39s since start)
i! Process=3600; Thread=10156; GPU=0; Handle=0x5555; StreamId=0x0.
"""
"""Synthetic blocks in the v9 layout (header ``(v91200 46)``, nested descriptor fields, ``[0]`` elements, as in the
v9.12 log of pytorch/pytorch#167242); the field names inside the execution plan are the parser's generic reading."""


def test_the_parser_reads_the_v9_block_layout() -> None:
    df = parse_log(V9_BLOCKS, "case")
    assert list(df["api"]) == ["cudnnBackendSetAttribute", "cudnnBackendExecute"]
    assert list(df["algo"]) == ["engine 28", "engine 28"] and list(df["cudnn_version"]) == [91200, 91200]
    assert pd.isna(df["workspace_bytes"].iloc[0]) and df["workspace_bytes"].iloc[1] == 1048576


# ---- the NVML sampler ------------------------------------------------------------------------------------------------
def _fake_nvml(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, gpus: list[dict]) -> types.ModuleType:
    import importlib.util

    cfg = tmp_path / "nvml.json"
    cfg.write_text(json.dumps({"gpus": gpus}))
    monkeypatch.setenv("FAKE_NVML_CONFIG", str(cfg))
    spec = importlib.util.spec_from_file_location("pynvml", SITE / "pynvml.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    return mod


def test_the_sampler_thread_keeps_the_process_peak(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """nvmlDeviceGetComputeRunningProcesses' usedGpuMemory of this PID, polled by a thread while it grows and
    shrinks; the device's used memory too."""
    import time

    from uvmlab.measure.gpu.kit.nvml_peak import open_sampler

    used = tmp_path / "used"

    def set_used(n: int) -> None:  # atomically: the sampler thread reads the file meanwhile
        (tmp_path / "used.tmp").write_text(str(n))
        os.replace(tmp_path / "used.tmp", used)

    set_used(100 * MiB)
    gpu = {"name": "G", "uuid": "GPU-1", "bus_id": "0", "total": 8 * GiB, "used": 0,
           "processes": [{"pid": os.getpid(), "used_file": str(used)}, {"pid": 1, "used": 5 * MiB}]}  # fmt: skip
    _fake_nvml(monkeypatch, tmp_path, [gpu])
    sampler = open_sampler("1", os.getpid(), used_before_bytes=7 * MiB, interval_s=0.001)  # torch prints no prefix
    assert sampler is not None
    for mib in (300, 900, 200):
        set_used(mib * MiB)
        time.sleep(0.05)
    r = sampler.stop()
    assert r["nvml_process_peak_bytes"] == 900 * MiB and r["nvml_used_peak_bytes"] == 905 * MiB
    assert r["nvml_used_before_bytes"] == 7 * MiB and r["nvml_source"] == "process" and r["nvml_samples"] > 3
    other = {**gpu, "processes": [{"pid": 1, "used": 5 * MiB}]}  # in a container NVML lists host PIDs
    _fake_nvml(monkeypatch, tmp_path, [other])
    s2 = open_sampler("GPU-1", os.getpid(), interval_s=0.001)
    assert s2 is not None and s2.stop()["nvml_source"] == "device used - used before"


# ---- end to end against the stub runtime ---------------------------------------------------------------------------
_STAND_IN = """#!{python}
# Stands in for `python` on this machine without a GPU (module docstring of tests/test_gpu_collect.py): the memory and
# cuDNN steps are played here (they need torch on CUDA); the GCN step runs its real code on the CPU and the probe
# step its real code against the stub runtime (--device cpu --cudart); every other step (facts, streams, link)
# runs its real code with this interpreter's own environment. FAKE_HANG_CASE names a memory case that hangs.
import ctypes, json, os, sys, time
from pathlib import Path
python, args = {python!r}, sys.argv[1:]
if args[:2] == ["-m", "uvmlab.measure.gpu.kit.gcn"]:
    os.execv(python, [python, *args, "--device", "cpu", "--cudart", {cudart!r}])
if args[:2] == ["-m", "uvmlab.measure.gpu.kit.probe_step"]:
    os.environ["LD_PRELOAD"] = os.environ["LD_PRELOAD"] + ":" + {cudart99!r}
    os.execv(python, [python, *args, "--device", "cpu", "--cudart", {cudart99!r}])
if args[:2] != ["-m", "uvmlab.measure.gpu.kit.memory_step"]:
    os.execv(python, [python, *args])
from uvmlab.files.atomic import atomic_write_json
from uvmlab.measure.gpu.kit.layout import RUN_COLUMNS, WORKSPACE_COLUMNS
from uvmlab.measure.gpu.kit.memory_step import workspace_rows
from uvmlab.trace.snapshot import write_snapshot
import pandas as pd
out, case = Path(args[2]), json.loads(args[args.index("--case") + 1])
stacks = args[args.index("--snapshot") + 1]
if case["name"] == os.environ.get("FAKE_HANG_CASE") and "/memory/" in args[2]:
    (out / "half-written").write_text("a step killed at its cap leaves this behind")
    time.sleep(600)
out.mkdir(parents=True, exist_ok=True)
lib = ctypes.CDLL({cudart!r})
MiB = 1 << 20
seg = ctypes.c_void_p()
assert lib.cudaMalloc(ctypes.byref(seg), ctypes.c_size_t(20 * MiB)) == 0  # the caching allocator's large segment
base = seg.value
frames = [{{"name": "at::native::run_conv_plan", "filename": "Conv_v8.cpp", "line": 1}}] if stacks == "all" else []
trace = [
    {{"action": "segment_alloc", "addr": base, "size": 20 * MiB, "stream": 0, "time_us": 1}},
    {{"action": "alloc", "addr": base, "size": 3 * MiB, "stream": 0, "time_us": 2}},
    {{"action": "alloc", "addr": base + 3 * MiB, "size": 5 * MiB, "stream": 0, "time_us": 3, "frames": frames}},
    {{"action": "free_requested", "addr": base + 3 * MiB, "size": 5 * MiB, "stream": 0, "time_us": 4}},
    {{"action": "free_completed", "addr": base + 3 * MiB, "size": 5 * MiB, "stream": 0, "time_us": 5}},
]
blocks = [{{"address": base, "size": 3 * MiB, "requested_size": 3 * MiB, "state": "active_allocated"}},
          {{"address": base + 3 * MiB, "size": 17 * MiB, "requested_size": 0, "state": "inactive"}}]
segments = [{{"device": 0, "address": base, "total_size": 20 * MiB, "stream": 0, "segment_type": "large",
              "blocks": blocks}}]
write_snapshot(out / "snapshot.pickle", segments, [trace])
if stacks == "all":
    rows = workspace_rows({{"device_traces": [trace]}}, case["name"])
    pd.DataFrame(rows, columns=list(WORKSPACE_COLUMNS)).to_csv(out / "workspaces.csv", index=False)
log = os.environ.get("CUDNN_LOGDEST_DBG")
if log:
    Path(log).write_text(
        "I! CuDNN (v90100) function cudnnConvolutionForward() called:\\n"
        "i!     algo: type=cudnnConvolutionFwdAlgo_t; val=CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM (1);\\n"
        "i!     workSpaceSizeInBytes: type=size_t; val=5242880;\\n"
        "i! Time: 2026-01-01T00:00:00.000000 (0d+0h+0m+1s since start)\\n"
        "i! Process=1; Thread=1; GPU=0; Handle=0x1; StreamId=0x0.\\n")
free, total = ctypes.c_size_t(), ctypes.c_size_t()
lib.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total))
rec = dict.fromkeys(RUN_COLUMNS)
rec.update(case=case["name"], workload=case["workload"], batch_size=case["batch_size"], optimizer=case["optimizer"],
           cudnn_benchmark=case["cudnn_benchmark"], options=json.dumps(case["options"], sort_keys=True),
           iterations=case["iterations"], outcome="ok", max_memory_reserved_bytes=20 * MiB,
           max_memory_allocated_bytes=8 * MiB, nvml_process_peak_bytes=total.value - free.value,
           nvml_source="process", snapshot="snapshot.pickle", gpu_name="NVIDIA A100 80GB PCIe",
           gpu_total_bytes=total.value, torch="stand-in", cuda="13.0", cudnn=90100)
atomic_write_json(out / "case.json", rec)
"""


@pytest.fixture(scope="module")
def stub_cudart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("cudart")
    # a second copy under its own soname, for the probe step: preloaded after the shim it serves the shim's real
    # calls while torch's own libcudart.so.13 stays torch's (tests/cuda_stub.py)
    build_cudart(d, "libcudart.so.99")
    return build_cudart(d)


def _kit_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, total: int, free: int, cupy_free: int) -> None:
    for k in [k for k in os.environ if k.startswith(("UVMLAB_", "FAKE_CUDART", "FAKE_CUPY", "CUDA_VISIBLE"))]:
        if k != "UVMLAB_CACHE":
            monkeypatch.delenv(k)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(SITE), str(REPO), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("FAKE_CUPY_FREE_BYTES", str(cupy_free))
    monkeypatch.setenv("FAKE_CUPY_TOTAL_BYTES", str(total))
    monkeypatch.setenv("FAKE_CUPY_LOG", str(tmp_path / "cupy.log"))
    monkeypatch.setenv("FAKE_CUDART_TOTAL_BYTES", str(total))
    monkeypatch.setenv("FAKE_CUDART_CONTEXT_BYTES", str(total - free))
    monkeypatch.setenv("FAKE_CUDART_PAGEABLE_ACCESS", "1")  # CuPy's managed buffers: its own static runtime's
    monkeypatch.setenv("FAKE_CUDART_LOG", str(tmp_path / "cudart.log"))


def test_the_kit_runs_end_to_end_against_the_stub_stops_a_step_at_its_cap_and_resumes(
    stub_cudart: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 43 blocker 2 and 3, end to end against the stub runtime on a small card. Every step is a child process
    with the step environment of a GPU run (the stand-in plays only the memory and cuDNN steps). One memory step
    hangs: it is killed at its cap, the data sets of the finished steps are written and valid (``uvmlab validate``
    passes on them), nothing of the killed step replaces anything; ``--resume`` then runs only that step. Every
    managed allocation stays under the measured free memory minus the margin (uvmlab.measure.gpu.kit.sizing)."""
    pytest.importorskip("torch")
    from uvmlab.measure.gpu.kit.runner import collect_evidence
    from uvmlab.measure.gpu.kit.sizing import managed_limit
    from uvmlab.validate.scorecard import validate

    total, free, cupy_free = 12 * GiB, 8 * GiB, 2560 * MiB  # CuPy (its own runtime) sees 2.5 GiB free
    gpu = {"name": "NVIDIA A100 80GB PCIe", "uuid": "GPU-00000000-0000-0000-0000-00000000000a",
           "bus_id": "00000000:01:00.0", "total": total, "used": total - free}  # fmt: skip
    nvml = _fake_nvml(monkeypatch, tmp_path, [gpu])
    _kit_env(monkeypatch, tmp_path, total, free, cupy_free)
    fake = tmp_path / "python"
    fake.write_text(
        _STAND_IN.format(python=sys.executable, cudart=str(stub_cudart), cudart99=str(stub_cudart.with_suffix(".99")))
    )
    fake.chmod(0o755)
    status = GpuStatus(True, "", gpu["name"], total, "580.95.05", "13.0", 0, 1, free_bytes=free)
    cases = (
        MemoryCase("gpt2", 2, "sgd", False, 2, TINY_GPT2),
        MemoryCase("resnet50", 2, "sgd", False, 2, TINY_CNN),
    )
    opts = CollectOptions(
        what=("facts", "probe", "memory", "cudnn", "link", "uvm"),
        cases=cases,
        factors=(0.25,),  # 640 MiB of CuPy's 2.5 GiB free: above its managed limit of 512 MiB, so cut to it
        stream_iterations=2,
        kernels=("seq_stream",),
        gcn_chunk_edges=2_000,
        gcn_factors=(0.004,),  # of the stub's 8 GiB: 34 MB, 25 MB after the worst error: about a thousand nodes
        gcn_epochs=2,
        link_sizes=(2 * MiB, 8 * MiB),
        python=str(fake),
        nsys=False,
        cudart=str(stub_cudart),  # the link step's host prefetch loads it by path (CuPy has none loaded)
        budget_s=None,
        caps={"memory-resnet50_b2_sgd_bench-off": 10.0},  # the step that hangs
    )
    out = tmp_path / "kit"
    (out / "snapshots").mkdir(parents=True)
    (out / "snapshots" / "MANIFEST.tsv").write_text("file\tsource\nkeep.pickle\tsomeone else\n")
    hung = "memory-resnet50_b2_sgd_bench-off"
    monkeypatch.setenv("FAKE_HANG_CASE", "resnet50_b2_sgd_bench-off")
    done: list[str] = []
    rec = collect_evidence(opts, out, status=status, progress=lambda name, i, n: done.append(name))
    steps = {s["name"]: s for s in rec["steps"]}
    assert rec["failed_steps"] == [hung], [(n, s["error"]) for n, s in steps.items() if s["status"] != "done"]
    assert steps[hung]["status"] == "killed at its cap" and steps[hung]["rc"] == 124
    assert 10 <= steps[hung]["seconds"] < 40 and rec["complete"] is True
    assert done == [s["name"] for s in rec["plan"]["steps"]] and len(done) == 1 + 1 + 2 + 1 + 1 + 1 + 2
    assert not (out / "raw" / "memory" / "resnet50_b2_sgd_bench-off").exists()  # the killed step replaced nothing
    assert (out / "raw" / "memory" / "resnet50_b2_sgd_bench-off.partial" / "half-written").is_file()
    assert all(v["valid"] for v in rec["sets"].values()), rec["sets"]
    runs = pd.read_csv(out / L.MEMORY_DIR / "runs.csv")
    assert list(runs["case"]) == ["gpt2_b2_sgd_bench-off"]  # the finished case only
    assert rec["runtime"] in ("gvisor", "firecracker", "vm", "none detected")
    assert json.loads((out / L.LINK_DIR / "meta.json").read_text())["runtime"] == rec["runtime"]
    assert rec["facts"]["doctor"]["checks"] and rec["facts"]["machine"]["kernel_release"]
    probe = rec["probe"]
    assert probe["balloon"]["cuda_result"] == 0 and probe["balloon"]["free_after"] == probe["balloon"]["leave_bytes"]
    res = probe["residency"]
    assert res["resident_lowers_free"] == res["size_bytes"] and res["free_after_free"] == res["free_untouched"]
    assert all(c["agrees"] for c in probe["codes"].values())  # the stub agrees with itself: the wiring works
    card = validate(out)
    applicable = {"snapshots-replay", "collect-memory", "collect-cudnn", "collect-uvm", "collect-link"}
    assert applicable <= set(card.ran) and not card.errors, card.errors

    # resume: only the killed step runs; the finished ones are kept as they were
    first_link = (out / L.LINK_DIR / "timings.csv").read_bytes()
    monkeypatch.delenv("FAKE_HANG_CASE")
    rec2 = collect_evidence(replace(opts, resume=True), out, status=status)
    steps2 = {s["name"]: s for s in rec2["steps"]}
    assert rec2["failed_steps"] == [] and steps2[hung]["status"] == "done"
    assert all("resumed" in s for n, s in steps2.items() if n != hung)
    assert (out / L.LINK_DIR / "timings.csv").read_bytes() == first_link
    runs = pd.read_csv(out / L.MEMORY_DIR / "runs.csv")
    assert sorted(runs["case"]) == ["gpt2_b2_sgd_bench-off", "resnet50_b2_sgd_bench-off"]
    manifest = pd.read_csv(out / "snapshots" / "MANIFEST.tsv", sep="\t")
    assert manifest["file"].tolist()[0] == "keep.pickle" and len(manifest) == 3
    streams = pd.read_csv(out / L.UVM_DIR / "streams.csv")
    uvm_rows = streams[streams["mode"] == "uvm"]
    assert set(uvm_rows["limited_by_margin"]) == {True} and streams["cold_ms"].notna().all()
    assert (uvm_rows["working_set_bytes"] <= managed_limit(cupy_free)).all()  # device rows: cudaMalloc, not managed
    gcn = sorted((out / L.UVM_DIR / "gcn" / "uvm").glob("*.json"))
    assert len(gcn) == 1 and json.loads(gcn[0].read_text())["sizing"]["managed_limit_bytes"] == managed_limit(free)
    assert all(v["valid"] for v in rec2["sets"].values()), rec2["sets"]

    # blocker 3: no managed allocation above the free memory measured before it, minus the margin
    cupy_log = (tmp_path / "cupy.log").read_text().split("\n")
    for line in filter(None, cupy_log):
        size, free_now = int(line.split()[1]), int(line.split("free=")[1])
        assert size <= managed_limit(free_now), line
    free_seen = free
    for line in (tmp_path / "cudart.log").read_text().splitlines():
        if line.startswith("cudaMemGetInfo free="):
            free_seen = int(line.split("free=")[1].split()[0])
        elif line.startswith("cudaMallocManaged") and line.endswith("-> 0"):
            size = int(line.split("size=")[1].split()[0])
            assert size <= managed_limit(free_seen) or size <= 2 * MiB, line  # 2 MiB: the probe's code checks
    assert nvml  # the fake NVML answered the steps' gpu_status


def test_the_run_step_refuses_a_job_that_could_exceed_the_free_memory() -> None:
    """Blocker 3 for the end-to-end run step: its calibration holds the job's footprint as managed memory with no
    balloon, so the estimate inflated by the worst known error must fit the managed limit."""
    from uvmlab.measure.gpu.kit.run_step import check_fits

    ok = check_fits(10 * GiB, 0.75, 139 * GiB, 128 * MiB)
    assert ok["estimate_inflated_bytes"] == int(10 * GiB / 0.744) + 1
    assert ok["managed_limit_bytes"] == 139 * GiB - int(0.1 * 139 * GiB)
    with pytest.raises(InputError, match="could need more than"):
        check_fits(10 * GiB, 0.75, 14 * GiB, 128 * MiB)  # 13.4 GiB after the worst error > the 11.6 GiB limit


def test_a_collected_folder_needs_resume_or_force_and_keeps_other_files(tmp_path: Path) -> None:
    from uvmlab.measure.gpu.kit.runner import check_out

    out = tmp_path / "kit"
    (out / L.MEMORY_DIR).mkdir(parents=True)
    (out / "mine.txt").write_text("not the kit's")
    with pytest.raises(InputError, match=r"--force .* or --resume"):
        check_out(out, force=False)
    check_out(out, force=True)
    check_out(out, force=False, resume=True)
    assert (out / "mine.txt").read_text() == "not the kit's"
    with pytest.raises(InputError, match="not both"):
        CollectOptions(resume=True, force=True)


# ---- the steps' own code, in this process (CPU) ------------------------------------------------------------------
def test_the_memory_step_runs_its_loop_on_the_cpu_and_leaves_cuda_values_unknown(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from uvmlab.measure.gpu.kit.memory_step import run_case

    case = json.loads(MemoryCase("gpt2", 2, "adam", False, 2, TINY_GPT2).to_json())
    rec = run_case(tmp_path / "c", case, snapshot="python", device="cpu")
    assert rec["outcome"] == "ok" and rec["case"] == "gpt2_b2_adam_bench-off" and rec["iterations"] == 2
    assert rec["max_memory_reserved_bytes"] is None and rec["nvml_source"] == "none"  # not measured, never 0
    assert set(L.RUN_COLUMNS) <= set(json.loads((tmp_path / "c" / "case.json").read_text()))


def test_workspace_rows_are_the_allocations_under_cudnn_calls() -> None:
    from uvmlab.measure.gpu.kit.memory_step import workspace_rows

    conv = [{"name": "at::native::run_conv_plan(...)", "filename": "Conv_v8.cpp", "line": 10}]
    gemm = [{"name": "at::cuda::blas::gemm", "filename": "CUDABlas.cpp", "line": 5}]
    trace = [
        {"action": "alloc", "size": 5 * MiB, "frames": conv},
        {"action": "alloc", "size": 7 * MiB, "frames": gemm},
        {"action": "free_requested", "size": 5 * MiB, "frames": conv},
    ]
    assert workspace_rows({"device_traces": [trace]}, "c") == [
        {"case": "c", "index": 0, "size_bytes": 5 * MiB, "frame": "at::native::run_conv_plan(...)"}
    ]


def test_the_gcn_step_trains_on_the_cpu() -> None:
    pytest.importorskip("torch")
    from uvmlab.measure.gpu.kit.gcn import run_gcn

    doc = run_gcn(2_000, epochs=2, chunk_edges=5_000, device="cpu")
    assert doc["nodes"] == 2_000 and len(doc["epoch_times_s"]) == 2 and doc["avg_epoch_time_s"] > 0
    assert doc["avg_epoch_time_s"] == doc["epoch_times_s"][1]  # epoch 0 is the warm-up


def test_the_stream_chunks_are_uvmbench_s() -> None:
    """63 / 79 / 95 pages per thread at 1.0x / 1.25x / 1.5x of the RTX 5090's 33,669,316,608 B (docs/uvm-sim.md)."""
    from uvmlab.measure.gpu.kit.uvm_step import PAGE_ELEMS, chunk_elems

    total = 33_669_316_608
    assert [chunk_elems(int(f * total) // 2 // 4) // PAGE_ELEMS for f in (1.0, 1.25, 1.5)] == [63, 79, 95]


def test_gcn_footprint_is_affine_in_the_nodes_once_a_chunk_is_full() -> None:
    """gcn_nodes_for reads the node count off the line through two traces: a third trace lies on it (to 0.1 %),
    and the answer fits its target while 1,000 more nodes do not."""
    pytest.importorskip("torch")
    from uvmlab.measure.gpu.kit.plan import gcn_nodes_for, gcn_peak_bytes

    chunk = 21_000  # full from 1,000 nodes on
    n1 = 2_000
    p1, p2 = gcn_peak_bytes(n1, chunk), gcn_peak_bytes(2 * n1, chunk)
    line = p1 + (p2 - p1) / n1 * (9_000 - n1)
    assert gcn_peak_bytes(9_000, chunk) == pytest.approx(line, rel=1e-3)
    target = (gcn_peak_bytes(7_000, chunk) + gcn_peak_bytes(8_000, chunk)) // 2
    n = gcn_nodes_for(target, chunk)
    assert n == 7_000
    assert gcn_nodes_for(gcn_peak_bytes(1_000, chunk) - 1, chunk) is None


def test_a_stream_row_below_the_free_memory_times_its_cold_first_launch(tmp_path: Path) -> None:
    """Issue 43 defect 10: rows at <= 0.9 of the free memory timed only launches after two warm-ups, all pages
    resident: resident speed, nothing about UVM. The first launch (migration of the host-written input, first touch
    of the output) is now its own column, ``cold_ms``. The fake CuPy makes a first touch cost real time here."""
    code = """
import json
from uvmlab.measure.gpu.kit.uvm_step import measure
rows = measure((0.25,), ("seq_stream",), ("uvm", "device"), 3)
print(json.dumps([{k: r[k] for k in ("mode", "cold_ms", "median_ms")} for r in rows]))
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAKE_", "UVMLAB_"))}
    env.update(
        PYTHONPATH=os.pathsep.join([str(SITE), str(REPO), env.get("PYTHONPATH", "")]),
        FAKE_CUPY_FREE_BYTES=str(2048 * MiB + 160 * MiB),  # the managed limit: 160 MiB, two arrays of 80 MiB
        FAKE_CUPY_MIGRATE_BYTES_PER_S=str(1000 * MiB),  # 80 ms a first touch of an array
    )
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {r["mode"]: r for r in json.loads(proc.stdout)}
    assert rows["uvm"]["cold_ms"] > 120 > rows["uvm"]["median_ms"]  # two arrays migrate in the first launch only
    assert rows["device"]["cold_ms"] < 120  # device memory: no migration
