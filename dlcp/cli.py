"""The ``dlcp`` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from .errors import UsageError
from .proto.wire import MAX_LOSS_BOUND

#: the benchmarks ``dlcp bench NAME`` runs (each a module of :mod:`dlcp.bench`
#: with a ``main``, imported by :func:`_bench_main`)
BENCHMARKS = ("core", "transport", "ddp", "allreduce", "messages", "turns", "auth", "flood")


def _integer(text: str, low: int, high: int | None = None) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < low or (high is not None and value > high):
        within = f"at least {low}" if high is None else f"in {low}..{high}"
        raise argparse.ArgumentTypeError(f"must be {within}, got {value}")
    return value


def _at_least_one(text: str) -> int:
    return _integer(text, 1)


def _port(text: str) -> int:
    value = _at_least_one(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port (1..65535)")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 <= value < 86400:  # (also refuses nan and inf)
        raise argparse.ArgumentTypeError(f"must be within 0..86400 seconds, got {text}")
    return value


def _fraction(low: float, high: float, *, high_open: bool = False) -> Callable[[str], float]:
    """A number in [low, high] ([low, high) with ``high_open``), or an argparse error."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        inside = low <= value < high if high_open else low <= value <= high  # (nan: neither)
        if not inside:
            bracket = ")" if high_open else "]"
            raise argparse.ArgumentTypeError(f"must be in [{low:g}, {high:g}{bracket}, got {text}")
        return value

    return parse


def _seed(text: str) -> int:
    return _integer(text, 0, 2**32 - 1)


#: the loss bound's range (the header's 8-bit field: p = value / 1000)
_P = _fraction(0.0, MAX_LOSS_BOUND)
#: a drop probability
_LOSS = _fraction(0.0, 1.0, high_open=True)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="dlcp", description="DLCP gradient transport")
    sub = ap.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="bounded-loss transport demo over an emulated link")
    demo.add_argument("--p", type=_P, default=0.05, help="loss bound (default 0.05)")
    demo.add_argument(
        "--loss", type=_LOSS, default=0.05, help="drop probability on the lossy path (default 0.05)"
    )
    demo.add_argument(
        "--steps", type=_at_least_one, default=5, help="gradient buckets to send (default 5)"
    )
    demo.add_argument(
        "--seed",
        type=_seed,
        default=0,
        help="seed of the gradients and the link's drops (default 0)",
    )
    demo.add_argument(
        "--json", action="store_true", help="also print the results as one JSON line at the end"
    )

    launch = sub.add_parser(
        "launch",
        help="run N local ranks with torchrun's env:// variables (dlcp.launch)",
        description="Start N local ranks of a script (or module, or executable) with "
        "torchrun's env:// variables (MASTER_ADDR, MASTER_PORT, RANK, LOCAL_RANK, "
        "WORLD_SIZE, LOCAL_WORLD_SIZE), prefix each rank's output with [rankN]:, and "
        "when one rank fails, stop the others and exit with its exit code.",
    )
    launch.add_argument(
        "-n",
        "--nproc-per-node",
        dest="nproc",
        type=_at_least_one,
        required=True,
        help="number of ranks to start",
    )
    launch.add_argument("-m", "--module", action="store_true", help="run target as a module")
    launch.add_argument(
        "--no-python", action="store_true", help="run target as an executable, not with python"
    )
    launch.add_argument("--master-port", type=_port, default=None, help="default: a free port")
    launch.add_argument("--no-prefix", action="store_true", help="do not prefix [rankN]:")
    launch.add_argument(
        "--grace",
        type=_seconds,
        default=10.0,
        help="seconds between SIGTERM and SIGKILL when stopping ranks (default 10)",
    )
    launch.add_argument("target", help="script (or module with -m)")
    launch.add_argument("args", nargs=argparse.REMAINDER, help="passed to every rank")

    train = sub.add_parser(
        "train-demo", help="the main job: digits CNN on 4 ranks over DLCP and Gloo, plot"
    )
    train.add_argument(
        "-n", "--nproc", type=_at_least_one, default=4, help="local ranks to train on (default 4)"
    )
    train.add_argument(
        "--epochs", type=_at_least_one, default=8, help="epochs of each run (default 8)"
    )
    train.add_argument("--p", type=_P, default=0.05, help="DLCP loss bound (default 0.05)")
    train.add_argument(
        "--loss", type=_LOSS, default=0.01, help="EMULATED loss on DLCP (default 0.01)"
    )
    train.add_argument(
        "--collective",
        choices=["ring", "halving-doubling", "ps"],
        default="ring",
        help="DLCP's all-reduce: ring, halving-doubling (power-of-two -n) or ps, a PS-style "
        "all-reduce with every rank a server (default ring)",
    )
    train.add_argument("--results", default="results", help="directory for JSON and PNG")

    bench = sub.add_parser("bench", help="benchmarks (machine-readable last line)")
    bench.add_argument(
        "which",
        choices=BENCHMARKS,
        help="the benchmark (docs/benchmarks.md); `dlcp bench NAME --help` lists its options",
    )
    bench.add_argument("args", nargs=argparse.REMAINDER, help="passed to the benchmark")

    sync = sub.add_parser(
        "sync", help="synchronisation schemes (dlcp.sync) on the digits CNN: one or all"
    )
    sync.add_argument("action", choices=["run", "suite"],
                      help="run: the schemes given (--scheme NAME); suite: every scheme, 3 seeds")
    sync.add_argument("args", nargs=argparse.REMAINDER, help="options of python -m dlcp.bench.sync")

    # dlcp does not depend on the testbed: the testbed's commands are imported here and
    # in main(), when the command line is built or run, never by importing dlcp
    from testbed.cli import add_parser as add_testbed_parser

    add_testbed_parser(sub)
    from .switch.cli import add_parser as add_switch_parser

    add_switch_parser(sub)
    from .sim.cli import add_parser as add_sim_parser

    add_sim_parser(sub)
    _describe(ap)
    return ap


