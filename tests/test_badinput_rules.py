"""Unit tests of the data-safety rules (docs/safety.md): owned and locked run directories, output checks,
untrusted-pickle limits, the self-healing trace cache, sweep exit codes and unreadable results."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import uvmlab.trace.capture as capture_mod
from uvmlab.cli import main
from uvmlab.config import WorkloadConfig
from uvmlab.errors import InputError
from uvmlab.files.outputs import check_output_file, check_output_folder
from uvmlab.files.rundir import MARKER_NAME, RunDir
from uvmlab.sweep.aggregate import collect, read_results, write_results
from uvmlab.trace import cache
from uvmlab.trace import snapshot as snapshot_mod
from uvmlab.trace.safe_pickle import _check_tree, safe_loads

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "docs" / "examples" / "tiny_mlp.py"


# -- run directories ---------------------------------------------------------------------------------------------


def _complete(rd: RunDir) -> None:
    rd.write_json(rd.config_json, {"a": 1})
    rd.write_table("t", pd.DataFrame({"x": [1]}))
    rd.write_json(rd.result_json, {"outcome": "ok"})


def test_a_second_writer_is_refused_while_the_first_holds_the_lock(tmp_path: Path) -> None:
    first = RunDir(tmp_path / "R")
    first.prepare()
    with pytest.raises(InputError, match="another uvmlab process is writing"):
        RunDir(tmp_path / "R").prepare()
    first.release()
    RunDir(tmp_path / "R").prepare()  # free again


def test_force_removes_only_uvmlabs_names_and_not_through_links(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.parquet").write_text("precious")
    rd = RunDir(tmp_path / "R")
    rd.prepare()
    _complete(rd)
    rd.release()
    (rd.path / "mine.txt").write_text("mine")
    (rd.path / "figures").symlink_to(outside, target_is_directory=True)  # a link among uvmlab's names
    with pytest.raises(InputError, match="--force"):
        RunDir(rd.path).prepare()
    again = RunDir(rd.path)
    again.prepare(force=True)
    assert (rd.path / "mine.txt").read_text() == "mine"  # not uvmlab's: kept
    assert not rd.result_json.exists() and not (rd.path / "tables").exists()
    assert not (rd.path / "figures").exists() and (outside / "keep.parquet").read_text() == "precious"
    assert (rd.path / MARKER_NAME).is_file()


def test_writes_never_go_through_a_link_inside_the_run_directory(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    rd = RunDir(tmp_path / "R")
    rd.prepare()
    (rd.path / "tables").symlink_to(outside, target_is_directory=True)  # planted after prepare
    with pytest.raises(InputError, match="symbolic link"):
        rd.write_table("t", pd.DataFrame({"x": [1]}))
    assert list(outside.iterdir()) == []


def test_an_incomplete_owned_run_loses_a_planted_tables_link(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    rd = RunDir(tmp_path / "R")
    rd.prepare()
    rd.release()
    (rd.path / "tables").symlink_to(outside, target_is_directory=True)
    again = RunDir(rd.path)
    again.prepare()
    again.write_table("t", pd.DataFrame({"x": [1]}))
    assert (rd.path / "tables").is_dir() and not (rd.path / "tables").is_symlink()
    assert list(outside.iterdir()) == []


def test_output_file_rules(tmp_path: Path) -> None:
    src = tmp_path / "v.sqlite"
    src.write_text("x")
    with pytest.raises(InputError, match="also an input"):
        check_output_file(src, [src], force=True)  # --force never lets an output replace an input
    with pytest.raises(InputError, match="--force"):
        check_output_file(src, [], force=False)
    assert check_output_file(src, [], force=True) == src
    with pytest.raises(InputError, match="is a folder"):
        check_output_file(tmp_path, [])
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "comparison.json").write_text("{}")
    with pytest.raises(InputError, match=r"already holds comparison\.json"):
        check_output_folder(tmp_path / "d", ["comparison.json", "tables"])
    check_output_folder(tmp_path / "d", ["comparison.json"], force=True)


# -- untrusted pickles ---------------------------------------------------------------------------------------------


def test_expanded_size_counts_every_use_of_a_shared_object() -> None:
    leaf = [1, 2, 3]  # 4 objects expanded
    assert _check_tree(leaf) == 4
    assert _check_tree([leaf, leaf, leaf]) == 1 + 3 * 4  # shared: counted at every use
    with pytest.raises(ValueError, match="expands to more than"):
        _check_tree([leaf] * 10, max_objects=20)


def test_limits_refuse_before_expansion() -> None:
    events = [{"action": "alloc", "addr": 1, "size": 512, "stream": 0, "frames": []}] * 200_000
    data = pickle.dumps({"segments": [], "device_traces": [events] * 500}, protocol=4)
    assert len(data) < 2_000_000  # a small file ...
    with pytest.raises(InputError, match="expands to more than"):  # ... that would be ~1.3e9 objects
        safe_loads(data, "bomb.pickle")
    with pytest.raises(InputError, match="string of"):
        safe_loads(pickle.dumps(["x" * (17 * 2**20)]), "long.pickle")
    with pytest.raises(InputError, match="bits"):
        safe_loads(pickle.dumps([2**200]), "wide.pickle")


def test_snapshot_limits_count_shared_traces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(snapshot_mod, "MAX_EVENTS", 10)
    trace = [{"action": "alloc", "addr": 4096, "size": 512, "stream": 0}] * 4
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [trace, trace, trace]}))
    with pytest.raises(InputError, match="12 trace events"):
        snapshot_mod.read_snapshot(path)


# -- the trace cache -----------------------------------------------------------------------------------------------


def test_a_corrupt_cache_header_is_rebuilt_with_one_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("UVMLAB_CACHE", str(tmp_path))
    calls: list[int] = []
    real = capture_mod.capture_trace
    monkeypatch.setattr(capture_mod, "capture_trace", lambda *a, **k: calls.append(1) or real(*a, **k))
    cfg = WorkloadConfig(str(EXAMPLE), batch_size=4, iterations=1)
    first = cache.get_trace(cfg)
    entry = tmp_path / "traces" / cache.cache_key(cfg)
    (entry / "trace.json").write_text("[1]\n")  # issue 13: AttributeError on every later estimate
    capsys.readouterr()
    again = cache.get_trace(cfg)
    assert len(calls) == 2 and again.allocations.equals(first.allocations)
    warning = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(warning) == 1 and "unreadable" in warning[0] and "capturing it again" in warning[0]
    assert cache.get_trace(cfg).allocations.equals(first.allocations) and len(calls) == 2  # healed


# -- evaluate and code in data ---------------------------------------------------------------------------------


def test_allow_code_lets_a_trusted_csv_name_a_workload_file(tmp_path: Path) -> None:
    from uvmlab.evaluate.ground_truth import read_ground_truth

    csv = tmp_path / "gt.csv"
    csv.write_text(f"id,source,config,gpu_memory,measured_peak_bytes,oom\nr,{EXAMPLE},,80GiB,1000,0\n")
    with pytest.raises(InputError, match="--allow-code"):
        read_ground_truth(csv)
    (case,) = read_ground_truth(csv, allow_code=True)
    assert case.workload is not None and case.workload.workload == str(EXAMPLE)


# -- sweeps --------------------------------------------------------------------------------------------------------


SPEC = "name: t\ndefaults: {mode: sim, iterations: 1}\ngrid:\n  workload: [gpt2]\n  oversub: [1.0, 2]\n"


def test_a_sweep_with_failures_exits_1_and_says_how_many(
    tmp_path: Path, fake_env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(SPEC + "include:\n  - {workload: bert, oversub: 2, sim.fail: [error]}\n")
    assert main(["sweep", str(spec), "-o", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "1 of 3 configurations did not finish (1 error)" in err and "--retry-failed" in err
    ok = tmp_path / "ok.yaml"
    ok.write_text(SPEC)
    assert main(["sweep", str(ok), "-o", str(tmp_path / "out2")]) == 0


def test_an_unreadable_result_is_pending_everywhere_and_redone(
    tmp_path: Path, fake_env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(SPEC)
    out = tmp_path / "out"
    assert main(["sweep", str(spec), "-o", str(out)]) == 0
    victim = sorted((out / "runs").iterdir())[0]
    (victim / "result.json").write_text("{not json")
    capsys.readouterr()
    collect(out)
    assert "1 run(s)" in capsys.readouterr().err  # collect says so instead of silently dropping it
    assert main(["sweep", str(spec), "-o", str(out), "--dry-run", "--format", "json"]) == 0
    status = {c["run_id"]: c["status"] for c in json.loads(capsys.readouterr().out)["configs"]}
    assert status[victim.name] == "pending"
    assert main(["sweep", str(spec), "-o", str(out), "--format", "json"]) == 0  # was rc 2
    assert json.loads(capsys.readouterr().out)["ran"] == 1
    assert json.loads((victim / "result.json").read_text())["outcome"] == "ok"
    kept = list((victim / "logs").glob("result.json.unreadable-*"))
    assert len(kept) == 1 and kept[0].read_text() == "{not json"  # moved aside, not deleted
    assert main(["sweep", str(spec), "-o", str(out), "--retry-failed"]) == 0


def test_a_corrupt_results_parquet_is_rebuilt(tmp_path: Path, fake_env: dict[str, str]) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(SPEC)
    out = tmp_path / "out"
    assert main(["sweep", str(spec), "-o", str(out)]) == 0
    path = write_results(out)
    path.write_bytes(b"PAR1" + os.urandom(100))
    os.utime(path, (path.stat().st_atime, path.stat().st_mtime + 60))  # newer than every result.json
    assert len(read_results(out)) == 2


def _naive_count(obj: object) -> int:
    if isinstance(obj, dict):
        return 1 + sum(_naive_count(k) + _naive_count(v) for k, v in obj.items())
    if isinstance(obj, list | tuple):
        return 1 + sum(_naive_count(x) for x in obj)
    return 1


@settings(max_examples=60, deadline=None)
@given(
    st.recursive(
        st.integers() | st.text(max_size=3) | st.none(),
        lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=2), kids, max_size=3),
        max_leaves=20,
    ),
    st.integers(min_value=1, max_value=4),
)
def test_expanded_count_equals_the_naive_count_with_sharing(tree: object, copies: int) -> None:
    shared = [tree] * copies + [{"again": tree}]  # the same object referenced copies + 1 times
    assert _check_tree(shared) == _naive_count(shared)
    back = safe_loads(pickle.dumps(shared, protocol=4), "prop")  # the pickle memo keeps the sharing
    assert _check_tree(back) == _naive_count(shared)


def test_nsys_import_force_keeps_unrelated_files(tmp_path: Path) -> None:
    """Defect 1 for `nsys import -o P --force`: the old code removed the whole folder."""
    from uvmlab.measure.nsys.synthetic import write_synthetic_export

    db = tmp_path / "x.sqlite"
    write_synthetic_export(db, faults=10, migrations=20, iterations=2, kernels_per_iteration=5)
    out = tmp_path / "P"
    assert main(["nsys", "import", str(db), "-o", str(out), "--format", "json"]) == 0
    (out / "src").mkdir()
    (out / "src" / "main.py").write_text("print(1)\n")
    assert main(["nsys", "import", str(db), "-o", str(out), "--format", "json"]) == 2  # complete: needs --force
    assert main(["nsys", "import", str(db), "-o", str(out), "--force", "--format", "json"]) == 0
    assert (out / "src" / "main.py").read_text() == "print(1)\n" and (out / "result.json").is_file()


# -- issue 29: limits that hold before anything is built -------------------------------------------------------


def test_the_opcode_scan_refuses_before_the_unpickler_allocates(monkeypatch: pytest.MonkeyPatch) -> None:
    from uvmlab.trace import safe_pickle

    with pytest.raises(InputError, match="memo slot 600,000,000"):
        safe_loads(b"\x80\x04]r\x00\x46\xc3\x23.", "m.pickle")  # LONG_BINPUT 600,000,000: ~9.6 GB of memo
    with pytest.raises(InputError, match="memo slot"):
        safe_loads(b"(lp99999999999\n.", "p0.pickle")  # protocol 0 PUT with a huge index
    with pytest.raises(InputError, match="integer of"):
        safe_loads(b"\x80\x04\x8b\x00\x00\x00\x10" + b"\x01" * 64, "wide.pickle")  # LONG4 of 2**28 bytes
    with pytest.raises(InputError, match="not a pickle opcode"):
        safe_loads(b"\x80\x04\xff.", "bad.pickle")
    monkeypatch.setattr(safe_pickle, "MAX_OPCODES", 50)
    defaults = safe_pickle.scan_opcodes.__defaults__ or ()
    monkeypatch.setattr(safe_pickle.scan_opcodes, "__defaults__", (50, *defaults[1:]))
    with pytest.raises(InputError, match="more than 50 opcodes"):
        safe_loads(pickle.dumps(list(range(100)), protocol=4), "many.pickle")
    assert safe_loads(pickle.dumps([1, 2, 3], protocol=0), "ok.pickle") == [1, 2, 3]


def test_untrusted_files_must_be_regular_and_small(tmp_path: Path) -> None:
    from uvmlab.files.inputs import read_input_bytes

    fifo = tmp_path / "f.pickle"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="not a regular file"):  # a FIFO would block a plain open()
        read_input_bytes(fifo, 100, "a pickle")
    (tmp_path / "big").write_bytes(b"x" * 101)
    with pytest.raises(InputError, match="101 bytes, more than the 100"):
        read_input_bytes(tmp_path / "big", 100, "a file")
    assert b"Name:" in read_input_bytes("/proc/self/status", 1 << 20, "a file")  # size 0 on stat: read in steps
    with pytest.raises(InputError, match="a folder"):
        read_input_bytes(tmp_path, 100, "a file")


def test_yaml_aliases_count_at_every_use_and_configurations_before_expansion(tmp_path: Path) -> None:
    from uvmlab.sweep.spec import parse_spec

    text = "grid:\n  workload: [gpt2]\n  option.a: &a [1, 2, 3]\n  option.b: *a\n  option.c: *a\n"
    assert len(parse_spec(text).configs) == 27
    with pytest.raises(InputError, match="27 configurations, more than the 10 allowed"):
        parse_spec(text, max_configs=10)
    laughs = "defaults:\n  options:\n" + "".join(
        f"    {k}: &{k} [{', '.join(['*' + chr(ord(k) - 1)] * 9) if k > 'a' else '1, 2'}]\n" for k in "abcdefg"
    )
    with pytest.raises(InputError, match="YAML nodes"):
        parse_spec(laughs + "grid: {workload: [gpt2]}\n")
    spec = tmp_path / "s.yaml"
    spec.write_text("grid:\n  workload: [gpt2]\n  oversub: [1, 2, 3]\n")
    assert main(["sweep", str(spec), "-o", str(tmp_path / "o"), "--dry-run", "--max-configs", "2"]) == 2
    assert main(["sweep", str(spec), "-o", str(tmp_path / "o"), "--dry-run", "--max-configs", "3"]) == 0


def test_numbers_that_overflow_are_one_sentence() -> None:
    from uvmlab.gpus import get_gpu
    from uvmlab.sim.allocator.allocconf import AllocatorSettings
    from uvmlab.units import parse_bytes

    for text in ("1e308GiB", "1e19", "inf"):
        with pytest.raises(InputError):
            parse_bytes(text)
    assert parse_bytes("64TiB") == 64 * 2**40
    with pytest.raises(InputError, match="64 TiB"):
        get_gpu("A100-80GB", "65TiB")
    for conf in ("max_split_size_mb:nan", "max_split_size_mb:1e308", "garbage_collection_threshold:inf"):
        with pytest.raises(InputError, match="PYTORCH_CUDA_ALLOC_CONF"):
            AllocatorSettings.parse(conf)


SPARSE_SCRIPT = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
from uvmlab.measure.nsys.kernel_stats import attribute
from uvmlab.measure.nsys.read import open_export
out = {}
for name in sys.argv[1:]:
    with open_export(name) as ex:
        kernels, its, buckets = attribute(ex, chunk_rows=100)
    outside = buckets["outside"].values()
    out[name] = int(kernels["fault_count"].sum()) + sum(int(v.get("fault_count", 0)) for v in outside)
print(json.dumps(out))
"""


