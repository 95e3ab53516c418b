"""``dist.init_process_group("dlcp")``: collectives and unmodified DDP over DLCP.

Three ranks are started the way ``torchrun`` starts them (env:// variables); the
parent hosts the TCPStore on a port the kernel picked and the ranks join it as
clients (TORCHELASTIC_USE_AGENT_STORE, as under torchrun), so no port is guessed
and nothing sleeps for readiness. Every rank runs every check of
``tests/shims/pg_worker.py`` once (a torch import costs seconds); each test
here asserts one check's outcome on every rank. References come from the same
operation over Gloo in a second group, or from computed expectations.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from dlcp.errors import ConfigError  # noqa: E402

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
WORLD = 3
DEADLINE = 150.0  # seconds for the whole run, imports included


def run_ranks(world: int, logdir: Path,
              module: str = "tests.shims.pg_worker") -> list[dict[str, Any]]:
    """Start ``world`` ranks of ``module``; each one's ``results`` line, parsed."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=DEADLINE))
    base = {k: v for k, v in os.environ.items() if not k.startswith("DLCP_")}
    procs: list[subprocess.Popen[str]] = []
    logs = [logdir / f"rank{r}.stderr" for r in range(world)]
    try:
        for r in range(world):
            env = {**base, "RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_RANK": str(r),
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port),
                   "TORCHELASTIC_USE_AGENT_STORE": "True", "OMP_NUM_THREADS": "1",
                   "PYTHONUNBUFFERED": "1"}
            with logs[r].open("wb") as err:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", module], cwd=ROOT, env=env,
                    stdout=subprocess.PIPE, stderr=err, text=True))
        deadline = time.monotonic() + DEADLINE
        outputs = []
        for r, p in enumerate(procs):
            try:
                out, _ = p.communicate(timeout=max(deadline - time.monotonic(), 1.0))
            except subprocess.TimeoutExpired:
                pytest.fail(f"rank {r} did not finish within {DEADLINE} s; stderr:\n"
                            f"{logs[r].read_text(errors='replace')[-4000:]}")
            outputs.append((r, p.returncode, out))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    results = []
    for r, code, out in outputs:
        lines = [ln for ln in out.splitlines() if ln.startswith("results ")]
        if code != 0 or not lines:
            pytest.fail(f"rank {r} exited with {code} without results; stderr:\n"
                        f"{logs[r].read_text(errors='replace')[-4000:]}")
        results.append(json.loads(lines[-1][len("results "):]))
    return results


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return run_ranks(WORLD, tmp_path_factory.mktemp("pg"))


def outcome(ranks: list[dict[str, Any]], name: str) -> list[Any]:
    """The check's detail per rank; fails with every rank's error if any failed."""
    failed = [f"rank {r['rank']}: {r['checks'][name]['error']}\n{r['checks'][name]['traceback']}"
              for r in ranks if not r["checks"][name]["ok"]]
    assert not failed, "\n".join(failed)
    return [r["checks"][name]["detail"] for r in ranks]


CHECKS = [
    "all_reduce_sum_float32_vs_gloo",
    "all_reduce_multidim_and_noncontiguous",
    "all_reduce_avg_and_half_types",
    "all_reduce_exact_types_and_ops",
    "all_reduce_async_future",
    "broadcast_vs_gloo",
    "all_gather_vs_gloo",
    "all_gather_coalesced_vs_gloo",
    "reduce_scatter_gather_scatter_reduce",
    "every_tensor_of_an_operation_is_reported",
    "a_refused_gather_keeps_the_ranks_paired",
    "a_failure_before_its_call_keeps_the_ranks_paired",
    "coalescing_manager_and_functional_collectives",
    "barrier_waits_for_every_rank",
    "object_collectives",
]


@pytest.mark.parametrize("name", CHECKS)
def test_collective_matches_reference(ranks: list[dict[str, Any]], name: str) -> None:
    outcome(ranks, name)


def test_all_reduce_reports_no_loss_at_p0(ranks: list[dict[str, Any]]) -> None:
    for detail in outcome(ranks, "all_reduce_sum_float32_vs_gloo"):
        small, large = detail["reports"]["77777"], detail["reports"]["1200000"]
        assert small["op"] == "direct_allreduce" and large["op"] == "ring_allreduce"
        assert small["lost_elems"] == large["lost_elems"] == 0


def test_unmodified_ddp_matches_gloo(ranks: list[dict[str, Any]]) -> None:
    details = outcome(ranks, "ddp_matches_gloo")
    # DDP checked shapes (allgather), broadcast rank 0's states and the buffers, and
    # reduced its (small, exact) gradient bucket in one round, all through the dlcp group
    assert set(details[0]["ops"]) == {"allgather", "broadcast", "direct_allreduce"}, details[0]


