"""Fuzzing live endpoints: junk, mutated and forged datagrams through real UDP
sockets, and junk on the TCP control channel, while genuine transfers run.

Three endpoints (ranks 0, 1, 2) on loopback, with and without authentication.
Rank 0 sends rank 1 messages with a loss bound (p = 0.05), two at a time (one
received into a buffer of the caller's, one not); rank 1 drops 8 % of
the data datagrams it receives (emulated loss), so its NACKs and rank 0's
retransmissions run too. Meanwhile the test sends rank 1's data port, seeded:

* random bytes of random lengths, alone and as GSO batches (which the receiver's
  GRO may coalesce with each other: its C receive loop and batch parser see runs);
* mutations of the genuine datagrams of the messages in flight (made by a
  protocol ``Session`` with rank 0's configuration and keys: byte for byte what
  rank 0 sends), forged for their keys (src, step, msg). Authenticated: any
  mutation (bit flips, byte overwrites, header fields, truncation, extension)
  before and during the transfer, and datagrams for the same keys tagged with
  another run's keys, carrying other data.
  Unauthenticated, where a well-formed datagram for a message *is* its data,
  mutations that break a rule of spec §6.1 on their own (header, length, bounds);
* the same mutations moved to keys not in flight (messages nobody asked for), and
  exact replays of the genuine datagrams (the sender's own bytes again);

and opens connections to rank 1's control port that send junk: nothing, short
hellos, wrong magic or job, bad authentication, then short frames, length
prefixes past 65536, empty frames and random frames, some claiming rank 0.

What must hold (the oracle): every message completes; in each, the elements
outside the reported lost ranges are exactly the sender's, the lost ranges hold
the fill (zeros), and the loss is within the bound; no error escapes an endpoint
(no future fails, no peer is marked gone, the I/O threads live); junk is counted
as rejected, or dropped by the data socket's kernel filter (its drops); and
afterwards transfers with p = 0 in both directions, and from rank 2, are exact.
``DLCP_LIVE_FUZZ_SEED`` replaces the seed; a failure names it.
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from dlcp.io import Endpoint, EndpointConfig
from dlcp.io import udp as udp_module
from dlcp.io.records import Received
from dlcp.keyring import KeyRing, new_run_nonce
from dlcp.proto.config import ProtocolConfig
from dlcp.proto.session import Session
from dlcp.proto.wire import DATA_HEADER_LEN
from tests.io.endpoint_helpers import LocalStore
from tests.security.sent_datagrams import data_datagrams

JOB = 0x5EED
SECRET = bytes(range(40, 72))
P = 0.05
EMULATED_LOSS = 0.08
ELEMS = 50_000  # 200 KB of float32: ~140 datagrams
TRANSFERS = 4
MSGS = (7, 8)
JUNK_PER_PHASE = 300
SEED = int(os.environ.get("DLCP_LIVE_FUZZ_SEED", "20261128"))
UDP_SEGMENT = 103  # (linux/udp.h)

# data header fields (spec §2.1): offset, size
VER_TYPE, FLAGS, JOB_F, STEP, MSG, SEQ, OFFSET, MSG_ELEMS, PAYLOAD_LEN, DTYPE = (
    (0, 1), (1, 1), (2, 2), (4, 4), (8, 2), (12, 4), (16, 4), (20, 4), (24, 2), (29, 1),
)  # fmt: skip


def _set(d: bytearray, field: tuple[int, int], value: int) -> bytearray:
    at, size = field
    d[at : at + size] = (value % (1 << (8 * size))).to_bytes(size, "big")
    return d


def _get(d: bytes, field: tuple[int, int]) -> int:
    at, size = field
    return int.from_bytes(d[at : at + size], "big")


def genuine_datagrams(
    proto: ProtocolConfig, ring: KeyRing | None, x: np.ndarray, step: int, msg: int
) -> list[bytes]:
    """The data datagrams rank 0 sends rank 1 for this message, made by a protocol
    ``Session`` with rank 0's configuration and keys."""
    s = Session(rank=0, job=JOB, config=proto, key=ring, peers=(0, 1, 2))
    s.send_message(1, x, step=step, msg=msg, now=0.0, p=P)
    return data_datagrams(s)


