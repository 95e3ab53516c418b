"""Every exception class DLCP defines descends from ``dlcp.errors.DLCPError``.

The packages (``dlcp`` with its bench, ``shims`` and ``testbed``) are walked and every
module imported; every class in it that is an exception and was defined there
must be a DLCPError. A module that cannot be imported here (an optional
dependency missing) is read from its source instead: any class whose bases name
an exception must also name one of ``dlcp.errors`` or one of its own classes
that does.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

from dlcp import errors
from dlcp.errors import BenchError, ConfigError, DLCPError, UsageError

PACKAGES = ("dlcp", "shims", "testbed")  # (dlcp.bench is under dlcp)
BUILTIN_EXCEPTIONS = {
    name for name, obj in vars(builtins).items()
    if isinstance(obj, type) and issubclass(obj, BaseException)
}  # fmt: skip


def _modules() -> list[str]:
    names = []
    for package in PACKAGES:
        pkg = importlib.import_module(package)
        names.append(package)
        for info in pkgutil.walk_packages(pkg.__path__, prefix=f"{package}."):
            # (the sub-packages mapped from other folders are walked on their own)
            if not any(info.name.startswith(f"{p}.") for p in PACKAGES if p != package
                       and p.startswith(f"{package}.")):  # fmt: skip
                names.append(info.name)
    return sorted(set(names))


def _source_exception_classes(path: Path) -> list[tuple[str, list[str]]]:
    """(class, base names) of every class in ``path`` that derives from a
    builtin exception by name, or from a name that ends in Error."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ClassDef):
            bases = [ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases]
            if any(b in BUILTIN_EXCEPTIONS or b.endswith("Error") for b in bases):
                found.append((node.name, bases))
    return found


def test_every_exception_class_descends_from_dlcp_error() -> None:
    checked, offenders, unimported = [], [], []
    for name in _modules():
        try:
            module = importlib.import_module(name)
        except ImportError as exc:  # an optional dependency (torch, grpc, mininet...)
            missing = getattr(exc, "name", None) or ""
            assert not missing.startswith("dlcp"), f"{name}: {exc}"
            unimported.append(name)
            continue
        for cls_name, cls in vars(module).items():
            if (
                inspect.isclass(cls)
                and issubclass(cls, BaseException)
                and cls.__module__ == module.__name__
            ):
                checked.append(f"{name}.{cls_name}")
                if not issubclass(cls, DLCPError):
                    offenders.append(f"{name}.{cls_name} {[b.__name__ for b in cls.__mro__]}")
    dlcp_names = {n for n, c in vars(errors).items() if inspect.isclass(c)}
    for name in unimported:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None
        in_tree = set(dlcp_names)  # (and the module's own classes found in it, in order)
        for cls_name, bases in _source_exception_classes(Path(spec.origin)):
            checked.append(f"{name}.{cls_name}")
            if any(b in in_tree for b in bases):
                in_tree.add(cls_name)
            else:
                offenders.append(f"{name}.{cls_name} {bases}")
    assert len(checked) >= 20, checked  # the walk found the package's exceptions
    assert not offenders, "\n".join(offenders)


def test_the_walk_would_catch_an_exception_outside_the_tree() -> None:
    class Stray(ValueError):
        pass

    assert not issubclass(Stray, DLCPError)
    assert _source_exception_classes(Path(__file__)) != []  # (this test's own Stray)


@pytest.mark.parametrize(
    ("cls", "also"),
    [(UsageError, ValueError), (ConfigError, UsageError), (BenchError, RuntimeError)],
)
def test_usage_config_and_bench_errors_keep_their_builtin_bases(cls: type, also: type) -> None:
    assert issubclass(cls, DLCPError) and issubclass(cls, also)


def test_wire_and_geometry_errors_are_dlcp_errors() -> None:
    from dlcp.proto.reassembler import GeometryError
    from dlcp.proto.wire import WireError

    assert issubclass(WireError, DLCPError) and issubclass(WireError, ValueError)
    assert issubclass(GeometryError, DLCPError) and issubclass(GeometryError, ValueError)


def test_misuse_raises_usage_error_naming_what_was_typed() -> None:
    from dlcp.proto.wire import bound_to_wire

    with pytest.raises(UsageError, match=r"loss bound p=0\.5 outside"):
        bound_to_wire(0.5)
