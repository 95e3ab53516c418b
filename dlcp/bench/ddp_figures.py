"""The arithmetic of :mod:`dlcp.bench.ddp`'s figures, and its Python-engine jobs.

With ``--python-engine`` every phase of the DDP benchmark runs a fourth
transport, ``dlcp_python``: DLCP's jobs again with ``DLCP_ENGINE=python``, in the
same turns as Gloo's and the default (native) engine's. Both engines' iterations
then meet the same machine, and :func:`python_engine_summary` gives their ratios
to Gloo and to each other phase by phase and round by round: two separate runs of
the benchmark, minutes apart, once moved Gloo's iteration by 14 % on a 2-vCPU VM,
more than the engines differ. Every DLCP job's ranks report the engine they ran,
and a job whose ranks ran another engine than its name says fails the run
(:func:`check_job_engines`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from dlcp.errors import BenchError

__all__ = [
    "PYTHON_ENGINE",
    "check_job_engines",
    "check_python_engine_jobs",
    "expected_engine",
    "job_env",
    "ms",
    "or_dash",
    "python_engine_lines",
    "python_engine_summary",
    "ratio",
    "round_ratios",
    "rounded",
]

#: the transport name of DLCP's jobs on the Python engine
PYTHON_ENGINE = "dlcp_python"


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b`` to 3 decimals; None if either is missing (or ``b`` is 0)."""
    return round(a / b, 3) if a is not None and b else None


