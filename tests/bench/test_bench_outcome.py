"""How a benchmark ends when something under it fails."""

from __future__ import annotations

import argparse

import pytest

from dlcp.bench.outcome import finish
from testbed.netns import NetnsError


class JobFailed(RuntimeError):
    pass


@pytest.mark.parametrize(
    ("exc", "line"),
    [
        (JobFailed("rank 2 died"), "dlcp bench x: rank 2 died"),
        # a namespace step (the loss rule, offloads, a counter) ends the same way,
        # not with a traceback
        (NetnsError("nft: rule not added"), "dlcp bench x: nft: rule not added"),
    ],
)
def test_a_failure_under_the_run_is_one_line_and_status_1(
    exc: Exception, line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    def run(args: argparse.Namespace) -> dict[str, object]:
        raise exc

    args = argparse.Namespace(json=True)
    assert finish("x", run, str, args, errors=JobFailed, cleaned_up="nothing") == 1
    out, err = capsys.readouterr()
    assert err.strip() == line and out == ""


def test_the_send_threads_reported_are_those_the_launched_ranks_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``auto`` resolves as for ranks that ``dlcp launch`` started ``world_size`` to
    this host (their LOCAL_WORLD_SIZE), not as for the benchmark's own process."""
    import json
    import os

    from dlcp.bench.outcome import engine_threads_of_run

    monkeypatch.delenv("DLCP_ENGINE_THREADS", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    assert engine_threads_of_run("native") == 1  # (no ranks: this process's LOCAL_WORLD_SIZE)
    assert [engine_threads_of_run("native", n) for n in (1, 4, 8)] == [2, 2, 1]
    assert engine_threads_of_run("python", 1) is None

    def run(args: argparse.Namespace) -> dict[str, object]:
        return {"engine": "native", "world_size": 4}

    args = argparse.Namespace(json=True)
    assert finish("x", run, lambda r: "", args, errors=JobFailed, cleaned_up="-") == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["engine_threads"] == 2
    monkeypatch.setenv("DLCP_ENGINE_THREADS", "3")
    assert finish("x", run, lambda r: "", args, errors=JobFailed, cleaned_up="-") == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["engine_threads"] == 3


def test_hosts_that_share_the_machine_get_their_share_of_send_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import os

    from dlcp.io.engine import shared_host_threads

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert shared_host_threads(4, {}) == {"DLCP_ENGINE_THREADS": "1"}
    assert shared_host_threads(1, {}) == {"DLCP_ENGINE_THREADS": "2"}
    assert shared_host_threads(4, {"DLCP_ENGINE_THREADS": "2"}) == {}
    # the Python engine refuses more than one: on 8 CPUs 4 hosts would get 2 each
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    assert shared_host_threads(4, {}) == {"DLCP_ENGINE_THREADS": "2"}
    assert shared_host_threads(4, {"DLCP_ENGINE": " Python"}) == {}
