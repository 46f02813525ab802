"""End-to-end ``uvmlab colocate``: two small jobs that fit, and two that do not (with the UVM cost table)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from uvmlab.cli import main

GPT2 = "gpt2:2,n_layer=1,seq_len=64,n_embd=128,n_head=2,vocab_size=2000,n_positions=64"
RESNET = "resnet50:2,image_size=32,num_classes=10"


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UVMLAB_CACHE", str(tmp_path_factory.getbasetemp() / "uvmlab-cache"))


def test_two_jobs_fit_on_an_a100(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["colocate", GPT2, RESNET, "--gpu", "A100-80GB", "-n", "2", "--format", "json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["fits"] is True and res["uvm"] is None
    peaks = {j["job"]: j["peak_reserved_bytes"] for j in res["jobs"]}
    assert peaks[RESNET] > peaks[GPT2] > 0  # ResNet-50's 25 M parameters + Adam state outweigh the tiny GPT-2
    assert res["need_bytes"] == sum(peaks.values()) + 2 * 512 * 2**20 + 2 * 2**30


def test_two_jobs_do_not_fit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # a 1030 MiB GPU: two 512 MiB CUDA contexts leave 6 MiB for UVM. Alone (1030 - 512 MiB) each job's working
    # set fits; together they evict each other.
    out = tmp_path / "colo"
    args = ["colocate", GPT2, RESNET, "--gpu-memory", "1030MiB", "--margin", "0", "-n", "2", "-o", str(out)]
    assert main([*args, "--format", "json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["fits"] is False
    assert res["need_bytes"] > 1030 * 2**20 and res["uvm_capacity_bytes"] == 6 * 2**20
    uvm = {r["job"]: r for r in res["uvm"]}
    assert set(uvm) == {GPT2, RESNET}
    for r in uvm.values():
        assert r["fault_count"] > r["fault_count_alone"] > 0
        assert r["eviction_count"] > 0 and r["dtoh_bytes"] > 0
        assert r["slowdown"] > 1.0 and r["slowdown_vs_native"] >= r["slowdown"]
    assert (out / "tables" / "uvm.parquet").is_file() and (out / "result.json").is_file()
    # the table output names the verdict
    assert main([*args, "--force"]) == 0  # the first call wrote a complete result into -o
    assert "DO NOT FIT" in capsys.readouterr().out


def test_bad_job_and_gpu_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["colocate", "gpt2:2", "--gpu", "NoSuchGPU"]) == 2
    assert main(["colocate", "nosuchmodel:2"]) == 2
    assert main(["colocate", "gpt2:2,n_layer"]) == 2
    assert "Traceback" not in capsys.readouterr().err