class Junk:
    """Seeded junk for one receiver: random bytes and mutations of genuine datagrams."""

    def __init__(self, rng: np.random.Generator, *, authenticated: bool) -> None:
        self.rng = rng
        self.authenticated = authenticated

    def random(self) -> bytes:
        n = int(self.rng.choice([0, 1, 31, 32, 33, int(self.rng.integers(0, 1500)), 9000]))
        return self.rng.integers(0, 256, n, dtype=np.uint8).tobytes()

    def any_mutation(self, g: bytes) -> bytes:
        """Anything but the genuine bytes (authenticated runs: all must fail)."""
        d = bytearray(g)
        kind = int(self.rng.integers(6))
        if kind == 0:  # flip bits anywhere (header, payload or tag)
            for at in self.rng.integers(0, len(d), int(self.rng.integers(1, 4))):
                d[int(at)] ^= 1 << int(self.rng.integers(8))
        elif kind == 1:  # overwrite a few bytes
            for at in self.rng.integers(0, len(d), int(self.rng.integers(1, 8))):
                d[int(at)] = int(self.rng.integers(256))
        elif kind == 2:  # a header field set to an extreme or random value
            field = [FLAGS, SEQ, OFFSET, MSG_ELEMS, PAYLOAD_LEN, DTYPE][int(self.rng.integers(6))]
            _set(
                d,
                field,
                int(
                    self.rng.choice(
                        [0, 1, 2 ** (8 * field[1]) - 1, int(self.rng.integers(2 ** (8 * field[1])))]
                    )
                ),
            )
        elif kind == 3:  # truncated
            del d[int(self.rng.integers(0, len(d))) :]
        elif kind == 4:  # extended
            d += self.rng.integers(0, 256, int(self.rng.integers(1, 64)), dtype=np.uint8).tobytes()
        else:  # seq and offset moved together: another chunk's place, this chunk's bytes
            seq = _get(d, SEQ) + int(self.rng.integers(1, 4))
            per_chunk = _get(d, OFFSET) // max(1, _get(d, SEQ)) if _get(d, SEQ) else 0
            _set(_set(d, SEQ, seq), OFFSET, seq * per_chunk)
        if bytes(d) == g:
            d[0] ^= 0x20  # (the version nibble: never a no-op)
        return bytes(d)

    def invalid_mutation(self, g: bytes) -> bytes:
        """A mutation that breaks a rule of spec §6.1 by itself, whatever the
        receiver knows of the message (unauthenticated runs)."""
        d = bytearray(g)
        kind = int(self.rng.integers(8))
        if kind == 0:
            del d[int(self.rng.integers(0, DATA_HEADER_LEN)) :]  # rule 1
        elif kind == 1:
            d[0] = int(self.rng.choice([0x01, 0x21, 0x12, 0x10, 0xFF]))  # rules 2-3
        elif kind == 2:
            _set(d, JOB_F, JOB ^ int(self.rng.integers(1, 1 << 16)))  # rule 4
        elif kind == 3:
            d[FLAGS[0]] |= 1 << int(self.rng.integers(3, 8))  # rule 5a
        elif kind == 4:
            d[DTYPE[0]] = (d[DTYPE[0]] & 0xF0) | int(self.rng.integers(1, 16))  # rule 5b
        elif kind == 5:  # rule 6b: the datagram's length disagrees with payload_len
            if self.rng.integers(2):
                del d[-int(self.rng.integers(1, 5)) :]
            else:
                d += bytes(int(self.rng.integers(1, 5)))
        elif kind == 6:
            _set(d, MSG_ELEMS, 0)  # rule 7
        else:  # rule 7: the chunk ends past the message
            _set(d, OFFSET, _get(d, MSG_ELEMS))
        return bytes(d)

    def elsewhere(self, g: bytes) -> bytes:
        """A mutation moved to a key not in flight (a message nobody asked for)."""
        d = bytearray(self.any_mutation(g) if self.authenticated else g)
        _set(d, STEP, 1_000_000 + int(self.rng.integers(1 << 20)))
        return bytes(d)


