"""What a testbed run leaves behind: router-counter summaries, and the results
folder's CSV (one row per run), bar plot and Markdown table.

:mod:`.experiments` runs the scenarios and writes through these; ``dlcp testbed
plot`` and the suite's table read them back.
"""

from __future__ import annotations

import csv
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "BATCH_SIZE",
    "CSV_FIELDS",
    "CSV_NAME",
    "FUNCTIONAL_NOTE",
    "HIDDEN",
    "LINK_RATE_MBIT",
    "MTU",
    "PNG_NAME",
    "append_csv",
    "bmv2_class_totals",
    "bmv2_link_packets",
    "class_totals",
    "code_revision",
    "cpu_fields",
    "cpu_line",
    "default_host_egress",
    "default_profile",
    "drops_summary",
    "host_egress_of",
    "per_link_drops",
    "per_link_packets",
    "plot",
    "read_csv",
    "table",
]

FUNCTIONAL_NOTE = "BMv2 is a functional model: its numbers are functional, not performance"
CSV_NAME = "testbed.csv"
PNG_NAME = "testbed.png"
CSV_FIELDS = (
    "scenario",
    "transport",
    "ablation",
    "epochs",
    "final_accuracy",
    "median_ms_per_iter",
    "lost_fraction",
    "retransmissions",
    "router_drops",
    "background_mbit",
    "wall_s",
    "switch",
    "profile",
    "link_rate_mbit",
    "batch_size",
    "hidden",
    "mtu",
    "host_egress",
    "load_avg_1m",
    "cpu_idle_pct",
    "cpu_softirq_pct",
    "ranks_cpu_s",
    "finished_utc",
    "code_rev",
)
#: the runs' defaults: a row without the column (written before it) had these
LINK_RATE_MBIT = 200.0
BATCH_SIZE = 16
HIDDEN = 64  # units of the digits model's hidden layer (~38k parameters)
MTU = 1500  # bytes, every link


def bmv2_class_totals(
    before: Mapping[str, Mapping[str, Any]], after: Mapping[str, Mapping[str, Any]]
) -> dict[str, dict[str, int]]:
    """Per queue ``q<n>``: packets forwarded (``packets``) and selectively dropped
    (``drops``) between two :func:`~.bmv2_backend.bmv2_counters`, summed over the
    switches; ``loss-injected`` and ``other`` (taken in, neither forwarded nor
    counted as dropped) as ``drops``."""
    out: dict[str, dict[str, int]] = {}

    def delta(sw: str, kind: str, key: Any) -> int:
        return int(after[sw][kind][key]) - int(before.get(sw, {}).get(kind, {}).get(key, 0))

    for sw, c in after.items():
        for q in c["forwarded"]:
            tot = out.setdefault(f"q{q}", {"packets": 0, "drops": 0})
            tot["packets"] += delta(sw, "forwarded", q)
            tot["drops"] += delta(sw, "dropped", q)
        injected = int(c["injected"]) - int(before.get(sw, {}).get("injected", 0))
        taken = sum(delta(sw, "ingress", dev) for dev in c["ingress"])
        sent = sum(delta(sw, "egress", dev) for dev in c["egress"])
        selective = sum(delta(sw, "dropped", q) for q in c["dropped"])
        for name, n in (("loss-injected", injected),
                        ("other", taken - sent - selective - injected)):  # fmt: skip
            out.setdefault(name, {"packets": 0, "drops": 0})["drops"] += n
    return out


def bmv2_link_packets(
    before: Mapping[str, Mapping[str, Any]], after: Mapping[str, Mapping[str, Any]]
) -> dict[str, dict[str, dict[str, int]]]:
    """``{switch: {egress iface: {"all": packets sent}}}`` (the program counts per
    port, not per class and port)."""
    return {
        sw: {
            dev: {"all": n - int(before.get(sw, {}).get("egress", {}).get(dev, 0))}
            for dev, n in c["egress"].items()
        }
        for sw, c in after.items()
    }


