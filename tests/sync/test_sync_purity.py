"""The schedule and rule modules of ``dlcp.sync`` (group generation, SSP clock
rules, learning-rate functions) are pure: they import no sockets, threads,
endpoints or torch, so they are unit-tested without any of them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import dlcp.sync

PURE = ["groups.py", "clocks.py", "lr.py"]
FORBIDDEN = {"socket", "threading", "asyncio", "selectors", "torch", "time", "queue"}


@pytest.mark.parametrize("name", PURE)
def test_pure_modules_import_no_io(name: str) -> None:
    tree = ast.parse((Path(dlcp.sync.__file__).parent / name).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            imported.add(module.split(".")[0] if node.level == 0 else "." * node.level + module)
    assert not imported & FORBIDDEN, imported
    assert not any(m.startswith("..io") or m.startswith(".ps") for m in imported), imported
