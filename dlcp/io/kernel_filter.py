"""The data socket's kernel filter: a classic BPF program (``SO_ATTACH_FILTER``)
that drops a datagram breaking a header rule of spec §6.1 before the kernel
queues it, so junk costs the receiving thread nothing (no read, no pre-filter).

What the kernel runs the program on, measured on Linux 6.18 and checked by
``tests/io/test_kernel_filter.py``: the datagram from its **UDP header** on
(so DLCP's header starts at offset 8), and the length (``BPF_LEN``) counts the
8-byte UDP header too. A filter needs no privilege and no loader; the kernel
copies the program at attach time.

The program checks the rules 1-8 of §6.1 (every rule but the tag's, row 9), for
one job, exactly as the user-space pre-filter (``_prefilter.h``) does, with one
exception: on a socket with UDP GRO the kernel runs the filter once on a whole
GRO super-packet (or a GSO train sent on loopback), and the program sees only
its first datagram's header. There it checks that the first datagram is whole
(the length is at least the one its header claims) instead of equal to it; the
pre-filter, which still checks every datagram of a run, catches the rest. A
super-packet whose first datagram breaks a rule is dropped whole.

A datagram the filter drops counts in the socket's drop counter (``sk_drops``:
``SO_MEMINFO``, the ``drops`` column of ``/proc/net/udp``, and ``UdpInErrors``),
together with those dropped because the receive buffer was full: the kernel
keeps one counter for both.
"""

from __future__ import annotations

import ctypes
import socket
import struct
from dataclasses import dataclass

from ..errors import ConfigError
from ..proto.wire import DATA_HEADER_LEN, VERSION, DType, Flags, PacketType

__all__ = ["Instruction", "attach", "data_filter", "drop_count"]

# Linux socket options (asm-generic/socket.h); Python 3.11 does not name them
SO_ATTACH_FILTER = 26
SO_MEMINFO = 55
#: SO_MEMINFO's u32 fields; the last of them (SK_MEMINFO_DROPS) is sk_drops
_MEMINFO_FIELDS = 9

#: bytes before the DLCP header in what a UDP socket filter sees
UDP_HEADER_LEN = 8
_VER_TYPE_DATA = VERSION << 4 | PacketType.DATA
_FLAGS_RESERVED = 0xF8
#: bits of the dtype byte that must be clear: the low nibble and the type code's
#: high two bits (codes 0-3)
_DTYPE_RESERVED = 0xCF
assert max(DType) == 3
#: log2 of each type code's element size, a nibble each: code c's is
#: (table >> 4c) & 0xF (0x0112: uint8 1 byte, bfloat16 and float16 2, float32 4)
_LOG2_SIZE_BY_CODE = sum((t.itemsize.bit_length() - 1) << 4 * t for t in DType)

# classic BPF opcodes (linux/filter.h, linux/bpf_common.h)
_LD, _LDX, _ST, _ALU, _JMP, _RET, _MISC = 0x00, 0x01, 0x02, 0x04, 0x05, 0x06, 0x07
_W, _H, _B = 0x00, 0x08, 0x10
_IMM, _ABS, _MEM, _LEN = 0x00, 0x20, 0x60, 0x80
_ADD, _SUB, _MUL, _AND, _LSH, _RSH = 0x00, 0x10, 0x20, 0x50, 0x60, 0x70
_K, _X = 0x00, 0x08
_JEQ, _JGT, _JGE, _JSET = 0x10, 0x20, 0x30, 0x40
_TAX = 0x00

_ACCEPT_ALL = 0xFFFFFFFF  # the return value that keeps the whole datagram
_DROP, _ACCEPT = "drop", "accept"


@dataclass(frozen=True, slots=True)
class Instruction:
    """One ``struct sock_filter``: ``jt``/``jf`` are resolved offsets."""

    code: int
    jt: int
    jf: int
    k: int
    #: what the instruction does, and which rule of §6.1 it checks
    comment: str

    def pack(self) -> bytes:
        return struct.pack("=HBBI", self.code, self.jt, self.jf, self.k)


class _Assembler:
    """Instructions whose jumps go to the next one or to the program's two
    returns (``accept``, ``drop``), resolved at the end."""

    def __init__(self) -> None:
        self._steps: list[tuple[int, int, str | None, str | None, str]] = []

    def op(self, code: int, k: int, comment: str) -> None:
        self._steps.append((code, int(k), None, None, comment))

    def test(
        self, code: int, k: int, comment: str, *, jt: str | None = None, jf: str | None = None
    ) -> None:
        self._steps.append((_JMP | code, int(k), jt, jf, comment))

    def program(self) -> list[Instruction]:
        end = len(self._steps)
        target = {_ACCEPT: end, _DROP: end + 1}
        out = []
        for i, (code, k, jt, jf, comment) in enumerate(self._steps):
            jump_t = 0 if jt is None else target[jt] - i - 1
            jump_f = 0 if jf is None else target[jf] - i - 1
            out.append(Instruction(code, jump_t, jump_f, k, comment))
        out.append(Instruction(_RET | _K, 0, 0, _ACCEPT_ALL, "accept: queue the whole datagram"))
        out.append(Instruction(_RET | _K, 0, 0, 0, "drop: never queued"))
        return out


