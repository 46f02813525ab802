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


def _module_imports() -> tuple[dict[str, set[str]], list[tuple[str, str]]]:
    """uvmlab's modules -> the uvmlab modules they import at module level (what an import circle is made of), and
    every (module, name) pair importing a private name (``_x``) from another uvmlab module, at any level."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "uvmlab"
    files = {
        ".".join(p.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__"): p
        for p in root.rglob("*.py")
    }
    graph: dict[str, set[str]] = {m: set() for m in files}
    private: list[tuple[str, str]] = []
    for mod, path in files.items():
        tree = ast.parse(path.read_text())
        top = set(map(id, tree.body))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("uvmlab"):
                for alias in node.names:
                    target = f"{node.module}.{alias.name}"
                    if id(node) in top:
                        graph[mod].add(target if target in files else str(node.module))
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        private.append((mod, target))
            elif isinstance(node, ast.Import) and id(node) in top:
                graph[mod].update(a.name for a in node.names if a.name in files)
    return graph, private


def test_no_import_circles_and_no_private_names_across_modules() -> None:
    """Module-level imports between uvmlab's modules form no circle (imports inside functions are how a module
    reaches a heavier one lazily and do not count); no module imports another's private name."""
    graph, private = _module_imports()
    assert not private, f"private names imported across modules: {private}"
    done: set[str] = set()

    def visit(mod: str, path: list[str]) -> None:
        if mod in path:
            raise AssertionError(f"import circle: {' -> '.join([*path[path.index(mod) :], mod])}")
        if mod in done:
            return
        for nxt in sorted(graph.get(mod, ())):
            visit(nxt, [*path, mod])
        done.add(mod)

    for mod in sorted(graph):
        visit(mod, [])
