"""A control message the network drops comes back within milliseconds, not
after Linux's 200 ms minimum retransmission timeout (``dlcp.io.control``).

Root: each case runs in a namespace of its own, where an nftables rule drops one
marked control frame once; the kernel's default timers are the control case,
so the test shows it can see the difference it claims."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest

from dlcp.errors import ConfigError
from dlcp.io.config import EndpointConfig
from dlcp.io.control import TCP_DELACK_MAX_US, TCP_RTO_MIN_US, ControlChannel, set_fast_timers
from testbed import netns

pytestmark = pytest.mark.integration

WORKER = Path(__file__).with_name("control_drop_worker.py")
MISSING = netns.missing_tools(loss=True)


def _kernel_has_timer_options() -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        return set_fast_timers(s, 0.005) is not None


def _lost_frame_delay(rto_min: float) -> dict[str, object]:
    with netns.netns_loopback() as box:
        proc = box.run([sys.executable, str(WORKER), str(rto_min)], check=False)
    assert proc.returncode == 0, proc.stderr
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["frame"] == "LOSE me once" and result["dropped"] == 1
    return result


@pytest.mark.skipif(not _kernel_has_timer_options(), reason="kernel lacks TCP_RTO_MIN_US")
def test_accepted_control_connections_get_the_listeners_timers() -> None:
    server = ControlChannel("127.0.0.1", 0, rank=1, job=3, connect_timeout=2.0, rto_min=0.005)
    client = ControlChannel("127.0.0.1", 0, rank=0, job=3, connect_timeout=2.0, rto_min=0.005)
    try:
        assert client.send(1, server.address, b"hello") is None
        conn = server.accept()
        assert conn is not None
        out = client.outbound[1]
        for sock in (conn, out):  # both ends: the kernel's two-jiffy floor, not 200 ms
            assert sock.getsockopt(socket.IPPROTO_TCP, TCP_RTO_MIN_US) <= 20_000
            assert sock.getsockopt(socket.IPPROTO_TCP, TCP_DELACK_MAX_US) <= 20_000
    finally:
        client.close()
        server.close()


@pytest.mark.skipif(bool(MISSING), reason=f"needs {', '.join(MISSING)} (network namespaces)")
@pytest.mark.skipif(not _kernel_has_timer_options(), reason="kernel lacks TCP_RTO_MIN_US")
def test_a_dropped_control_frame_is_resent_within_milliseconds() -> None:
    fast = _lost_frame_delay(0.005)
    default = _lost_frame_delay(0.0)
    assert float(str(fast["seconds"])) < 0.1  # measured: 13 ms
    assert float(str(default["seconds"])) >= 0.2  # measured: 205 ms (tcp_rto_min)


class _RefusingSocket:
    """Refuses timer values below ``floor`` microseconds with EINVAL (as the
    kernel refuses less than two jiffies); without a floor, every value with
    ``errno`` (92 = ENOPROTOOPT: a kernel without the options)."""

    def __init__(
        self, floor: int | None = None, errno: int = 92, lacks: frozenset[int] = frozenset()
    ) -> None:
        self.floor = floor
        self.errno = errno
        self.lacks = lacks  # options this kernel does not have at all
        self.set: dict[int, int] = {}

    def setsockopt(self, level: int, opt: int, value: int) -> None:
        if self.floor is None or opt in self.lacks:
            raise OSError(self.errno, "refused")
        if value < self.floor:
            raise OSError(22, "below the floor")
        self.set[opt] = value

    def getsockopt(self, level: int, opt: int) -> int:
        return self.set[opt]


def test_a_value_below_the_kernels_floor_is_raised_until_accepted() -> None:
    sock = _RefusingSocket(floor=8000)
    assert set_fast_timers(sock, 0.005) == 10_000  # type: ignore[arg-type]
    assert set(sock.set.values()) == {10_000} and len(sock.set) == 2
    assert set_fast_timers(_RefusingSocket(), 0.005) is None  # type: ignore[arg-type]
    only_rto = _RefusingSocket(floor=1, lacks=frozenset({TCP_DELACK_MAX_US}))
    assert set_fast_timers(only_rto, 0.005) == 5000  # type: ignore[arg-type]
    assert only_rto.set == {TCP_RTO_MIN_US: 5000}
    closed = _RefusingSocket(errno=9, lacks=frozenset({TCP_RTO_MIN_US}))  # EBADF
    with pytest.raises(OSError, match="Errno 9"):  # a real error, not "unsupported"
        set_fast_timers(closed, 0.005)  # type: ignore[arg-type]
    untouched = _RefusingSocket(floor=1)
    assert set_fast_timers(untouched, 0.0) is None  # type: ignore[arg-type]
    assert not untouched.set


def test_control_rto_min_is_validated() -> None:
    assert EndpointConfig(control_rto_min=0.0).control_rto_min == 0.0
    with pytest.raises(ConfigError, match=r"control_rto_min=0\.5"):
        EndpointConfig(control_rto_min=0.5)
    with pytest.raises(ConfigError, match="DLCP_CONTROL_RTO_MIN"):
        EndpointConfig.from_env({"DLCP_CONTROL_RTO_MIN": "soon"})
