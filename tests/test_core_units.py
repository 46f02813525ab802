"""Byte parsing/formatting, atomic writes, configs and GPU lookup: the rules every command relies on."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from uvmlab.config import RunConfig, WorkloadConfig, check_oversub
from uvmlab.errors import InputError
from uvmlab.files.atomic import atomic_write_json, atomic_write_text
from uvmlab.files.rundir import RunDir
from uvmlab.gpus import GPUS, get_gpu
from uvmlab.units import GiB, KiB, MiB, format_bytes, parse_bytes


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4096", 4096),  # plain bytes
        ("512MiB", 512 * MiB),  # binary suffix
        ("80GiB", 80 * GiB),
        ("1.5 GB", 1_500_000_000),  # decimal suffix, space allowed
        ("2kib", 2 * KiB),  # case-insensitive
        (1024, 1024),  # numbers pass through
    ],
)
def test_parse_bytes(text: str | int, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("bad", ["", "abc", "12 parsecs", "-5MiB", "1..2GB"])
def test_parse_bytes_rejects_nonsense(bad: str) -> None:
    with pytest.raises(InputError):
        parse_bytes(bad)


def test_format_bytes_units_and_not_collected() -> None:
    assert format_bytes(0) == "0 B"
    assert format_bytes(1536) == "1.50 KiB"
    assert format_bytes(3 * GiB) == "3.00 GiB"
    assert format_bytes(None) == "n/a"
    assert format_bytes(float("nan")) == "n/a"


@pytest.mark.parametrize("factor", [0, -1, "abc", float("nan"), float("inf"), 1e9])
def test_oversub_rejects_impossible_factors(factor: object) -> None:
    with pytest.raises(InputError, match="oversubscription factor"):
        check_oversub(factor)  # type: ignore[arg-type]


@pytest.mark.parametrize("factor", [0.5, 1, 1.25, 10])
def test_oversub_accepts_any_positive_factor(factor: float) -> None:
    assert check_oversub(factor) == pytest.approx(factor)


def test_workload_config_validates_at_the_boundary() -> None:
    with pytest.raises(InputError, match="batch size"):
        WorkloadConfig("gpt2", batch_size=0)
    with pytest.raises(InputError, match="optimizer must be one of"):
        WorkloadConfig("gpt2", optimizer="lamb")
    with pytest.raises(InputError, match="iterations"):
        WorkloadConfig("gpt2", iterations=0)


def test_run_config_round_trip_and_stable_hash() -> None:
    cfg = RunConfig(WorkloadConfig("gpt2", batch_size=8), oversub=4, pca=False, mode="sim")
    back = RunConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert back == cfg
    assert back.config_hash() == cfg.config_hash()
    other = RunConfig(WorkloadConfig("gpt2", batch_size=8), oversub=4, pca=True, mode="sim")
    assert other.config_hash() != cfg.config_hash()


def test_run_config_rejects_unknown_keys_naming_known_ones() -> None:
    d = RunConfig(WorkloadConfig("gpt2")).to_dict()
    d["oversubscription"] = 2
    with pytest.raises(InputError, match="known keys"):
        RunConfig.from_dict(d)


def test_gpu_lookup() -> None:
    assert get_gpu("a100-80gb").memory_bytes == 80 * GiB
    assert get_gpu("A100-80GB", memory="40GiB").memory_bytes == 40 * GiB
    with pytest.raises(InputError, match="known GPUs"):
        get_gpu("B9000")
    for spec in GPUS.values():
        assert spec.usable_bytes > 0
        assert spec.link_bytes_per_s < spec.hbm_bytes_per_s


def test_atomic_write_replaces_whole_files(tmp_path) -> None:
    path = tmp_path / "sub" / "x.json"
    atomic_write_json(path, {"a": 1, "nan": math.nan})
    assert json.loads(path.read_text()) == {"a": 1, "nan": None}  # NaN (not collected) becomes null
    atomic_write_text(path, "new")
    assert path.read_text() == "new"
    assert [p.name for p in path.parent.iterdir()] == ["x.json"]  # no temp files left behind


def test_atomic_write_failure_leaves_old_file(tmp_path) -> None:
    path = tmp_path / "r.json"
    atomic_write_json(path, {"v": 1})
    with pytest.raises(TypeError):
        atomic_write_json(path, {"v": object()})
    assert json.loads(path.read_text()) == {"v": 1}
    assert len(list(tmp_path.iterdir())) == 1


def test_rundir_complete_only_after_result_and_refuses_overwrite(tmp_path) -> None:
    rd = RunDir(tmp_path / "run")
    rd.prepare()
    rd.write_table("iterations", pd.DataFrame({"iteration": [0, 1]}))
    assert not rd.is_complete()
    rd.write_json(rd.result_json, {"outcome": "ok"})
    assert rd.is_complete()
    with pytest.raises(InputError, match="--force"):
        rd.prepare()
    rd.prepare(force=True)
    assert not rd.is_complete()
    with pytest.raises(InputError, match="no table"):
        rd.read_table("iterations")


def test_atomic_files_get_normal_permissions(tmp_path) -> None:
    import os
    import stat

    path = tmp_path / "shared.json"
    atomic_write_json(path, {})
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask
