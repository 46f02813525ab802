"""The safe snapshot reader: every real file, malicious/broken pickles refused with one sentence, CLI exit codes."""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import os
import pickle
import pickletools
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from uvmlab.cli import main
from uvmlab.errors import InputError
from uvmlab.trace.safe_pickle import safe_loads
from uvmlab.trace.snapshot import Snapshot, read_snapshot

EXPECTED_GENERATION = {
    "Yiyi-philosophy": "G1",
    "cranberrii": "G2",
    "Constructor-Sun": "G5",
    "Wedsonlin": "G6",
    "kkaitlyn111": "G4",
}


def _snapshots(real_data: Path) -> list[Path]:
    files = sorted(p for p in (real_data / "snapshots").iterdir() if p.suffix in (".pickle", ".pkl"))
    assert len(files) == 48
    return files


def _manifest(real_data: Path) -> dict[str, dict[str, str]]:
    with open(real_data / "snapshots" / "MANIFEST.tsv", newline="") as f:
        return {r["file"]: r for r in csv.DictReader(f, delimiter="\t")}


@pytest.fixture(scope="module")
def all_read(real_data: Path) -> dict[str, Snapshot]:
    """Every real snapshot, read once for the module."""
    return {p.name: read_snapshot(p) for p in _snapshots(real_data)}


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_every_real_snapshot_reads_and_matches_manifest(real_data: Path, all_read: dict[str, Snapshot]) -> None:
    manifest = _manifest(real_data)
    generations: dict[str, str] = {}
    for name, snap in all_read.items():
        generations[name] = snap.format_generation
        row = manifest[name]
        if row["segments"]:
            assert len(snap.segments) == int(row["segments"]), name
            assert len(snap.events) == int(row["trace_events"]), name
            if row["actions"]:
                counts = dict(kv.split(":") for kv in row["actions"].split(";"))
                got = snap.events["action"].value_counts().to_dict()
                assert {k: int(v) for k, v in counts.items()} == got, name
        # every block lies inside its segment, and blocks tile the segment exactly
        b = snap.blocks
        per_seg = b.groupby(["device", "segment_address"])["size"].sum()
        seg = snap.segments.set_index(["device", "address"])["total_size"]
        assert (per_seg.reindex(seg.index).fillna(0) == seg).all(), name
    for prefix, gen in EXPECTED_GENERATION.items():
        assert {g for n, g in generations.items() if n.startswith(prefix)} == {gen}, prefix
    assert generations["Muduard__LayoutEditing__33ade60d__memory_snapshot.pkl"] == "segments-list"


def test_peak_reserved_matches_replay_manifest(real_data: Path, all_read: dict[str, Snapshot]) -> None:
    """The reserved curve rebuilt backwards from the final segments reaches the peak the manifest replay found."""
    manifest = _manifest(real_data)
    checked = 0
    for name, row in manifest.items():
        note = row.get("replay_check") or ""
        if "peak_reserved real/sim=" not in note:
            continue
        real_peak = int(note.split("peak_reserved real/sim=")[1].split("/")[0])
        assert all_read[name].summary()[0]["peak_reserved_in_trace_bytes"] == real_peak, name
        checked += 1
    assert checked >= 30


def test_g1_block_addresses_are_inferred(real_data: Path) -> None:
    snap = read_snapshot(real_data / "snapshots" / "Yiyi-philosophy__LLM-inference__61261a2e__oom_snapshot.pickle")
    assert snap.blocks["address_inferred"].any()
    assert (snap.blocks["address"] == snap.blocks["segment_address"] + snap.blocks["offset"]).all()
    assert snap.allocator_settings is None


def test_events_columns_and_oom(real_data: Path) -> None:
    snap = read_snapshot(real_data / "snapshots" / "Constructor-Sun__code_location__52e52b22__memory_snapshot.pickle")
    oom = snap.events[snap.events["action"] == "oom"]
    assert len(oom) == 1
    assert oom["address"].isna().all() and oom["device_free"].notna().all()
    assert snap.allocator_settings["expandable_segments"] is True
    assert snap.devices == [0, 1, 2, 3]
    assert snap.events["time_us"].notna().all()
    assert len(snap.external_annotations) == 4


