"""Fragmentation characterization (STWeaver definitions) on synthetic traces, real snapshots and a workload."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from eval_helpers import make_trace

from uvmlab.cli import main
from uvmlab.evaluate.fragmentation import characterize

SNAP = "HugePandaCoder__octree-nca-groupeq__752276c1__my_snapshot.pickle"
TINY_GPT2 = [
    "--option",
    "n_layer=1",
    "--option",
    "seq_len=32",
    "--option",
    "n_embd=64",
    "--option",
    "n_head=2",
    "--option",
    "vocab_size=1000",
    "--option",
    "n_positions=32",
]


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UVMLAB_CACHE", str(tmp_path_factory.getbasetemp() / "uvmlab-cache"))


def test_definitions_on_a_synthetic_trace() -> None:
    # 3 MiB then 1 MiB live together (peak live 4 MiB), then freed; then 2 MiB alone
    trace = make_trace([(3 * 2**20, 2), (2**20, 1), (2 * 2**20, 0)])
    frag = characterize(trace, name="t")
    lb = frag.row("lower-bound")
    planned = frag.row("planned")
    assert lb["peak_reserved_bytes"] == 4 * 2**20 and lb["efficiency"] == 1.0
    assert planned["peak_reserved_bytes"] >= lb["peak_reserved_bytes"]
    assert planned["efficiency"] == pytest.approx(lb["peak_reserved_bytes"] / planned["peak_reserved_bytes"])
    assert planned["fragmentation_ratio"] == pytest.approx(1 - planned["efficiency"])
    pca = frag.row("pca")
    assert pca is not None and pca["peak_reserved_bytes"] >= lb["peak_reserved_bytes"]
    # timeline: live bytes never exceed either allocator's reserved bytes
    tl = frag.timeline
    assert (tl["live_bytes"] <= tl["planned_reserved_bytes"]).all()
    assert (tl["live_bytes"] <= tl["pca_reserved_bytes"]).all()


def test_snapshot_cli(real_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "frag"
    code = main(["fragmentation", str(real_data / "snapshots" / SNAP), "-o", str(out), "--format", "json"])
    assert code == 0
    payload = json.loads(capsys.readouterr().out)
    rows = {r["allocator"]: r for r in payload["allocators"]}
    assert rows["pca-recorded"]["peak_reserved_bytes"] == 9196011520  # MANIFEST.tsv
    assert rows["pca"]["peak_reserved_bytes"] == 9196011520  # the simulator replays this trace exactly
    assert rows["lower-bound"]["peak_reserved_bytes"] <= rows["planned"]["peak_reserved_bytes"]
    assert rows["planned"]["peak_reserved_bytes"] < rows["pca"]["peak_reserved_bytes"]
    assert 0 < payload["fragmentation_reduction"] <= 1
    assert (out / "figures" / "fragmentation.png").stat().st_size > 1000
    result = json.loads((out / "result.json").read_text())
    assert result["allocators"]["planned"]["efficiency"] == pytest.approx(rows["planned"]["efficiency"])


def test_workload_cli(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["fragmentation", "gpt2", "-b", "2", "-n", "2", *TINY_GPT2, "--format", "json"])
    assert code == 0
    rows = {r["allocator"]: r for r in json.loads(capsys.readouterr().out)["allocators"]}
    assert set(rows) == {"pca", "planned", "lower-bound"}
    assert rows["lower-bound"]["peak_reserved_bytes"] <= rows["planned"]["peak_reserved_bytes"]
    assert not math.isnan(rows["pca"]["efficiency"])


def test_broken_inputs_exit_2(real_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.pickle"
    bad.write_bytes((real_data / "snapshots" / SNAP).read_bytes()[:64])
    assert main(["fragmentation", str(bad)]) == 2
    assert main(["fragmentation", "no-such-workload"]) == 2
    assert main(["fragmentation", str(real_data / "snapshots" / SNAP), "--device", "7"]) == 2
    assert "Traceback" not in capsys.readouterr().err
