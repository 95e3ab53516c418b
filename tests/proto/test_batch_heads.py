"""The receive fast paths' view of a batch's first header (``batch.run_head``,
``batch.open_head``) against ``parse_batch``: what the fast view takes, the
general path takes too, with the same fields, for every bit of the header."""

import numpy as np
import pytest

from dlcp.proto.batch import PER_PACKET_FLAGS, open_head, parse_batch, run_head
from dlcp.proto.wire import DATA_HEADER_LEN, DType
from tests.proto.session_helpers import JOB
from tests.proto.test_receive_run import MSG, STEP, message_datagrams


def _buf(datagram: bytes) -> np.ndarray:
    return np.frombuffer(datagram, dtype=np.uint8)


def test_a_clean_first_datagram_reads_as_parse_batch_reads_it() -> None:
    grams = message_datagrams(200, seed=1)  # four chunks, the last one short
    for g in grams:
        head = open_head(_buf(g), len(grams[0]), JOB)
        assert head is not None
        h = parse_batch(_buf(g), len(g), job=JOB).headers[0]
        assert head.key == (int(h["src"]), STEP, MSG)
        assert (head.seq, head.offset, head.msg_elems) == (h["seq"], h["offset"], 200)
        assert (head.payload_len, head.tclass, head.bound) == (
            h["payload_len"], h["tclass"], h["bound"],
        )
        assert head.dtype is DType.FLOAT32 and head.flags == h["flags"]
        run = run_head(_buf(g), JOB)
        assert run is not None and run.key == head.key and run.msg_elems == 200
        assert run.dtype_byte == head.code


@pytest.mark.parametrize("byte", range(DATA_HEADER_LEN))
def test_what_the_fast_view_takes_parse_batch_takes(byte: int) -> None:
    grams = message_datagrams(200, seed=byte)
    seg = len(grams[0])
    for i in (0, 1, 3):
        for bit in range(8):
            g = bytearray(grams[i])
            g[byte] ^= 1 << bit
            buf = _buf(bytes(g))
            head = open_head(buf, seg, JOB)
            if head is None:
                continue
            parsed = parse_batch(buf, len(buf), job=JOB)
            assert parsed.ok[0], (byte, bit, parsed.message(0))
            assert head.key == tuple(int(parsed.headers[0][f]) for f in ("src", "step", "msg"))


def test_foreign_short_and_flagged_datagrams_are_left_to_the_general_path() -> None:
    g = message_datagrams(200, seed=2)[0]
    seg = len(g)
    assert open_head(_buf(g), seg, JOB + 1) is None  # another job
    assert run_head(_buf(g), JOB + 1) is None
    assert open_head(_buf(g[: DATA_HEADER_LEN - 1]), seg, JOB) is None  # no whole header
    assert run_head(_buf(g[: DATA_HEADER_LEN - 1]), JOB) is None
    assert open_head(_buf(g[:-4]), seg, JOB) is None  # shorter than its payload says
    tagged = bytearray(g)
    tagged[1] |= 0x04  # AUTH: a tag to check, the general path's work
    assert open_head(_buf(bytes(tagged)), seg, JOB) is None
    run = run_head(_buf(bytes(tagged)), JOB)
    assert run is not None and run.flags & ~PER_PACKET_FLAGS  # (the caller refuses it)