# ---- malicious and broken inputs -------------------------------------------------------------------------


class _CreatesFile:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):  # loading this with pickle.load would create the file
        return (open, (self.path, "w"))


class _System:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
@pytest.mark.parametrize("payload", [_CreatesFile, _System])
def test_malicious_pickle_is_refused_and_runs_nothing(tmp_path: Path, protocol: int, payload: type) -> None:
    victim = tmp_path / "pwned"
    evil = tmp_path / "evil.pickle"
    evil.write_bytes(pickle.dumps({"segments": [], "device_traces": [[payload(str(victim))]]}, protocol=protocol))
    before = _sha(evil)
    with pytest.raises(InputError, match=r"refused.*nothing in the file was run"):
        read_snapshot(evil)
    assert not victim.exists()
    assert main(["snapshot", "show", str(evil)]) == 2
    assert not victim.exists()
    assert _sha(evil) == before


def test_inst_ext_persid_and_set_opcodes_are_refused() -> None:
    inst = b"(S'touch /tmp/x'\nios\nsystem\n."  # protocol-0 INST
    persid = b"\x80\x02Pabc\n."  # PERSID
    ext = b"\x80\x02\x82\x01."  # EXT1 code 1
    as_set = pickle.dumps({"segments": {1, 2}}, protocol=4)
    for data in (inst, persid, ext, as_set):
        with pytest.raises(InputError, match=r"refused|not a readable pickle"):
            safe_loads(data, "x.pickle")
    with pytest.raises(InputError, match="refused"):
        safe_loads(inst, "x.pickle")
    with pytest.raises(InputError, match="set object"):
        safe_loads(as_set, "x.pickle")


def test_real_files_use_only_plain_opcodes(real_data: Path) -> None:
    """Evidence for the design: no real snapshot needs a global (checked on the smallest files to stay fast)."""
    for path in sorted(_snapshots(real_data), key=lambda p: p.stat().st_size)[:10]:
        names = {op.name for op, _, _ in pickletools.genops(path.read_bytes())}
        assert not names & {"GLOBAL", "STACK_GLOBAL", "REDUCE", "INST", "OBJ", "NEWOBJ", "BUILD"}, path.name


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1
    return err


def test_cli_truncated_file(tmp_path: Path, real_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = real_data / "snapshots" / "silmont2000__assignment2-systems__75d09aad__mem_snapshot.pickle"
    cut = tmp_path / "cut.pickle"
    cut.write_bytes(src.read_bytes()[: src.stat().st_size // 2])
    before = _sha(cut)
    assert main(["snapshot", "show", str(cut)]) == 2
    assert "truncated" in _one_error_line(capsys)
    assert _sha(cut) == before


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"", "empty"),
        (b"PK\x03\x04 this is a zip", "not a pickle"),
        (b"\x80\x04\x95\x00\x00\x00\x00\x00\x00\x00\x80", "not a readable pickle"),  # FRAME overflow (found by fuzzing)
        (pickle.dumps({"weights": [1, 2]}), "not a PyTorch memory snapshot"),
        (pickle.dumps([1, 2, 3]), "not a PyTorch memory snapshot"),
        (pickle.dumps("hello"), "not a PyTorch memory snapshot"),
        (pickle.dumps({"segments": [], "device_traces": [], "gpu_telemetry": 1}), "does not know.*gpu_telemetry"),
        (
            pickle.dumps({"segments": [], "device_traces": [[{"action": "teleport", "size": 1, "addr": 0}]]}),
            "does not know.*teleport",
        ),
        (pickle.dumps({"segments": [{"address": 0, "blocks": []}]}), "does not know.*lacks \\['total_size'\\]"),
    ],
)
def test_cli_bad_inputs_one_sentence_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, expected: str
) -> None:
    f = tmp_path / "bad.pickle"
    f.write_bytes(content)
    before = _sha(f)
    assert main(["snapshot", "show", str(f)]) == 2
    import re

    assert re.search(expected, _one_error_line(capsys))
    assert _sha(f) == before