def class_totals(
    before: Mapping[str, Mapping[str, Mapping[str, Mapping[str, int]]]],
    after: Mapping[str, Mapping[str, Mapping[str, Mapping[str, int]]]],
) -> dict[str, dict[str, int]]:
    """Per class: packets sent and drops between two :func:`~.impairments.profile_counters`,
    summed over every router interface."""
    out: dict[str, dict[str, int]] = {}
    for router, devs in after.items():
        for dev, classes in devs.items():
            for name, c in classes.items():
                b = before.get(router, {}).get(dev, {}).get(name, {})
                tot = out.setdefault(name, {"packets": 0, "drops": 0})
                tot["packets"] += c["packets"] - b.get("packets", 0)
                tot["drops"] += c["drops"] - b.get("drops", 0)
    return out


def _per_link(
    before: Mapping[str, Mapping[str, Mapping[str, Mapping[str, int]]]],
    after: Mapping[str, Mapping[str, Mapping[str, Mapping[str, int]]]],
    counter: str,
) -> dict[str, dict[str, dict[str, int]]]:
    """``{router: {egress iface: {class: counter's increase}}}`` between two readings
    (classes whose counter did not move left out)."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    for router, devs in after.items():
        for dev, classes in devs.items():
            b = before.get(router, {}).get(dev, {})
            moved = {
                name: c[counter] - b.get(name, {}).get(counter, 0)
                for name, c in sorted(classes.items())
            }
            out.setdefault(router, {})[dev] = {k: v for k, v in moved.items() if v}
    return out


def per_link_packets(
    before: Mapping[str, Mapping[str, Mapping[str, Mapping[str, int]]]],
    after: Mapping[str, Mapping[str, Mapping[str, Mapping[str, int]]]],
) -> dict[str, dict[str, dict[str, int]]]:
    """``{router: {egress iface: {class: packets sent}}}`` between two
    :func:`~.impairments.profile_counters` (classes that sent nothing left out)."""
    return _per_link(before, after, "packets")


def per_link_drops(
    before: Mapping[str, Mapping[str, Mapping[str, Mapping[str, int]]]],
    after: Mapping[str, Mapping[str, Mapping[str, Mapping[str, int]]]],
) -> dict[str, dict[str, dict[str, int]]]:
    """``{router: {egress iface: {class: packets dropped}}}`` between two
    :func:`~.impairments.profile_counters`: where in the fabric the queues
    dropped (classes that dropped nothing, and interfaces with no drops, left out)."""
    return {
        router: {dev: classes for dev, classes in devs.items() if classes}
        for router, devs in _per_link(before, after, "drops").items()
        if any(devs.values())
    }


def drops_summary(totals: Mapping[str, Mapping[str, int]]) -> str:
    """``class:drops/sent`` for every class that carried traffic."""
    parts = [
        f"{name}:{c['drops']}/{c['packets']}"
        for name, c in sorted(totals.items())
        if c["packets"] or c["drops"]
    ]
    return " ".join(parts)


def append_csv(results: str | Path, row: Mapping[str, Any]) -> Path:
    """Append ``row``; a file written before a column existed is rewritten with
    today's header first (the new columns empty in its old rows)."""
    path = Path(results) / CSV_NAME
    new = not path.exists()
    if not new:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            old_rows = list(reader)
            header = tuple(reader.fieldnames or ())
        if header != CSV_FIELDS:
            with path.open("w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
                w.writeheader()
                w.writerows(old_rows)
    with path.open("a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        if new:
            w.writeheader()
        w.writerow(row)
    return path


def code_revision(root: Path | None = None) -> str:
    """The git commit of the code a row was measured with (short hash, ``+dirty``
    if tracked files other than ``results/`` differ from it); empty outside a
    git checkout or without git."""
    root = root or Path(__file__).resolve().parent.parent
    try:
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
                             capture_output=True, text=True, timeout=10, check=True)
        # (the results file is tracked and changes with every run: not the code)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain",
                                "--untracked-files=no", "--", ".", ":(exclude)results"],
                               capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return ""
    return rev.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def cpu_fields(cpu: Mapping[str, Any] | None) -> dict[str, Any]:
    """The CSV's CPU columns from a run's :func:`~.cpu_usage.cpu_summary` (None
    each when the run has none): the 1-minute load average when training started,
    the machine's idle and softirq shares over the training (percent of all CPUs'
    time), and the CPU seconds the ranks used in it."""
    if cpu is None:
        return dict.fromkeys(("load_avg_1m", "cpu_idle_pct", "cpu_softirq_pct", "ranks_cpu_s"))
    return {
        "load_avg_1m": cpu["load_avg_start"][0],
        "cpu_idle_pct": cpu["idle_pct"],
        "cpu_softirq_pct": cpu["softirq_pct"],
        "ranks_cpu_s": cpu["ranks_cpu_s"],
    }


