"""Issue 42, section 2 (limits on every input path), over every command and every input option, enumerated from the
click tree, each probe under RLIMIT_AS = 1 GiB and a 60 s limit (tests/hostile.py).

- Every input option (a file, or a folder whose files the command reads) is given, in turn, a FIFO with no writer,
  a link to /dev/urandom and a sparse 1 GB one-line file (for a folder: every file in a valid folder replaced).
  Each ends with one sentence and exit 2, and nothing around it changes.
- Format probes: SQLite exports whose tables are VIEWs (an endless recursive CTE, 40 million generated rows) for
  every command that reads an export; a 300 MB kernel name; snapshot pickles with a sparse memo (slot 120 M),
  400,000 colliding int keys, 1.98 M events sharing two dicts, frames sharing two 15 MiB strings, for every command
  that reads a snapshot; a sweep product of 1,000,000 configurations with ``--max-configs 1000000 --dry-run``.

On main (before issue 42) these hang, exhaust the 1 GiB, print a traceback, or exit 0 as if the input were valid.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import hostile_files as H
import pytest
from hostile import Probe, assert_all, assert_refused, run_probes
from test_hostile_paths import commands, path_params

REPO = Path(__file__).resolve().parents[1]
REAL_UVM = REPO.parent / "shared" / "real-data" / "uvm"
SPECIALS = ("fifo", "urandom", "1gb-line")
NO_FILE_READ = {
    ("shim path", "cache_dir"): "only asks whether the built library exists (is_file); reads no file",
    ("shim status", "cache_dir"): "only asks whether the built library exists (is_file); reads no file",
}
"""Input options whose command reads no file under them, and why."""


def special(d: Path, name: str, how: str) -> Path:
    if how == "fifo":
        return H.fifo(d, name)
    if how == "urandom":
        return H.urandom_link(d, name)
    return H.sparse_line(d, name, 10**9, b"x" * 64)


def spoil(folder: Path, how: str) -> Path:
    """Replace every regular file under ``folder`` (a valid input folder) by a special file of kind ``how``."""
    for dirpath, _, filenames in os.walk(folder):
        for name in filenames:
            p = Path(dirpath) / name
            if p.is_file() and not p.is_symlink():
                p.unlink()
                special(Path(dirpath), name, how)
    return folder


def _trace(d: Path) -> Path:
    from uvm_synth import make_trace

    from uvmlab.trace.schema import write_trace

    return write_trace(make_trace(n_iter=1), d / "tr")


def _run(d: Path, name: str = "A") -> Path:
    from test_badinput_cli import fake_run

    return Path(fake_run(d, name))


def _sweep(d: Path) -> Path:
    from test_badinput_cli import fake_sweep

    return Path(fake_sweep(d))


def _validate_data(d: Path) -> Path:
    """A data folder for ``validate --check nsys-parser``: one nsys export (the check reads every export there)."""
    (d / "data" / "nsys").mkdir(parents=True)
    H.export(d / "data" / "nsys", "x.sqlite")
    return d / "data"


def _uvm_timings(d: Path) -> Path:
    if not REAL_UVM.is_dir():
        pytest.skip(f"real data not found at {REAL_UVM} (the layout of calibrate --uvm-timings)")
    from uvmlab.measure.profile_fit import BENCH_CSV, GCN_DIR

    dst = d / "uvm"
    for rel in (GCN_DIR, Path(BENCH_CSV).parent):
        shutil.copytree(REAL_UVM / rel, dst / rel)
    return dst


FILE = Callable[[Path, str], list[str]]
"""argv builder: (folder, the hostile path) -> command line."""
OUT = "out"
FILES: dict[tuple[str, str], tuple[str, FILE]] = {
    ("trace capture", "workload"): ("wl.py", lambda d, x: ["trace", x, "-n", "1", "-o", str(d / OUT)]),
    ("snapshot show", "file"): ("s.pickle", lambda d, x: ["snapshot", "show", x]),
    ("estimate", "workload"): ("wl.py", lambda d, x: ["estimate", x, "-n", "1"]),
    ("estimate", "stack_file"): ("stack.json", lambda d, x: ["estimate", "alexnet", "-b", "2", "--stack", x]),
    ("replay", "snapshot"): ("s.pickle", lambda d, x: ["replay", x]),
    ("run", "workload"): ("wl.py", lambda d, x: ["run", x, "-n", "1", "--mode", "sim", "-o", str(d / OUT)]),
    ("run", "params_file"): (
        "p.json",
        lambda d, x: ["run", "alexnet", "-b", "2", "-n", "1", "--mode", "sim", "--params", x, "-o", str(d / OUT)],
    ),
    ("nsys summarize", "report"): ("r.sqlite", lambda d, x: ["nsys", "summarize", x]),
    ("nsys import", "report"): ("r.sqlite", lambda d, x: ["nsys", "import", x, "-o", str(d / OUT)]),
    ("calibrate", "report"): ("r.sqlite", lambda d, x: ["calibrate", x, "-o", str(d / OUT)]),
    ("calibrate", "base"): ("b.json", lambda d, x: ["calibrate", str(H.export(d)), "--base", x, "-o", str(d / OUT)]),
    ("calibrate", "microbench_timings"): ("t.csv", lambda d, x: ["calibrate", "--microbench-timings", x, "-o", OUT]),
    ("calibrate", "memory_csv"): ("m.csv", lambda d, x: ["calibrate", "--memory", x, "-o", str(d / OUT)]),
    ("calibrate", "kernel_exports"): ("k.sqlite", lambda d, x: ["calibrate", "--kernels", x, "-o", str(d / OUT)]),
    ("calibrate", "work_file"): (
        "w.csv",
        lambda d, x: ["calibrate", "--kernels", str(H.export(d)), "--work", x, "-o", str(d / OUT)],
    ),
    ("sweep run", "spec"): ("s.yaml", lambda d, x: ["sweep", "run", x, "-o", str(d / OUT), "--dry-run"]),
    ("evaluate", "ground_truth"): ("gt.csv", lambda d, x: ["evaluate", x]),
    ("fragmentation", "source"): ("s.pickle", lambda d, x: ["fragmentation", x]),
    ("colocate", "jobs"): ("wl.py", lambda d, x: ["colocate", f"{x}:2", "-n", "1"]),
    ("advise", "workload"): ("wl.py", lambda d, x: ["advise", x, "-n", "1"]),
}  # fmt: skip
"""Input files: the name the hostile file takes, and the command line around it."""
FOLDERS: dict[tuple[str, str], tuple[Callable[[Path], Path], FILE]] = {
    ("trace show", "directory"): (_trace, lambda d, x: ["trace", "show", x]),
    ("compare", "run_a"): (_run, lambda d, x: ["compare", x, str(_run(d, "B"))]),
    ("compare", "run_b"): (_run, lambda d, x: ["compare", str(_run(d, "B")), x]),
    ("calibrate", "sim_run"): (_run, lambda d, x: ["calibrate", str(H.export(d)), "--sim-run", x, "-o", str(d / OUT)]),
    ("calibrate", "uvm_timings"): (_uvm_timings, lambda d, x: ["calibrate", "--uvm-timings", x, "-o", str(d / OUT)]),
    ("sweep collect", "out"): (_sweep, lambda d, x: ["sweep", "collect", x]),
    ("report", "sweep_dir"): (_sweep, lambda d, x: ["report", x, "-o", str(d / OUT / "r.html")]),
    ("validate", "data_dir"): (_validate_data, lambda d, x: ["validate", x, "--check", "nsys-parser", "--jobs", "1"]),
}  # fmt: skip
"""Input folders: a builder of a valid folder (every file of which is then spoiled), and the command line."""


def _snapshots(d: Path) -> Path:
    import pickle

    (d / "snaps").mkdir()
    event = {"action": "alloc", "addr": 4096, "size": 512, "stream": 0, "frames": []}
    (d / "snaps" / "a.pickle").write_bytes(pickle.dumps({"segments": [], "device_traces": [[event]]}))
    return d / "snaps"


SHAPES: dict[tuple[str, str], tuple[Callable[[Path], Path], FILE]] = {
    ("evaluate", "ground_truth"): (_snapshots, lambda d, x: ["evaluate", x]),
    ("fragmentation", "source"): (_trace, lambda d, x: ["fragmentation", x]),
}
"""Input options that also take a folder (a folder of snapshots, a trace folder): probed in that shape too."""


def test_every_input_option_is_probed() -> None:
    """A new input option fails here until it has a probe (or says why its command reads no file)."""
    inputs = {(p, param.name) for p, c in commands() for param, k in path_params(c) if k.role in ("input", "inout")}
    probed = set(FILES) | set(FOLDERS) | set(NO_FILE_READ)
    assert inputs == probed, {"without a probe": inputs - probed, "stale": probed - inputs}


def special_cases() -> list[tuple[str, tuple[str, str], str]]:
    keys = sorted(set(FILES) | set(FOLDERS))
    return [(f"{c}:{p}-{how}", (c, p), how) for (c, p) in keys for how in SPECIALS] + [
        (f"{c}:{p}-folder-{how}", (c, p), how) for (c, p) in sorted(SHAPES) for how in SPECIALS
    ]


SPECIAL_CASES = special_cases()


@pytest.mark.slow
@pytest.mark.timeout(1200)  # one probe per case, each under 60 s; together a few minutes on 2 busy cores
def test_a_special_file_on_any_input_path_is_one_sentence(tmp_path: Path) -> None:
    """Every case (SPECIAL_CASES), each under the limits: one sentence, exit 2, nothing around it changed."""
    root = tmp_path
    probes = []
    for name, key, how in SPECIAL_CASES:
        d = root / name.replace(" ", "_").replace(":", "_")
        d.mkdir()
        if "-folder-" in name:
            build, argv = SHAPES[key]
            x = spoil(build(d), how)
            line = argv(d, str(x))
        elif key in FILES:
            file_name, argv = FILES[key]
            x = special(d, file_name, how)
            line = argv(d, str(x))
        else:
            build, argv = FOLDERS[key]
            x = spoil(build(d), how)
            line = argv(d, str(x))
        probes.append(Probe(name, line, cwd=d, root=d, outputs=(d / OUT,)))
    outcomes = run_probes(probes)
    assert_all({name: (lambda o=outcome: assert_refused(o)) for name, outcome in outcomes.items()})


# -- format probes -------------------------------------------------------------------------------------------------

SQLITE_COMMANDS = {
    "nsys summarize": lambda d, x: ["nsys", "summarize", x],
    "nsys import": lambda d, x: ["nsys", "import", x, "-o", str(d / OUT)],
    "calibrate": lambda d, x: ["calibrate", x, "-o", str(d / OUT)],
}
"""Every command whose input is an nsys export (FILES entries named *.sqlite)."""
PICKLE_COMMANDS = {
    "snapshot show": lambda d, x: ["snapshot", "show", x],
    "replay": lambda d, x: ["replay", x],
    "fragmentation": lambda d, x: ["fragmentation", x],
}
"""Every command whose input is a snapshot pickle (FILES entries named *.pickle)."""
VIEWS = ("CUDA_UM_GPU_PAGE_FAULT_EVENTS", "CUPTI_ACTIVITY_KIND_KERNEL", "StringIds", "NVTX_EVENTS")


def test_the_format_probes_cover_every_command_of_their_format() -> None:
    assert {c for (c, _), (name, _) in FILES.items() if name.endswith(".sqlite")} == set(SQLITE_COMMANDS)
    assert {c for (c, _), (name, _) in FILES.items() if name.endswith(".pickle")} == set(PICKLE_COMMANDS)


PICKLES: dict[str, tuple[Callable[[Path], Path], str]] = {
    "sparse-memo": (lambda d: H.sparse_memo_pickle(d, index=120_000_000), "memo slot"),
    "colliding-keys": (H.colliding_keys_pickle, "not a string"),
    "shared-events": (H.shared_events_pickle, "trace events"),
    "shared-strings": (H.shared_strings_pickle, "string of"),
}
"""Hostile snapshot pickles (tests/hostile_files.py) and the words of the limit that refuses each."""


def format_cases() -> list[tuple[str, Callable[[Path], Path], Callable[[Path, str], list[str]], str]]:
    cases = []
    for command, argv in SQLITE_COMMANDS.items():
        for table in VIEWS:
            for endless in (True, False):
                how = "endless" if endless else "40m"
                build = lambda d, t=table, e=endless: H.view_export(d, t, e)  # noqa: E731
                cases.append((f"{command}-view-{table}-{how}", build, argv, "defines a view"))
    cases.append(("nsys summarize-300MB-name", H.huge_string_export, SQLITE_COMMANDS["nsys summarize"], "longer than"))
    json_line = lambda d: H.sparse_json_line(d, "x.json", 240_000_000)  # noqa: E731 (a JSON export's string table)
    cases.append(("nsys summarize-240MB-json-line", json_line, SQLITE_COMMANDS["nsys summarize"], "longer than"))
    for command, argv in PICKLE_COMMANDS.items():
        for name, (build, words) in PICKLES.items():
            cases.append((f"{command}-{name}", build, argv, words))
    million = "grid:\n  workload: [alexnet]\n" + "".join(
        f"  sim.k{i}: [{', '.join(map(str, range(10)))}]\n" for i in range(6)
    )

    def big(d: Path) -> Path:
        (d / "big.yaml").write_text(million)
        return d / "big.yaml"

    for flags, words in ((["--max-configs", "1000000"], "100000"), ([], "1,000,000 configurations")):
        cases.append(
            (
                f"sweep-1M-dry-run{'-max-configs' if flags else ''}",
                big,
                lambda d, x, f=flags: ["sweep", x, "-o", str(d / OUT), *f, "--dry-run"],
                words,
            )
        )
    return cases


FORMAT_CASES = format_cases()


@pytest.mark.slow
@pytest.mark.timeout(1200)  # one probe per case, each under 60 s; together a few minutes on 2 busy cores
def test_a_hostile_file_of_a_known_format_is_refused_by_its_limit(tmp_path: Path) -> None:
    """Every case (FORMAT_CASES), each under the limits: refused by the limit that names it, in one sentence."""
    probes, words = [], {}
    for name, build, argv, limit_words in FORMAT_CASES:
        d = tmp_path / name
        d.mkdir()
        probes.append(Probe(name, argv(d, str(build(d))), cwd=d, root=d, outputs=(d / OUT,)))
        words[name] = limit_words
    outcomes = run_probes(probes)
    assert_all({name: (lambda o=outcome, w=words[name]: assert_refused(o, w)) for name, outcome in outcomes.items()})
    for d in tmp_path.iterdir():  # about 400 MB of hostile inputs; pytest keeps the folders of its last three runs
        shutil.rmtree(d, ignore_errors=True)


def test_a_dry_run_of_a_large_sweep_counts_and_shows_a_sample_without_expanding_it(tmp_path: Path) -> None:
    """100,000 configurations (the most --max-configs allows): the count and the first 1,000, in seconds."""
    many = "".join(f"  sim.k{i}: [{', '.join(map(str, range(10)))}]\n" for i in range(5))
    (tmp_path / "s.yaml").write_text("grid:\n  workload: [alexnet]\n" + many)
    probe = Probe(
        "dry-run-100k",
        ["sweep", str(tmp_path / "s.yaml"), "-o", str(tmp_path / OUT), "--max-configs", "100000", "--dry-run"],
        cwd=tmp_path,
        root=tmp_path,
    )
    outcome = run_probes([probe])["dry-run-100k"]
    assert outcome.code == 0, outcome.describe()
    assert "100,000 configurations" in outcome.stdout and "the first 1,000" in outcome.stdout
    assert not outcome.changed and not (tmp_path / OUT).exists()