def rounded(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else round(x, digits)


def ms(x: float | None) -> str:
    """A time in seconds as the table shows it, in milliseconds ("-": none)."""
    return "-" if x is None else f"{1e3 * x:.1f} ms"


def or_dash(x: float | None) -> str:
    """A ratio as the table shows it ("-": none)."""
    return "-" if x is None else f"{x}"


def round_ratios(a: dict[str, Any] | None, b: dict[str, Any] | None) -> list[float | None] | None:
    """Each round's ratio of two configurations' jobs (the jobs of a round ran in
    turn), None if either did not run."""
    if not a or not b:
        return None
    return [ratio(x, y) for x, y in zip(a["iter_s_jobs"], b["iter_s_jobs"], strict=True)]


def _iter_s(config: dict[str, Any] | None) -> float | None:
    return config["iter_s"] if config else None


def check_python_engine_jobs(engine: str) -> None:
    """``--python-engine`` compares the Python engine with the native one: the
    run's own DLCP jobs (``engine``, from ``DLCP_ENGINE``, the build and, with
    ``--auth``, whether the native engine can tag) must be the native engine's."""
    if engine != "native":
        raise BenchError(
            "--python-engine runs DLCP's jobs on both engines, but this run's DLCP jobs "
            f"would run the {engine} engine already: DLCP_ENGINE is 'python', or the "
            "native engine was not built (install with a C compiler), or --auth needs "
            "tags the native engine cannot make (built without libcrypto)"
        )


def job_env(transport: str) -> tuple[str, dict[str, str]]:
    """The worker's transport and the extra environment of a job of ``transport``
    (the Python engine has no send threads: ``DLCP_ENGINE_THREADS`` set for the
    native engine's jobs must not reach its jobs)."""
    if transport == PYTHON_ENGINE:
        return "dlcp", {"DLCP_ENGINE": "python", "DLCP_ENGINE_THREADS": "1"}
    return transport, {}


def expected_engine(env: Mapping[str, str], run_engine: Callable[[], str]) -> str:
    """The engine a DLCP job's ranks must report: the one its environment ``env``
    names (``DLCP_ENGINE`` native or python), else what ``auto`` gives this run
    (``run_engine``: the build, and whether the ranks authenticate)."""
    named = env.get("DLCP_ENGINE")
    return named if named in ("native", "python") else run_engine()


def check_job_engines(transport: str, engines: list[str | None], expected: str) -> None:
    """A DLCP job's ranks ran ``engines`` (each rank's endpoint says; None: the rank
    had no endpoint); its name promised ``expected``."""
    missing = [rank for rank, e in enumerate(engines) if e is None]
    if missing:
        raise BenchError(f"{transport} job: rank(s) {missing} reported no endpoint's engine")
    if any(e != expected for e in engines):
        raise BenchError(
            f"{transport} job: its ranks ran the engines {engines}, not {expected!r} "
            "on every rank: its figures would be another engine's"
        )


def python_engine_summary(
    res: dict[str, Any], nocomm_iter_s: float, *, kernel: bool
) -> dict[str, Any] | None:
    """The Python engine's figures beside the native engine's (``res``: the
    benchmark's configurations by name; ``kernel``: the loss was nftables', not
    the emulator's), None when it did not run."""
    p = res.get(PYTHON_ENGINE)
    if p is None:
        return None
    d, g = res["dlcp"], res["gloo"]
    pn_, dn_, gn_ = (res.get(f"{t}_netns") for t in (PYTHON_ENGINE, "dlcp", "gloo"))
    pn, dn, gn = _iter_s(pn_), _iter_s(dn_), _iter_s(gn_)
    pl, dl, gl = (res.get(f"{t}_loss") for t in (PYTHON_ENGINE, "dlcp", "gloo"))
    return {
        "engines": p.get("engines"),  # (each lossless job's, as its ranks reported it)
        "iter_s": rounded(p["iter_s"]),
        "ratio": ratio(p["iter_s"], g["iter_s"]),
        "ratio_rounds": round_ratios(p, g),
        "comm_cost_s": rounded(p["iter_s"] - nocomm_iter_s),
        "ratio_comm_cost": ratio(p["iter_s"] - nocomm_iter_s, g["iter_s"] - nocomm_iter_s),
        # below 1: the native engine's iteration is the shorter
        "native_over_python": ratio(d["iter_s"], p["iter_s"]),
        "native_over_python_rounds": round_ratios(d, p),
        "iter_s_netns_lossless": rounded(pn),
        "ratio_netns_lossless": ratio(pn, gn),
        "ratio_netns_lossless_rounds": round_ratios(pn_, gn_),
        "native_over_python_netns_lossless": ratio(dn, pn),
        "native_over_python_netns_lossless_rounds": round_ratios(dn_, pn_),
        "iter_s_loss": rounded(_iter_s(pl)),
        "ratio_loss": ratio(_iter_s(pl), _iter_s(gl)),
        "ratio_loss_rounds": round_ratios(pl, gl),
        "native_over_python_loss": ratio(_iter_s(dl), _iter_s(pl)),
        "native_over_python_loss_rounds": round_ratios(dl, pl),
        "lost_fraction_loss": rounded(pl["lost_fraction"], 6) if pl else None,
        "retransmitted_per_iter_loss": rounded(pl["retransmitted_per_iter"], 1) if pl else None,
        # what the loss took from these jobs: the emulator's drops, or nftables'
        "emulated_loss_dropped": pl.get("emulated_loss_dropped") if pl and not kernel else None,
        "nft_dropped": pl.get("nft_dropped") if pl and kernel else None,
    }


def python_engine_lines(r: dict[str, Any]) -> list[str]:
    """The table's lines for the Python engine's jobs (none if they did not run)."""
    p = r.get("python_engine")
    if not p:
        return []
    lines = [
        f"  Python engine, lossless, loopback: {ms(p['iter_s'])}  over Gloo {p['ratio']}  "
        f"(communication cost over Gloo's {or_dash(p['ratio_comm_cost'])}); native over Python "
        f"{p['native_over_python']} (rounds {p['native_over_python_rounds']})"
    ]
    if p["ratio_netns_lossless"] is not None:
        lines.append(
            f"  Python engine, lossless, {r['loss_path']}: {ms(p['iter_s_netns_lossless'])}  "
            f"over Gloo {p['ratio_netns_lossless']}; native over Python "
            f"{p['native_over_python_netns_lossless']}"
        )
    if p["iter_s_loss"] is not None:
        lines.append(
            f"  Python engine, {r['loss_percent']:g}% loss ({r['loss_method']}): "
            f"{ms(p['iter_s_loss'])}  over Gloo {or_dash(p['ratio_loss'])}; native over Python "
            f"{or_dash(p['native_over_python_loss'])}"
        )
    return lines
