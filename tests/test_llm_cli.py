"""The fine-tuning options through the CLI (a user's config.json): LoRA, data-parallel layouts and their refusals
(one sentence, exit 2), on estimate, run and advise."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from llm_tiny import tiny_config


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_config(tmp_path_factory.mktemp("cli"), "qwen2")


def _uvmlab(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "uvmlab", *args], capture_output=True, text=True, check=False)


def test_estimate_lora_fsdp2_json(model: Path) -> None:
    """estimate --lora --shard fsdp2 --world-size 8: the JSON names the communication buffers at the peak."""
    out = _uvmlab("estimate", f"hf:{model}", "-b", "2", "--seq-len", "64", "-n", "2", "--lora", "4",
                  "--shard", "fsdp2", "--world-size", "8", "--format", "json")  # fmt: skip
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["config"]["shard"] == "fsdp2" and d["config"]["world_size"] == 8 and d["config"]["lora_rank"] == 4
    assert "communication" in d["live_at_allocated_peak_bytes"]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--world-size", "4"], "--shard"),
        (["--qlora"], "--lora R"),
        (["--shard", "zero2", "--shard-option", "bucket_cap_mb=2"], "applies to"),
        (["--shard", "zero2", "--shard-option", "nonsense=1"], "unknown --shard-option"),
        (["--sdpa-backend", "flash"], "flash"),
    ],
)
def test_estimate_refusals(model: Path, args: list[str], words: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Bad combinations are one sentence and exit 2 (flash attention refuses fp32), in-process."""
    from uvmlab.cli import main

    assert main(["estimate", f"hf:{model}", "-b", "1", "--seq-len", "32", "-n", "1", *args]) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) <= 2


def test_run_gpu_mode_refuses_a_rank(model: Path, tmp_path: Path) -> None:
    """uvmlab run --mode gpu cannot run one rank of a multi-rank job: one sentence, exit 2; --mode sim runs it."""
    out = _uvmlab("run", f"hf:{model}", "-b", "1", "--seq-len", "32", "-n", "2", "--shard", "ddp", "--world-size",
                  "2", "--mode", "gpu", "-o", str(tmp_path / "g"))  # fmt: skip
    assert out.returncode == 2 and "--mode sim" in out.stderr and "Traceback" not in out.stderr
    out = _uvmlab("run", f"hf:{model}", "-b", "1", "--seq-len", "32", "-n", "2", "--shard", "zero3", "--world-size",
                  "8", "--mode", "sim", "--oversub", "1.5", "-o", str(tmp_path / "s"), "--format", "json")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["footprint_bytes"] > 0
    assert json.loads((tmp_path / "s" / "config.json").read_text())["run"]["workload"]["shard"] == "zero3"
