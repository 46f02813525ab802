"""What the commands print: complete tables when stdout is not a terminal, CSV, no markup eaten, one -o spelling."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from uvmlab import console
from uvmlab.cli import cli, main
from uvmlab.console import markdown_table, note, print_csv, print_table, table_key

REPO = Path(__file__).resolve().parents[1]
LONG = "uvmlab-nocache-with-a-very-long-estimator-name-" + "x" * 90  # wider than any 80-column fallback


def _uvmlab(*args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    """Run the CLI with stdout and stderr piped (not a terminal), as in a CI or Slurm log."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "80"}
    return subprocess.run(
        [sys.executable, "-m", "uvmlab", *args], capture_output=True, text=True, timeout=timeout, env=env
    )


# -- tables -------------------------------------------------------------------------------------------------------
def test_piped_table_is_markdown_with_every_cell_whole(capsys: pytest.CaptureFixture[str]) -> None:
    print_table("Estimators", ["estimator", "MRE"], [[LONG, 0.25], ["uvmlab-pca", None]])
    text = capsys.readouterr().out
    assert LONG in text and "…" not in text
    lines = text.splitlines()
    assert lines[:2] == ["", "Estimators"]
    assert lines[3].startswith("| estimator") and lines[4].startswith("|:--") and lines[4].endswith("-:|")
    row = next(ln for ln in lines if "uvmlab-pca" in ln)
    assert row.split("|")[2].strip() == "n/a"


def _terminal(monkeypatch: pytest.MonkeyPatch, width: int) -> io.StringIO:
    """Point uvmlab's stdout console at a terminal of ``width`` columns for this test; return its text buffer."""
    buf = io.StringIO()
    term = Console(file=buf, force_terminal=True, width=width, markup=False, color_system=None)
    monkeypatch.setattr(console, "out", term)
    return buf


def test_terminal_table_folds_instead_of_cutting(monkeypatch: pytest.MonkeyPatch) -> None:
    buf = _terminal(monkeypatch, 60)
    print_table("t", ["estimator", "MRE"], [[LONG, 0.25]])
    first_column = "".join(ln.split("│")[1].strip() for ln in buf.getvalue().splitlines() if ln.startswith("│"))
    assert "…" not in buf.getvalue() and first_column == LONG


def test_markdown_table_escapes_pipes() -> None:
    text = markdown_table("t", ["a|b"], [["x|y"]], [False])
    assert "a\\|b" in text and "x\\|y" in text


def test_table_keys_drop_paths_and_counts() -> None:
    assert table_key("Attribution over 5,012 kernels (time overlap)") == "attribution"
    assert table_key("Per kernel (name; first 20 of 300)") == "per_kernel"
    assert table_key("Totals: A = /x/run_a, B = /y/run_b") == "totals"


def test_csv_one_table_and_several_wide() -> None:
    buf = io.StringIO()
    print_csv(("t", ["a", "b"], [[1, None], [2, 3.5]]), file=buf)
    assert list(csv.reader(io.StringIO(buf.getvalue()))) == [["a", "b"], ["1", ""], ["2", "3.5"]]
    buf = io.StringIO()
    print_csv([("Page faults", ["figure", "count"], [["gpu", 4]]), ("Per iteration", ["iteration", "count"], [[0, 2]])],
              file=buf)  # fmt: skip
    rows = list(csv.DictReader(io.StringIO(buf.getvalue())))
    assert rows == [
        {"table": "page_faults", "figure": "gpu", "count": "4", "iteration": ""},
        {"table": "per_iteration", "figure": "", "count": "2", "iteration": "0"},
    ]


# -- markup -------------------------------------------------------------------------------------------------------
def test_notes_and_cells_keep_square_brackets(capsys: pytest.CaptureFixture[str]) -> None:
    note("the NVML Python bindings are not installed: pip install 'uvmlab[gpu]' [bold]x[/bold]")
    print_table("[red]t[/red]", ["[b]c[/b]"], [["pip install 'uvmlab[gpu]'"]])
    captured = capsys.readouterr()
    assert "pip install 'uvmlab[gpu]' [bold]x[/bold]" in captured.err
    assert "pip install 'uvmlab[gpu]'" in captured.out and "[red]t[/red]" in captured.out


def test_terminal_console_keeps_square_brackets(monkeypatch: pytest.MonkeyPatch) -> None:
    buf = _terminal(monkeypatch, 100)
    print_table("t", ["k"], [["pip install 'uvmlab[gpu]'"]])
    console.say("[gpu] stays")
    assert "uvmlab[gpu]" in buf.getvalue() and "[gpu] stays" in buf.getvalue()


