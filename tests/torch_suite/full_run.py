"""Run the whole of torch's distributed harness (:mod:`run_suite`) in chunks, for
one backend mode, and merge the results into one JSON file.

    python tests/torch_suite/full_run.py run --mode gloo --out DIR
    python tests/torch_suite/full_run.py run --mode dressed --out DIR --only DIR/gloo.json
    python tests/torch_suite/full_run.py merge --out DIR
    python tests/torch_suite/full_run.py table --out DIR > table.md

Modes: ``gloo`` (torch's own Gloo), ``dlcp`` (BACKEND=dlcp) and ``dressed``
(DRESS_AS_GLOO=1: the harness asks for "gloo" and gets "dlcp"). Each chunk of
tests runs in one pytest process writing a JUnit XML file under
``DIR/<mode>/``; a chunk whose file exists is not run again, so an interrupted
run resumes. ``--only FILE`` runs just the tests a previous merged result
passed (the other backends are compared on what Gloo passes). ``merge`` writes
``DIR/<mode>.json`` per mode (command, date, commit, torch version, and per test
its outcome, seconds and first message line). ``table`` prints, for every test
Gloo passes, the other modes' outcomes.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SUITE = "tests/torch_suite/run_suite.py"
CLASS = "TestDistBackendWithSpawn"
MODES = {
    "gloo": {"BACKEND": "gloo"},
    "dlcp": {"BACKEND": "dlcp"},
    "dressed": {"DRESS_AS_GLOO": "1"},
    "dressed-mpi": {"DRESS_AS_MPI": "1"},
}


def mode_env(mode: str, test_timeout: int) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("BACKEND", "DRESS_AS_GLOO", "DRESS_AS_MPI", "TORCH_SUITE_FORK")
    }
    env.update(MODES[mode])
    env.setdefault("WORLD_SIZE", "3")
    # the harness's per-test limit (torch's default is 300 s)
    env["DISTRIBUTED_TESTS_DEFAULT_TIMEOUT"] = str(test_timeout)
    return env


#: decorators (by the code name of their wrapper) whose wrapper exits each rank
#: as skipped on a machine without a GPU
SKIPPING_WRAPPERS = ("skip_if_no_gpu.", "require_n_gpus_for_nccl")


def small_world() -> bool:
    """torch's ``skip_if_small_worldsize`` skips under 8 ranks, but for MPI."""
    return os.environ["BACKEND"] != "mpi" and int(os.environ["WORLD_SIZE"]) < 8


def static_skip(test: object) -> str | None:
    """Why the harness would start ``test``'s ranks only for each to skip it, or
    None: read from its decorators' wrappers, so that the full run need not pay
    for spawning them (tens of seconds each on two cores)."""
    fn = test
    while fn is not None:
        code = getattr(fn, "__code__", None)
        name = code.co_qualname if code is not None else ""
        if name.startswith(SKIPPING_WRAPPERS) or (
            name.startswith("skip_if_small_worldsize.") and small_world()
        ):
            return name.split(".")[0]
        if name.startswith(("skip_if_lt_x_gpu.", "nccl_skip_if_lt_x_gpu.")):
            closure = fn.__closure__ or ()
            cells = dict(zip(code.co_freevars, (c.cell_contents for c in closure), strict=True))
            if not cells.get("allow_cpu", False):
                return f"{name.split('.')[0]}({cells.get('x', '?')}): needs GPUs"
        fn = getattr(fn, "__wrapped__", None)
    return None


def plan(mode: str) -> dict[str, str | None]:
    """Every test for ``mode``: None (to run), or why it is not run."""
    code = (
        "import json, sys; sys.path.insert(0, 'tests/torch_suite'); import run_suite, full_run\n"
        f"cls = run_suite.{CLASS}\n"
        "out = {}\n"
        "for n in sorted(dir(cls)):\n"
        "    if n.startswith('test_'):\n"
        "        t = getattr(cls, n)\n"
        "        why = getattr(t, '__unittest_skip_why__', None) if getattr(\n"
        "            t, '__unittest_skip__', False) else full_run.static_skip(t)\n"
        "        out[n] = why\n"
        "print(json.dumps(out))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=mode_env(mode, 300),
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    result: dict[str, str | None] = json.loads(out.splitlines()[-1])
    return result


def passed_in(path: Path) -> set[str]:
    data = json.loads(path.read_text())
    return {name for name, r in data["tests"].items() if r["outcome"] == "passed"}


def done_in(chunk_dir: Path) -> set[str]:
    return {
        case.get("name", "?")
        for xml in chunk_dir.glob("chunk*.xml")
        for case in ET.parse(xml).getroot().iter("testcase")
    }


def run(args: argparse.Namespace) -> int:
    chunk_dir = Path(args.out) / args.mode
    chunk_dir.mkdir(parents=True, exist_ok=True)
    planned = plan(args.mode)
    (chunk_dir / "plan.json").write_text(json.dumps(planned, indent=1) + "\n")
    command = {
        "argv": ["python", "tests/torch_suite/full_run.py", *sys.argv[1:]],
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": git_commit(),
    }
    with (chunk_dir / "commands.jsonl").open("a") as f:
        f.write(json.dumps(command) + "\n")
    names = [n for n, why in planned.items() if why is None]
    if args.only:
        keep = passed_in(Path(args.only))
        names = [n for n in names if n in keep]
    if args.match:
        names = [n for n in names if args.match in n]
    if args.names:
        wanted = set(args.names.split(","))
        unknown = sorted(wanted - set(planned))
        if unknown:
            raise SystemExit(f"--names: no such test in the harness: {', '.join(unknown)}")
        names = [n for n in names if n in wanted]
    # the collectives and point-to-point first, DDP's tests (the slowest) last
    names.sort(key=lambda n: ("ddp" in n.lower() or "DistributedDataParallel" in n, n))
    done = done_in(chunk_dir)
    names = [n for n in names if n not in done]
    env = mode_env(args.mode, args.test_timeout)
    if args.fork:
        env["TORCH_SUITE_FORK"] = "1"
    for i in range(0, len(names), args.chunk):
        chunk = names[i : i + args.chunk]
        xml = chunk_dir / f"chunk{len(list(chunk_dir.glob('chunk*.xml'))):03d}.xml"
        ids = [f"{SUITE}::{CLASS}::{n}" for n in chunk]
        print(f"[{args.mode}] {i + len(chunk)}/{len(names)}: {' '.join(chunk)}", flush=True)
        partial = xml.with_suffix(".partial")
        subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
             f"--junitxml={partial}", *ids],
            cwd=ROOT, env=env, check=False,
        )  # fmt: skip
        if partial.exists():  # (pytest failed to start: no file; the chunk reruns)
            partial.rename(xml)
    return 0


