"""Results of ``dlcp.bench.transport``: the JSON summary and the human table.

Medians and the 99th percentile come from numpy (``np.percentile``, linear
interpolation): with 20 samples the p99 lies between the two largest, so it is
effectively the maximum, and the output says so.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Rep", "summary", "table"]


@dataclass
class Rep:
    """One timed transfer, with what both workers said about it."""

    seconds: float
    sender: dict[str, Any]
    receiver: dict[str, Any]
    timers: dict[str, dict[str, list[float]]] | None = None


def _median(xs: list[float]) -> float:
    return float(np.median(xs))


def _p99(xs: list[float]) -> float:
    return float(np.percentile(xs, 99))


def _gbps(nbytes: int, seconds: float) -> float:
    return round(nbytes / seconds / 1e9, 3)


def _mean(xs: list[float], digits: int) -> float:
    return round(float(np.mean(xs)), digits)


def _breakdown(reps: list[Rep]) -> dict[str, dict[str, list[float]]]:
    """Mean per repetition: {worker: {activity: [ms, calls]}}."""
    out: dict[str, dict[str, list[float]]] = {}
    for side in ("send", "recv"):
        acc: dict[str, list[float]] = {}
        for r in reps:
            assert r.timers is not None
            for label, (ms, calls) in r.timers[side].items():
                a = acc.setdefault(label, [0.0, 0.0])
                a[0] += ms / len(reps)
                a[1] += calls / len(reps)
        out[side] = {k: [round(v[0], 2), round(v[1], 1)] for k, v in acc.items()}
    return out


def summary(
    args: argparse.Namespace,
    path: str,
    kernel_loss: bool,
    ready: dict[str, Any],
    res: dict[str, Any],
) -> dict[str, Any]:
    nbytes = args.size_bytes
    secs = {
        k: [r.seconds for r in res[k]] for k in ("dlcp", "tcp", "auth", "dlcp_loss", "tcp_loss")
    }
    dl, tl, au, dloss, tloss = secs.values()
    reports = [r.receiver["report"] for r in res["dlcp_loss"]]
    sends = [r.sender["report"] for r in res["dlcp_loss"]]
    lost_runs = sum(r["lost_runs"] for r in reports)
    lost_chunks = sum(sum(r["lost_chunks"]) for r in reports)
    packets = sum(r.sender["packets_out"] for r in res["dlcp_loss"])
    # CPU seconds of each worker process (every thread) per lossless transfer,
    # median: the sender's from send to acknowledgement, the receiver's from
    # posting the receive to having it all
    cpu = {
        t: {
            side: round(_median([getattr(r, side)["cpu_seconds"] for r in res[t]]), 4)
            for side in ("sender", "receiver")
        }
        for t in ("dlcp", "tcp")
    }
    # of the datagrams the DLCP receiver took in the lossless transfers, the
    # fraction its run path (scatter_run) took
    fast = sum(r.receiver["datagrams_fast"] for r in res["dlcp"])
    arrived = sum(r.receiver["datagrams_in"] for r in res["dlcp"])
    # and the fraction the native receive path took (in the receive loop, in C),
    # plain and authenticated
    native = {
        k: round(
            sum(r.receiver.get("datagrams_native", 0) for r in res[k])
            / max(1, sum(r.receiver["datagrams_in"] for r in res[k])),
            4,
        )
        for k in ("dlcp", "auth")
    }
    out: dict[str, Any] = {
        "path": path,
        "size_bytes": nbytes,
        "repetitions": args.repetitions,
        "repetitions_lossless": args.lossless_repetitions,
        "timing": "on the sender, from the start of sending to the receiver's "
        "acknowledgement of the whole message (DLCP STOP, TCP ack byte)",
        # lent: the native engine reads the payload from the tensor, as TCP does
        # (the Python engine, and authenticated sends, copy it whatever this says)
        "dlcp_send": "copied" if args.copy_send else "lent",
        "dlcp_lossless_gbps": _gbps(nbytes, _median(dl)),
        "tcp_lossless_gbps": _gbps(nbytes, _median(tl)),
        "ratio_lossless": round(_median(tl) / _median(dl), 3),
        "lossless_cpu_s": cpu,
        "dlcp_lossless_run_path_fraction": round(fast / max(1, arrived), 4),
        "dlcp_lossless_native_fraction": native["dlcp"],
        "dlcp_auth_lossless_gbps": _gbps(nbytes, _median(au)),
        "dlcp_auth_lossless_native_fraction": native["auth"],
        "auth_cost": round(1 - _median(dl) / _median(au), 3),
        "loss_method": "nftables" if kernel_loss else "emulated",
        "loss_direction": args.loss_direction if kernel_loss else "receive (emulated)",
        "loss_percent": args.loss,
        "p": args.p,
        "dlcp_loss_median_s": round(_median(dloss), 4),
        "tcp_loss_median_s": round(_median(tloss), 4) if tloss else None,
        "dlcp_loss_p99_s": round(_p99(dloss), 4),
        "tcp_loss_p99_s": round(_p99(tloss), 4) if tloss else None,
        "ratio_loss_median": round(_median(dloss) / _median(tloss), 3) if tloss else None,
        "ratio_loss_p99": round(_p99(dloss) / _p99(tloss), 3) if tloss else None,
        "p99_method": f"numpy.percentile(q=99, linear) of {len(dloss)} samples: between the "
        "two largest, so effectively the maximum",
        "dlcp_loss_seconds": [round(x, 4) for x in dloss],
        # transfer by transfer, beside dlcp_loss_seconds: the sender's transmission
        # rounds, and the TCP segments both namespaces resent meanwhile (DLCP's only
        # TCP is its control channel: a control message lost on the way waits for it)
        "dlcp_loss_rounds": [s["rounds"] for s in sends],
        "dlcp_loss_control_resent_segs": [
            r.sender["counters"]["tcp_RetransSegs"] + r.receiver["counters"]["tcp_RetransSegs"]
            for r in res["dlcp_loss"]
        ],
        "tcp_loss_seconds": [round(x, 4) for x in tloss] if tloss else None,
        "dlcp_loss_lost_fraction_mean": _mean(
            [r["lost_elems"] / r["msg_elems"] for r in reports], 5
        ),
        "dlcp_loss_retransmitted_packets": sum(s["retransmitted_packets"] for s in sends),
        "dlcp_loss_retransmitted_packets_mean": _mean(
            [s["retransmitted_packets"] for s in sends], 1
        ),
        "dlcp_loss_nack_rounds_mean": _mean([r["nack_rounds"] for r in reports], 2),
        "dlcp_loss_packets_sent": packets,
        # per-packet drops leave lost runs of ~1 chunk, whole-batch drops of batch_packets
        "dlcp_loss_chunks_per_lost_run": round(lost_chunks / lost_runs, 2) if lost_runs else None,
        "dlcp_udp_rcvbuf_errors": {
            phase: sum(r.receiver["counters"]["udp_RcvbufErrors"] for r in res[key])
            for phase, key in (("lossless", "dlcp"), ("auth", "auth"), ("loss", "dlcp_loss"))
        },
        # the TCP baseline's sockets get DLCP's control-channel timers (None: the
        # kernel lacks the option, and both keep its 200 ms floor)
        "tcp_rto_min_us": res.get("tcp_rto_min_us"),
        # runs that slow DLCP's I/O threads down, so their ratios are not clean ones
        "instrumented": bool(args.instrument),
        "profiled": bool(getattr(args, "profile", None)),
        "tcp_loss_retrans_segs": sum(
            r.sender["counters"]["tcp_RetransSegs"] for r in res["tcp_loss"]
        )
        if tloss
        else None,
        "offloads": {"lossless": "on", "loss": args.loss_offloads}
        if kernel_loss
        else "loopback defaults",
        "gso": ready["gso"],
        "gro": ready["gro"],
        # (the sender's, as its endpoint runs them: dlcp.bench.outcome places them)
        "engine": ready["engine"],
        "engine_threads": ready["engine_threads"],
        "dlcp_config": ready["config"],
        "notes": [],
    }
    if res["dlcp_no_offloads"]:
        nd, nt = (
            _median([r.seconds for r in res[k]]) for k in ("dlcp_no_offloads", "tcp_no_offloads")
        )
        out["offloads_off_lossless"] = {
            "dlcp_gbps": _gbps(nbytes, nd),
            "tcp_gbps": _gbps(nbytes, nt),
            "ratio": round(nt / nd, 3),
        }
    out.update(_floor(nbytes, args.floor_senders, res, tloss))
    if kernel_loss:
        fraction = res["nft"]["dlcp"] / max(1, packets)
        out["nft_dropped_dlcp_fraction"] = round(fraction, 5)
        # drops of whole GSO batches would show as ~loss / batch_packets of the packets
        out["per_packet_drops"] = fraction >= 0.5 * args.loss / 100
        out["nft_dropped"] = res["nft"]
        if args.topology == "line":
            out["loss_direction"] = "both (router forward path)"
            out["notes"].append(
                "nftables drops in the router's forward path, both directions (data, TCP "
                "acks and DLCP control alike); hosts keep GRO on receive"
            )
        else:
            out["notes"].append(
                "nftables drops in the receiver's namespace"
                + (
                    " and in the sender's (data, TCP acks and DLCP control alike)"
                    if args.loss_direction == "both"
                    else " only (the data direction)"
                )
            )
        if args.loss_offloads == "on":
            out["notes"].append(
                "CONTROL RUN: offloads on under loss, so drops hit whole GSO/TSO batches"
            )
    else:
        out["emulated_loss_dropped"] = res["emulated_dropped"]
        out["notes"].append(
            "loss is EMULATED in-process (not root): TCP cannot be compared "
            "under emulated loss, its loss fields are null"
        )
    if args.instrument:
        out["instrument_ms_per_rep"] = {
            phase: _breakdown(res[key])
            for phase, key in (("lossless", "dlcp"), ("auth", "auth"), ("loss", "dlcp_loss"))
        }
    return out


FLOOR_METHOD = (
    "the same bytes in datagrams of DLCP's size, each sent once through DLCP's UDP layer "
    "(dlcp.io.udp.DataSockets: sendmmsg, GSO as configured; udp_floor_senders threads, a "
    "socket each) with no protocol above it, built before timing; time from the first send "
    "to the receiver's last read that got data (CLOCK_MONOTONIC, one kernel; DLCP's and "
    "TCP's times end a little later, when the sender has the receiver's acknowledgement). "
    "DLCP sends this way, so whatever its protocol does, its transfer takes at least this "
    "long on this path; so does any transport that sends every byte this way"
)


def _floor(nbytes: int, senders: int, res: dict[str, Any], tloss: list[float]) -> dict[str, Any]:
    """The UDP floor's figures (root only; null without it)."""
    floor = [r.seconds for r in res["floor_loss"]]
    if not floor:
        return {
            k: None
            for k in (
                "udp_floor_loss_median_s",
                "udp_floor_loss_p99_s",
                "udp_floor_ratio_loss_median",
                "udp_floor_ratio_loss_p99",
            )
        }
    out: dict[str, Any] = {
        "udp_floor_method": FLOOR_METHOD,
        "udp_floor_senders": senders,
        "udp_floor_loss_median_s": round(_median(floor), 4),
        "udp_floor_loss_min_s": round(min(floor), 4),
        "udp_floor_loss_p99_s": round(_p99(floor), 4),
        # the lowest ratios a transport that sends every byte once would reach
        "udp_floor_ratio_loss_median": round(_median(floor) / _median(tloss), 3),
        "udp_floor_ratio_loss_p99": round(_p99(floor) / _p99(tloss), 3),
        "udp_floor_loss_delivered_fraction": round(
            sum(r.receiver["bytes"] for r in res["floor_loss"])
            / sum(r.receiver["expected_bytes"] for r in res["floor_loss"]),
            5,
        ),
        "udp_floor_rcvbuf_errors": sum(
            r.receiver["counters"]["udp_RcvbufErrors"]
            for k in ("floor_no_offloads", "floor_loss")
            for r in res[k]
        ),
        # floor transfers made again because their receive socket overflowed (a
        # busy machine's): the figures above are of the attempts that did not
        "udp_floor_overflowed_attempts": res.get("floor_overflows", 0),
    }
    if res["floor_no_offloads"]:
        lossless = _median([r.seconds for r in res["floor_no_offloads"]])
        out["udp_floor_offloads_off_gbps"] = _gbps(nbytes, lossless)
    return out


