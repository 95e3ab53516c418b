"""The data socket's kernel filter (``dlcp.io.kernel_filter``): where a UDP
socket filter sees the datagram, that the kernel drops exactly what the
session's parser rejects for a header rule (and, on a GRO socket, what it
rejects for one in the first datagram of a super-packet), that what it lets
through is still screened in user space, and how it is configured."""

from __future__ import annotations

import socket
import struct

import numpy as np
import pytest

from dlcp.errors import ConfigError
from dlcp.io import EndpointConfig, kernel_filter, udp
from dlcp.io.udp import UDP_GRO, UDP_SEGMENT, DataSockets
from dlcp.proto.batch import parse_batch
from dlcp.proto.wire import AUTH_TRAILER_LEN, DATA_HEADER_LEN, DType, Flags, Reason
from tests.io.test_prefilter import JOB, KEY, _genuine, _mutants

#: sends per drain of the receiving socket: far below what its buffer holds
_CHUNK = 200


def _drain(sock: socket.socket) -> list[bytes]:
    got = []
    while True:
        try:
            got.append(sock.recv(1 << 16))
        except BlockingIOError:
            return got


def _receiver(gro: bool) -> socket.socket:
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    rx.setblocking(False)
    if gro:
        rx.setsockopt(socket.SOL_UDP, UDP_GRO, 1)
    return rx


def _passes_header_rules(d: bytes, *, require_auth: bool) -> bool:
    buf = np.frombuffer(d, dtype=np.uint8).copy()
    return Reason(int(parse_batch(buf, len(d), job=JOB, require_auth=require_auth).reasons[0])) in (
        Reason.OK,
        Reason.AUTH_FAILED,  # (the tag: rule 9, no filter's business)
    )


def _kernel_keeps(d: bytes, *, require_auth: bool, gro: bool) -> bool:
    """What the filter must decide for datagram ``d``: keep it iff it passes the
    header rules; on a GRO socket, iff its first ``32 + payload_len + tag``
    bytes (the first datagram of a super-packet) are there and pass them."""
    if not gro or len(d) < DATA_HEADER_LEN:
        return _passes_header_rules(d, require_auth=require_auth)
    tag = AUTH_TRAILER_LEN if d[1] & Flags.AUTH else 0
    claimed = DATA_HEADER_LEN + int.from_bytes(d[24:26], "big") + tag
    return len(d) >= claimed and _passes_header_rules(d[:claimed], require_auth=require_auth)


def _edge_geometries() -> list[bytes]:
    """Genuine datagrams of every element type at the edge of rule 7: ending
    exactly at the message's end, one element past it, or with a message of
    no elements."""
    out = []
    for dtype in DType:
        for chunk in (1, 3):
            for elems in (3 * chunk, 3 * chunk - 1, 2 * chunk + 1, 0):
                like = DType.FLOAT16 if dtype is DType.BFLOAT16 else dtype  # (numpy has no bf16)
                d = bytearray(_genuine(2, chunk=chunk, elems=max(elems, 1), dtype=like))
                d[29] = dtype << 4
                d[20:24] = elems.to_bytes(4, "big")
                out.append(bytes(d))
    return out


def test_a_socket_filter_sees_the_udp_header_first() -> None:
    """The offsets of the filter rest on this: at offset 0 a UDP socket filter
    sees the UDP header (its destination port at 2), and the length counts it."""
    rx = _receiver(gro=False)
    port = rx.getsockname()[1]
    program = [  # keep a datagram iff bytes 2-3 are this socket's port and it is 8 + 5 long
        kernel_filter.Instruction(0x28, 0, 0, 2, "A = halfword at 2"),
        kernel_filter.Instruction(0x15, 0, 3, port, "the receiving port?"),
        kernel_filter.Instruction(0x80, 0, 0, 0, "A = length"),
        kernel_filter.Instruction(0x15, 0, 1, kernel_filter.UDP_HEADER_LEN + 5, "8 + 5?"),
        kernel_filter.Instruction(0x06, 0, 0, 0xFFFFFFFF, "keep"),
        kernel_filter.Instruction(0x06, 0, 0, 0, "drop"),
    ]
    try:
        kernel_filter.attach(rx, program, setting="(a test)")
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
            for d in (b"12345", b"1234", b"123456"):
                tx.sendto(d, rx.getsockname())
        assert _drain(rx) == [b"12345"]
        assert kernel_filter.drop_count(rx) == 2  # the filter's drops count there
    finally:
        rx.close()


