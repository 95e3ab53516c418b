"""A small P4Runtime client over grpcio (the ``switch`` extra).

:class:`P4RuntimeClient` connects to one device (``address``, ``device_id``), opens
the stream channel and becomes primary controller with its election id (waiting for
the arbitration answer with a timeout), pushes the forwarding pipeline (P4Info +
target config, e.g. the BMv2 JSON), writes table entries, reads counters and closes
cleanly. Every RPC has a deadline; failures raise :class:`P4RuntimeError` with the
address, the RPC and the gRPC status. A failed Write raises
:class:`P4RuntimeWriteError`, which lists every update the device rejected (from the
``p4.v1.Error`` details of the ``google.rpc.Status`` the device returns) with the
entry it came from.

The message classes come from :mod:`dlcp.switch.p4proto`; the RPCs are called by
their paths (``/p4.v1.P4Runtime/Write`` ...), so no generated stub module is needed.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import grpc

from ..errors import DLCPError, UsageError
from .p4entries import TableEntry
from .p4info import P4InfoHelper
from .p4proto import SERVICE, P4Protos, load

__all__ = [
    "CounterValue",
    "P4RuntimeClient",
    "P4RuntimeError",
    "P4RuntimeWriteError",
    "WriteFailure",
]

_STATUS_DETAILS_KEY = "grpc-status-details-bin"
_BATCH = 1000
_CODE_NAMES = {c.value[0]: c.name for c in grpc.StatusCode}


class P4RuntimeError(DLCPError, RuntimeError):
    """A P4Runtime device could not be reached or refused a request."""


@dataclass(frozen=True)
class WriteFailure:
    """One rejected update of a Write: its position, what it was, and why."""

    index: int
    update: str
    code: str
    message: str

    def __str__(self) -> str:
        return f"update {self.index} ({self.update}): {self.code}: {self.message}"


class P4RuntimeWriteError(P4RuntimeError):
    """A Write in which the device rejected some updates (see :attr:`failures`)."""

    def __init__(self, message: str, failures: Sequence[WriteFailure]) -> None:
        super().__init__(message)
        self.failures = list(failures)


@dataclass(frozen=True)
class CounterValue:
    packets: int
    bytes: int


def _uint128(value: int) -> tuple[int, int]:
    if not 0 <= value < 1 << 128:
        raise UsageError(f"election_id must be within 0..2**128-1, got {value}")
    return value >> 64, value & ((1 << 64) - 1)


class P4RuntimeClient:
    """One controller connection to one P4Runtime device; use as a context manager
    or call :meth:`connect` and :meth:`close`. ``primary=False`` skips arbitration
    (enough for Read, e.g. counters, while another controller is primary)."""

    def __init__(
        self,
        address: str,
        device_id: int,
        *,
        election_id: int = 1,
        timeout: float = 10.0,
        primary: bool = True,
        protos: P4Protos | None = None,
    ) -> None:
        if timeout <= 0:
            raise UsageError(f"timeout must be positive, got {timeout}")
        self.address = address
        self.device_id = device_id
        self.election_id = election_id
        self.timeout = timeout
        self.primary = primary
        self.protos = protos or load()
        self._high, self._low = _uint128(election_id)
        self._channel: Any = None
        self._stream: Any = None
        self._requests: queue.Queue[Any] = queue.Queue()
        self._responses: queue.Queue[Any] = queue.Queue()
        self._reader: threading.Thread | None = None

    # ---- connection ---------------------------------------------------------------

    def __enter__(self) -> P4RuntimeClient:
        return self.connect()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def connect(self) -> P4RuntimeClient:
        """Reach the device and become its primary controller."""
        if self._channel is not None:
            return self
        options = [
            ("grpc.max_send_message_length", -1),
            ("grpc.max_receive_message_length", 64 << 20),
        ]
        self._channel = grpc.insecure_channel(self.address, options=options)
        try:
            grpc.channel_ready_future(self._channel).result(timeout=self.timeout)
        except grpc.FutureTimeoutError:
            self.close()
            raise P4RuntimeError(
                f"P4Runtime server at {self.address} not reachable within "
                f"{self.timeout:g} s (is the switch, e.g. simple_switch_grpc, running?)"
            ) from None
        if not self.primary:
            return self  # Read-only use: no stream channel, no arbitration
        try:
            self._arbitrate()
        except BaseException:
            self.close()
            raise
        return self

    def _rpc(self, name: str, kind: str = "unary_unary") -> Any:
        if self._channel is None:
            raise P4RuntimeError(f"{self.address}: not connected (call connect() first)")
        pr = self.protos
        req, resp = {
            "Write": (pr.WriteRequest, pr.WriteResponse),
            "Read": (pr.ReadRequest, pr.ReadResponse),
            "SetForwardingPipelineConfig": (
                pr.SetForwardingPipelineConfigRequest,
                pr.SetForwardingPipelineConfigResponse,
            ),
            "StreamChannel": (pr.StreamMessageRequest, pr.StreamMessageResponse),
        }[name]
        return getattr(self._channel, kind)(
            f"/{SERVICE}/{name}",
            request_serializer=req.SerializeToString,
            response_deserializer=resp.FromString,
        )

    def _request_iter(self) -> Iterator[Any]:
        while True:
            item = self._requests.get()
            if item is None:
                return
            yield item

    def _read_stream(self, stream: Any) -> None:
        try:
            for msg in stream:
                self._responses.put(msg)
        except grpc.RpcError as e:
            self._responses.put(e)
        self._responses.put(None)

    def _arbitrate(self) -> None:
        pr = self.protos
        # a stream of its own: an earlier one's end (None) must not end this one
        self._requests, self._responses = queue.Queue(), queue.Queue()
        self._stream = self._rpc("StreamChannel", "stream_stream")(self._request_iter())
        self._reader = threading.Thread(
            target=self._read_stream, args=(self._stream,), name="p4rt-stream", daemon=True
        )
        self._reader.start()
        req = pr.StreamMessageRequest()
        req.arbitration.device_id = self.device_id
        req.arbitration.election_id.high = self._high
        req.arbitration.election_id.low = self._low
        self._requests.put(req)
        deadline = time.monotonic() + self.timeout
        while True:
            left = deadline - time.monotonic()
            try:
                msg = self._responses.get(timeout=max(left, 0.0))
            except queue.Empty:
                raise P4RuntimeError(
                    f"{self.address}: no arbitration answer for device {self.device_id} "
                    f"within {self.timeout:g} s"
                ) from None
            if msg is None:
                raise P4RuntimeError(f"{self.address}: stream channel closed during arbitration")
            if isinstance(msg, grpc.RpcError):
                raise self._error("StreamChannel (arbitration)", msg) from None
            if msg.WhichOneof("update") != "arbitration":
                continue  # packet-in, digest ... before our answer: not for us
            st = msg.arbitration.status
            if st.code != 0:
                raise P4RuntimeError(
                    f"{self.address}: device {self.device_id} did not make this client "
                    f"primary (election id {self.election_id}): "
                    f"{_CODE_NAMES.get(st.code, st.code)}: {st.message}"
                )
            return

    def close(self) -> None:
        """End the stream channel and the connection (safe to call twice)."""
        if self._stream is not None:
            self._requests.put(None)  # half-close: the device ends the stream
            if self._reader is not None:
                self._reader.join(timeout=min(self.timeout, 2.0))
            self._stream.cancel()  # no-op when the device already ended it
            self._stream = None
        if self._reader is not None:
            self._reader.join(timeout=self.timeout)
            self._reader = None
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    # ---- errors ---------------------------------------------------------------------

    def _error(self, what: str, e: grpc.RpcError) -> P4RuntimeError:
        code = e.code() if hasattr(e, "code") else None
        details = e.details() if hasattr(e, "details") else str(e)
        name = code.name if code is not None else "UNKNOWN"
        hint = ""
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            hint = f" (no answer within {self.timeout:g} s)"
        elif code == grpc.StatusCode.UNAVAILABLE:
            hint = " (device unreachable)"
        return P4RuntimeError(f"{self.address}: {what} failed: {name}{hint}: {details}")

    def _write_failures(self, e: grpc.RpcError, labels: Sequence[str]) -> list[WriteFailure]:
        trailers = e.trailing_metadata() if hasattr(e, "trailing_metadata") else None
        raw = next((v for k, v in trailers or () if k == _STATUS_DETAILS_KEY), None)
        if raw is None:
            return []
        status = self.protos.Status()
        status.ParseFromString(raw)
        out = []
        for i, detail in enumerate(status.details):
            err = self.protos.Error()
            if not detail.Unpack(err) or err.canonical_code == 0:
                continue
            label = labels[i] if i < len(labels) else "?"
            code = _CODE_NAMES.get(err.canonical_code, str(err.canonical_code))
            out.append(WriteFailure(i, label, code, err.message))
        return out

    # ---- RPCs -------------------------------------------------------------------------

    def _election(self, msg: Any) -> None:
        msg.election_id.high = self._high
        msg.election_id.low = self._low

    def set_pipeline(self, p4info: Any, device_config: bytes, cookie: int = 0) -> None:
        """SetForwardingPipelineConfig (VERIFY_AND_COMMIT) with ``p4info`` (a P4Info
        message) and the target's config (BMv2: the JSON file's bytes)."""
        pr = self.protos
        req = pr.SetForwardingPipelineConfigRequest(
            device_id=self.device_id,
            action=pr.SetForwardingPipelineConfigRequest.VERIFY_AND_COMMIT,
        )
        self._election(req)
        req.config.p4info.CopyFrom(p4info)
        req.config.p4_device_config = device_config
        req.config.cookie.cookie = cookie
        try:
            self._rpc("SetForwardingPipelineConfig")(req, timeout=self.timeout)
        except grpc.RpcError as e:
            raise self._error("SetForwardingPipelineConfig", e) from None

    def write(self, updates: Sequence[Any], labels: Sequence[str] = ()) -> None:
        """Send ``updates`` (``p4.v1.Update``) in Write requests; ``labels[i]``
        names update ``i`` in error messages."""
        rpc = self._rpc("Write")
        for start in range(0, len(updates), _BATCH):
            chunk = updates[start : start + _BATCH]
            req = self.protos.WriteRequest(device_id=self.device_id)
            self._election(req)
            req.updates.extend(chunk)
            try:
                rpc(req, timeout=self.timeout)
            except grpc.RpcError as e:
                fails = self._write_failures(e, labels[start : start + len(chunk)])
                if not fails:
                    raise self._error("Write", e) from None
                fails = [WriteFailure(f.index + start, f.update, f.code, f.message) for f in fails]
                lines = "\n".join(f"  {f}" for f in fails)
                raise P4RuntimeWriteError(
                    f"{self.address}: device {self.device_id} rejected {len(fails)} of "
                    f"{len(chunk)} updates:\n{lines}",
                    fails,
                ) from None

    def write_entries(
        self, helper: P4InfoHelper, entries: Sequence[TableEntry], kind: str = "INSERT"
    ) -> None:
        """Encode ``entries`` with ``helper`` and write them (``kind`` INSERT/MODIFY/DELETE)."""
        self.write(helper.updates(entries, kind), [e.describe() for e in entries])

    def write_register(self, helper: P4InfoHelper, name: str, index: int, value: int) -> None:
        """Set cell ``index`` of register ``name`` (where the target supports
        P4Runtime register writes)."""
        self.write([helper.register_update(name, index, value)], [f"{name}[{index}] = {value}"])

    def read(self, entities: Sequence[Any]) -> list[Any]:
        """Read ``entities`` (``p4.v1.Entity`` patterns); every entity returned."""
        req = self.protos.ReadRequest(device_id=self.device_id)
        req.entities.extend(entities)
        out: list[Any] = []
        try:
            for resp in self._rpc("Read", "unary_stream")(req, timeout=self.timeout):
                out.extend(resp.entities)
        except grpc.RpcError as e:
            raise self._error("Read", e) from None
        return out

    def read_counter(
        self, helper: P4InfoHelper, name: str, index: int | None = None
    ) -> dict[int, CounterValue]:
        """Indirect counter ``name``: index -> packets and bytes (every index when
        ``index`` is None)."""
        out: dict[int, CounterValue] = {}
        for ent in self.read([helper.counter_entity(name, index)]):
            ce = ent.counter_entry
            out[int(ce.index.index)] = CounterValue(
                int(ce.data.packet_count), int(ce.data.byte_count)
            )
        return dict(sorted(out.items()))
