"""The package's import graph: no cycle, and the value types on the ground floor (issue #25).

Every ``import``/``from ... import`` of a ``resnet8ptq`` module counts, at module level or inside a function
(a lazy import still ties the two modules together)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "resnet8ptq"
GROUND_FLOOR = (
    "resnet8ptq.spec",
    "resnet8ptq.errors",
    "resnet8ptq.dtype",
    "resnet8ptq.calibration",
    "resnet8ptq.entropy_threshold",  # calibration's KL threshold search: ORT and NumPy only
    "resnet8ptq.metrics",  # how outputs are scored: NumPy and SciPy
    "resnet8ptq.statistics",
)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (a ``from pkg import name`` that names a submodule counts
    as that submodule)."""
    modules = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets.add(node.module)
                targets |= {f"{node.module}.{alias.name}" for alias in node.names}
        graph[name] = {target for target in targets if target in modules and target != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle():
    assert cycles(import_graph()) == []


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("module", GROUND_FLOOR)
def test_ground_floor_imports_only_ground_floor(module):
    """The value types and errors import nothing of the package above them."""
    assert import_graph()[module] <= set(GROUND_FLOOR)