def _describe(ap: argparse.ArgumentParser) -> None:
    """Give every subcommand without a description its one-line help as one, so
    that ``dlcp NAME --help`` says what NAME does."""
    for action in ap._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                if sub.description is None and helps.get(name):
                    sub.description = helps[name]
                _describe(sub)


def _bench_main(which: str) -> Callable[..., int]:
    """The ``main`` of benchmark ``which`` (one of ``dlcp bench``'s choices)."""
    if which == "core":
        from .bench.core import main
    elif which == "transport":
        from .bench.transport import main
    elif which == "ddp":
        from .bench.ddp import main
    elif which == "allreduce":
        from .bench.allreduce import main
    elif which == "messages":
        from .bench.messages import main
    elif which == "turns":
        from .bench.turns import main
    elif which == "auth":
        from .bench.auth import main
    elif which == "flood":
        from .bench.flood import main
    else:
        raise UsageError(f"no benchmark {which!r}")
    return main


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    halving = args.command == "train-demo" and args.collective == "halving-doubling"
    if halving and args.nproc & (args.nproc - 1):
        ap.error(f"--collective halving-doubling needs a power-of-two -n, got {args.nproc}")
    if args.command == "demo":
        from .demo import main as demo_main

        return demo_main(
            p=args.p, loss=args.loss, steps=args.steps, seed=args.seed, as_json=args.json
        )
    if args.command == "launch":
        from .launch import run_cli

        return run_cli(
            args.nproc,
            args.module,
            args.target,
            args.args,
            no_python=args.no_python,
            master_port=args.master_port,
            prefix=not args.no_prefix,
            grace=args.grace,
        )
    if args.command == "train-demo":
        from .train_demo import main as train_main

        return train_main(
            nproc=args.nproc,
            epochs=args.epochs,
            p=args.p,
            loss=args.loss,
            collective=args.collective,
            results=args.results,
        )
    if args.command == "bench":
        return _bench_main(args.which)(args.args, prog=f"dlcp bench {args.which}")
    if args.command == "sync":
        from .bench import sync as bench_sync

        extra = list(args.args)
        if args.action == "suite" and "--seeds" not in extra:
            extra = ["--seeds", "3", *extra]
        return int(bench_sync.main(extra, prog=f"dlcp sync {args.action}"))
    if args.command == "testbed":
        from testbed.cli import main as testbed_main

        return testbed_main(args)
    if args.command == "switch":
        from .switch.cli import main as switch_main

        return switch_main(args)
    if args.command == "sim":
        from .sim.cli import main as sim_main

        return sim_main(args)
    raise AssertionError(args.command)


if __name__ == "__main__":
    sys.exit(main())