@pytest.mark.parametrize("gro", [False, True], ids=["no-gro", "gro"])
@pytest.mark.parametrize("require_auth", [False, True], ids=["plain", "require-auth"])
def test_the_kernel_keeps_a_datagram_iff_its_header_passes_the_rules(
    require_auth: bool, gro: bool
) -> None:
    """Random, mutated and edge-of-geometry datagrams: the kernel queues exactly
    the ones the session's parser gives no header reason (the tag aside), in
    order, and counts the rest as the socket's drops. With GRO it checks that
    the datagram is at least as long as its header says, not equal."""
    if gro and not udp.kernel_supports(UDP_GRO):
        pytest.skip("this kernel has no UDP GRO")
    rng = np.random.default_rng(31)
    datagrams = _mutants(rng, 2000) + _edge_geometries()
    tagged = [_genuine(s, key=KEY) for s in range(5)]
    datagrams += tagged + [_genuine(s) for s in range(5)]
    rx = _receiver(gro)
    try:
        program = kernel_filter.data_filter(
            JOB, require_auth=require_auth, tag_len=AUTH_TRAILER_LEN, gro=gro
        )
        kernel_filter.attach(rx, program, setting="(a test)")
        got: list[bytes] = []
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
            for start in range(0, len(datagrams), _CHUNK):
                for d in datagrams[start : start + _CHUNK]:
                    tx.sendto(d, rx.getsockname())
                got += _drain(rx)  # (queued on loopback once sendto returned)
        kept = [d for d in datagrams if _kernel_keeps(d, require_auth=require_auth, gro=gro)]
        assert got == kept
        assert kernel_filter.drop_count(rx) == len(datagrams) - len(kept)
    finally:
        rx.close()
    # the sample reaches both decisions, on genuine and on junk datagrams
    assert set(tagged) <= set(kept) and len(kept) < len(datagrams) // 2
    if gro:  # and datagrams longer than their header says, which only GRO lets by
        assert any(not _passes_header_rules(d, require_auth=require_auth) for d in kept)


def _sockets(gro: str) -> DataSockets:
    return DataSockets("127.0.0.1", 0, 1, gso="auto", gro=gro, rcvbuf=1 << 22, sndbuf=1 << 20)


def _receive(rx: DataSockets) -> list[bytes]:
    got: list[bytes] = []
    rx.receive(lambda buf, seg: got.extend(_split(buf.tobytes(), seg)))
    return got


def _split(run: bytes, seg: int) -> list[bytes]:
    return [run[i : i + seg] for i in range(0, len(run), seg)]


def _wrong_job(d: bytes) -> bytes:
    junk = bytearray(d)
    junk[2:4] = (JOB ^ 1).to_bytes(2, "big")
    return bytes(junk)


