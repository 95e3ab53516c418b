"""The arithmetic of :mod:`dlcp.bench.ddp`'s figures, and its Python-engine jobs.

With ``--python-engine`` every phase of the DDP benchmark runs a fourth
transport, ``dlcp_python``: DLCP's jobs again with ``DLCP_ENGINE=python``, in the
same turns as Gloo's and the default (native) engine's. Both engines' iterations
then meet the same machine, and :func:`python_engine_summary` gives their ratios
to Gloo and to each other phase by phase and round by round: separate jobs of
the benchmark, minutes apart, moved Gloo's iteration by 14 % on these VMs, more
than the engines differ.
"""

from __future__ import annotations

from typing import Any

from dlcp.errors import BenchError

__all__ = [
    "PYTHON_ENGINE",
    "check_python_engine_jobs",
    "job_env",
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
    run's own DLCP jobs (``engine``, from ``DLCP_ENGINE`` and the build) must be
    the native engine's."""
    if engine != "native":
        raise BenchError(
            "--python-engine runs DLCP's jobs on both engines, but this run's DLCP jobs "
            f"already use the {engine} engine (DLCP_ENGINE unset or 'native' needs the "
            "native engine built: pip install with a C compiler)"
        )


def job_env(transport: str) -> tuple[str, dict[str, str]]:
    """The worker's transport and the extra environment of a job of ``transport``."""
    if transport == PYTHON_ENGINE:
        return "dlcp", {"DLCP_ENGINE": "python"}
    return transport, {}


def python_engine_summary(res: dict[str, Any], nocomm_iter_s: float) -> dict[str, Any] | None:
    """The Python engine's figures beside the native engine's (``res``: the
    benchmark's configurations by name), None when it did not run."""
    p = res.get(PYTHON_ENGINE)
    if p is None:
        return None
    d, g = res["dlcp"], res["gloo"]
    pn, dn, gn = (_iter_s(res.get(f"{t}_netns")) for t in (PYTHON_ENGINE, "dlcp", "gloo"))
    pl, dl, gl = (res.get(f"{t}_loss") for t in (PYTHON_ENGINE, "dlcp", "gloo"))
    return {
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
        "native_over_python_netns_lossless": ratio(dn, pn),
        "iter_s_loss": rounded(_iter_s(pl)),
        "ratio_loss": ratio(_iter_s(pl), _iter_s(gl)),
        "ratio_loss_rounds": round_ratios(pl, gl),
        "native_over_python_loss": ratio(_iter_s(dl), _iter_s(pl)),
        "native_over_python_loss_rounds": round_ratios(dl, pl),
        "lost_fraction_loss": rounded(pl["lost_fraction"], 6) if pl else None,
        "retransmitted_per_iter_loss": rounded(pl["retransmitted_per_iter"], 1) if pl else None,
    }


def python_engine_lines(r: dict[str, Any]) -> list[str]:
    """The table's lines for the Python engine's jobs (none if they did not run)."""
    p = r.get("python_engine")
    if not p:
        return []

    def ms(x: float | None) -> str:
        return "-" if x is None else f"{1e3 * x:.1f} ms"

    lines = [
        f"  Python engine, lossless, loopback: {ms(p['iter_s'])}  over Gloo {p['ratio']}  "
        f"(communication cost over Gloo's {p['ratio_comm_cost']}); native over Python "
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
            f"  Python engine, {r['loss_percent']:g}% loss: {ms(p['iter_s_loss'])}  over Gloo "
            f"{p['ratio_loss']}; native over Python {p['native_over_python_loss']}"
        )
    return lines
