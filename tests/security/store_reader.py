"""A store reader: a process that knows only the rendezvous store's address.

It lists and reads every key in the store, then tries every value it found as
an authentication key, and as a job secret with the run nonce it found, to
forge rank 0's data (a whole one-chunk message 0 -> 1, step 0, msg 1) and
rank 0's control connection (a hello with a proof, then an ABORT of that
message) against rank 1. Prints one JSON object: the store's keys and values,
and how many forgeries it sent.

    python tests/security/store_reader.py HOST PORT
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
import sys
from datetime import timedelta

from torch.distributed import TCPStore  # type: ignore[attr-defined]

from dlcp.io.control import HELLO, HELLO_NONCE_LEN, _proof_input, hello_proof
from dlcp.keyring import KeyRing
from dlcp.proto.control import Abort, AbortReason, encode_control
from dlcp.proto.wire import DataHeader, Flags, encode_data


def _candidates(values: list[bytes], job: int, nonce: bytes | None) -> list[bytes]:
    """Every key a store reader could make of what it read."""
    raw: list[bytes] = []
    for v in values:
        raw.append(v)
        with contextlib.suppress(ValueError, UnicodeDecodeError):
            raw.append(bytes.fromhex(v.decode()))
    keys: list[bytes] = []
    for r in raw:
        if len(r) in (16, 24, 32):
            keys.append(r)  # as the key itself (what the store used to carry)
        if 16 <= len(r) <= 1024 and nonce is not None:
            keys.append(KeyRing(r, job=job, run_nonce=nonce)(0, 1))  # as the secret
    return list(dict.fromkeys(keys))


def main(host: str, port: int) -> None:
    store = TCPStore(host, port, is_master=False, timeout=timedelta(seconds=10))
    names = [k for k in store.list_keys() if k.startswith("dlcp/")]
    values = {k: store.get(k) for k in names}
    job_name = next(k for k in names if k.endswith("/job"))
    prefix = job_name[: -len("job")]
    job = int(values[job_name])
    nonce_s = values.get(prefix + "nonce")
    nonce = bytes.fromhex(nonce_s.decode()) if nonce_s is not None else None
    addr = values[f"{prefix}dlcp/{job}/addr/1"].decode().split()
    host1, data_port, control_port = addr[0], int(addr[1]), int(addr[2])
    keys = _candidates(list(values.values()), job, nonce)
    header = DataHeader(job=job, step=0, msg=1, seq=0, offset=0, msg_elems=100,
                        payload_len=400, src=0, flags=Flags.LAST)  # fmt: skip
    data_sent = hellos = hellos_refused = 0
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        for key in keys:
            forged = encode_data(header, b"\xee" * 400, key=key, nonce=data_sent)
            udp.sendto(forged, (host1, data_port))
            data_sent += 1
    for key in keys:
        hello = HELLO.pack(b"DLCP", job, 0)
        proof_nonce = os.urandom(HELLO_NONCE_LEN)
        proof = hello_proof(key, _proof_input(hello, 1, proof_nonce))
        abort = encode_control(
            Abort(0, 1, 0, reason=AbortReason.CANCELLED), job=job, key=key, nonce=hellos
        )
        with socket.create_connection((host1, control_port), timeout=10) as s:
            s.sendall(hello + proof_nonce + proof + struct.pack(">I", len(abort)) + abort)
            hellos += 1
            s.settimeout(5)
            try:
                refused = s.recv(1) == b""  # rank 1 closes a connection it refuses
            except ConnectionResetError:
                refused = True
            except TimeoutError:  # still open: the hello was taken
                refused = False
            hellos_refused += refused
    print(json.dumps({
        "keys": names,
        "values": {k: v.hex() for k, v in values.items()},
        "candidates": len(keys),
        "data_sent": data_sent,
        "hellos": hellos,
        "hellos_refused": hellos_refused,
    }))  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