#: a rank's error line in a failure's text ("E   SomeError: ..."), not the
#: harness's "Process N exited" that wraps it
RANK_ERROR = re.compile(r"^E\s+(\w+(?:Error|Exception|Timeout)\b.*)$")


def outcome(case: ET.Element) -> tuple[str, str]:
    """(passed / failed / error / skipped, the most telling line of its message)."""
    for tag in ("failure", "error", "skipped"):
        node = case.find(tag)
        if node is not None:
            text = node.text or ""
            errors = [
                m.group(1)
                for line in text.splitlines()
                if (m := RANK_ERROR.match(line)) and "exited with error code" not in line
            ]
            first = (node.get("message") or text).strip().splitlines()
            line = errors[-1] if errors else (first[0] if first else "")
            return ("failed" if tag == "failure" else tag), line.strip()[:300]
    return "passed", ""


def git_commit() -> str:
    return subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()


def merge(args: argparse.Namespace) -> int:
    import torch

    for mode in MODES:
        chunk_dir = Path(args.out) / mode
        if not chunk_dir.is_dir():
            continue
        tests: dict[str, dict[str, object]] = {}
        for xml in sorted(chunk_dir.glob("chunk*.xml")):
            for case in ET.parse(xml).getroot().iter("testcase"):
                result, message = outcome(case)
                tests[case.get("name", "?")] = {
                    "outcome": result,
                    "seconds": round(float(case.get("time", "0")), 1),
                    "message": message,
                }
        planned = json.loads((chunk_dir / "plan.json").read_text())
        not_started = {n: why for n, why in planned.items() if why is not None}
        counts: dict[str, int] = {}
        for r in tests.values():
            counts[str(r["outcome"])] = counts.get(str(r["outcome"]), 0) + 1
        counts["not started"] = len(not_started)
        commands = [json.loads(line) for line in (chunk_dir / "commands.jsonl").open()]
        summary = {
            "commands": commands,
            "environment": MODES[mode]
            | {"WORLD_SIZE": os.environ.get("WORLD_SIZE", "3")}
            | {k: os.environ[k] for k in ("INIT_METHOD",) if k in os.environ},
            "merged": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "commit": git_commit(),
            "torch": torch.__version__,
            "python": sys.version.split()[0],
            "counts": counts,
            "tests": dict(sorted(tests.items())),
            # skipped by their decorators (read without starting their ranks), or
            # by unittest's skip before any rank starts: the reason
            "not_started": not_started,
        }
        (Path(args.out) / f"{mode}.json").write_text(json.dumps(summary, indent=1) + "\n")
        print(mode, counts)
    return 0


def table(args: argparse.Namespace) -> int:
    """Markdown: every test Gloo passes, with each other mode's outcome."""
    out = Path(args.out)
    gloo = json.loads((out / "gloo.json").read_text())["tests"]
    others = {
        mode: json.loads((out / f"{mode}.json").read_text())
        for mode in ("dressed", "dlcp")
        if (out / f"{mode}.json").exists()
    }

    def cell(data: dict[str, Any], name: str) -> str:
        if name in data["tests"]:
            return str(data["tests"][name]["outcome"])
        why = data["not_started"].get(name)
        return f"not run: {why[:60]}" if why else "not run"

    print("| test (Gloo passes) | " + " | ".join(others) + " |")
    print("|---|" + "---|" * len(others))
    for name in sorted(n for n, r in gloo.items() if r["outcome"] == "passed"):
        print(f"| {name} | " + " | ".join(cell(d, name) for d in others.values()) + " |")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run")
    p_run.add_argument("--mode", choices=sorted(MODES), required=True)
    p_run.add_argument("--only", help="a merged JSON: run only the tests it passed")
    p_run.add_argument("--match", help="only the tests whose name contains this")
    p_run.add_argument("--names", help="only these tests (comma-separated names)")
    p_run.add_argument("--fork", action="store_true", help="fork the ranks (TORCH_SUITE_FORK=1)")
    p_run.add_argument("--chunk", type=int, default=4, help="tests per pytest process")
    p_run.add_argument("--test-timeout", type=int, default=180, help="seconds per test")
    for p in (p_run, sub.add_parser("merge"), sub.add_parser("table")):
        p.add_argument("--out", required=True, help="results directory")
    args = parser.parse_args()
    return {"run": run, "merge": merge, "table": table}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