def cpu_line(cpu: Mapping[str, Any] | None, failure: str | None = None) -> str:
    """One line on how busy the CPUs were while a run trained (``failure``: why
    there is no reading, where known)."""
    if cpu is None:
        why = failure or "rank 0 did not report the start and the end of its training"
        return f"CPU: not read ({why})"
    ranks = (
        "ranks' CPU time unknown (a rank had exited)"
        if cpu["ranks_cpu_s"] is None
        else f"ranks {cpu['ranks_cpu_s']:.1f} CPU s ({cpu['ranks_cpu_pct']:.1f} % of the machine)"
    )
    return (
        f"CPU over {cpu['window_s']:.1f} s of training on {cpu['cpus']} CPUs: "
        f"{cpu['idle_pct']:.1f} % idle, {cpu['softirq_pct']:.1f} % softirq, load average "
        f"{cpu['load_avg_start'][0]:.2f} at the start; {ranks}"
    )


def default_profile(transport: str) -> str:
    """The routers' queueing a transport's runs get unless told otherwise: DLCP
    its switch profile; the baseline a plain FIFO of the same buffer at the same
    rate, as a network without DLCP's configuration would give it (on the DLCP
    profile its unmarked TCP would land in class 0's short drop-eligible queue)."""
    return "fifo" if transport == "gloo" else "dlcp"


def _switch_of(row: Mapping[str, Any]) -> str:
    return str(row.get("switch") or "linux")  # rows from before the column: Linux


def _profile_of(row: Mapping[str, Any]) -> str:
    # rows from before the column: every run used the DLCP profile (or BMv2's program)
    return str(row.get("profile") or ("p4" if _switch_of(row) == "bmv2" else "dlcp"))


def host_egress_of(row: Mapping[str, Any]) -> str:
    """Whether a row's hosts were ``shaped`` or ``unshaped`` (rows from before the
    column: unshaped, as every host then was)."""
    return str(row.get("host_egress") or "unshaped")


def default_host_egress(switch: str) -> str:
    """The hosts' egress a run gets unless told otherwise: serialised at the link
    rate behind Linux routers; unshaped behind BMv2 (whose links are not shaped)."""
    return "unshaped" if switch == "bmv2" else "shaped"


def _settings_of(row: Mapping[str, Any]) -> tuple[float, int, int, int]:
    """(link rate in Mbit/s, batch size, hidden units, link MTU) of a row; rows
    from before the columns used the defaults. BMv2 rows have no link rate (its
    links are not shaped)."""
    rate = row.get("link_rate_mbit")
    batch = row.get("batch_size")
    hidden = row.get("hidden")
    mtu = row.get("mtu")
    return (
        float(rate) if rate not in (None, "") else LINK_RATE_MBIT,
        int(batch) if batch not in (None, "") else BATCH_SIZE,
        int(hidden) if hidden not in (None, "") else HIDDEN,
        int(mtu) if mtu not in (None, "") else MTU,
    )


def settings_label(
    link_rate_mbit: float, batch_size: int, hidden: int = HIDDEN, mtu: int = MTU
) -> str:
    """What a run's name and plot label add for settings other than the defaults:
    ``-<rate>mbit``, ``-batch<n>``, ``-hidden<n>``, ``-mtu<n>`` (empty for the
    defaults)."""
    return (
        (f"-{link_rate_mbit:g}mbit" if link_rate_mbit != LINK_RATE_MBIT else "")
        + (f"-batch{batch_size}" if batch_size != BATCH_SIZE else "")
        + (f"-hidden{hidden}" if hidden != HIDDEN else "")
        + (f"-mtu{mtu}" if mtu != MTU else "")
    )


def read_csv(results: str | Path) -> list[dict[str, str]]:
    """The newest row of every (scenario, transport, ablation, switch, profile,
    link rate, batch size, hidden units, MTU, host egress), in first-seen order."""
    path = Path(results) / CSV_NAME
    if not path.exists():
        return []
    latest: dict[tuple[Any, ...], dict[str, str]] = {}
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            key = (
                row["scenario"], row["transport"], row["ablation"], _switch_of(row),
                _profile_of(row), *_settings_of(row), host_egress_of(row),
            )  # fmt: skip
            latest[key] = row
    return list(latest.values())


