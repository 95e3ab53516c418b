"""The protocol core's modules import each other without a cycle.

The graph is read from the source (every ``from .x import`` / ``from dlcp.proto.x
import`` / ``import dlcp.proto.x``, wherever it stands in the module, so that an
import moved to the bottom of a file or into a function still counts) and
searched for a cycle; a cycle is reported as the chain of modules that forms it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import dlcp.proto

PROTO = Path(dlcp.proto.__file__).resolve().parent


def _imports_of(path: Path, modules: set[str]) -> set[str]:
    """The ``dlcp.proto`` modules (by short name) that ``path`` imports."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:
                if node.module is None:
                    found.update(a.name for a in node.names if a.name in modules)
                else:
                    found.add(node.module.split(".")[0])
            elif node.level == 0 and node.module and node.module.startswith("dlcp.proto."):
                found.add(node.module.split(".")[2])
            elif node.level == 0 and node.module == "dlcp.proto":
                found.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("dlcp.proto."):
                    found.add(alias.name.split(".")[2])
    return found & modules


def import_graph() -> dict[str, set[str]]:
    modules = {p.stem for p in PROTO.glob("*.py") if p.stem != "__init__"}
    return {m: _imports_of(PROTO / f"{m}.py", modules) - {m} for m in sorted(modules)}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as ``[a, b, ..., a]``, or None if it has none."""
    done: set[str] = set()
    path: list[str] = []
    on_path: set[str] = set()

    def visit(node: str) -> list[str] | None:
        path.append(node)
        on_path.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt in on_path:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in done:
                cycle = visit(nxt)
                if cycle is not None:
                    return cycle
        path.pop()
        on_path.discard(node)
        done.add(node)
        return None

    for start in graph:
        if start not in done:
            cycle = visit(start)
            if cycle is not None:
                return cycle
    return None


def test_cycle_finder_finds_a_cycle_and_passes_a_tree() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_protocol_core_has_no_import_cycle() -> None:
    graph = import_graph()
    assert {"wire", "batch", "control", "inbox"} <= graph.keys()  # the graph was read
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_the_wire_layout_imports_no_codec() -> None:
    # batch and control build on wire; wire names neither (only the tag
    # primitive, auth, which names no protocol module), and neither the other
    graph = import_graph()
    assert graph["wire"] <= {"auth"} and graph["auth"] == set()
    assert "control" not in graph["batch"] and "batch" not in graph["control"]