def test_sparse_rowids_do_not_plan_work_by_rowid_range(tmp_path: Path) -> None:
    """Issue 29: a fault table whose last rowid is 2**62 made the chunk planner list 2**62 / chunk_rows bounds
    (memory exhaustion, then a MemoryError traceback); chunks are planned by row number now."""
    import sqlite3
    import subprocess
    import sys

    from uvmlab.measure.nsys import schema as S
    from uvmlab.measure.nsys.synthetic import write_synthetic_export

    dense, sparse = tmp_path / "dense.sqlite", tmp_path / "sparse.sqlite"
    write_synthetic_export(dense, faults=450, migrations=20, iterations=2, kernels_per_iteration=5)
    sparse.write_bytes(dense.read_bytes())
    con = sqlite3.connect(sparse)
    con.execute(f"UPDATE {S.GPU_FAULTS} SET rowid = {2**62} WHERE rowid = (SELECT max(rowid) FROM {S.GPU_FAULTS})")
    con.commit()
    con.close()
    env = {**os.environ, "PYTHONPATH": str(REPO), "UVMLAB_NSYS_WORKERS": "2"}  # worker processes: the planned path
    proc = subprocess.run(
        [sys.executable, "-c", SPARSE_SCRIPT, str(dense), str(sparse)], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    totals = json.loads(proc.stdout.splitlines()[-1])
    assert totals[str(sparse)] == totals[str(dense)] > 0


def test_rerunning_a_finished_sweep_with_failures_still_exits_1(
    tmp_path: Path, fake_env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 29: the second run of a sweep whose configurations failed ran nothing and exited 0."""
    spec = tmp_path / "s.yaml"
    spec.write_text(SPEC + "include:\n  - {workload: bert, oversub: 2, sim.fail: [error]}\n")
    out = tmp_path / "out"
    assert main(["sweep", str(spec), "-o", str(out)]) == 1
    capsys.readouterr()
    assert main(["sweep", str(spec), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "1 of 3 configurations failed in an earlier run" in err and "--retry-failed" in err


def test_a_python_warning_is_one_line_without_its_source(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import warnings

    import workloads.info

    def warn(*a: object, **k: object) -> list[object]:
        warnings.warn("something odd\nsecond line", RuntimeWarning, stacklevel=1)
        return []

    monkeypatch.setattr(workloads.info, "describe_workloads", warn)
    assert main(["workloads", "--format", "json"]) == 0
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert lines == ["uvmlab: warning: something odd second line (RuntimeWarning)"], lines


# -- issue 42: the mechanisms' own invariants ---------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab./\\\x00~ ")), max_size=12))
def test_a_plain_manifest_name_never_leaves_its_folder(name: str) -> None:
    """Whatever a manifest lists, a name that passes the check resolves inside the folder (no '..', no absolute
    path, no empty or '.' part); everything else is refused."""
    from uvmlab.files.owned import plain_relative_name

    root = "/srv/run"
    if plain_relative_name(name):
        joined = os.path.normpath(os.path.join(root, name))
        assert joined.startswith(root + os.sep) and os.path.relpath(joined, root) == name.rstrip("/")


@settings(max_examples=80, deadline=None)
@given(
    st.recursive(
        st.integers(min_value=-(2**63), max_value=2**63 - 1) | st.text(max_size=3) | st.none() | st.booleans(),
        lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=2), kids, max_size=3),
        max_leaves=20,
    ),
    st.sampled_from([0, 1, -5, 2**61 - 1, 1.5, (1, 2), b"k"]),
)
def test_the_scan_refuses_exactly_the_dicts_keyed_by_something_else_than_strings(tree: object, key: object) -> None:
    """Plain data keyed by strings loads unchanged (every protocol); one dict key of another type anywhere is
    refused by the opcode scan, before the unpickler builds anything (str hashes are randomized, others are not)."""
    for protocol in (2, 3, 4, 5):
        assert safe_loads(pickle.dumps(tree, protocol=protocol), "ok") == tree
    for protocol in (3, 4, 5):  # (protocol 2 pickles bytes through a global: refused as such)
        with pytest.raises(InputError, match="not a string"):
            safe_loads(pickle.dumps([tree, {key: tree}], protocol=protocol), "keyed")


def test_the_scan_bounds_memo_slots_by_the_opcodes_read() -> None:
    """A sparse file naming a memo slot far beyond its opcodes (290 M in the issue) is refused, however long the file
    is: the C unpickler would grow its memo array to twice the slot."""
    data = b"\x80\x04]r" + (10_000_000).to_bytes(4, "little") + b"." + b"\x00" * 10_000_001
    with pytest.raises(InputError, match="beyond the 3 opcodes read so far"):
        safe_loads(data, "sparse.pickle")


def test_foreign_sqlite_stops_a_statement_past_its_time_limit(tmp_path: Path) -> None:
    import sqlite3

    from uvmlab.files import foreign_sqlite

    db = tmp_path / "x.sqlite"
    sqlite3.connect(db).execute("CREATE TABLE t (x)").connection.commit()
    conn = foreign_sqlite.connect(db, "a test database", time_limit_s=0.2)
    endless = "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) SELECT count(*) FROM r"
    with pytest.raises(sqlite3.OperationalError) as caught:
        conn.execute(endless).fetchall()
    assert "took more than 0 s" in foreign_sqlite.sqlite_failure(caught.value, db, conn)
    with pytest.raises(sqlite3.OperationalError):  # and nothing is ever written through it
        conn.execute("INSERT INTO t VALUES (1)")


def test_an_export_table_over_the_row_cap_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from uvmlab.measure.nsys import read as nsys_read
    from uvmlab.measure.nsys.synthetic import write_synthetic_export

    write_synthetic_export(tmp_path / "x.sqlite", faults=50, migrations=20, iterations=2, kernels_per_iteration=5)
    monkeypatch.setattr(nsys_read, "MAX_TABLE_ROWS", 30)
    with pytest.raises(InputError, match="more than the 30 uvmlab reads"):
        nsys_read.open_export(tmp_path / "x.sqlite")


def test_one_reader_per_format_refuses_what_python_would_raise(tmp_path: Path) -> None:
    """JSON: NaN, a float beyond range, 5,000 digits, 100,000 levels; CSV: a 2 MiB field; Parquet: a footer that
    declares more rows than the limit. Each is one sentence (InputError), never ValueError or RecursionError."""
    from uvmlab.files.inputs import read_csv_rows, read_json_file, read_parquet_file

    for text in ('{"x": NaN}', '{"x": 1e400}', '{"x": ' + "9" * 5000 + "}", "[" * 100_000 + "]" * 100_000):
        (tmp_path / "x.json").write_text(text)
        with pytest.raises(InputError):
            read_json_file(tmp_path / "x.json", 1 << 20, "a JSON file")
    (tmp_path / "x.csv").write_text("a,b\n" + "x" * (2 << 20) + ",1\n")
    with pytest.raises(InputError, match="not a readable CSV"):
        read_csv_rows(tmp_path / "x.csv", 16 << 20, "a CSV file")
    pd.DataFrame({"x": range(100)}).to_parquet(tmp_path / "x.parquet")
    with pytest.raises(InputError, match="declares 100 rows"):
        read_parquet_file(tmp_path / "x.parquet", 1 << 20, "a table", max_rows=10)


READ_THEN_EXIT = """
import sys
from uvmlab.files.inputs import read_parquet_table
assert read_parquet_table(sys.argv[1], 1 << 30, "a table").num_rows == 200_000
"""


def test_a_process_that_reads_a_table_and_exits_does_not_abort(tmp_path: Path) -> None:
    """A process that reads a Parquet table through uvmlab.files.inputs and exits at once exits 0. Through
    ``pyarrow.parquet.read_table(file object)`` 63 % of such processes aborted at exit ("terminate called without
    an active exception", the dataset scanner's thread dropping the file object during finalization): 8 runs all
    pass by chance with probability 0.37**8 < 0.0004."""
    import subprocess
    import sys

    path = tmp_path / "t.parquet"
    pd.DataFrame({"a": range(200_000), "s": [f"x{i}" for i in range(200_000)]}).to_parquet(path, row_group_size=10_000)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    for _ in range(8):
        proc = subprocess.run(
            [sys.executable, "-c", READ_THEN_EXIT, str(path)], capture_output=True, text=True, env=env
        )
        assert proc.returncode == 0, proc.stderr[-2000:]


def test_the_table_readers_keep_what_pandas_reads(tmp_path: Path) -> None:
    """read_parquet_file gives the frame ``pandas.read_parquet`` gives: index, string, categorical and float dtypes."""
    from uvmlab.files.inputs import read_parquet_file

    frame = pd.DataFrame(
        {"name": ["a", "b", None], "kind": pd.Categorical(["x", "y", "x"]), "v": [1.5, float("nan"), 3.0]},
        index=pd.Index([10, 20, 30], name="id"),
    )
    frame.to_parquet(tmp_path / "f.parquet")
    pd.testing.assert_frame_equal(
        read_parquet_file(tmp_path / "f.parquet", 1 << 20, "a table"), pd.read_parquet(tmp_path / "f.parquet")
    )


def test_library_output_checks_apply_the_command_line_rules(tmp_path: Path) -> None:
    """check_output_file / check_output_folder (the API's checks) refuse what ``check_paths`` refuses on a command
    line: an output folder holding an input folder too (before, only an input file was refused there), and name no
    option for an input that has none."""
    data = tmp_path / "out" / "data"
    data.mkdir(parents=True)
    with pytest.raises(InputError, match=r"holds the input .*data; choose another output folder"):
        check_output_folder(tmp_path / "out", ["result.json"], inputs=[data])
    (tmp_path / "in.json").write_text("{}")
    with pytest.raises(InputError) as err:
        check_output_file(tmp_path / "in.json", inputs=[tmp_path / "in.json"], force=True)
    assert str(err.value).endswith("is also an input of this command; choose another output path")
    check_output_folder(tmp_path / "elsewhere", ["result.json"], inputs=[data])  # no overlap: accepted
