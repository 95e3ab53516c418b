"""Rewrite the authenticated vectors of ``wire_vectors.json`` with the codec.

The tagged data and control vectors (those with a ``key``) are re-encoded from
their fields with the nonce each one names (``nonce``, added with the default
below where missing), and the ``bad`` vectors about authentication are made
again from them by the change each one names. Run from the repository root:

    .venv/bin/python tests/golden/make_auth_vectors.py

then review the diff against docs/spec.md §3; tests/proto/test_wire.py and
tests/proto/test_inspect.py check every vector against the codec and the scapy
layers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dlcp.proto import wire
from dlcp.proto.wire import AUTH_TAG_LEN, AUTH_TRAILER_LEN, Domain, gmac_tag

PATH = Path(__file__).with_name("wire_vectors.json")
#: the nonces the vectors use unless they name one: small, large, and the largest
DEFAULT_NONCES = {
    "data_auth_float32": 1,
    "data_max_fields_auth": (1 << 64) - 1,
    "control_nack_auth": 0x0102030405060708,
    "control_finish_auth_max": (1 << 64) - 1,
}
OTHER_KEY = bytes(range(100, 132))


def _data(vector: dict[str, Any]) -> bytes:
    f = dict(vector["header"])
    header = wire.DataHeader(
        **{**f, "dtype": wire.DType[f["dtype"]], "flags": wire.Flags(f["flags"])}
    )
    key = bytes.fromhex(vector["key"])
    return wire.encode_data(header, bytes.fromhex(vector["payload"]), key, nonce=vector["nonce"])


def _control(vector: dict[str, Any]) -> bytes:
    f = dict(vector["fields"])
    kind = wire.PacketType[vector["type"]]
    if kind is wire.PacketType.NACK:
        msg: wire.ControlMessage = wire.Nack(**{**f, "ranges": tuple(map(tuple, f["ranges"]))})
    elif kind is wire.PacketType.FINISH:
        tail = tuple(f.get("tail", ()))
        msg = wire.Finish(**{**f, "class_chunks": tuple(f["class_chunks"]), "tail": tail})
    else:
        raise ValueError(f"{vector['name']}: no authenticated {kind.name} vector is expected")
    return wire.encode_control(
        msg, job=vector["job"], key=bytes.fromhex(vector["key"]), nonce=vector["nonce"]
    )


def _message_of(vector: dict[str, Any]) -> str:
    raw, key = bytes.fromhex(vector["hex"]), vector["key"] and bytes.fromhex(vector["key"])
    try:
        if vector["kind"] == "data":
            wire.decode_data(raw, job=vector["job"], key=key or None)
        else:
            wire.decode_control(
                raw, job=vector["job"], key=key or None, require_auth=vector["require_auth"]
            )
    except wire.WireError as exc:
        assert exc.reason is wire.Reason[vector["reason"]], vector["name"]
        return str(exc)
    raise AssertionError(f"{vector['name']} decodes")


def _flip(raw: bytes, at: int) -> bytes:
    out = bytearray(raw)
    out[at] ^= 0x01
    return bytes(out)


def _bad(name: str, kind: str, job: int, key: bytes, raw: bytes, note: str) -> dict[str, Any]:
    return {
        "name": name, "note": note, "kind": kind, "job": job, "key": key.hex(),
        "require_auth": False, "hex": raw.hex(), "reason": "AUTH_FAILED",
        "message": "authentication failed: tag does not match",
    }  # fmt: skip


def main() -> None:
    golden = json.loads(PATH.read_text())
    by_name = {}
    for kind, make in (("data", _data), ("control", _control)):
        for vector in golden[kind]:
            if vector["key"] is None:
                continue
            vector.setdefault("nonce", DEFAULT_NONCES[vector["name"]])
            raw = make(vector)
            vector["hex"] = raw.hex()
            vector["tag"] = raw[-AUTH_TAG_LEN:].hex()
            if kind == "data":
                vector["note"] = "AUTH flag, nonce and AES-GMAC tag under `key`" + (
                    "; every field at its largest value, all three flags"
                    if "max" in vector["name"] else ""
                )  # fmt: skip
            by_name[vector["name"]] = raw
    data, nack = by_name["data_auth_float32"], by_name["control_nack_auth"]
    key = bytes.fromhex(next(v["key"] for v in golden["data"] if v["key"]))
    # a control message tagged as if it were data: the domain byte of the IV differs
    nack_nonce = DEFAULT_NONCES["control_nack_auth"]
    end = len(nack) - AUTH_TAG_LEN
    as_data = nack[:end] + gmac_tag(key, nack[:end], domain=Domain.DATA, src=9, nonce=nack_nonce)
    remade = {
        "data_auth_tampered_payload": _bad("data_auth_tampered_payload", "data", 1, key,
                                           _flip(data, 32), "payload bit flipped"),
        "data_auth_tampered_header": _bad("data_auth_tampered_header", "data", 1, key,
                                          _flip(data, 11), "layer bit flipped"),
        "data_auth_tampered_nonce": _bad("data_auth_tampered_nonce", "data", 1, key,
                                         _flip(data, len(data) - AUTH_TRAILER_LEN + 7),
                                         "nonce changed: another IV"),
        "data_auth_wrong_key": _bad("data_auth_wrong_key", "data", 1, OTHER_KEY, data,
                                    "another pair's key (another destination or run)"),
        "control_auth_tampered": _bad("control_auth_tampered", "control", 7, key,
                                      _flip(nack, 27), "NACK range bit flipped"),
        "control_auth_wrong_key": _bad("control_auth_wrong_key", "control", 7, OTHER_KEY, nack,
                                       "another pair's key (another destination or run)"),
        "control_auth_data_domain": _bad("control_auth_data_domain", "control", 7, key, as_data,
                                         "tagged with the data domain's IV"),
    }  # fmt: skip
    bad = [remade.pop(v["name"], v) for v in golden["bad"]]
    for vector in bad:  # the AUTH flag without a trailer: the message counts the trailer
        if vector["name"].endswith("_auth_flag_without_tag"):
            vector["message"] = _message_of(vector)
    golden["bad"] = bad + list(remade.values())
    golden["about"] = (
        "DLCP version 1 golden vectors. Integers are plain JSON numbers, bytes are lowercase "
        "hex. data/control vectors decode (with `job` and `key`) to the listed fields and "
        "re-encode to `hex` exactly (an authenticated one with its `nonce`); bad vectors raise "
        "WireError with `reason` and `message`. Authenticated vectors are written by "
        "tests/golden/make_auth_vectors.py."
    )
    PATH.write_text(json.dumps(golden, indent=1) + "\n")


if __name__ == "__main__":
    main()
