"""The plan of the house, checked from the code's imports (issue 27; docs/contracts.md "Rooms and layers").

Every ``import`` / ``from ... import`` of a ``uvmlab`` module anywhere in a module (lazy imports inside functions
and ``TYPE_CHECKING`` blocks included) is an edge of the module graph. The rules:

- no import cycles between modules;
- no private name (``_x``) imported from another module;
- rooms are layered (``LAYERS``, bottom first): a module imports only from its own room or from rooms below it,
  so no call can climb back up from a lower room into a higher one;
- ``uvmlab/sim/`` holds only its two simulators, ``allocator/`` and ``uvm/``;
- the package top holds at most 10 modules beside its folders;
- a run's memory policy is looked up in one place (``get_policy``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "uvmlab"

LAYERS = (
    ("uvmlab", "errors"),
    ("numbers",),
    ("units",),
    ("gpus", "console"),
    ("config",),
    ("files",),
    ("stats",),
    ("trace",),
    ("sim.allocator",),
    ("sim.uvm",),
    ("sim",),
    ("export",),
    ("memory",),
    ("evaluate",),
    ("uvm",),
    ("measure",),
    ("advise",),
    ("run",),
    ("sweep",),
    ("report",),
    ("validate",),
    ("api",),
    ("cli",),
    ("__main__",),
)
"""Rooms from the bottom up; rooms in one tuple may not import each other."""
RANK = {room: i for i, rooms in enumerate(LAYERS) for room in rooms}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def room(module: str) -> str:
    """``uvmlab.sim.uvm.driver`` -> ``sim.uvm``; ``uvmlab.memory.estimate`` -> ``memory``; ``uvmlab.api`` -> ``api``."""
    parts = module.split(".")[1:]
    if not parts:
        return "uvmlab"
    if parts[0] == "sim" and len(parts) > 1:
        return f"sim.{parts[1]}"
    return parts[0]


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports(path: Path, known: dict[str, Path]) -> list[tuple[str, str]]:
    """(imported module, imported name or "") for every uvmlab import in ``path``."""
    is_pkg = path.name == "__init__.py"
    here = module_name(path)
    package = here if is_pkg else here.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, "") for a in node.names if a.name.split(".")[0] == "uvmlab"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            if target.split(".")[0] != "uvmlab":
                continue
            for alias in node.names:
                full = f"{target}.{alias.name}"
                out.append((full, "") if full in known else (target, alias.name))
    return out


@pytest.fixture(scope="module")
def graph() -> dict[str, list[tuple[str, str]]]:
    known = modules()
    return {name: imports(path, known) for name, path in known.items()}


def test_every_room_has_a_layer() -> None:
    missing = sorted({room(m) for m in modules()} - set(RANK))
    assert not missing, f"rooms without a layer in LAYERS: {missing}"


def test_no_import_cycles(graph: dict[str, list[tuple[str, str]]]) -> None:
    edges = {m: {t for t, _ in deps if t in graph and t != m} for m, deps in graph.items()}
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m, [])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_no_private_name_is_imported_from_another_module(graph: dict[str, list[tuple[str, str]]]) -> None:
    bad = [
        f"{m} imports {name} from {target}"
        for m, deps in graph.items()
        for target, name in deps
        if name.startswith("_") and not name.startswith("__") and target != m
    ]
    assert not bad, bad


def test_rooms_import_only_their_own_room_or_lower_ones(graph: dict[str, list[tuple[str, str]]]) -> None:
    climbs = []
    for m, deps in graph.items():
        src = room(m)
        for target, _ in deps:
            dst = room(target)
            if dst != src and not RANK[dst] < RANK[src]:
                climbs.append(f"{m} ({src}) imports {target} ({dst})")
    assert not climbs, "imports that climb back up: " + "; ".join(sorted(climbs))


def test_sim_holds_only_its_two_simulators() -> None:
    loose = sorted(p.name for p in (PACKAGE / "sim").iterdir() if p.is_file() and p.suffix == ".py")
    rooms = sorted(p.name for p in (PACKAGE / "sim").iterdir() if p.is_dir() and p.name != "__pycache__")
    assert loose == ["__init__.py"]
    assert rooms == ["allocator", "uvm"]


def test_the_package_top_holds_at_most_ten_modules() -> None:
    top = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert len(top) <= 10, top


def test_a_runs_policy_is_looked_up_in_one_place() -> None:
    """``get_policy`` (the policy catalogue lookup) is called only by ``resolve_policy``; below ``uvmlab.run`` the
    code reads ``RunConfig.applied``."""
    calls = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "get_policy":
                calls.append(name)
    assert calls == ["uvmlab.advise.advisor"], calls
