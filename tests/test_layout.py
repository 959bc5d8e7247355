"""The package's layout as DESIGN §6 draws it: plumbing free of AMPS concepts, small modules, no cycle.

Plumbing under connectors/ with no AMPS concept in it, modules of one idea (under 600 lines), and no import
cycle."""

from __future__ import annotations

import ast
from pathlib import Path

from support.repo import REPO

PACKAGE = REPO / "replication"
#: Modules plumbing may import besides its own: the exception hierarchy (no concept in it).
SHARED = {"replication.errors"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> set[str]:
    """The ``replication`` modules a file imports (absolute imports: the project uses no relative ones)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("replication")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("replication"):
            assert node.level == 0, f"{path}: a relative import"
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def test_connectors_are_plumbing_that_imports_no_concept_module():
    offenders = {}
    for name, path in modules().items():
        if not name.startswith("replication.connectors"):
            continue
        concepts = {m for m in imported(path) if not m.startswith("replication.connectors")
                    and not any(m == s or m.startswith(s + ".") for s in SHARED)
                    and m != "replication"}
        if concepts:
            offenders[name] = sorted(concepts)
    assert offenders == {}, "connectors/ must not import AMPS concepts (move the code, or the concept)"


def test_every_module_is_under_600_lines():
    long = {name: n for name, path in modules().items()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > 600}
    assert long == {}


def test_no_import_cycle():
    mods = modules()
    graph = {name: {m for m in imported(path) if m in mods and m != name} for name, path in mods.items()}
    for name in graph:  # a package re-exporting its own modules is not a cycle of concepts
        graph[name] = {m for m in graph[name] if not (name.startswith(m + ".") and mods[m].name == "__init__.py")}
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif not state.get(nxt):
                visit(nxt, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if not state.get(node):
            visit(node, [])
    assert cycles == []
