"""Sweep specs: expansion of grid/include/exclude, and errors that name the line and the field before any run."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from uvmlab.cli import main
from uvmlab.errors import InputError
from uvmlab.sweep.spec import load_spec, parse_spec

REPO = Path(__file__).resolve().parents[1]


def spec(text: str) -> str:
    return textwrap.dedent(text).lstrip()


GRID_SPEC = spec("""
    version: 1
    name: t
    defaults: {mode: sim, iterations: 1}
    grid:
      workload: [{workload: alexnet, batch_size: 2}, gpt2]
      oversub: [1.0, 2]
      pca: [on, off]
    include:
      - {workload: bert, oversub: [3, 4], pca: on, sim.prefetch_threshold: 51}
    exclude:
      - {workload: gpt2, oversub: 2}
    """)


def test_grid_include_exclude_expand_in_order() -> None:
    s = parse_spec(GRID_SPEC)
    # 2 workloads x 2 factors x 2 PCA = 8, minus gpt2@2 (2 runs), plus 2 included
    assert len(s.configs) == 8
    first = s.configs[0]
    assert (first.workload.workload, first.workload.batch_size, first.oversub, first.pca) == ("alexnet", 2, 1.0, True)
    assert all(not (c.workload.workload == "gpt2" and c.oversub == 2) for c in s.configs)
    bert = [c for c in s.configs if c.workload.workload == "bert"]
    assert [c.oversub for c in bert] == [3.0, 4.0]
    assert bert[0].sim_options == {"prefetch_threshold": 51}
    assert all(c.mode == "sim" and c.workload.iterations == 1 for c in s.configs)
    # deterministic: same text, same hashes in the same order
    again = parse_spec(GRID_SPEC)
    assert [c.config_hash() for c in s.configs] == [c.config_hash() for c in again.configs]


def test_duplicates_are_kept_once() -> None:
    s = parse_spec("grid: {workload: [alexnet], oversub: [2, 2.0]}\ninclude: [{workload: alexnet, oversub: 2}]\n")
    assert len(s.configs) == 1
    assert s.duplicates == 2


def test_seed_study_spec() -> None:
    s = load_spec(REPO / "experiments" / "lin_jeon_2025.yaml")
    assert len(s.configs) == 6 * 10 * 2
    batch = {c.workload.workload: c.workload.batch_size for c in s.configs}
    assert batch == {"alexnet": 128, "resnet50": 32, "resnet101": 32, "gpt2": 8, "bert": 16, "whisper-small": 16}
    assert sorted({c.oversub for c in s.configs}) == [1.0, 1.25, 1.5, 2, 3, 4, 5, 6, 8, 10]
    assert {c.pca for c in s.configs} == {True, False}
    assert {c.mode for c in s.configs} == {"sim"}
    assert len({c.config_hash() for c in s.configs}) == 120


def test_smoke_spec() -> None:
    s = load_spec(REPO / "experiments" / "smoke.yaml")
    assert len(s.configs) == 4


@pytest.mark.parametrize(
    ("text", "line", "needles"),
    [
        ("grid:\n  workload: [alexnet, alexnett]\n", 2, ["grid.workload", "unknown workload 'alexnett'", "gpt2"]),
        ("grid:\n  workload: [alexnet]\n  oversub: [1.0,\n    0]\n", 4, ["grid.oversub", "> 0"]),
        ("grid:\n  workload: [alexnet]\n  oversub: [-2]\n", 3, ["grid.oversub", "> 0"]),
        ("grid:\n  workload: [alexnet]\n  oversubb: [2]\n", 3, ["grid.oversubb", "unknown field", "oversub"]),
        ("defaults:\n  mode: sim\n  batchsize: 4\ngrid: {workload: [gpt2]}\n", 3, ["defaults.batchsize", "batch_size"]),
        ("grid: {workload: [gpt2]}\nslurm:\n  partitoin: gpu\n", 3, ["slurm.partitoin", "partition"]),
        ("grid: {workload: [gpt2]}\ngrdi: {}\n", 2, ["grdi", "unknown section", "grid"]),
        ("grid:\n  workload:\n    - {workload: gpt2, batch_size: 0}\n", 3, ["batch_size", ">= 1"]),
        ("grid:\n  workload: [gpt2]\n  pca: [maybe]\n", 3, ["grid.pca", "on/off"]),
        ("grid:\n  workload: [gpt2]\n  oversub: []\n", 3, ["grid.oversub", "empty"]),
        ("grid: {workload: [gpt2]}\nexclude:\n  - {wrkload: gpt2}\n", 3, ["exclude[0].wrkload", "unknown field"]),
        ("version: 2\ngrid: {workload: [gpt2]}\n", 1, ["version", "must be 1"]),
        ("grid:\n  workload: [gpt2\n", 3, ["not valid YAML"]),
    ],
)
def test_errors_name_line_and_field(text: str, line: int, needles: list[str]) -> None:
    with pytest.raises(InputError) as info:
        parse_spec(text, source="s.yaml")
    message = str(info.value)
    assert message.startswith(f"s.yaml line {line}"), message
    for needle in needles:
        assert needle in message, message


def test_no_configurations() -> None:
    with pytest.raises(InputError, match="no configurations"):
        parse_spec("name: x\n")
    with pytest.raises(InputError, match="every configuration is excluded"):
        parse_spec("grid: {workload: [gpt2]}\nexclude: [{workload: gpt2}]\n")


def test_user_workload_file_resolved_against_spec(tmp_path: Path) -> None:
    (tmp_path / "mlp.py").write_text("# a user workload file\n")
    (tmp_path / "s.yaml").write_text("grid: {workload: [mlp.py]}\n")
    s = load_spec(tmp_path / "s.yaml")
    assert s.configs[0].workload.workload == str((tmp_path / "mlp.py").resolve())
    (tmp_path / "bad.yaml").write_text("grid:\n  workload: [missing.py]\n")
    with pytest.raises(InputError, match=r"line 2, grid.workload: workload file .* does not exist"):
        load_spec(tmp_path / "bad.yaml")


def test_cli_rejects_bad_spec_before_any_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("grid:\n  workload: [alexnet]\n  oversub: [2, 0]\n")
    out = tmp_path / "out"
    assert main(["sweep", str(bad), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "line 3, grid.oversub" in err
    assert "Traceback" not in err
    assert not out.exists(), "nothing may be created before the spec is valid"
    assert main(["sweep", str(tmp_path / "nope.yaml"), "-o", str(out)]) == 2


@settings(max_examples=25, deadline=None)
@given(
    factors=st.lists(st.floats(min_value=0.5, max_value=20, allow_nan=False), min_size=1, max_size=5, unique=True),
    pcas=st.sampled_from([["on"], ["off"], ["on", "off"]]),
    workloads=st.lists(st.sampled_from(["alexnet", "gpt2", "bert"]), min_size=1, max_size=3, unique=True),
)
def test_grid_size_is_the_product(factors: list[float], pcas: list[str], workloads: list[str]) -> None:
    text = f"grid:\n  workload: {workloads}\n  oversub: {factors}\n  pca: [{', '.join(pcas)}]\n"
    s = parse_spec(text)
    assert len(s.configs) == len(factors) * len(pcas) * len(workloads)
    assert len({c.config_hash() for c in s.configs}) == len(s.configs)


def test_named_models_are_sweepable(tmp_path) -> None:
    """torchvision:/timm:/hf: names pass the spec's workload check (the model itself is built at run time)."""
    spec = tmp_path / "s.yaml"
    spec.write_text("grid:\n  workload: [torchvision:vgg11, hf:gpt2-medium]\n  oversub: [2]\n")
    assert [c.workload.workload for c in load_spec(spec).configs] == ["torchvision:vgg11", "hf:gpt2-medium"]