def test_cli_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["snapshot", "show", str(tmp_path / "nope.pickle")]) == 2
    assert "does not exist" in _one_error_line(capsys)


def test_cli_show_real_file_json(real_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    src = (
        real_data
        / "snapshots"
        / "HugePandaCoder__octree-nca-groupeq__3e8aa21a__mem_snapshots_inference2_peso_oct.pickle"
    )
    before = _sha(src)
    assert main(["snapshot", "show", str(src), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["format_generation"] == "G4"
    assert data["devices"][0]["actions"]["segment_free"] == 17
    assert data["devices"][0]["peak_reserved_in_trace_bytes"] == 24366809088
    assert _sha(src) == before
    assert main(["snapshot", "show", str(src)]) == 0
    assert "G4" in capsys.readouterr().out


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=64))
def test_random_bytes_never_escape_as_other_errors(data: bytes) -> None:
    with contextlib.suppress(InputError):
        safe_loads(b"\x80\x04" + data, "fuzz.pickle")


@settings(max_examples=40, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
        lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=3), c, max_size=4),
        max_leaves=20,
    )
)
def test_plain_data_round_trips(obj: object) -> None:
    assert safe_loads(pickle.dumps(obj, protocol=4), "x") == obj
    assert safe_loads(io.BytesIO(pickle.dumps(obj, protocol=2)).getvalue(), "x") == obj


_leaf = st.none() | st.booleans() | st.integers(-5, 2**40) | st.text(max_size=4) | st.floats(allow_nan=False)
_history = st.lists(_leaf | st.dictionaries(st.text(max_size=2), _leaf), max_size=2)
_block = st.fixed_dictionaries(
    {"size": _leaf | st.integers(0, 4096), "state": st.sampled_from(["inactive", "active_allocated", "odd"]) | _leaf},
    optional={"address": _leaf, "requested_size": _leaf, "history": _history},
)
_segment = st.fixed_dictionaries(
    {"address": _leaf | st.integers(0, 2**40), "total_size": _leaf, "blocks": st.lists(_block, max_size=3) | _leaf},
    optional={"device": _leaf, "stream": _leaf, "allocated_size": _leaf, "segment_pool_id": _leaf},
)
_entry = st.fixed_dictionaries(
    {"action": st.sampled_from(["alloc", "free_completed", "segment_alloc", "teleport"]) | _leaf, "size": _leaf},
    optional={"addr": _leaf, "stream": _leaf, "time_us": _leaf, "frames": _leaf | st.lists(_leaf, max_size=2)},
)
_snapshot_like = st.fixed_dictionaries(
    {"segments": st.lists(_segment, max_size=3) | _leaf},
    optional={
        "device_traces": st.lists(st.lists(_entry, max_size=3) | _leaf, max_size=2) | _leaf,
        "allocator_settings": st.dictionaries(st.text(max_size=3), _leaf, max_size=2) | _leaf,
        "external_annotations": st.lists(_leaf, max_size=2) | _leaf,
    },
)


@settings(max_examples=120, deadline=None)
@given(_snapshot_like)
def test_malformed_snapshot_structures_give_input_errors(tmp_path_factory: pytest.TempPathFactory, obj: dict) -> None:
    """Any snapshot-shaped pickle either reads or is refused with InputError: never another exception."""
    path = tmp_path_factory.mktemp("fuzz") / "s.pickle"
    path.write_bytes(pickle.dumps(obj, protocol=4))
    try:
        snap = read_snapshot(path)
    except InputError:
        return
    assert len(snap.blocks) == sum(len(s["blocks"]) for s in obj["segments"])