def test_ddp_find_unused_parameters_matches_gloo(ranks: list[dict[str, Any]]) -> None:
    outcome(ranks, "ddp_find_unused_parameters_matches_gloo")


def test_a_callback_may_wait_for_another_operation(ranks: list[dict[str, Any]]) -> None:
    outcome(ranks, "a_callback_may_wait_for_another_operation")


def test_ddp_powersgd_hook_matches_gloo(ranks: list[dict[str, Any]]) -> None:
    outcome(ranks, "ddp_powersgd_hook_matches_gloo")


def test_unsupported_ops_name_themselves(ranks: list[dict[str, Any]]) -> None:
    for seen in outcome(ranks, "unsupported_ops_raise_clear_errors"):
        assert set(seen) == {"avg_int64", "sum_uint16"}


def test_mismatched_shapes_raise_on_receivers(ranks: list[dict[str, Any]]) -> None:
    details = outcome(ranks, "mismatched_shapes_fail_loudly")
    # the root's send may complete or be refused; a receiver never accepts it quietly
    assert details[0]["raised"] in ("", "TransferFailed"), details[0]
    for got in details[1:]:
        # (UsageError: the library's misuse error, a ValueError)
        assert got["raised"] in ("UsageError", "ValueError", "TransferFailed"), got
        assert "uint8[20]" in got["message"] and "uint8[16]" in got["message"], got


def test_bounded_loss_group(ranks: list[dict[str, Any]]) -> None:
    """Under 2 % emulated loss a p = 0.05 group loses some elements, within the
    bound, and keeps replicas identical (checked in the worker)."""
    for detail in outcome(ranks, "bounded_loss_group_keeps_replicas_identical"):
        assert 0 < detail["lost_fraction"] <= 0.05, detail


def test_rank_failure_raises_clear_error_without_hang(ranks: list[dict[str, Any]]) -> None:
    """Every survivor fails fast with an error naming a rank it lost. The first to
    notice names the dead rank; a survivor that hears of the failure only when
    another survivor gives up names that one, which is just as true: it left
    (its control connection closed), or it aborted the message this survivor
    was about to wait for."""
    dead = WORLD - 1
    survivors = [r["rank_failure"] for r in ranks[:-1]]  # the last rank exited abruptly
    lost = (r"rank \d+ closed its control connection|control connection to rank \d+"
            r"|receiving from rank \d+: sender aborted the message")  # fmt: skip
    # every survivor's outcome in full, whichever fails (pytest shortens the repr
    # of a list in the middle, joining one survivor's message to the next one's)
    shown = "survivors:\n" + json.dumps(survivors, indent=1)
    for got in survivors:
        # (a hang shows as the group's DLCPTimeout after its 30 s timeout)
        assert got["raised"] == "TransferFailed", shown
        assert re.search(lost, got["message"]), shown
        assert got["seconds"] < 20.0, shown  # well below the group's 30 s timeout
    assert any(
        f"rank {dead} closed its control connection" in got["message"]
        or f"control connection to rank {dead}" in got["message"]
        for got in survivors
    ), shown


def test_ddp_raises_after_a_rank_failure(ranks: list[dict[str, Any]]) -> None:
    """A failed bucket reaches unmodified DDP as an error: its reducer used to
    take the failed future's exception for the result and crash the process."""
    for got in (r["ddp_after_failure"] for r in ranks[:-1]):
        assert got["raised"] == "RuntimeError", got
        lost = r"closed its control connection|control connection to rank"
        assert re.search(lost, got["message"]), got


def test_destroy_stops_every_dlcp_thread(ranks: list[dict[str, Any]]) -> None:
    for r in ranks[:-1]:
        assert r["threads_after_destroy"] == [], r


def test_options_are_validated() -> None:
    from shims.process_group import DLCPOptions

    with pytest.raises(ConfigError, match=r"p=0\.5"):
        DLCPOptions(p=0.5)
    with pytest.raises(ConfigError, match="fill"):
        DLCPOptions(fill="bogus")
    with pytest.raises(ConfigError, match="cannot fill the reduce phase"):
        DLCPOptions(fill="previous")
    with pytest.raises(ConfigError, match=r"p_gather=0\.05 exceeds p=0\.01"):
        DLCPOptions(p=0.01, p_gather=0.05)
    assert DLCPOptions().p is None


