"""The native receive path's tag checks: an authenticated session's runs are taken
by the C table only where their AES-GMAC tags verify under the key the message was
registered with. Tampered, forged and untagged datagrams go back to Python and are
rejected as on the Python run path; a run whose AUTH flag differs from the
message's is not taken; a source's replaced key is never used again; bad keys are
named. (The plain and authenticated comparisons of the two paths are in
``test_native_receive.py``.)"""

from __future__ import annotations

import numpy as np
import pytest

from dlcp.io import native_receive
from dlcp.proto.batch import PER_PACKET_FLAGS, SHARED_HEADER_MASK
from dlcp.proto.reassembler import RUN_LAYOUT
from dlcp.proto.wire import DATA_HEADER_LEN
from tests.io.test_native_receive import (
    KEY,
    MSG,
    NOW,
    OTHER_KEY,
    STEP,
    Native,
    Pair,
    assert_same_stats,
    expect_both,
    message,
    needs_tags,
    read_from_socket,
    receiver,
    registered,
)
from tests.proto.session_helpers import JOB

pytestmark = pytest.mark.skipif(
    not native_receive.available(), reason="the native receive path was not built"
)


def tampered(gram: bytes) -> bytes:
    """``gram`` with one payload byte changed: only its tag tells."""
    b = bytearray(gram)
    b[DATA_HEADER_LEN + 7] ^= 0x5A
    return bytes(b)


@needs_tags
def test_tampered_forged_and_untagged_datagrams_go_back_to_python() -> None:
    """In runs of a message under way: a datagram with a changed payload, a run
    that starts with datagrams tagged under another key (an outsider's, with
    other data), and untagged ones. The table takes only what verifies; each
    datagram it declines reaches the general path, rejected by its reason exactly
    as with the run path in Python; the genuine data lands whole."""
    n = 20_000
    grams, _ = message(n, seed=21, key=KEY)
    forged, _ = message(n, seed=22, key=OTHER_KEY)
    untagged, _ = message(n, seed=23)
    seg, plain_seg = len(grams[0]), len(untagged[0])
    assert seg == plain_seg + 24  # (the trailer)
    pair = Pair(n, expect=True, key=KEY)
    pair.feed([(grams[:1], seg)])
    pair.feed([
        ([*grams[1:20], tampered(grams[20]), *grams[21:40]], seg),  # taken up to it
        (forged[40:45] + grams[40:60], seg),  # its head fails: handed back whole
        (untagged[60:62], plain_seg),
        (grams[60:70] + forged[5:6] + grams[70:], seg),
    ])  # fmt: skip
    assert pair.native.native > 0
    assert pair.native.handovers[native_receive.TAKE_REST] >= 2
    stats = pair.native.session._inbox.stats
    assert stats.rejected == {"auth_failed": 1 + 5 + 1, "auth_required": 2}
    pair.feed([([grams[20]], seg)])  # the genuine one: the message completes
    want = np.random.default_rng(21).standard_normal(n).astype(np.float32)
    assert pair.outs[0] is not None and pair.outs[0].tobytes() == want.tobytes()
    assert len(pair.native.runs) == 0


@needs_tags
def test_a_plain_message_takes_no_tagged_run_and_a_tagged_one_no_plain_run() -> None:
    """The AUTH flag must be what the message was registered with: a run that
    differs is handed back whole and nothing is written."""
    n = 5_000
    tagged, _ = message(n, seed=24, key=KEY)
    plain, _ = message(n, seed=24)
    for key, first, other in ((KEY, tagged, plain), (None, plain, tagged)):
        native = Native(key)
        out = np.zeros(n, np.float32)
        native.session.expect_message(0, step=STEP, msg=MSG, out=out)
        native.session.receive_batch(np.frombuffer(first[0], np.uint8), len(first[0]), now=NOW)
        assert len(native.runs) == 1
        before = out.copy()
        raw = np.frombuffer(b"".join(other[1:]), np.uint8).copy()
        native.runs.table.stage(raw, [(0, len(raw), len(other[1]))])
        assert native.runs.table.next(raw)[0] == (
            0, len(raw), len(other[1]), native_receive.TAKE_WHOLE
        )  # fmt: skip
        assert out.tobytes() == before.tobytes()


