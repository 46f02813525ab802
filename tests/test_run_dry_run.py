"""`uvmlab run --mode gpu --dry-run` prints the plan on a machine without a GPU (and runs nothing)."""

from __future__ import annotations

import json

import pytest

from uvmlab.cli import main


@pytest.mark.parametrize("pca", ["on", "off"])
def test_gpu_dry_run_through_the_cli_without_a_gpu(tmp_path, capsys, pca: str) -> None:
    out = tmp_path / "run"
    argv = ["run", "alexnet", "-b", "8", "-n", "1", "--oversub", "4", "--pca", pca, "--mode", "gpu"]
    rc = main([*argv, "--dry-run", "--footprint", "2GiB", "-o", str(out), "--format", "json"])
    assert rc == 0
    plan = json.loads(capsys.readouterr().out)
    env = plan["steps"][-1]["env"]
    assert env["PYTORCH_CUDA_ALLOC_CONF"].startswith("backend:native,expandable_segments:False")
    assert ("PYTORCH_NO_CUDA_MEMORY_CACHING" in env) == (pca == "off")
    assert env["LD_PRELOAD"].endswith("libuvmlab_shim.so")
    assert plan["balloon"]["available_bytes"] == pytest.approx(2 * 2**30 / 4, rel=0.01)
    assert not out.exists(), "a dry run writes nothing"


def test_gpu_mode_without_gpu_is_one_sentence(capsys, monkeypatch) -> None:
    import uvmlab.run as run_mod
    from uvmlab.measure.gpu.detect import GpuStatus

    # report no GPU on every machine (on a GPU machine this command would otherwise really run)
    monkeypatch.setattr(run_mod, "gpu_availability", lambda: GpuStatus(False, "no CUDA device found"))
    rc = main(["run", "alexnet", "-b", "8", "-n", "1", "--oversub", "2", "--mode", "gpu"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert "--mode gpu needs a CUDA device" in err
