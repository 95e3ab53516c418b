"""Build and run the libFuzzer targets of tests/fuzz/ (``make fuzz``).

    python tests/fuzz/run.py [--seconds 60] [--jobs 1] [--build build/fuzz] [TARGET ...]

For each target (``fuzz_<name>.c``): builds it with clang and
``-fsanitize=fuzzer,address,undefined`` (any sanitizer finding aborts), writes the
seed corpus from the golden vectors (``make_corpus.py``), runs the inputs of
``regressions/<name>/`` once each (inputs that once failed), then fuzzes it for
its share of ``--seconds`` (split evenly; ``--jobs`` targets at a time), keeping
what it finds in ``<build>/work/<name>`` for the next run and any failing input in
``<build>/crashes/<name>/``. Prints libFuzzer's figures per target (executions,
coverage) and exits 1 if any target failed, 2 if clang cannot build them.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
TARGETS = sorted(p.stem.removeprefix("fuzz_") for p in HERE.glob("fuzz_*.c"))
FLAGS = [
    "-g",
    "-O1",
    "-fsanitize=fuzzer,address,undefined",
    "-fno-sanitize-recover=all",
    "-Wall",
    "-Wextra",
]


@dataclass
class Outcome:
    target: str
    ok: bool
    execs: int
    cov: int
    features: int
    corpus: int
    seconds: float
    detail: str


def find_clang() -> str | None:
    for name in (os.environ.get("FUZZ_CC"), "clang", "clang-16", "clang-15", "clang-14"):
        if name and shutil.which(name):
            return name
    return None


def build(clang: str, target: str, out: Path) -> Path:
    binary = out / f"fuzz_{target}"
    cmd = [clang, *FLAGS, str(HERE / f"fuzz_{target}.c"), "-o", str(binary)]
    subprocess.run(cmd, check=True, cwd=ROOT)
    return binary


def last_int(pattern: str, text: str) -> int:
    found = re.findall(pattern, text)
    return int(found[-1]) if found else 0


def fuzz(binary: Path, target: str, seconds: int, out: Path) -> Outcome:
    work, crashes = out / "work" / target, out / "crashes" / target
    work.mkdir(parents=True, exist_ok=True)
    crashes.mkdir(parents=True, exist_ok=True)
    regressions = sorted((HERE / "regressions" / target).glob("*"))
    if regressions:  # each once: a fixed bug stays fixed
        run = subprocess.run(
            [str(binary), *map(str, regressions)], capture_output=True, text=True, check=False
        )
        if run.returncode:
            return Outcome(
                target, False, 0, 0, 0, 0, 0.0, "a regression input fails:\n" + run.stderr[-3000:]
            )
    cmd = [
        str(binary),
        f"-max_total_time={seconds}",
        "-timeout=10",
        "-rss_limit_mb=2048",
        "-print_final_stats=1",
        f"-artifact_prefix={crashes}/",
        str(work),
        str(out / "corpus" / target),
    ]
    began = time.monotonic()
    run = subprocess.run(cmd, capture_output=True, text=True, check=False)
    log = run.stderr
    (out / f"{target}.log").write_text(log)
    return Outcome(
        target,
        run.returncode == 0,
        last_int(r"stat::number_of_executed_units:\s*(\d+)", log),
        last_int(r"cov: (\d+)", log),
        last_int(r"ft: (\d+)", log),
        last_int(r"corp: (\d+)/", log),
        time.monotonic() - began,
        "" if run.returncode == 0 else log[-3000:],
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("targets", nargs="*", default=TARGETS, help=f"of {TARGETS}")
    parser.add_argument("--seconds", type=int, default=60, help="fuzzing time of all targets")
    parser.add_argument("--jobs", type=int, default=1, help="targets fuzzed at a time")
    parser.add_argument("--build", type=Path, default=ROOT / "build" / "fuzz")
    args = parser.parse_args()
    unknown = [t for t in args.targets if t not in TARGETS]
    if unknown:
        parser.error(f"no target {', '.join(unknown)} (there are {', '.join(TARGETS)})")
    if args.seconds < 1 or args.jobs < 1:
        parser.error("--seconds and --jobs must be positive")
    clang = find_clang()
    if clang is None:
        print("fuzz: clang not found (Debian: apt-get install clang libclang-rt-14-dev)")
        return 2
    out = args.build.resolve()
    out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(HERE))
    import make_corpus

    made = make_corpus.main(out / "corpus")
    print("seeds from the golden vectors:", made)
    try:
        binaries = {t: build(clang, t, out) for t in args.targets}
    except subprocess.CalledProcessError as e:
        print(f"fuzz: building failed: {e}")
        return 2
    # each target's share, in rounds of --jobs targets at a time
    rounds = -(-len(args.targets) // args.jobs)
    share = max(1, args.seconds // rounds)
    with ThreadPoolExecutor(args.jobs) as pool:
        outcomes = list(pool.map(lambda t: fuzz(binaries[t], t, share, out), args.targets))
    print(
        f"{'target':14} {'result':7} {'execs':>11} {'exec/s':>8} {'cov':>5} {'ft':>6} {'corpus':>6}"
    )
    for o in outcomes:
        rate = o.execs / o.seconds if o.seconds else 0
        print(
            f"{o.target:14} {'ok' if o.ok else 'FAILED':7} {o.execs:>11} {rate:>8.0f} "
            f"{o.cov:>5} {o.features:>6} {o.corpus:>6}"
        )
    print(f"total executions: {sum(o.execs for o in outcomes)}")
    failed = [o for o in outcomes if not o.ok]
    for o in failed:
        print(f"\n--- {o.target} failed (inputs in {out / 'crashes' / o.target}):\n{o.detail}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
