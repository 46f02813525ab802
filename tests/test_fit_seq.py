"""``uvmlab estimate --max-seq-len`` (uvmlab.memory.fit_seq) agrees with a sweep of ``--seq-len``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from llm_tiny import tiny_config

from uvmlab.config import WorkloadConfig
from uvmlab.errors import InputError
from uvmlab.gpus import get_gpu
from uvmlab.memory.fit_seq import max_seq_len


@settings(max_examples=80, deadline=None)
@given(limit=st.integers(0, 20_000), step=st.sampled_from([1, 64, 100, 512]), positions=st.integers(256, 16_384))
def test_search_equals_the_sweep_for_any_threshold(limit: int, step: int, positions: int) -> None:
    """For any monotone verdict (fits up to ``limit`` tokens, refused beyond the model's positions) the search
    returns the largest multiple of ``step`` the sweep finds, probing about log2 of the range."""
    calls: list[int] = []

    def fake(cfg: WorkloadConfig, gpu: object, **kw: object) -> SimpleNamespace:
        n = cfg.options["seq_len"]
        calls.append(n)
        if n > positions:
            raise InputError(f"seq_len {n} exceeds the model's {positions} positions")
        return SimpleNamespace(oom=n > limit, device_peak_bytes=n)

    fit = max_seq_len(WorkloadConfig("gpt2"), get_gpu("A100-80GB"), step=step, estimate_fn=fake)
    sweep = [n for n in range(step, min(limit, positions) + 1, step)]
    assert fit.max_seq_len == (sweep[-1] if sweep else None)
    assert len(calls) <= 2 * (20_000 // step).bit_length() + 4


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama shared by the tests of this module (their captures are cached once)."""
    return tiny_config(tmp_path_factory.mktemp("seq"), "llama", num_hidden_layers=2, hidden_size=64,
                       intermediate_size=128, head_dim=16)  # fmt: skip


def test_max_seq_len_agrees_with_a_sweep_of_seq_len(small: Path) -> None:
    """The real estimate: the answer fits, the next step does not, and every estimate of a sweep of --seq-len
    below it fits (the verdict is monotone here)."""
    from uvmlab.memory.estimate import estimate

    folder = small
    cfg = WorkloadConfig(f"hf:{folder}", batch_size=4, iterations=1)
    gpu = get_gpu("A100-80GB", "700MiB")
    step = 512
    fit = max_seq_len(cfg, gpu, step=step)
    assert fit.max_seq_len is not None and 512 <= fit.max_seq_len < 4096
    verdicts = {}
    for n in range(step, fit.max_seq_len + 2 * step, step):
        verdicts[n] = not estimate(WorkloadConfig(**{**cfg.to_dict(), "options": {"seq_len": n}}), gpu).oom
    assert max(n for n, ok in verdicts.items() if ok) == fit.max_seq_len
    assert all(verdicts[n] for n in verdicts if n <= fit.max_seq_len)
    assert not verdicts[fit.max_seq_len + step]
    assert {p["seq_len"]: p["fits"] for p in fit.probes}.items() <= verdicts.items() | {
        (p["seq_len"], p["fits"]) for p in fit.probes if p["seq_len"] not in verdicts
    }


def test_cli_max_seq_len(small: Path) -> None:
    """The CLI prints the answer in JSON (from the captures the sweep cached); --seq-len with --max-seq-len, and a
    workload without seq_len, are one sentence and exit 2."""
    folder = small
    base = [sys.executable, "-m", "uvmlab", "estimate", f"hf:{folder}", "-b", "4", "-n", "1", "--gpu-memory", "700MiB"]
    out = subprocess.run([*base, "--max-seq-len", "--seq-len-step", "512", "--format", "json"], capture_output=True,
                         text=True, check=False)  # fmt: skip
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["max_seq_len"]["max_seq_len"] == d["config"]["options"]["seq_len"]
    assert d["fits"]
    bad = subprocess.run([*base, "--max-seq-len", "--seq-len", "1024"], capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "--seq-len" in bad.stderr
    bad = subprocess.run([sys.executable, "-m", "uvmlab", "estimate", "alexnet", "--max-seq-len"], capture_output=True,
                         text=True, check=False)  # fmt: skip
    assert bad.returncode == 2 and "seq_len" in bad.stderr
