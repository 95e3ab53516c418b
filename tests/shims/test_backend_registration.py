"""Each way the torch.distributed backend ``"dlcp"`` gets registered (docs/usage.md).

Every case runs in a fresh interpreter, since registration is per process and
torch reads ``TORCH_DEVICE_BACKEND_AUTOLOAD`` when it is imported.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from importlib.metadata import entry_points
from pathlib import Path

import pytest

import shims

ROOT = Path(__file__).resolve().parents[2]

REGISTERED = "import torch.distributed as dist\nprint('dlcp' in dist.Backend.backend_list)\n"


def _run(script: str, *, autoload: bool) -> list[str]:
    """Run ``script``; its printed lines. ``autoload``: torch's plugin hook on or off."""
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="1" if autoload else "0")
    argv = [sys.executable, "-W", "error::RuntimeWarning", "-c", script]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.split()


def test_the_install_declares_torchs_plugin_entry_point() -> None:
    (point,) = entry_points(group="torch.backends", name="dlcp")
    assert point.value == "shims:torch_autoload"
    assert point.load() is shims.torch_autoload


def test_import_torch_alone_registers_through_the_entry_point() -> None:
    """No ``import dlcp``: torch's hook loads shims (which imports neither dlcp nor
    anything heavy) and registers."""
    got = _run("import sys\n" + REGISTERED + "print('dlcp' in sys.modules)\n", autoload=True)
    assert got == ["True", "False"]


def test_without_the_hook_import_torch_alone_does_not_register() -> None:
    """The control for the test above: the registration came from the hook."""
    assert _run(REGISTERED, autoload=False) == ["False"]


def test_import_dlcp_before_torch_leaves_torch_to_its_hook() -> None:
    script = "import sys, dlcp\nprint('torch' in sys.modules)\n" + REGISTERED
    assert _run(script, autoload=True) == ["False", "True"]


def test_import_dlcp_before_torch_without_the_hook_registers_by_importing_torch() -> None:
    script = "import sys, dlcp\nprint('torch' in sys.modules)\n" + REGISTERED
    assert _run(script, autoload=False) == ["True", "True"]


def test_import_dlcp_after_torch_without_the_hook_registers() -> None:
    script = "import torch\nimport dlcp\n" + REGISTERED
    assert _run(script, autoload=False) == ["True"]


def test_register_called_by_the_program() -> None:
    script = "import shims\nshims.register()\n" + REGISTERED
    assert _run(script, autoload=False) == ["True"]


def test_import_of_the_process_group_module_registers() -> None:
    script = "import shims.process_group\n" + REGISTERED
    assert _run(script, autoload=False) == ["True"]


@pytest.mark.parametrize("autoload", [True, False])
def test_a_group_starts_after_import_dlcp(autoload: bool, tmp_path: Path) -> None:
    script = (
        "import dlcp\n"
        "import torch, torch.distributed as dist\n"
        f"dist.init_process_group('dlcp', init_method='file://{tmp_path / 'store'}',\n"
        "                        rank=0, world_size=1)\n"
        "t = torch.ones(3)\n"
        "dist.all_reduce(t)\n"
        "print(dist.get_backend(), t.tolist() == [1.0] * 3)\n"
        "dist.destroy_process_group()\n"
    )
    assert _run(script, autoload=autoload) == ["dlcp", "True"]


def test_the_hook_warns_instead_of_breaking_import_torch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch turns an exception from an entry point into a failed ``import torch``."""

    def broken() -> None:
        raise RuntimeError("no torch.distributed in this build")

    monkeypatch.setattr(shims, "register", broken)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        shims.torch_autoload()
    assert [str(w.message) for w in caught] == [
        "dlcp: backend 'dlcp' not registered with torch.distributed: "
        "RuntimeError('no torch.distributed in this build')"
    ]


@pytest.mark.parametrize(
    ("value", "enabled"), [(None, True), ("1", True), ("0", False), ("yes", False)]
)
def test_autoload_is_read_as_torch_reads_it(value: str | None, enabled: bool) -> None:
    environ = {} if value is None else {"TORCH_DEVICE_BACKEND_AUTOLOAD": value}
    assert shims.autoload_enabled(environ) is enabled


def test_the_hook_leaves_torchs_default_backends_alone() -> None:
    """Every program of the environment gets the hook: it must not make "dlcp" the
    default of any device (a group made without a backend name)."""
    script = "import torch.distributed as dist\nprint(dist.Backend.default_device_backend_map)\n"
    assert _run(script, autoload=True) == _run(script, autoload=False)
