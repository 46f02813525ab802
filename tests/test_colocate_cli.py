"""End-to-end ``uvmlab colocate``: two small jobs that fit, and two that do not (with the UVM cost table)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from uvmlab.cli import main
from uvmlab.memory.devicemem import context_model
from uvmlab.units import MiB

GPT2 = "gpt2:2,n_layer=1,seq_len=64,n_embd=128,n_head=2,vocab_size=2000,n_positions=64"
RESNET = "resnet50:2,image_size=32,num_classes=10"
CONTEXT = {  # uvmlab estimate's rule: the modelled context, and a CNN's lazily loaded cuDNN modules on top
    GPT2: context_model("A100-80GB").total_bytes,
    RESNET: context_model("A100-80GB", convolutions=True).total_bytes,
}


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UVMLAB_CACHE", str(tmp_path_factory.getbasetemp() / "uvmlab-cache"))


def test_two_jobs_fit_on_an_a100(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["colocate", GPT2, RESNET, "--gpu", "A100-80GB", "-n", "2", "--format", "json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["fits"] is True and res["uvm"] is None
    peaks = {j["job"]: j["peak_reserved_bytes"] for j in res["jobs"]}
    assert peaks[RESNET] > peaks[GPT2] > 0  # ResNet-50's 25 M parameters + Adam state outweigh the tiny GPT-2
    assert {j["job"]: j["context_bytes"] for j in res["jobs"]} == CONTEXT
    margins = {j["job"]: j["model_margin_bytes"] for j in res["jobs"]}
    assert all(m > 0 for m in margins.values())  # each job's need is uvmlab estimate's required_mb
    assert res["need_bytes"] == sum(peaks.values()) + sum(CONTEXT.values()) + sum(margins.values()) + 2 * 2**30


def test_colocate_needs_what_estimate_says_carma_needs(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 42: estimate --format carma said 21,735 MiB for GPT-2 on 24 GiB where colocate said it needs 15.80 GiB,
    with another margin; now one rule: each job's need is estimate's required_mb, CARMA's 2 GiB comes on top once."""
    assert main(["colocate", GPT2, "-n", "2", "--format", "json"]) == 0
    job = json.loads(capsys.readouterr().out)["jobs"][0]
    args = ["gpt2", "-b", "2", *[a for kv in GPT2.split(",")[1:] for a in ("--option", kv)], "-n", "2"]
    assert main(["estimate", *args, "--format", "carma"]) == 0
    captured = capsys.readouterr()
    assert int(captured.out) == job["required_mb"] and "uvmlab colocate: the same rule per job" in captured.err


def test_colocate_and_estimate_give_one_context_per_job(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 29: estimate said 522 MiB of CUDA context and colocate 512 MiB for the same ResNet job."""
    assert main(["colocate", RESNET, "-n", "2", "--format", "json"]) == 0
    colocated = json.loads(capsys.readouterr().out)["jobs"][0]["context_bytes"]
    args = ["resnet50", "-b", "2", "--option", "image_size=32", "--option", "num_classes=10", "-n", "2"]
    assert main(["estimate", *args, "--format", "json"]) == 0
    estimated = json.loads(capsys.readouterr().out)["context_bytes"]
    assert colocated == estimated == 522 * MiB


def test_two_jobs_do_not_fit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # a GPU of the two CUDA contexts (429 + 522 MiB) + 6 MiB: 6 MiB for UVM. Alone (GPU memory - its own context)
    # each job's working set fits; together they evict each other.
    memory = sum(CONTEXT.values()) + 6 * MiB
    out = tmp_path / "colo"
    args = ["colocate", GPT2, RESNET, "--gpu-memory", str(memory), "--margin", "0", "-n", "2", "-o", str(out)]
    assert main([*args, "--format", "json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["fits"] is False
    assert res["need_bytes"] > memory and res["uvm_capacity_bytes"] == 6 * MiB
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
