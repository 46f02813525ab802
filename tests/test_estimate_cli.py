"""``uvmlab estimate`` end to end on small real captures (tiny GPT-2 and ResNet-50 configs): formats, run
directory, snapshot export, errors with exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from uvmlab.cli import main
from uvmlab.trace.snapshot import read_snapshot

_GPT2_OPTS = ("n_layer=1", "seq_len=32", "n_embd=64", "n_head=2", "vocab_size=512", "n_positions=64")
TINY_GPT2 = ["gpt2", "-b", "2", "-n", "2"] + [x for o in _GPT2_OPTS for x in ("--option", o)]
TINY_RESNET = ["resnet50", "-b", "2", "-n", "2", "--option", "image_size=32", "--option", "num_classes=10"]


pytestmark = pytest.mark.usefixtures("module_trace_cache")


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_json_carma_table_agree(capsys: pytest.CaptureFixture[str]) -> None:
    data = _json(capsys, ["estimate", *TINY_GPT2, "--format", "json"])
    assert data["fits"] and data["peak_reserved_bytes"] >= data["peak_allocated_bytes"] >= data["peak_live_bytes"] > 0
    assert data["workspace_bytes"]["cublas"] == 8_519_680
    assert data["orchestration_changes"]["cublas_workspace"] == 1
    assert data["required_bytes"] == data["peak_reserved_bytes"] + data["context_bytes"] + data["margin_bytes"]
    assert main(["estimate", *TINY_GPT2, "--format", "carma"]) == 0
    captured = capsys.readouterr()
    assert captured.out == f"{data['required_mb']}\n"
    assert "margin" in captured.err and "CARMA adds its own 2048 MiB" in captured.err
    assert main(["estimate", *TINY_GPT2]) == 0
    assert "fits" in capsys.readouterr().out
    h100 = _json(capsys, ["estimate", *TINY_GPT2, "--gpu", "H100-80GB", "--format", "json", "--margin-mb", "0"])
    assert h100["workspace_bytes"]["cublas"] == 32 * 1024 * 1024 and h100["margin_bytes"] == 0


def test_nocache_and_oom(capsys: pytest.CaptureFixture[str]) -> None:
    pca = _json(capsys, ["estimate", *TINY_GPT2, "--format", "json"])
    nocache = _json(capsys, ["estimate", *TINY_GPT2, "--format", "json", "--allocator", "nocache"])
    assert nocache["peak_reserved_bytes"] <= pca["peak_reserved_bytes"]
    eager = _json(capsys, ["estimate", *TINY_GPT2, "--format", "json", "--module-loading", "eager"])
    assert eager["context_bytes"] > pca["context_bytes"]  # eager modules count in the context
    assert eager["device_peak_bytes"] - pca["device_peak_bytes"] == eager["context_bytes"] - pca["context_bytes"]
    tight = eager["context_bytes"] + pca["peak_allocated_bytes"] // 2  # above the GpuSpec's 512 MiB floor
    small = _json(capsys, ["estimate", *TINY_GPT2, "--format", "json", "--gpu-memory", str(tight),
                           "--module-loading", "eager"])  # fmt: skip
    assert small["oom"] and small["oom_phase"] in ("setup", "data", "forward", "backward", "optimizer")


def test_run_directory_and_snapshot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    snap = tmp_path / "est.pickle"
    assert main(["estimate", *TINY_GPT2, "-o", str(out), "--snapshot", str(snap), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert json.loads((out / "result.json").read_text()) == data
    assert (out / "figures" / "memory_curve.png").read_bytes()[:4] == b"\x89PNG"
    tl = pd.read_parquet(out / "tables" / "memory_timeline.parquet")
    assert tl["reserved_bytes"].max() == data["peak_reserved_bytes"]
    s = read_snapshot(snap)
    assert s.summary()[0]["peak_reserved_in_trace_bytes"] == data["peak_reserved_bytes"]
    n_alloc = int((s.events["action"] == "alloc").sum())  # 0-byte tensors never reach the allocator
    assert 0.9 * data["trace_allocations"] <= n_alloc <= data["trace_allocations"] < data["trace_events"]
    assert main(["estimate", *TINY_GPT2, "-o", str(out)]) == 2  # complete run, no --force
    assert "--force" in capsys.readouterr().err


def test_resnet_gets_cudnn_workspaces(capsys: pytest.CaptureFixture[str]) -> None:
    data = _json(capsys, ["estimate", *TINY_RESNET, "--format", "json"])
    assert data["orchestration_changes"]["cudnn_workspace"] > 0
    off = _json(capsys, ["estimate", *TINY_RESNET, "--format", "json", "--allocator", "nocache"])
    assert off["peak_reserved_bytes"] > 0


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["estimate", "nosuchmodel"], "unknown workload"),
        (["estimate", *TINY_GPT2, "--alloc-conf", "max_split_size_mb:banana"], "max_split_size_mb"),
        (["estimate", *TINY_GPT2, "--gpu", "Z80"], "unknown GPU"),
        (["estimate", *TINY_GPT2, "--gpu-memory", "100MiB"], "context"),
    ],
)
def test_bad_input_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str], expected: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("uvmlab: error:")]
    assert len(errors) == 1 and expected in errors[0] and "Traceback" not in err


@pytest.mark.parametrize("name", ["torchvision:nope", "hf:nope"])
def test_unknown_model_is_exactly_one_line_on_stderr(capsys: pytest.CaptureFixture[str], name: str) -> None:
    """The error raised inside the progress bar is the only output: no blank line before it when stderr is not a
    terminal (a CI log, a pipe)."""
    assert main(["estimate", name]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("uvmlab: error: "), captured.err


def test_workspace_range_covers_every_model_only_when_cudnn_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """--cudnn-workspace-range: one device peak per workspace model for a CNN, a single figure without cuDNN."""
    from uvmlab.trace.cudnn_conv import WORKSPACE_MODELS

    plain = _json(capsys, ["estimate", *TINY_RESNET, "--format", "json"])
    assert plain["cudnn_workspace_range"] is None
    data = _json(capsys, ["estimate", *TINY_RESNET, "--format", "json", "--cudnn-workspace-range"])
    rng = data["cudnn_workspace_range"]
    assert sorted(rng["device_peak_bytes"]) == sorted(WORKSPACE_MODELS)
    assert rng["device_peak_bytes"]["envelope"] == data["device_peak_bytes"] == plain["device_peak_bytes"]
    assert rng["min_bytes"] == min(rng["device_peak_bytes"].values()) <= data["device_peak_bytes"] <= rng["max_bytes"]
    assert rng["max_bytes"] > rng["min_bytes"]  # the models differ on a real CNN
    fft = _json(capsys, ["estimate", *TINY_RESNET, "--format", "json", "--cudnn-workspace-model", "fft"])
    assert rng["device_peak_bytes"]["fft"] == fft["device_peak_bytes"]
    gpt2 = _json(capsys, ["estimate", *TINY_GPT2, "--format", "json", "--cudnn-workspace-range"])
    assert gpt2["cudnn_workspace_range"]["device_peak_bytes"] == {"envelope": gpt2["device_peak_bytes"]}
    assert main(["estimate", *TINY_RESNET, "--cudnn-workspace-range"]) == 0
    assert "over cuDNN workspace models" in capsys.readouterr().out
    assert main(["estimate", *TINY_RESNET]) == 0
    assert "--cudnn-workspace-range" in capsys.readouterr().out  # the table points a CNN's user to the option
    assert main(["estimate", *TINY_GPT2]) == 0
    assert "--cudnn-workspace-range" not in capsys.readouterr().out
