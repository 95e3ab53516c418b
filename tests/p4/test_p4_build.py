"""The P4 program's committed artefacts: up to date with the sources (when the
compiler is here) and faithful to the control-plane contract in docs/switch.md
(always: the controller relies on the committed P4Info, not on the compiler)."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
P4_DIR = REPO / "p4"
BUILD = P4_DIR / "bmv2" / "build"
CONTRACT = REPO / "docs" / "switch.md"
P4C = shutil.which("p4c-bm2-ss")

needs_p4c = pytest.mark.skipif(
    P4C is None, reason="p4c-bm2-ss not on PATH (build p4lang/p4c; see p4/README.md)"
)

# name of the artefact set -> extra compiler flags (as in p4/Makefile)
VARIANTS = {"dlcp": [], "dlcp_loss": ["-DDLCP_LOSS_INJECTION"]}
LOSS_ONLY = ("DlcpIngress.loss.",)


# --- the contract, read from docs/switch.md ---------------------------------------------


@dataclass
class Contract:
    # table -> {match field name: (match kind, bit width)}
    table_keys: dict[str, dict[str, tuple[str, int]]] = field(default_factory=dict)
    # table -> action names it must offer
    table_actions: dict[str, set[str]] = field(default_factory=dict)
    # action -> {parameter: bit width}
    actions: dict[str, dict[str, int]] = field(default_factory=dict)
    # counter -> size
    counters: dict[str, int] = field(default_factory=dict)
    # register -> (size, bit width)
    registers: dict[str, tuple[int, int]] = field(default_factory=dict)


_KEY_RE = re.compile(r"`([^`]+)`(?: as `([^`]+)`)? \((\w+), (\d+)\)")
_ACTION_RE = re.compile(r"`((?:DlcpIngress|DlcpEgress)\.[\w.]+)\(([^)]*)\)`")
_COUNTER_ROW_RE = re.compile(r"^\| `((?:DlcpIngress|DlcpEgress)\.[\w.]+)` \| (\d+) \|")
_REGISTER_RE = re.compile(
    r"register `((?:DlcpIngress|DlcpEgress)\.[\w.]+)` \(size (\d+), (\d+) bits\)"
)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def read_contract(text: str) -> Contract:
    c = Contract()
    section = ""
    for line in text.splitlines():
        if line.startswith(("## ", "### ")):  # (the contract's sections: ## or ###)
            section = line.lstrip("#").strip().lower()
            continue
        if section.startswith("tables") and line.startswith("| `"):
            name_cell, keys_cell, actions_cell = _cells(line)[:3]
            table = name_cell.strip("`")
            c.table_keys[table] = {
                (alias or expr): (kind, int(width))
                for expr, alias, kind, width in _KEY_RE.findall(keys_cell)
            }
            c.table_actions[table] = set()
            for action, params in _ACTION_RE.findall(actions_cell):
                c.table_actions[table].add(action)
                c.actions[action] = {
                    p.split(":")[0].strip(): int(p.split(":")[1])
                    for p in params.split(",")
                    if p.strip()
                }
        elif section.startswith("counters"):
            m = _COUNTER_ROW_RE.match(line)
            if m:
                c.counters[m.group(1)] = int(m.group(2))
        for m in _REGISTER_RE.finditer(line):
            c.registers[m.group(1)] = (int(m.group(2)), int(m.group(3)))
    return c


# --- the P4Info, read with the P4Runtime protos or a small text-format reader ------------


@dataclass
class Info:
    table_keys: dict[str, dict[str, tuple[str, int]]]
    table_actions: dict[str, set[str]]
    actions: dict[str, dict[str, int]]
    counters: dict[str, int]
    registers: dict[str, tuple[int, int]]


def _info_from_proto(text: str) -> Info:
    from dlcp.switch.p4proto import load

    protos = load()
    p4info = protos.p4info["P4Info"]()
    protos.text_format.Parse(text, p4info)  # raises on anything not P4Info
    field_desc = protos.p4info["MatchField"].DESCRIPTOR.fields_by_name["match_type"]
    kinds = {v.number: v.name.lower() for v in field_desc.enum_type.values}
    action_names = {a.preamble.id: a.preamble.name for a in p4info.actions}
    return Info(
        table_keys={
            t.preamble.name: {m.name: (kinds[m.match_type], m.bitwidth) for m in t.match_fields}
            for t in p4info.tables
        },
        table_actions={
            t.preamble.name: {action_names[r.id] for r in t.action_refs} for t in p4info.tables
        },
        actions={a.preamble.name: {p.name: p.bitwidth for p in a.params} for a in p4info.actions},
        counters={c.preamble.name: c.size for c in p4info.counters},
        registers={
            r.preamble.name: (r.size, r.type_spec.bitstring.bit.bitwidth) for r in p4info.registers
        },
    )


_TOKEN_RE = re.compile(r'\s*(?:([{}:])|("(?:[^"\\]|\\.)*")|([^\s{}:"]+))')


def _parse_text_format(text: str) -> dict[str, list[Any]]:
    """Protobuf text format as nested dicts of lists (no schema: enough to read names,
    sizes and widths when the P4Runtime protos are not installed)."""
    tokens = []
    pos = 0
    text = re.sub(r"#[^\n]*", "", text)
    while pos < len(text):
        m = _TOKEN_RE.match(text, pos)
        if m is None or m.end() == pos:
            if text[pos:].strip() == "":
                break
            raise ValueError(f"P4Info text: cannot read at offset {pos}: {text[pos : pos + 40]!r}")
        tokens.append(m.group(1) or m.group(2) or m.group(3))
        pos = m.end()

    def message(i: int) -> tuple[dict[str, list[Any]], int]:
        out: dict[str, list[Any]] = {}
        while i < len(tokens) and tokens[i] != "}":
            name = tokens[i]
            if tokens[i + 1] == ":":
                i += 2
            else:
                i += 1
            value: Any
            if tokens[i] == "{":
                value, i = message(i + 1)
                i += 1  # the closing brace
            else:
                value = tokens[i].strip('"')
                i += 1
            out.setdefault(name, []).append(value)
        return out, i

    result, _ = message(0)
    return result


def _info_from_text(text: str) -> Info:
    msg = _parse_text_format(text)

    def name(obj: dict[str, list[Any]]) -> str:
        return str(obj["preamble"][0]["name"][0])

    action_names = {a["preamble"][0]["id"][0]: name(a) for a in msg.get("actions", [])}
    return Info(
        table_keys={
            name(t): {
                m["name"][0]: (m["match_type"][0].lower(), int(m["bitwidth"][0]))
                for m in t.get("match_fields", [])
            }
            for t in msg.get("tables", [])
        },
        table_actions={
            name(t): {action_names[r["id"][0]] for r in t.get("action_refs", [])}
            for t in msg.get("tables", [])
        },
        actions={
            name(a): {p["name"][0]: int(p["bitwidth"][0]) for p in a.get("params", [])}
            for a in msg.get("actions", [])
        },
        counters={name(c): int(c["size"][0]) for c in msg.get("counters", [])},
        registers={
            name(r): (
                int(r["size"][0]),
                int(r["type_spec"][0]["bitstring"][0]["bit"][0]["bitwidth"][0]),
            )
            for r in msg.get("registers", [])
        },
    )


def _protos_available() -> bool:
    try:
        from dlcp.switch.p4proto import load

        load()
    except ImportError:
        return False
    return True


READERS = [pytest.param(_info_from_text, id="text-reader")]
if _protos_available():
    READERS.append(pytest.param(_info_from_proto, id="p4runtime-protos"))
else:
    READERS.append(
        pytest.param(
            _info_from_proto,
            id="p4runtime-protos",
            marks=pytest.mark.skip(reason="P4Runtime protos not installed (pip install p4runtime)"),
        )
    )


# --- tests ------------------------------------------------------------------------------


def test_contract_is_readable() -> None:
    """The contract parser sees what docs/switch.md lists (guards the name check below
    against silently checking nothing)."""
    c = read_contract(CONTRACT.read_text())
    assert len(c.table_keys) == 5
    assert c.table_keys["DlcpIngress.routing.ipv4_lpm"] == {"hdr.ipv4.dst_addr": ("lpm", 32)}
    assert c.table_keys["DlcpIngress.queueing.dlcp_class_to_queue"] == {
        "meta.dlcp_prio": ("exact", 3)
    }
    assert c.actions["DlcpIngress.routing.set_next_hop"] == {"port": 9, "smac": 48, "dmac": 48}
    assert c.actions["DlcpIngress.routing.drop"] == {}
    assert len(c.counters) == 5
    assert c.registers == {"DlcpIngress.loss.drop_per_65536": (1, 16)}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("reader", READERS)
def test_p4info_has_every_contract_name(variant: str, reader: Any) -> None:
    contract = read_contract(CONTRACT.read_text())
    info = reader((BUILD / f"{variant}.p4info.txtpb").read_text())
    loss = variant == "dlcp_loss"

    def wanted(name: str) -> bool:
        return loss or not name.startswith(LOSS_ONLY)

    for table, keys in contract.table_keys.items():
        assert table in info.table_keys, f"{variant}: table {table} missing from the P4Info"
        assert info.table_keys[table] == keys, f"{variant}: keys of {table}"
        missing = contract.table_actions[table] - info.table_actions[table]
        assert not missing, f"{variant}: {table} lacks actions {sorted(missing)}"
    for action, params in contract.actions.items():
        assert info.actions.get(action) == params, f"{variant}: parameters of {action}"
    for counter, size in contract.counters.items():
        if wanted(counter):
            assert info.counters.get(counter) == size, f"{variant}: counter {counter}"
        else:
            assert counter not in info.counters, f"{variant}: {counter} without the loss flag"
    for register, spec in contract.registers.items():
        if wanted(register):
            assert info.registers.get(register) == spec, f"{variant}: register {register}"
        else:
            assert register not in info.registers
    # nothing beyond the contract that the controller would have to know about
    assert set(info.table_keys) == set(contract.table_keys)
    assert set(info.counters) == {c for c in contract.counters if wanted(c)}


@pytest.mark.parametrize("reader", READERS)
def test_text_reader_agrees_with_protos(reader: Any) -> None:
    """Both P4Info readers give the same answer on the committed file."""
    text = (BUILD / "dlcp_loss.p4info.txtpb").read_text()
    assert reader(text) == _info_from_text(text)


def test_committed_json_matches_p4info() -> None:
    """The BMv2 JSON and the P4Info come from the same compile: the JSON has every
    table, counter and register of the P4Info under the same fully qualified name."""
    import json

    for variant in VARIANTS:
        cfg = json.loads((BUILD / f"{variant}.json").read_text())
        info = _info_from_text((BUILD / f"{variant}.p4info.txtpb").read_text())
        json_tables = {t["name"] for p in cfg["pipelines"] for t in p["tables"]}
        assert set(info.table_keys) <= json_tables, variant
        json_counters = {c["name"] for c in cfg["counter_arrays"]}
        assert set(info.counters) <= json_counters, variant
        json_registers = {r["name"] for r in cfg["register_arrays"]}
        assert set(info.registers) == json_registers, variant


@needs_p4c
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_committed_artefacts_are_up_to_date(variant: str, tmp_path: Path) -> None:
    """A fresh compile (same command as p4/Makefile, from p4/) gives the committed
    bytes: run `make -C p4 all loss` after changing the P4 sources."""
    assert P4C is not None
    out_json = tmp_path / f"{variant}.json"
    out_info = tmp_path / f"{variant}.p4info.txtpb"
    proc = subprocess.run(
        [
            P4C,
            "--std",
            "p4-16",
            "--arch",
            "v1model",
            *VARIANTS[variant],
            "--p4runtime-files",
            str(out_info),
            "-o",
            str(out_json),
            "bmv2/dlcp.p4",
        ],
        cwd=P4_DIR,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, f"p4c-bm2-ss failed:\n{proc.stderr}"
    for fresh, committed in ((out_info, BUILD / out_info.name), (out_json, BUILD / out_json.name)):
        assert fresh.read_bytes() == committed.read_bytes(), (
            f"{committed.relative_to(REPO)} is out of date: run `make -C p4 all loss`"
        )


# --- the P4 DLCP header against the golden wire vectors (no compiler needed) ------------

HEADERS_P4 = P4_DIR / "shared" / "headers.p4"
GOLDEN = REPO / "tests" / "golden" / "wire_vectors.json"


def p4_header_fields(source: str, header: str) -> list[tuple[str, int]]:
    """``(field, width)`` of ``header`` in P4 source (``bit<W>`` fields only)."""
    body = re.search(rf"header\s+{header}\s*\{{(.*?)\}}", source, re.DOTALL)
    assert body is not None, f"no header {header} in the P4 source"
    text = re.sub(r"/\*.*?\*/|//[^\n]*", "", body.group(1), flags=re.DOTALL)
    return [(n, int(w)) for w, n in re.findall(r"bit<(\d+)>\s+(\w+)\s*;", text)]


def test_p4_dlcp_header_reads_the_golden_vectors() -> None:
    """Slicing each golden data datagram by the P4 header's fields gives the
    values the vectors list (spec §2.1: 32 bytes, tclass = prio/drop/mag)."""
    import json

    fields = p4_header_fields(HEADERS_P4.read_text(), "dlcp_data_t")
    assert sum(w for _, w in fields) == 32 * 8
    vectors = json.loads(GOLDEN.read_text())["data"]
    assert vectors
    for v in vectors:
        raw = int.from_bytes(bytes.fromhex(v["hex"])[:32], "big")
        got, pos = {}, 256
        for name, width in fields:
            pos -= width
            got[name] = (raw >> pos) & ((1 << width) - 1)
        header, wire = v["header"], v["wire"]
        assert (got["version"] << 4) | got["pkt_type"] == wire["ver_type"], v["name"]
        assert got["dtype"] == wire["dtype"], v["name"]
        assert (got["prio"] << 5) | (got["drop"] << 4) | got["mag"] == wire["tclass"], v["name"]
        for name in ("flags", "job", "step", "msg", "layer", "seq", "offset", "msg_elems",
                     "payload_len", "src", "prio", "mag", "bound", "path"):  # fmt: skip
            assert got[name] == header[name], f"{v['name']}: {name}"
        assert got["drop"] == int(header["drop"]), v["name"]


def test_committed_json_has_the_p4_header_layout() -> None:
    """The compiled program carries the DLCP header exactly as headers.p4 declares it."""
    import json

    fields = p4_header_fields(HEADERS_P4.read_text(), "dlcp_data_t")
    cfg = json.loads((BUILD / "dlcp.json").read_text())
    (ht,) = [h for h in cfg["header_types"] if h["name"] == "dlcp_data_t"]
    assert [(f[0], f[1]) for f in ht["fields"]] == fields