def _send_udp(sock: socket.socket, port: int, grams: list[bytes], rng: np.random.Generator) -> None:
    """Each datagram to 127.0.0.1:port; runs of equal-length ones sometimes as one
    GSO message (a batch the receiver's GRO may keep together)."""
    i = 0
    while i < len(grams):
        j = i + 1
        while j < len(grams) and j - i < 16 and len(grams[j]) == len(grams[i]):
            j += 1
        if j - i > 1 and grams[i] and rng.integers(2):
            try:
                sock.sendmsg(
                    [b"".join(grams[i:j])],
                    [(socket.SOL_UDP, UDP_SEGMENT, struct.pack("=H", len(grams[i])))],
                    0,
                    ("127.0.0.1", port),
                )
                i = j
                continue
            except OSError:  # no GSO here (or this size): one by one
                pass
        for g in grams[i:j]:
            sock.sendto(g, ("127.0.0.1", port))
        i = j


def _control_scripts(rng: np.random.Generator, *, authenticated: bool) -> Iterator[bytes]:
    """What junk connections to a control port send, one byte string each."""

    def hello(rank: int, job: int = JOB, magic: bytes = b"DLCP") -> bytes:
        head = magic + struct.pack(">HH", job, rank)
        if authenticated:  # a nonce and a tag nobody could have made
            head += rng.integers(0, 256, 32, dtype=np.uint8).tobytes()
        return head

    def frame(body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + body

    def noise(n: int) -> bytes:
        return rng.integers(0, 256, n, dtype=np.uint8).tobytes()

    yield b""
    yield b"DL"
    yield hello(2, magic=b"DLCQ") + frame(noise(20))
    yield hello(2, job=JOB ^ 1) + frame(noise(20))
    for claimed in (0, 2):  # claiming the sender in flight, and an idle rank
        yield hello(claimed) + b"\x00\x02"  # a short length prefix
        yield hello(claimed) + struct.pack(">I", 0xFFFFFFFF) + noise(64)
        yield hello(claimed) + struct.pack(">I", 65537) + noise(100)
        yield hello(claimed) + frame(b"") + frame(noise(3))
        yield hello(claimed) + b"".join(frame(noise(int(rng.integers(1, 120)))) for _ in range(8))
        yield hello(claimed) + noise(4096)


def _junk_control(port: int, rng: np.random.Generator, *, authenticated: bool) -> int:
    """Sends every control script on a connection of its own; returns how many."""
    sent = 0
    for script in _control_scripts(rng, authenticated=authenticated):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
            try:
                c.sendall(script)
                c.shutdown(socket.SHUT_WR)
            except OSError:  # the endpoint refused and closed it: what junk should get
                pass
        sent += 1
    return sent


def check_received(r: Received, x: np.ndarray, where: str) -> None:
    """Elements outside the lost ranges are the sender's, lost ranges hold zeros,
    the loss is within the bound."""
    report = r.report
    assert report.msg_elems == len(x), where
    lost = np.zeros(len(x), bool)
    for offset, length in report.lost_ranges:
        lost[offset : offset + length] = True
    assert int(lost.sum()) == report.lost_elems, where
    assert report.lost_elems <= P * len(x) + 1e-9, f"{where}: lost {report.lost_elems} > p"
    assert np.array_equal(r.data[~lost], x[~lost]), f"{where}: delivered bytes differ"
    assert not r.data[lost].any(), f"{where}: lost ranges do not hold the fill"


def _endpoints(proto: ProtocolConfig, ring: KeyRing | None, seed: int) -> list[Endpoint]:
    store = LocalStore()
    eps: list[Endpoint] = []
    try:
        for rank in range(3):
            cfg = EndpointConfig(
                timeout=20.0,
                protocol=proto,
                emulated_loss=EMULATED_LOSS if rank == 1 else 0.0,
                emulated_loss_seed=seed,
            )
            eps.append(Endpoint(rank, store=store, world_size=3, job=JOB, config=cfg, key=ring))
    except BaseException:
        for ep in eps:
            ep.close()
        raise
    return eps


def _rejected(ep: Endpoint) -> int:
    """Junk ``ep`` dropped: rejected in user space, or by its kernel filter (the
    socket's drops, which would count a full receive buffer's too)."""
    stats: dict[str, Any] = ep.stats()
    return int(sum(stats["rejected"].values())) + int(stats["socket_drops"])


@pytest.mark.parametrize(
    ("authenticated", "loop"),
    [(False, "c"), (True, "c"), (False, "python")],
    ids=["plain-c-loop", "authenticated-c-loop", "plain-python-loop"],
)
def test_live_endpoints_deliver_exact_data_under_junk_and_forgeries(
    authenticated: bool, loop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if loop == "c" and udp_module._udpio is None:
        pytest.skip("the C receive loop (dlcp.io._udpio) is not built")
    if loop == "python":
        monkeypatch.setattr(udp_module, "_udpio", None)
    seed = SEED + authenticated + 2 * (loop == "python")
    where = f"seed {seed} (DLCP_LIVE_FUZZ_SEED={SEED}), {authenticated=}, {loop} receive loop"
    rng = np.random.default_rng(seed)
    proto = ProtocolConfig(authenticate=authenticated)
    ring = KeyRing(SECRET, job=JOB, run_nonce=new_run_nonce()) if authenticated else None
    other_ring = KeyRing(SECRET, job=JOB, run_nonce=new_run_nonce())  # another run's keys
    junk = Junk(rng, authenticated=authenticated)
    mutate = junk.any_mutation if authenticated else junk.invalid_mutation
    eps = _endpoints(proto, ring, seed)
    try:
        port = eps[1].address.data_port
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            for i in range(TRANSFERS):
                step = 100 + i
                at = f"{where}, step {step}"
                # two messages in flight at once, both forged for
                xs = {msg: rng.uniform(1.0, 2.0, ELEMS).astype(np.float32) for msg in MSGS}
                genuine = [
                    g for msg in MSGS for g in genuine_datagrams(proto, ring, xs[msg], step, msg)
                ]
                # the first into a buffer of the caller's (NaN until written), the other not
                outs = {MSGS[0]: np.full(ELEMS, np.nan, np.float32), MSGS[1]: None}
                received = {
                    m: eps[1].recv(src=0, step=step, msg=m, p=P, fill="zero", out=outs[m])
                    for m in MSGS
                }
                # before the first genuine datagram: forgeries for the keys, junk
                picks = rng.integers(0, len(genuine), JUNK_PER_PHASE)
                before = [mutate(genuine[int(k)]) for k in picks]
                if authenticated:  # well-formed, for these keys, under another run's keys
                    y = rng.uniform(-2.0, -1.0, ELEMS).astype(np.float32)
                    for msg in MSGS:
                        before += genuine_datagrams(proto, other_ring, y, step, msg)[:25]
                before += [junk.random() for _ in range(JUNK_PER_PHASE // 3)]
                _send_udp(udp, port, before, rng)
                sent = [eps[0].send(xs[m], to=1, step=step, msg=m, p=P) for m in MSGS]
                # while they are in flight: more of the same, replays, other keys, control junk
                during = [mutate(genuine[int(k)]) for k in picks[::-1]]
                during += [junk.elsewhere(genuine[int(k)]) for k in picks[:50]]
                during += [genuine[int(k)] for k in picks[:30]]  # the sender's own bytes again
                during += [junk.random() for _ in range(JUNK_PER_PHASE // 3)]
                order = rng.permutation(len(during))
                _send_udp(udp, port, [during[int(k)] for k in order], rng)
                _junk_control(eps[1].address.control_port, rng, authenticated=authenticated)
                for m in MSGS:
                    got = received[m].result(timeout=30)
                    check_received(got, xs[m], f"{at}, msg {m}")
                    assert outs[m] is None or got.data is outs[m], f"{at}: not into out="
                for fut in sent:
                    assert fut.result(timeout=30) is not None, at
        assert _rejected(eps[1]) >= TRANSFERS * JUNK_PER_PHASE, where
        # later transfers: exact, both directions and from the idle rank
        z = np.arange(ELEMS, dtype=np.float32)
        for src, dst in ((0, 1), (1, 0), (2, 1)):
            r = eps[dst].recv(src=src, step=900, msg=src)
            eps[src].send(z + src, to=dst, step=900, msg=src).result(timeout=30)
            got = r.result(timeout=30)
            assert np.array_equal(got.data, z + src) and got.report.lost_elems == 0, where
        for ep in eps:
            assert ep.stats()["peers_gone"] == {}, where
            assert ep._thread.is_alive(), f"{where}: rank {ep.rank}'s I/O thread ended"
    finally:
        for ep in eps:
            ep.close()
