"""The ``dlcp`` command line refuses bad values with a usage error naming the
option, before anything starts (they came out as a traceback per rank, or ran:
``dlcp demo --loss 2`` printed "drops 200% of packets")."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlcp.cli import main


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["demo", "--p", "1.5"], "argument --p: must be in [0, 0.255], got 1.5"),
        (["demo", "--p", "-0.1"], "argument --p: must be in [0, 0.255]"),
        (["demo", "--loss", "2"], "argument --loss: must be in [0, 1), got 2"),
        (["demo", "--loss", "nan"], "argument --loss: must be in [0, 1), got nan"),
        (["demo", "--seed", "-1"], "argument --seed: must be in 0..4294967295, got -1"),
        (["train-demo", "--p", "0.3"], "argument --p: must be in [0, 0.255]"),
        (["train-demo", "--loss", "1"], "argument --loss: must be in [0, 1)"),
        (["train-demo", "-n", "3", "--collective", "halving-doubling"],
         "--collective halving-doubling needs a power-of-two -n, got 3"),
    ],
)  # fmt: skip
def test_bad_values_are_usage_errors(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    assert says in capsys.readouterr().err


def test_a_results_path_that_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "afile").write_text("")
    assert main(["train-demo", "--results", str(tmp_path / "afile")]) == 2
    assert f"cannot use --results {tmp_path / 'afile'}" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--p", "0.3"], "a loss bound is in [0, 0.255]"),
        (["--p", "0.01", "--p-gather", "0.02"], "--p-gather 0.02 must not exceed --p 0.01"),
        (["--batch-size", "0"], "'0' is not a positive integer"),
        (["--epochs", "-2"], "'-2' is not a positive integer"),
        (["--json", "/no/such/dir/out.json"], "--json /no/such/dir/out.json: no directory"),
    ],
)  # fmt: skip
def test_the_examples_bad_values_are_usage_errors(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from examples.train_digits import main as train_main

    with pytest.raises(SystemExit) as stop:
        train_main(argv)
    assert stop.value.code == 2
    assert says in capsys.readouterr().err
