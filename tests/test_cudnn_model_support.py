"""tools/cudnn_model_support.py on ../shared/real-data/cudnn: the figures docs/estimate.md quotes ("Which workspace
model each real cuDNN data set supports")."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT.parent / "shared" / "real-data"


def _row(out: str, pattern: str) -> list[str]:
    """The fields of the one output line matching ``pattern`` (after its label)."""
    (line,) = [m for m in out.splitlines() if re.match(pattern, m)]
    return line.split()


@pytest.mark.skipif(not (REAL / "cudnn").is_dir(), reason="../shared/real-data/cudnn absent")
def test_the_tool_reproduces_the_documented_family_checks() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "cudnn_model_support.py"), str(REAL)],
        capture_output=True, text=True, check=True, timeout=600,
    ).stdout  # fmt: skip
    # non-fused Winograd: 158 of DLPerf's 185 layers exact; explicit GEMM: 5 of 5 logged calls exact at their size
    assert _row(out, r"DLPerf fastest +WINOGRAD_NONFUSED +winograd ")[-2:] == ["1.00", "158"]
    assert _row(out, r"AlexNet log forward +GEMM +gemm exact ")[-1] == "5"
    # the fastest engines' largest workspace is 2.8x the envelope's for VGG16 (median over batch and GPU)
    assert _row(out, r"DLPerf fastest \(benchmark\) +VGG16 +envelope ")[-3] == "0.36"
