"""The data datagrams a protocol ``Session`` would put on the wire, one ``bytes``
each: what a live endpoint with its rank, configuration and keys sends, byte for
byte, for the security tests to replay, mutate or forge from."""

from __future__ import annotations

from dlcp.proto.session import DataBatch, Session


def data_datagrams(sender: Session) -> list[bytes]:
    """Every data datagram ``sender`` has to send now (its batches cut at their
    segment size); control datagrams are left out."""
    out: list[bytes] = []
    for item in sender.datagrams_to_send(now=0.0, max_batches=100_000):
        if isinstance(item, DataBatch):
            raw, seg = bytes(item.data), item.segment_size
            out += [raw[i : i + seg] for i in range(0, len(raw), seg)]
    return out
