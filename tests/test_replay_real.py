"""Replays of every real snapshot in MANIFEST.tsv (../shared/real-data/snapshots) and the ``uvmlab replay`` CLI.

Every file with an alloc/free trace must replay identically: same address for every allocation, same
segment_alloc/free (map/unmap) sequence with the same addresses and sizes, same peak reserved and peak
requested bytes, and the same final blocks as the snapshot's segments. Files without a trace must be refused
with exit code 2.
"""

from __future__ import annotations

import csv
import json
import pickle
import shutil
from pathlib import Path

import pytest

from tests.conftest import real_data_dir
from uvmlab.cli import main
from uvmlab.errors import InputError
from uvmlab.memory.replay import replay_snapshot

SNAPDIR = real_data_dir() / "snapshots"


def _manifest() -> list[tuple[str, str]]:
    path = SNAPDIR / "MANIFEST.tsv"
    if not path.is_file():
        return []
    with path.open() as fh:
        return [(r["file"], r["replay_check"]) for r in csv.DictReader(fh, delimiter="\t")]


MANIFEST = _manifest()
NO_TRACE = {
    f for f, _ in MANIFEST if f.startswith(("Yiyi-philosophy", "Muduard", "jogregoire", "LfieLike"))
}  # state-only snapshots (real-data README group D)


@pytest.mark.parametrize("name", [f for f, _ in MANIFEST] or ["<no manifest>"])
def test_real_snapshot_replays_identically(real_data: Path, name: str) -> None:
    path = real_data / "snapshots" / name
    if not path.is_file():
        pytest.skip(f"{name} not present")
    if name in NO_TRACE:
        with pytest.raises(InputError, match="no alloc/free trace"):
            replay_snapshot(path)
        return
    report = replay_snapshot(path)
    assert report.devices
    for d in report.devices:
        assert d.allocs_matched == d.allocs, d.first_divergence
        assert d.segment_sequence_equal, d.first_divergence
        assert d.peak_reserved_sim == d.peak_reserved_real
        assert d.peak_requested_sim == d.peak_requested_real
        assert d.final_blocks_equal, d.notes
        assert d.final_reserved_sim == d.final_reserved_real
        assert d.final_allocated_sim == d.final_allocated_real
        assert d.identical and d.first_divergence is None


def test_expandable_oom_is_decided_by_the_simulator(real_data: Path) -> None:
    """Constructor-Sun device 1: with the capacity PyTorch had at the real OOM (reserved + device_free), the
    simulator's own OOM path unmaps the same 6 page ranges and then fails the same request."""
    path = real_data / "snapshots" / "Constructor-Sun__code_location__52e52b22__memory_snapshot.pickle"
    if not path.is_file():
        pytest.skip("Constructor-Sun snapshot not present")
    dev1 = next(d for d in replay_snapshot(path, device=1).devices)
    assert dev1.capacity_bytes is not None and dev1.ooms_real == 1 and dev1.ooms_sim == 1
    assert dev1.release_bursts == 0  # no emulated empty_cache: the unmaps came from the simulated OOM path
    assert dev1.segment_sequence_equal and dev1.identical
    unlimited = next(d for d in replay_snapshot(path, device=1, infer_capacity=False).devices)
    assert unlimited.release_bursts == 1 and unlimited.ooms_sim == 0  # without a capacity it must be emulated


def _small(real_data: Path) -> Path:
    return real_data / "snapshots" / "silmont2000__assignment2-systems__75d09aad__mem_snapshot.pickle"


def test_cli_replay_identical_table_and_json(real_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(_small(real_data))]) == 0
    assert "36/36 (100.0%)" in capsys.readouterr().out
    assert main(["replay", str(_small(real_data)), "--format", "json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    dev = payload["devices"][0]
    assert payload["identical"] and dev["allocs"] == 36 and dev["segment_events_real"] == 9
    assert dev["peak_reserved_real"] == 3_781_165_056  # MANIFEST.tsv: peak_reserved real 3781165056


def test_cli_replay_divergence_exits_1(real_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the newest-main tie-break (per-block counters) does not reproduce a 2025 trace: a real divergence
    assert main(["replay", str(_small(real_data)), "--tie-break", "block_counter"]) == 1
    captured = capsys.readouterr()
    assert "diverged on device 0" in captured.err and "first divergence" in captured.out


def test_cli_replay_unusable_inputs_exit_2(real_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _small(real_data)
    truncated = tmp_path / "truncated.pickle"
    truncated.write_bytes(src.read_bytes()[:2000])
    assert main(["replay", str(truncated)]) == 2
    err = capsys.readouterr().err
    assert "truncated" in err and "Traceback" not in err and err.count("\n") == 1
    text = tmp_path / "notes.pickle"
    shutil.copy(real_data / "snapshots" / "README.md", text)
    assert main(["replay", str(text)]) == 2
    assert "not a pickle" in capsys.readouterr().err
    assert main(["replay", str(tmp_path / "missing.pickle")]) == 2
    capsys.readouterr()
    state_only = real_data / "snapshots" / "Yiyi-philosophy__LLM-inference__61261a2e__oom_snapshot.pickle"
    assert main(["replay", str(state_only)]) == 2
    assert "no alloc/free trace" in capsys.readouterr().err
    assert main(["replay", str(src), "--device", "5"]) == 2
    assert "device 5" in capsys.readouterr().err
    not_snapshot = tmp_path / "list.pickle"
    not_snapshot.write_bytes(pickle.dumps([1, 2, 3]))
    assert main(["replay", str(not_snapshot)]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_cli_replay_inconsistent_snapshot_exits_2(
    real_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A snapshot whose final segments do not contain the segments its trace allocated cannot be replayed."""
    from uvmlab.trace.safe_pickle import safe_load_file
    from uvmlab.trace.snapshot import write_snapshot

    raw = safe_load_file(_small(real_data))
    broken = write_snapshot(tmp_path / "broken.pickle", raw["segments"][:2], raw["device_traces"])
    assert main(["replay", str(broken)]) == 2
    err = capsys.readouterr().err
    assert "segment_alloc" in err and "no matching segment" in err and err.count("\n") == 1
