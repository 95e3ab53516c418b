"""Which package may import which, and how.

The installed packages are ``dlcp`` (the transport), ``shims`` (torch adapters,
built on dlcp) and ``testbed`` (networks to run on, built on dlcp). The
dependency runs one way: ``dlcp`` does not depend on the testbed. Its command-line
tools (``dlcp.cli``, ``dlcp switch``, ``dlcp sim`` given a topology file) and its
benchmarks (``dlcp.bench``) use testbed code through a real ``import`` inside the
function that needs it, never at module level and never by a module name held in a
string (``importlib.import_module("...")``), which no reader or type checker can
follow.

Two checks: every module's source is parsed (module-level imports, string
imports), and a fresh interpreter imports every ``dlcp`` module outside
``dlcp.bench`` and reports whether the testbed came with them.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("dlcp", "shims", "testbed")


def _sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def _module_level(tree: ast.Module) -> list[ast.stmt]:
    """The statements run on import: the module's own, and those of its top-level
    ``if``/``try`` blocks except ``if TYPE_CHECKING:``."""
    out: list[ast.stmt] = []
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        out.append(node)
        if isinstance(node, ast.If):
            if not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                todo += node.body + node.orelse
        elif isinstance(node, ast.Try):
            todo += node.body + node.orelse + node.finalbody
            for handler in node.handlers:
                todo += handler.body
    return out


def _imported(node: ast.stmt) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        return [node.module]
    return []


def string_imports(source: str) -> list[str]:
    """``importlib.import_module("name")`` / ``__import__("name")`` calls, by line."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = (
            func.id
            if isinstance(func, ast.Name)
            else func.attr
            if isinstance(func, ast.Attribute)
            else ""
        )
        if name in ("import_module", "__import__"):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_is_imported_by_a_name_in_a_string(path: Path) -> None:
    assert string_imports(path.read_text()) == []


def test_the_string_import_check_finds_one() -> None:
    source = "import importlib\nmod = importlib.import_module('testbed.cli')\n"
    assert string_imports(source) == ["line 2: importlib.import_module('testbed.cli')"]


def test_dlcp_does_not_import_the_testbed_at_module_level() -> None:
    offenders = []
    for path in sorted((ROOT / "dlcp").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in _module_level(tree):
            for name in _imported(node):
                if name.split(".")[0] == "testbed":
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}")
    assert offenders == []


def test_importing_dlcp_leaves_the_testbed_unloaded() -> None:
    """Every module of dlcp outside its benchmarks, imported in a fresh interpreter
    (a module whose optional extra is missing, grpc or ns-3, is skipped)."""
    script = (
        "import json, pkgutil, sys, dlcp\n"
        "missing = {}\n"
        "for m in pkgutil.walk_packages(dlcp.__path__, 'dlcp.'):\n"
        "    if m.name.startswith('dlcp.bench'):\n"
        "        continue\n"
        "    try:\n"
        "        __import__(m.name)\n"
        "    except ImportError as exc:\n"
        "        missing[m.name] = exc.name\n"
        "loaded = sorted(n for n in sys.modules if n.split('.')[0] == 'testbed')\n"
        "print(json.dumps({'loaded': loaded, 'missing': missing}))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.splitlines()[-1])
    assert got["loaded"] == [], got
    # only an optional extra may be missing (grpc, ns-3), never a module of these packages
    assert not [n for n in got["missing"].values() if (n or "").split(".")[0] in PACKAGES], got