def test_doctor_piped_shows_the_pip_extra() -> None:
    proc = _uvmlab("doctor")
    assert proc.returncode == 0, proc.stderr
    if "not installed" in proc.stdout:  # this machine lacks nvidia-ml-py or cupy
        assert "pip install 'uvmlab[gpu]'" in proc.stdout


# -- commands, piped ----------------------------------------------------------------------------------------------
def test_workloads_is_fast_and_piped_complete() -> None:
    proc = _uvmlab("workloads")
    assert proc.returncode == 0, proc.stderr
    assert "…" not in proc.stdout
    from workloads.registry import WORKLOADS

    for name, spec in WORKLOADS.items():
        assert name in proc.stdout and spec.description in proc.stdout
    code = "import sys; from uvmlab.cli import main; main(['workloads', '--format', 'csv']); "
    code += "sys.exit(1 if 'torch' in sys.modules else 0)"
    listing = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ})
    assert listing.returncode == 0, "listing workloads imported torch"
    rows = list(csv.DictReader(io.StringIO(listing.stdout)))
    assert {r["name"] for r in rows} == set(WORKLOADS) and all(r["parameters"] == "" for r in rows)


def test_compare_piped_and_csv(tmp_path: Path) -> None:
    from test_compare_runs import make_run

    names = [f"a_kernel_with_a_long_name_{i}_" + "y" * 60 for i in range(4)]
    a = make_run(tmp_path / "a", pca=True, faults=[1, 2, 3, 4], names=names, fp=10 << 20)
    b = make_run(tmp_path / "b", pca=False, faults=[2, 2, 3, 8], names=names, fp=20 << 20)
    proc = _uvmlab("compare", str(a.path), str(b.path))
    assert proc.returncode == 0, proc.stderr
    assert "…" not in proc.stdout
    assert all(n in proc.stdout for n in names) and "fault_count_rel_error" in proc.stdout
    proc = _uvmlab("compare", str(a.path), str(b.path), "--format", "csv")
    assert proc.returncode == 0, proc.stderr
    rows = list(csv.DictReader(io.StringIO(proc.stdout)))
    assert {"totals", "footprint", "per_iteration", "per_kernel"} <= {r["table"] for r in rows}
    assert sum(r["table"] == "per_kernel" for r in rows) == 4


@pytest.mark.real_data
def test_nsys_summarize_csv_is_wide_without_the_path(real_data: Path) -> None:
    f = real_data / "nsys" / "cudamicrobench_gh200_um_gpu_faults_nsys2023.4.4.sqlite"
    if not f.is_file():
        pytest.skip(f"{f.name} missing from real data")
    proc = _uvmlab("nsys", "summarize", str(f), "--format", "csv")
    assert proc.returncode == 0, proc.stderr
    rows = list(csv.DictReader(io.StringIO(proc.stdout)))
    tables = {r["table"] for r in rows}
    assert "export" in tables and "page_faults" in tables and not any(str(f) in t for t in tables)
    assert "row" not in rows[0] and "column" not in rows[0]  # one row per entity, not one per cell
    proc = _uvmlab("nsys", "summarize", str(f), "--format", "csv", "--table", "page_faults")
    head = next(csv.reader(io.StringIO(proc.stdout)))
    assert head == ["figure", "count"]
    table = _uvmlab("nsys", "summarize", str(f))
    assert str(f) in table.stdout and "…" not in table.stdout


# -- options ------------------------------------------------------------------------------------------------------
def _walk(group: object, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], object]]:
    import click

    found = []
    for name, cmd in getattr(group, "commands", {}).items():
        found.append(((*prefix, name), cmd))
        if isinstance(cmd, click.Group):
            found += _walk(cmd, (*prefix, name))
    return found


def test_output_option_is_spelled_out_everywhere() -> None:
    import click

    for path, cmd in _walk(cli):
        for p in getattr(cmd, "params", []):
            if isinstance(p, click.Option) and ("-o" in p.opts or "--output" in p.opts or "--out" in p.opts):
                assert "-o" in p.opts and "--out" in p.opts and "--output" in p.opts, (path, p.opts)
                record = p.get_help_record(click.Context(cmd))
                assert record is not None and "--output" not in record[0], (path, record)


def test_every_table_command_takes_format_json() -> None:
    import click

    for path, cmd in _walk(cli):
        if isinstance(cmd, click.Group) or (path[0] in ("shim",) and path[-1] in ("build", "path")):
            continue
        fmt = next((p for p in cmd.params if p.name == "fmt"), None)
        assert fmt is not None, f"uvmlab {' '.join(path)} has no --format"
        assert {"table", "json"} <= set(fmt.type.choices), path