def plot(results: str | Path) -> Path | None:
    """Bar plot of ms/iter and final accuracy per scenario and transport (newest
    CSV row of each) to ``<results>/testbed.png``; None if there is no data."""
    rows = read_csv(results)
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def variant(r: Mapping[str, str]) -> str:
        ablation = f" {r['ablation']}" if r["ablation"] else ""
        switch = " [bmv2, functional]" if _switch_of(r) == "bmv2" else ""
        prof = _profile_of(r)
        other = f" [on {prof}]" if switch == "" and prof != default_profile(r["transport"]) else ""
        settings = settings_label(*_settings_of(r))
        extra = f" [{settings[1:]}]" if settings else ""
        hosts = host_egress_of(r)
        odd_hosts = f" [hosts {hosts}]" if hosts != default_host_egress(_switch_of(r)) else ""
        return r["transport"] + ablation + switch + other + extra + odd_hosts

    scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
    variants = list(dict.fromkeys(variant(r) for r in rows))
    by = {(r["scenario"], variant(r)): r for r in rows}
    fig, axes = plt.subplots(1, 2, figsize=(max(8.0, 1.6 * len(scenarios) * 2), 4.5))
    width = 0.8 / len(variants)
    for ax, key, title in (
        (axes[0], "median_ms_per_iter", "median ms / iteration (lower is better)"),
        (axes[1], "final_accuracy", "final test accuracy % (higher is better)"),
    ):
        for i, v in enumerate(variants):
            xs, ys = [], []
            for j, s in enumerate(scenarios):
                r = by.get((s, v))
                if r is not None:
                    xs.append(j + (i - (len(variants) - 1) / 2) * width)
                    ys.append(float(r[key]))
            ax.bar(xs, ys, width, label=v)
        ax.set_xticks(range(len(scenarios)), scenarios)
        ax.set_title(title)
        if key == "final_accuracy":
            ax.set_ylim(0, 100)
    axes[0].legend(fontsize="small")
    fig.suptitle("DLCP vs Gloo on the leaf-spine testbed")
    fig.tight_layout()
    path = Path(results) / PNG_NAME
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _blank(value: Any) -> str:
    """'-' where a row has no value (an empty CSV cell, e.g. Gloo's retransmissions)."""
    return "-" if value in (None, "") else str(value)


def _percent(fraction: Any) -> str:
    return "-" if fraction in (None, "") else f"{100 * float(fraction):.2f}"


def _number(value: Any, digits: int) -> str:
    """``value`` to ``digits`` decimals; '-' where a row has none (rows from before
    the column, or a run whose reading is missing)."""
    return "-" if value in (None, "") else f"{float(value):.{digits}f}"


def table(rows: Sequence[Mapping[str, Any]]) -> str:
    """A Markdown table of CSV-like rows (a note under it when a row is BMv2's):
    besides the results, each run's link rate and how busy the machine was while
    it trained (load average at the start, CPU idle share, the ranks' CPU seconds)."""
    head = (
        "| scenario | transport | ablation | accuracy % | ms/iter | lost % | retx "
        "| link Mbit/s | load | CPU idle % | ranks CPU s "
        "| router drops (class:drops/sent) | switch | queues |"
    )
    lines = [head, "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|"]
    for r in rows:
        rate = "-" if _switch_of(r) == "bmv2" else f"{_settings_of(r)[0]:g}"
        lines.append(
            f"| {r['scenario']} | {r['transport']} | {r['ablation'] or '-'} | "
            f"{float(r['final_accuracy']):.1f} | {float(r['median_ms_per_iter']):.1f} | "
            f"{_percent(r['lost_fraction'])} | {_blank(r['retransmissions'])} | "
            f"{rate} | {_number(r.get('load_avg_1m'), 2)} | "
            f"{_number(r.get('cpu_idle_pct'), 1)} | {_number(r.get('ranks_cpu_s'), 1)} | "
            f"{r['router_drops'] or '-'} | {_switch_of(r)} | {_profile_of(r)} |"
        )
    if any(_switch_of(r) == "bmv2" for r in rows):
        lines.append("")
        lines.append(f"switch bmv2: {FUNCTIONAL_NOTE}.")
    return "\n".join(lines)
