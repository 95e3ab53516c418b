"""Timeline of DLCP endpoints' control traffic and rounds (a profiling aid): put
this folder first on PYTHONPATH and set TL_PROBE=1; each process writes
/tmp/tl_<pid>.log at exit (time.monotonic, event). Used with
``python -m dlcp.bench.transport --lossless-repetitions 1 --repetitions 4``."""

import os
import time

if os.environ.get("TL_PROBE"):
    import atexit

    from dlcp.io import io_loop
    from dlcp.proto import session
    from dlcp.proto.control import decode_control
    from dlcp.proto.wire import PacketType

    log: list[str] = []
    clock = time.monotonic

    def _write() -> None:
        with open(f"/tmp/tl_{os.getpid()}.log", "w") as f:
            f.write("\n".join(log))

    atexit.register(_write)

    def _probe(cls, name, describe):
        orig = getattr(cls, name)

        def probed(self, *a, **k):
            log.append(f"{clock():.6f} {describe(self, *a, **k)}")
            return orig(self, *a, **k)

        setattr(cls, name, probed)

    def _incoming(sess, data, **_):
        kind = PacketType(data[0] & 0x0F).name
        if kind != "NACK":
            return f"in {kind} len {len(data)}"
        m = decode_control(bytes(data), job=sess.job)
        chunks = sum(c for _, c in m.ranges)
        return f"in NACK round {m.round} ranges {len(m.ranges)} chunks {chunks} more {m.more}"

    _probe(io_loop.IOLoop, "_send_control",
           lambda _, item: f"out {PacketType(item.data[0] & 0x0F).name} to {item.dst}")  # fmt: skip
    _probe(io_loop.IOLoop, "_post_round", lambda *_: "post_round")
    _probe(session.Session, "receive_datagram", _incoming)
    _probe(session.Session, "round_sent", lambda *_, **__: "round_sent")
    _probe(session.Session, "send_message", lambda *_, **__: "send_message")
    _probe(session.Session, "expect_message", lambda *_, **__: "expect_message")
