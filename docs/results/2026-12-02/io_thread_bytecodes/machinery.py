"""The I/O thread's bytecodes a ring call in the turn's fixed machinery, from a
bytecodes.py listing (the functions below, by their file and name):

    python machinery.py bytecodes.txt
"""

import sys

#: the turn's loop, its deadlines and timers, idle metering, select, the lock,
#: the flush and the dispatch of events
MACHINERY = (
    "io_loop.py:_run", "io_loop.py:_next_time", "session.py:get_timer",
    "outbox.py:next_timer", "inbox.py:next_timer", "orphans.py:next_deadline",
    "engine.py:quiet_due", "engine.py:quiet", "session.py:note_idle", "rate_meter.py:on_idle",
    "rate_meter.py:sample", "rate_meter.py:due", "io_loop.py:_take_input",
    "io_loop.py:_backlogged", "io_loop.py:_holds_back", "readiness.py:select",
    "readiness.py:<listcomp>", "io_loop.py:_send_and_settle", "io_loop.py:_flush",
    "session.py:datagrams_to_send", "outbox.py:batches", "session.py:next_event",
    "transfers.py:dispatch", "control_input.py:_stops_taken", "control_in_waits.py:stops",
    "native_receive.py:stops", "threading.py:__enter__", "threading.py:__exit__",
    "inbox.py:handle_timer", "outbox.py:handle_timer", "session.py:handle_timer",
)  # fmt: skip
#: the receive call's Python wrappers
RECEIVE = ("io_loop.py:_receive_data", "udp.py:receive", "udp.py:_receive_c")

counts: dict[str, int] = {}
thread = None
with open(sys.argv[1]) as listing:
    for line in listing:
        if line.startswith("== "):
            thread = line[3:].strip()
            continue
        if thread == "dlcp-io" and line.strip():
            n, name = line.split(None, 1)
            counts[name.strip()] = int(n)
machinery = sum(n for k, n in counts.items() if k.endswith(MACHINERY))
receive = sum(n for k, n in counts.items() if k.endswith(RECEIVE))
total = sum(counts.values())
print(f"of {total}: machinery {machinery}, with the receive wrappers {machinery + receive}")
