"""How close testbed runs come to what their links allow: for each run JSON
(``dlcp testbed run ... --link-rate R``) the bytes a ring all-reduce must move
into each host per iteration, the packets each host's downlink carried per
iteration (the routers' counters), and the time those take at the link rate.

    python link_bound.py clean-dlcp-50mbit-hidden1024.json ...

A ring all-reduce of N float32 values over n ranks moves 2 (n - 1) / n * 4 N
bytes into every rank. A parameter server on one rank (``incast``) takes the
other ranks' (n - 1) * 4 N bytes in, then sends as many out: each bucket's pull
follows its push, and one bucket holds nearly all of the gradient, so the two
add up (the busiest host's downlink carries the pushes; the out leg is taken to
need as many packets). On the wire each packet adds its headers: DLCP's data
datagram 60 bytes (IP 20, UDP 8, DLCP 32), Gloo's TCP segment 52 (IP 20, TCP 32
with timestamps); a pure ACK or a control message counts as one header here, so
the estimate errs low. The link time is bytes / rate, the least the iteration
can take when, as here, every host's downlink carries that much.
"""

from __future__ import annotations

import json
import sys

HEADER = {"dlcp": 60, "gloo": 52}


def bound(path: str) -> dict[str, float | str]:
    with open(path) as f:
        run = json.load(f)
    train = run["train"]
    n, values = train["world_size"], train["parameters"]
    iterations = sum(e["iterations"] for e in train["epochs"])
    if train["collective"] == "ps":  # in, then as much out (see the docstring)
        payload = (n - 1) * 4 * values
        legs = 2
    else:
        payload = 2 * (n - 1) / n * 4 * values  # bytes into each rank per iteration
        legs = 1
    rate = run["link_rate_mbit"] * 1e6 / 8
    hosts = {
        host: sum(classes.values())
        for router in ("leaf1", "leaf2")
        for host, classes in run["router_link_packets"][router].items()
        if host.startswith("h")
    }
    packets = max(hosts.values()) / iterations
    wire = legs * (payload + packets * HEADER[run["transport"]])
    return {
        "run": f"{run['scenario']}-{run['transport']}",
        "ms_per_iter": run["median_ms_per_iter"],
        "payload_MB": payload / 1e6,
        "packets_per_iter": packets,
        "link_ms": 1e3 * wire / rate,
        "over_link_ms": run["median_ms_per_iter"] - 1e3 * wire / rate,
    }


def main() -> None:
    rows = [bound(p) for p in sys.argv[1:]]
    print(
        "| run | ms/iter | payload MB into a host | packets into a host "
        "| link time ms | above it ms |"
    )
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['run']} | {r['ms_per_iter']:.1f} | {r['payload_MB']:.3f} | "
            f"{r['packets_per_iter']:.0f} | {r['link_ms']:.1f} | {r['over_link_ms']:.1f} |"
        )


if __name__ == "__main__":
    main()
