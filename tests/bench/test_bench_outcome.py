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