def test_a_timeout_says_how_long_the_operation_ran_when_it_ended_early() -> None:
    """A peer's own timer (a sender's FINISH retries, say) can end an operation
    long before the group's timeout: the error must not claim that timeout was
    reached. Without ``elapsed``, or once it has passed, it is."""
    from shims.pg_timeouts import timed_out

    early = timed_out("allreduce", 1, [2], 30.0, "rank 1: why", elapsed=0.2149)
    assert str(early) == (
        "Timed out: dlcp allreduce on rank 1 gave up after 0.21 s, before its timeout "
        "of 30 s: rank 2 did not arrive (rank 1: why)"
    )
    for elapsed in (None, 30.0, 31.5):
        late = timed_out("allreduce", 1, [2], 30.0, elapsed=elapsed)
        assert str(late) == (
            "Timed out: dlcp allreduce on rank 1 reached its timeout of 30 s: rank 2 did not arrive"
        )


def test_backend_is_registered_by_import() -> None:
    import dlcp  # noqa: F401

    assert "dlcp" in dist.Backend.backend_list
    # CUDA tensors go through host staging (no GPU here to run it on)
    assert dist.Backend.backend_capability["dlcp"] == ["cpu", "cuda"]


def test_import_dlcp_registers_without_importing_torch() -> None:
    """``import dlcp`` leaves torch alone, yet the backend is there once torch loads,
    even after a ``find_spec("torch")`` probe."""
    script = (
        "import importlib.util, sys\n"
        "import dlcp\n"
        "assert 'torch' not in sys.modules, 'import dlcp imported torch'\n"
        "assert importlib.util.find_spec('torch') is not None\n"
        "import torch.distributed as dist\n"
        "assert 'dlcp' in dist.Backend.backend_list\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


@pytest.mark.parametrize("first", ["shims.pg_options", "shims.ddp",
                                   "shims.process_group", "shims.metrics"])
def test_the_backend_is_registered_whichever_dlcp_module_comes_first(first: str) -> None:
    """A module of the shims imported first (``from shims.pg_options import
    DLCPOptions``) loads torch, or has it loaded later; the backend must be
    registered either way, with no warning."""
    script = (
        f"import {first}\n"
        "import torch.distributed as dist\n"
        "assert 'dlcp' in dist.Backend.backend_list, dist.Backend.backend_list\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-c", script],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def _prints_ok_without_env_variables(script: str) -> None:
    """Run ``script`` with none of the env:// variables set; it must print ok."""
    unset = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env=env)  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


@pytest.mark.parametrize("method", ["tcp", "file"])
def test_the_group_starts_from_an_init_method_without_env_variables(
    method: str, tmp_path: Path
) -> None:
    """``init_method="tcp://…"`` or ``"file://…"`` with rank and world size given,
    and none of the env:// variables: the group used to refuse with "MASTER_PORT=0
    is not a port" (the store is given, so the port is not needed)."""
    from dlcp.launch import free_port

    url = (f"tcp://127.0.0.1:{free_port()}" if method == "tcp"
           else f"file://{tmp_path / 'store'}")  # fmt: skip
    script = (
        "import torch, torch.distributed as dist\n"
        "import dlcp\n"
        f"dist.init_process_group('dlcp', init_method={url!r}, rank=0, world_size=1)\n"
        "t = torch.ones(4)\n"
        "dist.all_reduce(t)\n"
        "assert t.tolist() == [1.0] * 4\n"
        "dist.destroy_process_group()\n"
        "print('ok')\n"
    )
    _prints_ok_without_env_variables(script)


def test_the_ddp_hook_starts_from_an_init_method_without_env_variables() -> None:
    """The hook's endpoint takes the rank and size from the initialised group (and
    its store), not from env:// variables an init_method "tcp://…" never set: it
    used to refuse with "RANK is not set"."""
    from dlcp.launch import free_port

    script = (
        "import torch, torch.distributed as dist\n"
        "from torch import nn\n"
        "from shims.ddp import DLCPState, dlcp_hook\n"
        f"dist.init_process_group('gloo', init_method='tcp://127.0.0.1:{free_port()}',\n"
        "                        rank=0, world_size=1)\n"
        "torch.manual_seed(0)\n"
        "ddp = nn.parallel.DistributedDataParallel(nn.Linear(4, 2))\n"
        "state = DLCPState(model=ddp)\n"
        "ddp.register_comm_hook(state, dlcp_hook)\n"
        "ddp(torch.ones(3, 4)).sum().backward()\n"
        "assert ddp.module.weight.grad.tolist() == [[3.0] * 4] * 2\n"
        "state.close()\n"
        "dist.destroy_process_group()\n"
        "print('ok')\n"
    )
    _prints_ok_without_env_variables(script)
