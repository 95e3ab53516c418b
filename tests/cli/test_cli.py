"""The ``dlcp`` command line refuses bad values with a usage error naming the
option, before anything starts (they came out as a traceback per rank, or ran:
``dlcp demo --loss 2`` printed "drops 200% of packets")."""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest

from dlcp.cli import BENCHMARKS, _bench_main, _parser, main
from dlcp.train_demo import example_script


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
    # examples/ are scripts, not a package: loaded by path
    spec = importlib.util.spec_from_file_location("train_digits", example_script("train_digits.py"))
    assert spec is not None and spec.loader is not None
    train_digits = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train_digits)
    with pytest.raises(SystemExit) as stop:
        train_digits.main(argv)
    assert stop.value.code == 2
    assert says in capsys.readouterr().err


def _commands(
    ap: argparse.ArgumentParser, path: tuple[str, ...] = ("dlcp",)
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, ap
    for action in ap._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))


def test_every_option_and_command_says_what_it_is_for() -> None:
    """``dlcp demo --help`` listed --steps, --seed and --json with nothing beside them,
    as train-demo did -n, --epochs and --collective, and ``dlcp launch --help`` said
    nothing about what launch does: every option, and every command, has a help text."""
    silent = []
    for path, ap in _commands(_parser()):
        if ap.description is None:
            silent.append(" ".join(path))
        for action in ap._actions:
            if action.help is None and not isinstance(action, argparse._SubParsersAction):
                silent.append(f"{' '.join(path)} {'/'.join(action.option_strings) or action.dest}")
    assert silent == []


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["launch", "--help"], "SIGKILL when stopping ranks (default 10)"),
        (["launch", "--help"], "prefix each rank's output with [rankN]:"),
        (["demo", "--help"], "gradient buckets to send (default 5)"),
        (["train-demo", "--help"], "local ranks to train on (default 4)"),
    ],
)  # fmt: skip
def test_help_shows_the_defaults(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 0
    assert says in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("which", BENCHMARKS)
def test_a_benchmarks_help_names_the_command_that_ran_it(
    which: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``dlcp bench core --help`` called itself ``dlcp`` (argparse's program name)."""
    with pytest.raises(SystemExit) as stop:
        main(["bench", which, "--help"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: dlcp bench {which} [")


class _Parsed(Exception):
    """Raised in place of parsing: carries the parser a benchmark built."""


@pytest.mark.parametrize("which", BENCHMARKS)
def test_every_benchmark_option_says_what_it_is_for(
    which: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``dlcp bench auth`` was listed among the choices but not run (``no benchmark
    'auth'``), and ``dlcp bench core --help`` listed --size-mib, --repeat and four more
    options with nothing beside them: every listed benchmark runs, and every option
    it takes (internal ones hidden) has a help text."""

    def grab(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        raise _Parsed(self)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", grab)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", grab)
    with pytest.raises(_Parsed) as parsed:
        _bench_main(which)([], prog=f"dlcp bench {which}")
    ap = parsed.value.args[0]
    silent = [
        "/".join(action.option_strings) or action.dest
        for action in ap._actions
        if action.help is None
    ]
    assert silent == []


def test_every_option_of_dlcp_sync_says_what_it_is_for() -> None:
    """``dlcp sync`` passes its options to :mod:`dlcp.bench.sync`, whose --workers,
    --steps, --seeds and four more had no help text."""
    from dlcp.bench.sync import _parser as sync_parser

    silent = [
        "/".join(action.option_strings) or action.dest
        for action in sync_parser()._actions
        if action.help is None
    ]
    assert silent == []
