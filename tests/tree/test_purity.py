"""The protocol core is pure: no sockets, threads, event loops, torch, grpc, scapy or clock.

Two independent checks, because either alone can be fooled:

* every ``dlcp.proto`` module's source is parsed, and imports of forbidden
  modules or calls that read the clock are reported with file and line;
* a fresh interpreter imports numpy (which itself pulls in ``time`` and
  ``datetime``), notes ``sys.modules``, imports every ``dlcp.proto`` module and
  reports what that added: none of it may be a forbidden module, whoever
  imported it indirectly.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import dlcp.proto

ROOT = Path(__file__).resolve().parents[2]

#: top-level modules the protocol core must not import
FORBIDDEN_MODULES = frozenset(
    {
        "socket",
        "selectors",
        "asyncio",
        "threading",
        "_thread",
        "multiprocessing",
        "concurrent",
        "time",
        "torch",
        "grpc",
        "scapy",
    }
)
#: attribute calls that read the clock, by the module or class they hang off
CLOCK_CALLS = {
    "time": {
        "time",
        "time_ns",
        "monotonic",
        "monotonic_ns",
        "perf_counter",
        "perf_counter_ns",
        "process_time",
        "thread_time",
    },
    "datetime": {"now", "utcnow", "today"},
    "date": {"today"},
}


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def forbidden_uses(source: str, filename: str = "<source>") -> list[str]:
    """Every forbidden import and clock read in ``source``, as ``file:line: what``."""
    tree = ast.parse(source, filename)
    found: list[str] = []
    # names bound to time / datetime / date, so aliases are caught too
    clock_names = {name: name for name in CLOCK_CALLS}

    def report(node: ast.AST, what: str) -> None:
        found.append(f"{filename}:{getattr(node, 'lineno', '?')}: {what}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                root = alias.name.split(".")[0]
                if root in FORBIDDEN_MODULES:
                    report(node, f"imports {alias.name}")
                if alias.name in ("time", "datetime"):
                    clock_names[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            root = node.module.split(".")[0]
            if root in FORBIDDEN_MODULES:
                report(node, f"imports from {node.module}")
            if node.module == "datetime":
                for alias in node.names:
                    if alias.name in ("datetime", "date"):
                        clock_names[alias.asname or alias.name] = alias.name
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute):
            base = _dotted(func.value)
            owner = clock_names.get(base.split(".")[-1]) if base else None
            if owner and func.attr in CLOCK_CALLS[owner]:
                report(node, f"reads the clock: {base}.{func.attr}()")
        name = _dotted(func)
        if name in ("__import__", "importlib.import_module", "import_module") and node.args:
            arg = node.args[0]
            target = arg.value if isinstance(arg, ast.Constant) else None
            if isinstance(target, str) and target.split(".")[0] in FORBIDDEN_MODULES:
                report(node, f"imports {target} dynamically")
    return found


def proto_modules() -> list[str]:
    """``dlcp.proto`` and every module under it that exists right now."""
    names = ["dlcp.proto"]
    names += [m.name for m in pkgutil.walk_packages(dlcp.proto.__path__, "dlcp.proto.")]
    return sorted(names)


MODULES = proto_modules()


def _source_of(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, module
    return Path(spec.origin)


PY_MODULES = [m for m in MODULES if _source_of(m).suffix == ".py"]

#: the headers the C accelerators of the core may include: Python's and libc's integer,
#: math and memory routines, SSE2 streaming stores, the compiler's CPUID (which AES-GMAC
#: code suits the CPU), libcrypto's EVP ciphers (AES-GMAC, computed in memory) and the
#: core's own gmac.h; nothing that reaches a socket, a thread or the clock
C_INCLUDES_ALLOWED = {
    "Python.h", "math.h", "stdint.h", "limits.h", "string.h", "emmintrin.h", "cpuid.h",
    "openssl/evp.h", "openssl/crypto.h", "openssl/modes.h", "gmac.h", "sys/types.h",
    "_kernels_core.h",
}  # fmt: skip


@pytest.mark.parametrize("module", PY_MODULES)
def test_module_source_has_no_forbidden_imports_or_clock_reads(module: str) -> None:
    path = _source_of(module)
    assert forbidden_uses(path.read_text(), str(path.relative_to(ROOT))) == []


def test_c_accelerator_includes_only_memory_routines() -> None:
    sources = sorted((ROOT / "dlcp" / "proto").glob("*.[ch]"))
    assert sources, "the core's C accelerator source is missing"
    for src in sources:
        text = src.read_text()
        includes = set(re.findall(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', text, re.MULTILINE))
        extra = includes - C_INCLUDES_ALLOWED
        assert not extra, f"{src.name} includes {extra}"


_IMPORT_SCRIPT = """
import importlib, json, sys
import numpy
before = set(sys.modules)
for name in sys.argv[1:]:
    importlib.import_module(name)
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def modules_added_by_importing(names: list[str]) -> set[str]:
    """What importing ``names`` adds to ``sys.modules`` of a fresh interpreter after numpy."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYTHONSTARTUP", None)
    done = subprocess.run(
        [sys.executable, "-c", _IMPORT_SCRIPT, *names],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout))


def test_importing_the_core_loads_no_forbidden_module() -> None:
    added = modules_added_by_importing(MODULES)
    assert set(MODULES) <= added  # they really were imported here
    assert sorted(m for m in added if m.split(".")[0] in FORBIDDEN_MODULES) == []


# ------------------------------------------------------------------ the checks can fail


def test_fresh_interpreter_check_sees_a_forbidden_import() -> None:
    assert "asyncio" in modules_added_by_importing(["asyncio"])


@pytest.mark.parametrize(
    "source",
    [
        "import socket\n",
        "import asyncio.events\n",
        "from threading import Lock\n",
        "import torch.distributed as dist\n",
        "from grpc import aio\n",
        "from scapy.all import IP\n",
        "from time import monotonic\n",
        "import time as clock\n",
        "def f():\n    return time.perf_counter()\n",
        "import datetime\nstamp = datetime.datetime.now()\n",
        "from datetime import datetime as dt\nstamp = dt.now()\n",
        "from datetime import date\nday = date.today()\n",
        "sock = __import__('socket')\n",
        "import importlib\nmod = importlib.import_module('selectors')\n",
    ],
)
def test_checker_flags_impure_sources(source: str) -> None:
    assert forbidden_uses(source, "<synthetic>")


def test_checker_names_file_line_and_what() -> None:
    assert forbidden_uses("x = 1\nimport socket\n", "<synthetic>") == [
        "<synthetic>:2: imports socket"
    ]


def test_checker_accepts_pure_sources() -> None:
    source = (
        "import numpy as np\n"
        "from .wire import VERSION\n"
        "from datetime import timedelta\n"
        "def deadline(now: float) -> float:\n"
        "    return now + timedelta(seconds=1).total_seconds()\n"
        "socket_count = np.zeros(3).sum()\n"
    )
    assert forbidden_uses(source, "<synthetic>") == []