def test_run_help_explains_the_default_directory(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "runs/<workload>-x<F>-pca<on|off>[-<policy>]-<hash>" in text and "SHA-256" in text


def test_output_alias_still_works(tmp_path: Path) -> None:
    from test_compare_runs import make_run

    a = make_run(tmp_path / "a", pca=True, faults=[1, 2], names=["k0", "k1"], fp=1 << 20)
    b = make_run(tmp_path / "b", pca=False, faults=[2, 2], names=["k0", "k1"], fp=2 << 20)
    assert main(["compare", str(a.path), str(b.path), "--output", str(tmp_path / "cmp"), "--format", "json"]) == 0
    assert (tmp_path / "cmp" / "comparison.json").is_file()


def test_gen_cli_docs_help_writes_nothing(tmp_path: Path) -> None:
    doc = REPO / "docs" / "cli.md"
    before = doc.stat().st_mtime_ns, doc.read_bytes()
    for args in (["--help"], ["--no-such-flag"]):
        proc = subprocess.run(
            [sys.executable, str(REPO / "tools" / "gen_cli_docs.py"), *args], capture_output=True, text=True
        )
        assert proc.returncode in (0, 2), proc.stderr
    assert "usage: gen_cli_docs.py" in proc.stderr or "usage" in proc.stdout
    assert (doc.stat().st_mtime_ns, doc.read_bytes()) == before


def test_gpus_lists_known_models_and_detection(capsys: pytest.CaptureFixture[str]) -> None:
    from uvmlab.gpus import GPUS

    assert main(["gpus", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [g["name"] for g in doc["known"]] == list(GPUS)
    assert [g["name"] for g in doc["known"] if g["default"]] == ["A100-80GB"]
    assert isinstance(doc["detected"]["available"], bool)
    assert doc["detected"]["available"] or doc["detected"]["reason"]


def test_detected_name_maps_to_a_known_model() -> None:
    from uvmlab.gpus import known_gpu as _known_match

    assert _known_match("NVIDIA A100 80GB PCIe") == "A100-80GB"
    assert _known_match("NVIDIA A100-SXM4-40GB") == "A100-40GB"
    assert _known_match("NVIDIA B200") is None  # not a known model: no guess
    assert _known_match("NVIDIA H100 PCIe") == "H100-PCIe"
    assert _known_match("Tesla T4") == "T4"
    assert _known_match(None) is None


def test_auto_mode_note_keeps_the_pip_extra(tmp_path: Path) -> None:
    tiny = str(REPO / "docs" / "examples" / "tiny_mlp.py")
    env_args = ["--option", "hidden=256", "--batch-size", "8", "--iterations", "2", "--format", "json"]
    proc = _uvmlab("run", tiny, *env_args, "--mode", "auto", "-o", str(tmp_path / "r"))
    assert proc.returncode == 0, proc.stderr
    assert "running the simulator" in proc.stderr
    if "NVML Python bindings" in proc.stderr:  # the machine lacks nvidia-ml-py: the note names the pip extra
        assert "pip install 'uvmlab[gpu]'" in proc.stderr


def test_terms_are_explained(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, words in (
        (["trace", "show", "--help"], ["Terms:", "event N", "accesses"]),
        (["replay", "--help"], ["Terms:", "blocks inferred", "empty_cache bursts"]),
        (["snapshot", "show", "--help"], ["Terms:", "format G1..G6", "segments"]),
    ):
        assert main(argv) == 0
        text = capsys.readouterr().out
        assert all(w in text for w in words), (argv, words)


def test_fragmentation_plan_line_says_what_none_means() -> None:
    from types import SimpleNamespace

    from uvmlab.cli.eval_cmds import _plan_words

    words = _plan_words(SimpleNamespace(grouping="none", n_groups=3393, n_fusions=0))
    assert words == "no grouping (one group per request), 3,393 groups, 0 fusions of groups"
    assert "plan: none" not in words


def test_calibrate_shows_where_a_null_parameter_comes_from() -> None:
    from uvmlab.cli.nsys_cmds import _param_rows

    doc = {"params": {"zero_fill_bytes_per_s": None, "link_bytes_per_s": 2e10, "evict_fixed_ns": 5.0},
           "fitted": ["link_bytes_per_s"]}  # fmt: skip
    rows = {name: (value, source) for name, value, source in _param_rows(doc)}
    assert rows["zero_fill_bytes_per_s"][0] is None and "HBM bandwidth" in rows["zero_fill_bytes_per_s"][1]
    assert rows["link_bytes_per_s"] == (2e10, "fitted") and rows["evict_fixed_ns"] == (5.0, "set by the file")
    assert rows["fault_entry_ns"] == ("", "the run GPU's profile (not in the file)")  # issue 42: not a default
