"""The frozen configs check their inputs as strictly as the CLI: a Python caller gets the same normalised values
(``pca="off"`` is False) and the same one-sentence errors naming the parameter (issue 29)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from uvmlab.config import RunConfig, WorkloadConfig, parse_on_off
from uvmlab.errors import InputError

WL = WorkloadConfig("gpt2")


@pytest.mark.parametrize(
    ("given", "expected"),
    [(True, True), (False, False), ("on", True), ("off", False), ("OFF", False), (" On ", True), ("true", True),
     ("false", False), ("yes", True), ("no", False), ("1", True), ("0", False)],
)  # fmt: skip
def test_pca_spellings_are_normalised(given: Any, expected: bool) -> None:
    cfg = RunConfig(WL, oversub=4, pca=given)
    assert cfg.pca is expected
    assert cfg.config_hash() == RunConfig(WL, oversub=4, pca=expected).config_hash()
    assert RunConfig(WL, prefetch=given).prefetch is expected


@pytest.mark.parametrize("bad", ["maybe", "", None, 1, 0, 2.0, [True]])
def test_pca_refuses_anything_else_naming_the_parameter(bad: Any) -> None:
    with pytest.raises(InputError, match=r"^pca takes on or off"):
        RunConfig(WL, pca=bad)
    assert parse_on_off("--pca", "off") is False


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"oversub": True}, "oversubscription factor"),
        ({"oversub": "four"}, "oversubscription factor"),
        ({"mode": None}, "mode must be one of sim, gpu, auto"),
        ({"gpu": "B200-999"}, "unknown GPU 'B200-999'; known GPUs: A100-80GB"),
        ({"gpu": 80}, "gpu must be a GPU name"),
        ({"gpu_memory_bytes": 1.5}, "gpu_memory_bytes must be a whole number of bytes"),
        ({"gpu_memory_bytes": -1}, "gpu_memory_bytes must be a whole number of bytes"),
        ({"sim_options": ["prefetch_threshold=51"]}, "sim_options must be a mapping"),
        ({"policy": 7}, "policy must be a policy name"),
        ({"params_file": 3}, "params_file must be a file path"),
        ({"workload": "gpt2"}, "workload must be a WorkloadConfig"),
    ],
)
def test_run_config_refuses_what_the_cli_refuses(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError, match=message):
        RunConfig(**{"workload": WL, **kw})


def test_run_config_normalises_sizes_and_paths() -> None:
    cfg = RunConfig(WL, gpu_memory_bytes="40GiB", params_file=Path("p.json"))
    assert cfg.gpu_memory_bytes == 40 << 30 and cfg.params_file == "p.json"


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"workload": 5}, "workload must be a workload name or a file path"),
        ({"workload": ""}, "workload must be a workload name or a file path"),
        ({"optimizer": None}, "optimizer must be one of sgd, adam, adamw"),
        ({"options": "seq_len=8"}, "options must be a mapping"),
    ],
)
def test_workload_config_refuses_wrong_types(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError, match=message):
        WorkloadConfig(**{"workload": "gpt2", **kw})
    assert WorkloadConfig(Path("docs/examples/tiny_mlp.py")).workload == "docs/examples/tiny_mlp.py"


def test_an_unknown_policy_is_one_sentence_where_it_is_resolved(tmp_path: Path) -> None:
    """The config keeps the name (the catalogue lives above it, uvmlab.advise); the run refuses it before it runs."""
    from uvmlab import api

    cfg = RunConfig(WL, policy="no-such-policy", mode="sim")
    with pytest.raises(InputError, match="unknown policy 'no-such-policy'"):
        api.run(cfg, out=tmp_path / "r")
    assert not (tmp_path / "r").exists()