@pytest.mark.skipif(udp._udpio is None, reason="dlcp.io._udpio not built")
@pytest.mark.parametrize("in_kernel", [True, False], ids=["kernel-filter", "no-kernel-filter"])
def test_junk_with_a_wrong_job_never_reaches_the_socket_with_the_kernel_filter(
    in_kernel: bool,
) -> None:
    """Genuine datagrams flow. Junk for another job is the socket's kernel drop
    with the filter, the pre-filter's count without it. A datagram longer than
    its header says passes the filter of a GRO socket and is screened in user
    space as before."""
    rx = _sockets("auto")
    try:
        rx.screen(job=JOB, require_auth=False, tag_len=AUTH_TRAILER_LEN, in_kernel=in_kernel)
        assert rx.kernel_filter is in_kernel
        genuine = [_genuine(s) for s in range(3)]
        sent = [genuine[0], _wrong_job(genuine[1]), genuine[1], genuine[2] + b"\0\0\0\0"]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
            for d in sent:
                tx.sendto(d, rx.address)
        assert _receive(rx) == genuine[:2]
        screened = rx.take_screened()
        if in_kernel:
            assert rx.socket_drops() == 1 + (not rx.use_gro)
            assert screened == ({"length_mismatch": 1} if rx.use_gro else {})
        else:
            assert rx.socket_drops() == 0
            assert screened == {"wrong_job": 1, "length_mismatch": 1}
    finally:
        rx.close()


@pytest.mark.skipif(udp._udpio is None, reason="dlcp.io._udpio not built")
@pytest.mark.skipif(
    not (udp.kernel_supports(UDP_GRO) and udp.kernel_supports(UDP_SEGMENT)),
    reason="this kernel has no UDP GSO or GRO",
)
def test_a_gso_train_is_filtered_by_its_first_datagram_and_screened_whole() -> None:
    """A GSO train sent on loopback reaches a GRO socket whole, and the filter
    sees its first datagram only: a train that starts genuine is queued with the
    junk in it, which the pre-filter drops and counts; a train that starts with
    junk is dropped whole, as one of the socket's drops."""
    rx = _sockets("on")
    try:
        rx.screen(job=JOB, require_auth=False, tag_len=AUTH_TRAILER_LEN, in_kernel=True)
        genuine = [_genuine(s) for s in range(4)]
        seg = len(genuine[0])
        gso = [(socket.SOL_UDP, UDP_SEGMENT, struct.pack("=H", seg))]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
            train = genuine[0] + _wrong_job(genuine[1]) + genuine[2]
            tx.sendmsg([train], gso, 0, rx.address)
            assert _receive(rx) == [genuine[0], genuine[2]]
            assert rx.take_screened() == {"wrong_job": 1}
            assert rx.socket_drops() == 0
            train = _wrong_job(genuine[1]) + genuine[2] + genuine[3]
            tx.sendmsg([train], gso, 0, rx.address)
            assert _receive(rx) == []
            assert rx.take_screened() == {}
            assert rx.socket_drops() == 1
    finally:
        rx.close()


def test_a_filter_that_cannot_be_attached_fails_naming_the_option_and_the_setting() -> None:
    rx = _receiver(gro=False)
    rx.close()  # (what any attach failure looks like: the kernel's error)
    program = kernel_filter.data_filter(JOB, require_auth=False, tag_len=24, gro=False)
    with pytest.raises(ConfigError, match=r"SO_ATTACH_FILTER.*Bad file descriptor.*DLCP_KERN"):
        kernel_filter.attach(rx, program, setting="DLCP_KERNEL_FILTER=0")


def test_the_setting_is_on_by_default_and_turned_off_by_its_variable() -> None:
    assert EndpointConfig().kernel_filter is True
    assert EndpointConfig.from_env({"DLCP_KERNEL_FILTER": "0"}).kernel_filter is False
    with pytest.raises(ConfigError, match="DLCP_KERNEL_FILTER='maybe' is not a valid bool"):
        EndpointConfig.from_env({"DLCP_KERNEL_FILTER": "maybe"})
    with pytest.raises(ConfigError, match="kernel_filter='no' is not True or False"):
        EndpointConfig(kernel_filter="no")  # type: ignore[arg-type]


def test_a_job_outside_the_header_field_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"job=65536 outside 0\.\.65535"):
        kernel_filter.data_filter(1 << 16, require_auth=False, tag_len=24, gro=False)
