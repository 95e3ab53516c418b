"""Seed corpora for the libFuzzer targets of tests/fuzz/, from the golden vectors.

    python tests/fuzz/make_corpus.py OUT_DIR

writes OUT_DIR/<target>/<name> for each target, in the input layout its harness
describes at the top of its source:

* ``scatter_run``: every data vector of ``tests/golden/wire_vectors.json`` as a
  one-record run; where the message is small, every chunk of it (the vector's
  header with seq, offset, payload length and LAST set per chunk) as one run, in
  order, reversed, and with a duplicate; the ``bad`` vectors as one-record runs.
* ``swap_records``: the same runs as batches of headers, with the wire header's
  swapped fields and the shared-header mask the receive path uses.
* ``engine_round``: the rounds the native send engine is posted for those
  messages (breaks at each quarter), with narrow and wide numbers;
* ``recv_runs``: the vectors' lengths as plain datagrams, GRO reads of a run of
  them, short last datagrams, empty datagrams and receive errors.
* ``take_runs``: each small message registered (a second message beside it,
  removed after the first handover), its chunks as the datagrams of the pool, read
  one by one, as one GRO read, reversed, with a duplicate and a stray datagram;
  once untagged and once tagged (AUTH and a trailer the harness's stand-in tag
  check accepts).
* ``control_frames``: the control vectors as a stream of frames, for the job and
  source of each RATE, STOP and FINISH among them, with STOPs taken (up to 32 or
  2) and not, and every FINISH, some or none taken: each vector alone, all of them
  in order, and each repeated behind itself, whole and cut short.

The golden vectors and the layouts come from the repository (``dlcp.proto``),
so the seeds follow any change of the wire format.
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys
from pathlib import Path

from dlcp.proto.auth import AUTH_TRAILER_LEN
from dlcp.proto.batch import SHARED_HEADER_MASK
from dlcp.proto.kernels import _swapped
from dlcp.proto.reassembler import _RUN_LAYOUT
from dlcp.proto.wire import DATA_HEADER_LEN, HEADER_DTYPE, NATIVE_HEADER_DTYPE, DType, Flags

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "wire_vectors.json"
MAX_CHUNKS = 64  # messages with more chunks are seeded with their vector's record only


def _geometry(values: list[int], wide: bool) -> bytes:
    return b"".join(struct.pack(">q" if wide else ">H", v) for v in values)


def _fits_narrow(values: list[int]) -> bool:
    return all(0 <= v < 2**16 for v in values)


def _message_chunks(vector: dict) -> tuple[list[bytes], int, int, int] | None:
    """Every datagram of the vector's message (its header, per-chunk fields set),
    with (chunk_elems, msg_elems, itemsize); None if the message is too large."""
    h = vector["header"]
    itemsize = DType[h["dtype"]].itemsize
    msg_elems, seq = h["msg_elems"], h["seq"]
    chunk_elems = h["offset"] // seq if seq else h["payload_len"] // itemsize
    if chunk_elems <= 0:
        return None
    n_chunks = -(-msg_elems // chunk_elems)
    if n_chunks > MAX_CHUNKS:
        return None
    f_flags, f_seq, f_off, f_len, _, last_bit = _RUN_LAYOUT[:6]
    header = bytearray(bytes.fromhex(vector["hex"])[:DATA_HEADER_LEN])
    records = []
    for s in range(n_chunks):
        start = s * chunk_elems
        payload_len = (min(start + chunk_elems, msg_elems) - start) * itemsize
        header[f_seq : f_seq + 4] = struct.pack(">I", s)
        header[f_off : f_off + 4] = struct.pack(">I", start)
        header[f_len : f_len + 2] = struct.pack(">H", payload_len)
        header[f_flags] = (header[f_flags] & ~last_bit) | (last_bit if s == n_chunks - 1 else 0)
        payload = bytes((s * 37 + k) & 0xFF for k in range(payload_len))
        records.append(bytes(header) + payload)
    return records, chunk_elems, msg_elems, itemsize


def _run(records: list[bytes]) -> tuple[bytes, int]:
    """Records back to back, each padded to the longest (the last one may be
    shorter, as in a GRO read): (bytes, stride)."""
    stride = max(len(r) for r in records)
    body = b"".join(r.ljust(stride, b"\0") for r in records[:-1]) + records[-1]
    return body, stride


def scatter_seed(records: list[bytes], chunk_elems: int, msg_elems: int, itemsize: int,
                 *, adds: bool = False) -> bytes:  # fmt: skip
    """scatter_run's input; ``adds``: the payloads added to out as float32 values."""
    body, stride = _run(records)
    n_chunks = -(-msg_elems // chunk_elems)
    geometry = [stride, chunk_elems, msg_elems, itemsize, len(records), len(body), 0, 0]
    wide = not _fits_narrow(geometry)
    # the template is the first record's header
    mode = 0x01 | (0x04 if wide else 0) | (0x20 if adds else 0)
    if wide:  # sizes as given: out and maps of one chunk's worth, the rest refused
        mode |= 0x08
        geometry[6:] = [min(msg_elems * itemsize, 2**16 - 1), min(n_chunks, 2**16 - 1)]
    head = bytes([mode, DATA_HEADER_LEN]) + _RUN_LAYOUT
    return (
        head
        + _geometry(geometry[:6], wide)
        + _geometry(geometry[6:], False)
        + bytes(8)
        + (SHARED_HEADER_MASK + body)
    )


def swap_seed(records: list[bytes]) -> bytes:
    body, stride = _run(records)
    fields = _swapped(HEADER_DTYPE)
    native = NATIVE_HEADER_DTYPE.itemsize
    geometry = [len(records), HEADER_DTYPE.itemsize, native, stride]
    mode = 0x02  # with the mask, buffers sized to the records
    return (
        bytes([mode, len(fields)])
        + fields
        + _geometry(geometry, False)
        + struct.pack(">HB", 0, len(SHARED_HEADER_MASK))
        + SHARED_HEADER_MASK
        + body
    )


def engine_seed(records: list[bytes], *, wide: bool, limit: int) -> bytes:
    """The round the native engine would be posted for these records: count,
    stride, the short last record, a break after each quarter and at the end."""
    stride, count = max(len(r) for r in records), len(records)
    short = count - 1 if len(records[-1]) < stride else -1
    breaks = sorted({max(1, count * k // 4) for k in (1, 2, 3)} | {count})
    geometry = [count, stride, 1, short if wide else short + 1, len(records[-1]), limit, 0]
    body = bytes([0x01 * wide | 0x02 * wide]) + _geometry(geometry, wide)
    return body + bytes([len(breaks)]) + _geometry(breaks, wide)


# recv_runs event kinds (see fuzz_recv_runs.c)
PLAIN, GRO, ERROR, BAD_CONTROL, EMPTY = range(5)


def _event(kind: int, length: int, value: int = 0, repeat: int = 1) -> bytes:
    return (
        bytes([kind | (repeat - 1) << 3])
        + struct.pack(">H", length)
        + (value & 0xFFFFFF).to_bytes(3, "big")
    )


def recv_seed(lengths: list[int], gro_at: int) -> bytes:
    read_size, buf_len, budget, max_reads = 65536, 1 << 18, 1 << 22, 1024
    head = struct.pack(">H", read_size - 1) + buf_len.to_bytes(3, "big")
    head += budget.to_bytes(3, "big") + struct.pack(">H", max_reads)
    events = b"".join(_event(PLAIN, n, repeat=3) for n in lengths)
    seg = lengths[gro_at % len(lengths)]
    events += _event(GRO, seg * 5, seg) + _event(GRO, seg * 4 + 1, seg)  # a short last one
    events += _event(EMPTY, 0) + _event(BAD_CONTROL, seg * 2, seg) + _event(ERROR, 0, 0)
    events += _event(PLAIN, lengths[0], repeat=32) + _event(ERROR, 0, 2)
    return head + events


def _registered(h: dict, chunk_elems: int, msg_elems: int, itemsize: int, *, held: int,
                removed_after: int, tagged: bool = False, adds: bool = False) -> bytes:  # fmt: skip
    """A registered message of take_runs' input (fuzz_take_runs.c): the vector's
    key and geometry, chunks ``held`` (a bit map) already in; ``tagged``: its
    datagrams carry a trailer, checked by the harness's stand-in tag check;
    ``adds``: its payloads are added to the buffer (float32 messages)."""
    dtype_byte = int(DType[h["dtype"]]) << 4
    flags = (2 if tagged else 0) | (4 if adds else 0)
    return (
        struct.pack(">HIHH", h["src"], h["step"], h["msg"], chunk_elems)
        + msg_elems.to_bytes(3, "big")
        + bytes([itemsize.bit_length() - 1, dtype_byte, flags])
        + struct.pack(">Q", held)
        + msg_elems.to_bytes(3, "big")
        + struct.pack(">HB", 0, removed_after)
    )


def stand_in_tagged(record: bytes) -> bytes:
    """``record`` with the AUTH flag and a trailer that fuzz_take_runs.c's stand-in
    tag check accepts (its last byte the record's length modulo 256)."""
    body = record[:-AUTH_TRAILER_LEN] if record[1] & Flags.AUTH else record
    body = bytes([body[0], body[1] | Flags.AUTH]) + body[2:]
    length = len(body) + AUTH_TRAILER_LEN
    return body + bytes(AUTH_TRAILER_LEN - 1) + bytes([length & 0xFF])


def take_seed(h: dict, records: list[bytes], chunk_elems: int, msg_elems: int, itemsize: int,
              stray: bytes, *, tagged: bool = False, adds: bool = False) -> bytes:  # fmt: skip
    """take_runs' input: the message registered with a neighbour (another msg,
    removed after the first handover), its records (and a stray one) in the pool,
    read one by one, reversed, with a duplicate, and as one GRO read; ``tagged``:
    the message registered as tagged, its records with stand-in trailers;
    ``adds``: registered to add its payloads to the buffer."""
    if tagged:
        records = [stand_in_tagged(r) for r in records]
    read_size, buf_len, budget, max_reads = 65536, 1 << 18, 1 << 22, 1024
    head = struct.pack(">H", read_size - 1) + buf_len.to_bytes(3, "big")
    head += budget.to_bytes(3, "big") + struct.pack(">HH", max_reads, h["job"])
    other = dict(h, msg=(h["msg"] + 1) & 0xFFFF)
    head += bytes([2]) + _registered(h, chunk_elems, msg_elems, itemsize, held=0b10,
                                     removed_after=255, tagged=tagged, adds=adds)  # fmt: skip
    head += _registered(other, chunk_elems, msg_elems, itemsize, held=0, removed_after=1)
    pool = [*records[:15], stray]
    head += bytes([len(pool)]) + b"".join(struct.pack(">H", len(r)) + r for r in pool)
    n = len(pool) - 1
    order = [*range(n), *reversed(range(n)), 0, n, 0]
    events = b"".join(_event(PLAIN, len(pool[i]), 0) + bytes([i]) for i in order)
    stride = len(records[0])
    total = sum(len(r) for r in records[:n])
    events += _event(GRO, total, stride) + bytes([0])
    return head + events


def control_frames_seeds(control: list[dict]) -> list[bytes]:
    """control_frames' inputs (fuzz_control_frames.c): job, source, frame limit,
    STOP limit (top bit: STOPs off), which FINISHes are taken, then a stream of
    length-prefixed control datagrams."""
    frames = [struct.pack(">I", len(d)) + d for d in (bytes.fromhex(v["hex"]) for v in control)]
    seeds = []
    for vector in control:
        if vector["type"] not in ("RATE", "STOP", "FINISH"):
            continue
        datagram = bytes.fromhex(vector["hex"])
        frame = struct.pack(">I", len(datagram)) + datagram
        for stops, finishes in ((32, 1), (2, 2), (0x80, 0), (32, 3)):
            head = struct.pack(">HHBBB", vector["job"], vector["fields"]["src"], 32, stops,
                               finishes)  # fmt: skip
            seeds += [head + b"".join(frames), head + frame * 5, head + frame * 3 + frame[:17]]
            seeds += [head + f for f in frames]
        # the job authenticates (the finishes byte's top bit): the same frames tagged
        # with the target's stand-in tag, one of them with a tag it refuses
        src = vector["fields"]["src"]
        tagged = _stand_in_tagged(datagram, src)
        bad = tagged[:-1] + bytes([tagged[-1] ^ 1])
        head = struct.pack(">HHBBB", vector["job"], src, 32, 32, 0x80 | 1)
        seeds += [head + _framed(tagged) * 3, head + _framed(tagged) + _framed(bad),
                  head + _framed(datagram) + _framed(tagged)]  # fmt: skip
    return seeds


def _stand_in_tagged(datagram: bytes, src: int) -> bytes:
    """``datagram`` with the AUTH flag and a trailer (a nonce, and the tag that
    fuzz_control_frames.c's stand-in check accepts: 16 bytes of the tagged
    datagram's length, low byte, xor the source's)."""
    length = len(datagram) + 24
    head = datagram[:1] + bytes([datagram[1] | 0x04]) + datagram[2:]
    return head + struct.pack(">Q", 1) + bytes([(length ^ src) & 0xFF]) * 16


def _framed(datagram: bytes) -> bytes:
    return struct.pack(">I", len(datagram)) + datagram


def write(out: Path, target: str, seed: bytes, counts: dict[str, int]) -> None:
    folder = out / target
    folder.mkdir(parents=True, exist_ok=True)
    (folder / hashlib.sha1(seed).hexdigest()).write_bytes(seed)
    counts[target] = counts.get(target, 0) + 1


def main(out: Path) -> dict[str, int]:
    golden = json.loads(GOLDEN.read_text())
    counts: dict[str, int] = {}
    lengths = []
    for vector in golden["data"]:
        record = bytes.fromhex(vector["hex"])
        lengths.append(len(record))
        h = vector["header"]
        itemsize = DType[h["dtype"]].itemsize
        chunk = max(1, h["offset"] // h["seq"] if h["seq"] else h["payload_len"] // itemsize)
        write(out, "scatter_run", scatter_seed([record], chunk, h["msg_elems"], itemsize), counts)
        write(out, "swap_records", swap_seed([record]), counts)
        message = _message_chunks(vector)
        if message is None:
            continue
        records, chunk_elems, msg_elems, itemsize = message
        for run in (records, records[::-1], records + records[:1]):
            write(out, "scatter_run", scatter_seed(run, chunk_elems, msg_elems, itemsize), counts)
            write(out, "swap_records", swap_seed(run), counts)
        if itemsize == 4:
            seed = scatter_seed(records + records[:1], chunk_elems, msg_elems, itemsize, adds=True)
            write(out, "scatter_run", seed, counts)
        for wide, limit in ((False, 3), (True, 64)):
            write(out, "engine_round", engine_seed(records, wide=wide, limit=limit), counts)
        stray = bytes.fromhex(golden["data"][-1]["hex"])
        for tagged, adds in ((False, False), (True, False), (False, itemsize == 4)):
            seed = take_seed(vector["header"], records, chunk_elems, msg_elems, itemsize, stray,
                             tagged=tagged, adds=adds)  # fmt: skip
            write(out, "take_runs", seed, counts)
    for vector in golden["bad"]:
        record = bytes.fromhex(vector["hex"])
        if vector["kind"] == "data" and record:
            write(out, "scatter_run", scatter_seed([record], 4, 16, 4), counts)
            write(out, "swap_records", swap_seed([record.ljust(DATA_HEADER_LEN, b"\0")]), counts)
    lengths += [len(bytes.fromhex(v["hex"])) for v in golden["control"]]
    for i in range(len(golden["data"])):
        write(out, "recv_runs", recv_seed(lengths[i:] + lengths[:i], i), counts)
    for seed in control_frames_seeds(golden["control"]):
        write(out, "control_frames", seed, counts)
    return counts


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: make_corpus.py OUT_DIR")
    made = main(Path(sys.argv[1]))
    print("seeds:", ", ".join(f"{target} {n}" for target, n in sorted(made.items())))
