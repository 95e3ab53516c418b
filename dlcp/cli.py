"""The ``dlcp`` command line."""

from __future__ import annotations

import argparse
import importlib
import sys


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="dlcp", description="DLCP gradient transport")
    sub = ap.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="bounded-loss transport demo over an emulated link")
    demo.add_argument("--p", type=float, default=0.05, help="loss bound (default 0.05)")
    demo.add_argument(
        "--loss", type=float, default=0.05, help="drop probability on the lossy path (default 0.05)"
    )
    demo.add_argument("--steps", type=int, default=5)
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--json", action="store_true")

    bench = sub.add_parser("bench", help="benchmarks (machine-readable last line)")
    bench.add_argument("which", choices=["core"])
    bench.add_argument("args", nargs=argparse.REMAINDER, help="passed to the benchmark")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "demo":
        from .demo import main as demo_main

        return demo_main(
            p=args.p, loss=args.loss, steps=args.steps, seed=args.seed, as_json=args.json
        )
    if args.command == "bench":
        # bench/ is installed as dlcp.bench (package-dir), so it is imported by name
        bench = importlib.import_module(f"dlcp.bench.{args.which}")
        return int(bench.main(args.args))
    raise AssertionError(args.command)


if __name__ == "__main__":
    sys.exit(main())
