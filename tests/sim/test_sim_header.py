"""The ns-3 model's header (``dlcp/sim/cpp/dlcp_wire.h``) against the Python
reference (no ns-3 needed): its packet types are the codec's, its size is the data
header's, a NACK part holds as many ranges as the codec's, and (with a C++
compiler) each per-type constructor sets the fields it names and survives the
memcpy the model sends it with."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from dlcp.proto.wire import DATA_HEADER_LEN, MAX_NACK_RANGES, PacketType

CPP = Path(__file__).resolve().parents[2] / "dlcp" / "sim" / "cpp"
WIRE_H = (CPP / "dlcp_wire.h").read_text()


def test_packet_types_are_the_codecs() -> None:
    enum = re.search(r"enum DlcpType : uint8_t \{([^}]*)\}", WIRE_H)
    assert enum is not None
    types = dict(re.findall(r"D_([A-Z]+) = (\d+)", enum.group(1)))
    assert len(types) >= 5
    for name, value in types.items():
        assert PacketType[name] == int(value), name


def test_header_size_and_nack_part_match_the_codec() -> None:
    assert f"static_assert(sizeof(DlcpHdr) == {DATA_HEADER_LEN}," in WIRE_H
    assert re.search(rf"uint32_t header = {DATA_HEADER_LEN};", WIRE_H)
    transport = (CPP / "dlcp_transport.h").read_text()
    assert re.search(rf"const uint32_t perPart = {MAX_NACK_RANGES};", transport)


def test_header_fields_carry_spec_names_not_letters() -> None:
    struct = WIRE_H[WIRE_H.index("struct DlcpHdr") : WIRE_H.index("static_assert")]
    assert not re.search(r"\buint32_t [^;]*\b[abcd]\b[,;]", struct)
    for field in ("round", "protectedChunks", "neededChunks", "rangeCount", "kBytesPerS"):
        assert re.search(rf"\b{field};", struct), field


ROUND_TRIP = r"""
#include "dlcp_wire.h"
#include <cstdio>
using namespace dlcpsim;
static DlcpHdr sent(const DlcpHdr& h) {  // as the model sends it: by memcpy
    unsigned char buf[sizeof h];
    DlcpHdr out;
    std::memcpy(buf, &h, sizeof h);
    std::memcpy(&out, buf, sizeof out);
    return out;
}
int main() {
    DlcpHdr n = sent(NackHdr(7, 100, 3, 12, 5, true));
    DlcpHdr f = sent(FinishHdr(2, 9, 50, 1, 40));
    DlcpHdr d = sent(DataHdr(3, 1, 4, 8, 50));
    DlcpHdr r = sent(RateHdr(1, 99));
    DlcpHdr s = sent(StopHdr(5));
    std::printf("%d %u %u %u %u %u %u\n", n.type, n.flow, n.totalChunks, n.nack.round,
                n.nack.neededChunks, n.nack.rangeCount, n.nack.more);
    std::printf("%d %u %u %u %u %u\n", f.type, f.cls, f.flow, f.totalChunks, f.finish.round,
                f.finish.protectedChunks);
    std::printf("%d %u %u %u %u %u %u\n", d.type, d.flags, d.cls, d.flow, d.seq, d.totalChunks,
                d.unused[0] | d.unused[1] | d.unused[2] | d.unused[3]);
    std::printf("%d %u %u\n", r.type, r.flow, r.rate.kBytesPerS);
    std::printf("%d %u %u\n", s.type, s.flow, s.unused[0] | s.seq | s.totalChunks);
}
"""


def test_constructors_set_the_named_fields(tmp_path: Path) -> None:
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler here")
    # dlcp_wire.h's only include is the scenario (ns-3): a stand-in with its types
    (tmp_path / "scenario.h").write_text("#pragma once\n#include <cstdint>\n#include <vector>\n")
    (tmp_path / "dlcp_wire.h").write_text(WIRE_H)
    (tmp_path / "main.cc").write_text(ROUND_TRIP)
    exe = tmp_path / "main"
    subprocess.run(
        [cxx, "-std=c++17", "-Wall", "-Wextra", "-pedantic", "-Werror", "-o", exe,
         tmp_path / "main.cc"], check=True, capture_output=True, text=True,
    )  # fmt: skip
    lines = subprocess.run([exe], check=True, capture_output=True, text=True).stdout.split("\n")
    assert lines[:5] == [
        f"{PacketType.NACK} 7 100 3 12 5 1",
        f"{PacketType.FINISH} 2 9 50 1 40",
        f"{PacketType.DATA} 3 1 4 8 50 0",
        f"{PacketType.RATE} 1 99",
        f"{PacketType.STOP} 5 0",
    ]