def table(r: dict[str, Any]) -> str:
    def f(x: Any, spec: str) -> str:
        return "-" if x is None else format(x, spec)

    rows = [
        f"DLCP vs TCP, {r['size_bytes'] / 2**20:g} MiB float32, path {r['path']}, "
        f"GSO {'on' if r['gso'] else 'off'}, GRO {'on' if r['gro'] else 'off'}",
        f"{'':34}{'DLCP':>10}{'TCP':>10}{'DLCP/TCP':>10}  (GB/s: higher is better for "
        "DLCP; s: lower is)",
        f"{'lossless GB/s (median of ' + str(r['repetitions_lossless']) + ')':<34}"
        f"{r['dlcp_lossless_gbps']:>10.3f}{r['tcp_lossless_gbps']:>10.3f}"
        f"{r['ratio_lossless']:>10.3f}",
        f"{'lossless GB/s, authenticated':<34}{r['dlcp_auth_lossless_gbps']:>10.3f}"
        f"{'':>10}{'cost ' + format(r['auth_cost'], '.0%'):>10}",
        f"{r['loss_percent']:g}% loss ({r['loss_method']}, {r['loss_direction']}), "
        f"p = {r['p']:g}, {r['repetitions']} repetitions:",
        f"{'  median s':<34}{r['dlcp_loss_median_s']:>10.4f}"
        f"{f(r['tcp_loss_median_s'], '.4f'):>10}{f(r['ratio_loss_median'], '.3f'):>10}",
        f"{'  p99 s (~max of the samples)':<34}{r['dlcp_loss_p99_s']:>10.4f}"
        f"{f(r['tcp_loss_p99_s'], '.4f'):>10}{f(r['ratio_loss_p99'], '.3f'):>10}",
        f"  DLCP lost {r['dlcp_loss_lost_fraction_mean']:.3%} of values on average and "
        f"retransmitted {r['dlcp_loss_retransmitted_packets_mean']:g} packets per transfer",
    ]
    if "offloads_off_lossless" in r:
        o = r["offloads_off_lossless"]
        rows.insert(
            4,
            f"{'lossless GB/s, offloads off':<34}{o['dlcp_gbps']:>10.3f}"
            f"{o['tcp_gbps']:>10.3f}{o['ratio']:>10.3f}",
        )
    if r["udp_floor_loss_median_s"] is not None:
        rows.append(
            f"{'  UDP floor, median s (see JSON)':<34}{r['udp_floor_loss_median_s']:>10.4f}"
            f"{r['tcp_loss_median_s']:>10.4f}{r['udp_floor_ratio_loss_median']:>10.3f}"
            f"  (no protocol, {r['udp_floor_senders']} sender(s): every byte sent once)"
        )
        rows.append(
            f"{'  UDP floor, p99 s':<34}{r['udp_floor_loss_p99_s']:>10.4f}"
            f"{r['tcp_loss_p99_s']:>10.4f}{r['udp_floor_ratio_loss_p99']:>10.3f}"
        )
        if "udp_floor_offloads_off_gbps" in r:
            rows.append(
                f"{'  UDP floor, lossless, offloads off':<34}"
                f"{r['udp_floor_offloads_off_gbps']:>10.3f} GB/s"
            )
    if "nft_dropped_dlcp_fraction" in r:
        rows.append(
            f"  nftables dropped {r['nft_dropped_dlcp_fraction']:.3%} of DLCP packets "
            f"sent; {r['dlcp_loss_chunks_per_lost_run']} chunks per lost run; "
            f"TCP retransmitted {r['tcp_loss_retrans_segs']} segments"
        )
    overflow = r["dlcp_udp_rcvbuf_errors"]["loss"]
    if overflow:
        rows.append(f"  DLCP's receive socket buffer overflowed: {overflow} more datagrams lost")
    rows += [f"  note: {n}" for n in r["notes"]]
    for phase, sides in r.get("instrument_ms_per_rep", {}).items():
        for side, labels in sides.items():
            rows.append(f"  {phase} {side}: DLCP I/O thread, ms (calls) per transfer:")
            rows += [
                f"    {label:<36}{ms:>9.2f} ({calls:g})" for label, (ms, calls) in labels.items()
            ]
    return "\n".join(rows)