@needs_tags
def test_a_replaced_source_key_is_never_used_again() -> None:
    """Registering a message of a source with another key replaces that source's
    key in the table for all its messages: datagrams tagged under the old key
    are handed back whole (nothing written), those under the new one are taken."""
    n = 20_000
    grams, _ = message(n, seed=25, key=KEY)
    renewed, _ = message(n, seed=25, key=OTHER_KEY)  # the same data, the new key
    seg = len(grams[0])
    native = Native(KEY)
    out = np.zeros(n, np.float32)
    native.session.expect_message(0, step=STEP, msg=MSG, out=out)
    native.feed([(grams[:1], seg), (grams[1:10], seg)])
    assert native.native == 10  # (registered when its receive was posted: the first too)
    r = native.session._inbox._incoming[(0, STEP, MSG)].reassembler
    native.runs.register((0, STEP, MSG), r, OTHER_KEY)
    received = r.received.copy()
    raw = np.frombuffer(b"".join(grams[10:20]), np.uint8).copy()
    native.runs.table.stage(raw, [(0, len(raw), seg)])
    assert native.runs.table.next(raw) == ((0, len(raw), seg, native_receive.TAKE_WHOLE), None)
    assert np.array_equal(r.received, received)
    raw = np.frombuffer(b"".join(renewed[10:20]), np.uint8).copy()
    native.runs.table.stage(raw, [(0, len(raw), seg)])
    handover, taken = native.runs.table.next(raw)
    assert handover is None and taken is not None and taken[0][3] == 10
    assert r.received[10:20].all() and not r.received[20:].any()


@needs_tags
def test_tagged_datagrams_read_from_the_socket_with_forgeries_among_them() -> None:
    """The whole loop, authenticated: datagrams read from a loopback socket, the
    pre-filter requiring tags, wrong-key forgeries after the message is under
    way; the table verifies and takes the genuine ones, and the session ends as
    one fed the same datagrams through the Python run path: the forgeries
    rejected auth_failed, the data exact."""
    n = 50_000
    grams, _ = message(n, seed=26, key=KEY)
    forged, _ = message(n, seed=27, key=OTHER_KEY)
    junk = [b"\x00" * 100]  # (dropped by the pre-filter: the runs either side stay apart)
    # the forgeries after a verified prefix of their run (handed back, the rest of
    # their run with them), then a run of genuine ones
    arriving = grams[:40] + junk + grams[40:60] + forged[60:65] + junk + grams[60:]
    python = receiver(KEY)
    native = Native(KEY)
    outs = expect_both(native, python, n)
    screened = read_from_socket(native, arriving, require_auth=True, tag_len=24)
    for g in arriving:
        if g not in junk:
            python.receive_batch(np.frombuffer(g, np.uint8), len(g), now=NOW)
    want = np.random.default_rng(26).standard_normal(n).astype(np.float32)
    assert outs[0].tobytes() == outs[1].tobytes() == want.tobytes()
    f = assert_same_stats(native, python, len(grams))
    assert f["rejected"] == {"auth_failed": 5}
    assert screened == {"bad_version": 2}


@needs_tags
def test_bad_tag_keys_are_named() -> None:
    runs, _, out = registered()
    table = runs.table
    received = np.zeros(4, np.bool_)
    classes = np.zeros(4, np.uint8)
    with pytest.raises(ValueError, match=r"tag_key of src 3 must be 16, 24 or 32 bytes .* got 5"):
        table.register(3, 1, 2, out, received, classes, 250, 1000, 4, 0, False, False, 0, 0,
                       1000, 0, b"short")  # fmt: skip
    made = (JOB, 0x12, PER_PACKET_FLAGS, native_receive._head_layout(), SHARED_HEADER_MASK,
            RUN_LAYOUT)  # fmt: skip
    plain = native_receive._udpio.MessageTable(*made)  # (no auth_flag)
    with pytest.raises(ValueError, match="has no auth_flag"):
        plain.register(0, 1, 2, out, received, classes, 250, 1000, 4, 0, False, False, 0, 0,
                       1000, 0, KEY)  # fmt: skip
    with pytest.raises(ValueError, match="auth_flag 3 is not one flag bit outside"):
        native_receive._udpio.MessageTable(*made, 3)
