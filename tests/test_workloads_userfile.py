"""User workload files: cache key without import, the same file by another path, failures in one sentence."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import uvmlab.trace.capture as capture_mod
from uvmlab.cli import main
from uvmlab.config import WorkloadConfig
from uvmlab.trace import cache

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "docs" / "examples" / "tiny_mlp.py"

BROKEN = {
    "import": ('raise ValueError("bad module")\n', "failed while importing it: ValueError: bad module"),
    "build": (
        "def build(cfg, device, options):\n    raise RuntimeError('no model\\nsecond line')\n",
        "failed while building its model: RuntimeError: no model",
    ),
    "optimizer": (
        "import torch\nfrom workloads.base import Workload\n\n\ndef build(cfg, device, options):\n"
        "    dev = torch.device(device)\n"
        "    batch = lambda: torch.ones(2, device=dev)\n"
        "    return Workload('relu', torch.nn.ReLU(), batch, lambda m, x: m(x).sum(), dev)\n",
        "failed while building its optimizer: ValueError: optimizer got an empty parameter list",
    ),
    "forward": (
        EXAMPLE.read_text().replace("return F.cross_entropy(m(b[0]), b[1])", "raise KeyError('oops')"),
        "failed while running its forward phase (iteration 0): KeyError: 'oops'",
    ),
    "backward": (
        EXAMPLE.read_text().replace(
            "return F.cross_entropy(m(b[0]), b[1])", "return F.cross_entropy(m(b[0]), b[1]).detach()"
        ),
        "failed while running its backward phase (iteration 0): RuntimeError: element 0 of tensors",
    ),
}


@pytest.mark.parametrize("phase", list(BROKEN))
def test_a_failing_user_model_is_one_sentence_exit_2(
    phase: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text, message = BROKEN[phase]
    f = tmp_path / f"broken_{phase}.py"
    f.write_text(text)
    assert main(["estimate", str(f), "-n", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"uvmlab: error: workload file {f.resolve()} "), err
    assert message in err, err
    assert "Traceback" not in err and len(err.splitlines()) == 1


def test_a_failing_user_model_in_a_fresh_process_has_no_traceback(tmp_path: Path) -> None:
    """The real entry point (python -m uvmlab): exit 2, one line on stderr, nothing on stdout."""
    f = tmp_path / "inception_at_224.py"
    f.write_text(BROKEN["build"][0])
    env = {**os.environ, "PYTHONPATH": str(REPO), "UVMLAB_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run(
        [sys.executable, "-m", "uvmlab", "estimate", str(f)], capture_output=True, text=True, env=env, check=False
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        f"uvmlab: error: workload file {f.resolve()} failed while building its model: RuntimeError: no model"
    ]


def test_named_model_failures_are_input_errors(capsys: pytest.CaptureFixture[str]) -> None:
    """Inception v3 at 224 px fails in its auxiliary head: one sentence naming the model and phase."""
    argv = ["estimate", "torchvision:inception_v3", "--image-size", "224", "-b", "2", "-n", "1"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "torchvision:inception_v3 failed while running its forward phase (iteration 0): RuntimeError" in err
    assert "Traceback" not in err


def test_cache_key_imports_nothing_and_ignores_how_the_file_is_named(tmp_path: Path, monkeypatch) -> None:
    copy = tmp_path / "mlp.py"
    copy.write_text(EXAMPLE.read_text())
    link = tmp_path / "link.py"
    link.symlink_to(copy)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x").mkdir()
    keys = {cache.cache_key(WorkloadConfig(p, batch_size=4)) for p in ("mlp.py", str(copy), "./x/../mlp.py", "link.py")}
    assert len(keys) == 1
    other = cache.cache_key(WorkloadConfig(str(EXAMPLE), batch_size=4))
    assert other not in keys  # same bytes, another resolved path
    copy.write_text(EXAMPLE.read_text() + "\n# edited\n")
    assert cache.cache_key(WorkloadConfig("mlp.py", batch_size=4)) not in keys  # content is part of the key
    probe = (
        "import sys; from uvmlab.config import WorkloadConfig; from uvmlab.trace.cache import cache_key; "
        f"cache_key(WorkloadConfig({str(copy)!r})); cache_key(WorkloadConfig('torchvision:vgg16')); "
        "cache_key(WorkloadConfig('hf:llama-3.2-1b')); "
        "bad = [m for m in ('torch', 'torchvision', 'transformers', 'timm') if m in sys.modules]; "
        "assert not bad and not any(m.startswith('uvmlab_user_workload') for m in sys.modules), bad"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-c", probe], check=True, env=env)


def test_warm_estimate_of_a_user_file_does_not_import_torch(tmp_path: Path, monkeypatch) -> None:
    f = tmp_path / "mlp.py"
    f.write_text(EXAMPLE.read_text())
    env = {**os.environ, "PYTHONPATH": str(REPO), "UVMLAB_CACHE": str(tmp_path / "cache")}
    cmd = ["estimate", str(f), "-b", "4", "-n", "1", "--format", "json"]
    subprocess.run([sys.executable, "-m", "uvmlab", *cmd], check=True, env=env, capture_output=True)
    probe = (
        f"import sys; from uvmlab.cli import main; assert main({cmd!r}) == 0; "
        "assert 'torch' not in sys.modules, 'torch imported on a warm hit'"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=False, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr


def test_the_same_file_by_another_path_is_not_captured_again(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("UVMLAB_CACHE", str(tmp_path / "cache"))
    calls: list[str] = []
    real = capture_mod.capture_trace

    def counting(cfg, *a, **k):
        calls.append(cfg.workload)
        return real(cfg, *a, **k)

    monkeypatch.setattr(capture_mod, "capture_trace", counting)
    f = tmp_path / "mlp.py"
    f.write_text(EXAMPLE.read_text())
    monkeypatch.chdir(tmp_path)
    for name in (str(f), "mlp.py", "./mlp.py"):
        cache.get_trace(WorkloadConfig(name, batch_size=4, iterations=1))
    assert calls == [str(f)]
