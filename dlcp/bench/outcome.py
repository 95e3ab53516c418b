"""How a benchmark ends: its table, its JSON line, or one line saying why not."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from dlcp.processes import sigterm_interrupts

__all__ = ["engine_of_run", "engine_threads_of_run", "finish", "ranks_authenticate"]


def engine_of_run() -> str:
    """The engine the endpoints of this run send with (``native`` or ``python``):
    what ``DLCP_ENGINE`` selects in the ranks, which inherit this environment and
    this build."""
    from dlcp.io.config import EndpointConfig
    from dlcp.io.engine import choose_engine

    config = EndpointConfig.from_env()
    return choose_engine(config.engine, authenticate=config.protocol.authenticate)


def engine_threads_of_run(engine: str, local_ranks: int | None = None) -> int | None:
    """The send threads of the native engine in this run's endpoints
    (``DLCP_ENGINE_THREADS``; ``auto`` as it resolves for ranks launched
    ``local_ranks`` to this host, as ``dlcp launch`` sets ``LOCAL_WORLD_SIZE``, or,
    without, in this process's environment), None when they run the Python
    ``engine``."""
    from dlcp.io.config import EndpointConfig
    from dlcp.io.engine import send_threads

    if engine != "native":
        return None
    env = dict(os.environ)
    if local_ranks is not None:
        env["LOCAL_WORLD_SIZE"] = str(local_ranks)
    return send_threads(EndpointConfig.from_env().engine_threads, env)


def ranks_authenticate(asked: bool) -> bool:
    """Whether the ranks a benchmark launches authenticate. It sets DLCP against
    Gloo and TCP, which do not: its ranks run unauthenticated (``DLCP_AUTHENTICATE=0``,
    set here for them to inherit, whatever the default) unless ``asked``
    (``--auth``) or ``DLCP_AUTHENTICATE`` in the environment says otherwise. The
    JSON's ``authenticated`` is the answer."""
    import os

    from dlcp.io.config import EndpointConfig

    if asked:
        os.environ["DLCP_AUTHENTICATE"] = "1"
    else:
        os.environ.setdefault("DLCP_AUTHENTICATE", "0")
    return EndpointConfig.from_env().protocol.authenticate


def finish(
    name: str,
    run: Callable[[argparse.Namespace], dict[str, Any]],
    table: Callable[[dict[str, Any]], str],
    args: argparse.Namespace,
    *,
    errors: type[Exception] | tuple[type[Exception], ...],
    cleaned_up: str,
) -> int:
    """``run(args)``, then print ``table`` of its result and, with ``--json``, the
    result as the last line, with the machine it ran on and how busy that was
    during the run (``"machine"``, :mod:`dlcp.bench.machine`); exit status 0. A
    failed job (one of ``errors``), a namespace step that failed
    (:class:`NetnsError`: a loss rule, offloads, a counter) or Ctrl-C ends with
    one line naming the benchmark (``dlcp bench <name>: ...``; ``cleaned_up``
    says what was stopped and removed) and status 1 or 130.
    SIGTERM counts as Ctrl-C here: it unwinds the same way, so that what the run
    built (namespaces, workers) is removed by its ``finally`` blocks."""
    # the benchmarks build their networks with the testbed (dlcp itself does not import it)
    from testbed.netns import NetnsError

    caught: tuple[type[Exception], ...] = (
        *(errors if isinstance(errors, tuple) else (errors,)),
        NetnsError,
    )
    from .machine import cpu_times, describe

    start = cpu_times()
    try:
        with sigterm_interrupts():
            result = run(args)
    except caught as exc:
        print(f"dlcp bench {name}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"dlcp bench {name}: interrupted ({cleaned_up})", file=sys.stderr)
        return 130
    engine = result.get("engine", engine_of_run())
    # (a benchmark whose ranks dlcp launch started on this host says how many)
    threads = result.get("engine_threads", engine_threads_of_run(engine, result.get("world_size")))
    placed: dict[str, Any] = {}  # (the thread count beside the engine)
    for key, value in {**result, "engine": engine}.items():
        if key != "engine_threads":
            placed[key] = value
        if key == "engine":
            placed["engine_threads"] = threads
    result = placed
    result["machine"] = describe(start, cpu_times())
    print(table(result))
    if args.json:
        print(json.dumps(result))
    return 0