def data_filter(job: int, *, require_auth: bool, tag_len: int, gro: bool) -> list[Instruction]:
    """The filter of a data socket serving ``job``: drops what breaks rules 1-8
    of spec §6.1 (``require_auth``: untagged datagrams too; ``tag_len``: the
    bytes a tag adds; ``gro``: the socket receives GRO super-packets, whose
    first datagram only is checked, and that it is whole, not its exact length)."""
    if not 0 <= job <= 0xFFFF:
        raise ConfigError(f"job={job} outside 0..65535")
    h = UDP_HEADER_LEN
    a = _Assembler()
    a.op(_LD | _W | _LEN, 0, "A = length: UDP header + datagram")
    a.test(_JGE | _K, h + DATA_HEADER_LEN, "rule 1: a whole data header (TRUNCATED)", jf=_DROP)
    a.op(_LD | _B | _ABS, h + 0, "A = ver_type")
    a.test(_JEQ | _K, _VER_TYPE_DATA, "rules 2-3: version 1, type DATA", jf=_DROP)
    a.op(_LD | _H | _ABS, h + 2, "A = job")
    a.test(_JEQ | _K, job, "rule 4: this endpoint's job (WRONG_JOB)", jf=_DROP)
    a.op(_LD | _B | _ABS, h + 1, "A = flags")
    a.test(_JSET | _K, _FLAGS_RESERVED, "rule 5a: reserved flag bits clear", jt=_DROP)
    if require_auth:
        a.test(_JSET | _K, Flags.AUTH, "rule 8: AUTH set (AUTH_REQUIRED)", jf=_DROP)
    a.op(_LD | _B | _ABS, h + 29, "A = dtype")
    a.test(_JSET | _K, _DTYPE_RESERVED, "rules 5b-5c: low nibble clear, code 0-3", jt=_DROP)
    a.op(_ALU | _RSH | _K, 2, "A = 4 * type code")
    a.op(_MISC | _TAX, 0, "X = 4 * type code")
    a.op(_LD | _IMM, _LOG2_SIZE_BY_CODE, "A = the table of log2 element sizes")
    a.op(_ALU | _RSH | _X, 0, "A = the table from the type code's nibble on")
    a.op(_ALU | _AND | _K, 0xF, "A = log2 size (size: the element size)")
    a.op(_MISC | _TAX, 0, "X = log2 size")
    a.op(_LD | _H | _ABS, h + 24, "A = payload_len")
    a.op(_ALU | _RSH | _X, 0, "A = n = payload_len / size, the chunk's elements")
    a.test(_JEQ | _K, 0, "rule 7: n >= 1 (payload_len >= size)", jt=_DROP)
    a.op(_ST, 0, "M[0] = n")
    a.op(_ALU | _LSH | _X, 0, "A = n * size")
    a.op(_MISC | _TAX, 0, "X = n * size")
    a.op(_LD | _H | _ABS, h + 24, "A = payload_len")
    a.test(_JEQ | _X, 0, "rule 6a: payload_len a multiple of size", jf=_DROP)
    a.op(_ALU | _ADD | _K, h + DATA_HEADER_LEN, "A = UDP header + DLCP header + payload")
    a.op(_ST, 1, "M[1] = that")
    a.op(_LD | _B | _ABS, h + 1, "A = flags")
    a.op(_ALU | _AND | _K, Flags.AUTH, "A = AUTH bit")
    a.op(_ALU | _RSH | _K, 2, "A = 1 if AUTH is set, else 0")
    a.op(_ALU | _MUL | _K, tag_len, "A = the tag's bytes (tag_len if AUTH, else 0)")
    a.op(_LDX | _W | _MEM, 1, "X = M[1]")
    a.op(_ALU | _ADD | _X, 0, "A = length the header claims: 8 + 32 + payload_len + tag")
    a.op(_MISC | _TAX, 0, "X = length the header claims")
    a.op(_LD | _W | _LEN, 0, "A = length received")
    if gro:
        a.test(_JGE | _X, 0, "rule 6b, GRO: the first datagram whole", jf=_DROP)
    else:
        a.test(_JEQ | _X, 0, "rule 6b: len = 32 + payload_len + tag", jf=_DROP)
    a.op(_LD | _W | _ABS, h + 20, "A = msg_elems")
    a.op(_LDX | _W | _MEM, 0, "X = n")
    a.test(_JGE | _X, 0, "rule 7: n <= msg_elems (so msg_elems >= 1)", jf=_DROP)
    a.op(_ALU | _SUB | _X, 0, "A = msg_elems - n")
    a.op(_MISC | _TAX, 0, "X = msg_elems - n")
    a.op(_LD | _W | _ABS, h + 16, "A = offset")
    a.test(_JGT | _X, 0, "rule 7: offset + n <= msg_elems (OUT_OF_BOUNDS)", jt=_DROP)
    return a.program()


def attach(sock: socket.socket, program: list[Instruction], *, setting: str) -> None:
    """Attach ``program`` to ``sock`` (replacing any filter it had). Fails with
    a ConfigError naming the socket option, the kernel's reason and ``setting``,
    the configuration that turns the filter off."""
    code = ctypes.create_string_buffer(b"".join(i.pack() for i in program))
    fprog = struct.pack("@HP", len(program), ctypes.addressof(code))  # struct sock_fprog
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
    except OSError as exc:
        raise ConfigError(
            f"cannot attach the data socket's kernel filter (SO_ATTACH_FILTER, "
            f"{len(program)} instructions): {exc.strerror or exc}; {setting} turns it off"
        ) from exc


def drop_count(sock: socket.socket) -> int:
    """The socket's drop counter (``sk_drops``, a u32 that wraps): datagrams the
    filter dropped and datagrams dropped for a full receive buffer."""
    info = sock.getsockopt(socket.SOL_SOCKET, SO_MEMINFO, 4 * _MEMINFO_FIELDS)
    return int(struct.unpack(f"={_MEMINFO_FIELDS}I", info)[_MEMINFO_FIELDS - 1])
