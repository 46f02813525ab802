"""The architecture rules a linter cannot see: the simulator, nsys parser and reports never import torch."""

from __future__ import annotations

import subprocess
import sys


def test_sim_nsys_report_do_not_import_torch() -> None:
    code = (
        "import importlib, pkgutil, sys\n"
        "import uvmlab.sim, uvmlab.measure.nsys, uvmlab.report, uvmlab.stats\n"
        "for pkg in (uvmlab.sim, uvmlab.measure.nsys, uvmlab.report, uvmlab.stats):\n"
        "    for m in pkgutil.iter_modules(pkg.__path__):\n"
        "        importlib.import_module(f'{pkg.__name__}.{m.name}')\n"
        "import uvmlab.trace.schema\n"
        "sys.exit(1 if 'torch' in sys.modules else 0)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, f"torch was imported (transitively) by a torch-free layer: {proc.stderr}"


def test_cli_help_does_not_import_torch() -> None:
    code = "import sys\nfrom uvmlab.cli import cli\nsys.exit(1 if 'torch' in sys.modules else 0)\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, f"uvmlab --help would import torch: {proc.stderr}"
