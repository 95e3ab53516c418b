"""Names to P4Runtime ids through a P4Info, and values to canonical bytestrings.

:class:`P4InfoHelper` reads the P4Info the compiler wrote (text format, e.g.
``p4/bmv2/build/dlcp.p4info.txtpb``, or binary) and resolves table, action, match
field, action parameter, counter and register names -- never hard-coded ids. It
turns :class:`~dlcp.switch.p4entries.TableEntry` values into ``p4.v1.Update``
messages, encoding every value as a P4Runtime canonical bytestring: big-endian,
without leading zero bytes (zero is one ``0x00`` byte), checked against the field's
bitwidth. An LPM value must have no bits set past its prefix; a ``/0`` LPM match is
left out of the entry, as the spec requires for a don't-care.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..errors import DLCPError
from .p4entries import Exact, Lpm, TableEntry, Value
from .p4proto import P4Protos, load

__all__ = ["P4InfoError", "P4InfoHelper", "canonical_bytes", "to_int"]


class P4InfoError(DLCPError, ValueError):
    """A name is not in the P4Info, or a value does not fit its field."""


def to_int(value: Value, where: str) -> int:
    """An integer from an int, a dotted IPv4 address or a colon-separated MAC."""
    if isinstance(value, bool):
        raise P4InfoError(f"{where}: expected a number, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        if value.count(".") == 3:
            try:
                return int(ipaddress.IPv4Address(value))
            except ValueError:
                pass
        parts = value.split(":")
        if len(parts) == 6 and all(len(p) == 2 for p in parts):
            try:
                return int("".join(parts), 16)
            except ValueError:
                pass
    raise P4InfoError(f"{where}: {value!r} is not an integer, IPv4 address or MAC address")


def canonical_bytes(value: int, bitwidth: int, where: str) -> bytes:
    """``value`` as a P4Runtime canonical bytestring for a ``bitwidth``-bit field."""
    if value < 0 or value >= 1 << bitwidth:
        raise P4InfoError(f"{where}: value {value} does not fit in {bitwidth} bits")
    return value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big")


class P4InfoHelper:
    """Lookups in one P4Info (a ``p4.config.v1.P4Info`` message)."""

    def __init__(self, p4info: Any, protos: P4Protos | None = None) -> None:
        self.protos = protos or load()
        self.p4info = p4info
        self._tables = {t.preamble.name: t for t in p4info.tables}
        self._actions = {a.preamble.name: a for a in p4info.actions}
        self._counters = {c.preamble.name: c for c in p4info.counters}
        self._registers = {r.preamble.name: r for r in p4info.registers}
        self._table_by_id = {t.preamble.id: t for t in p4info.tables}

    @classmethod
    def from_file(
        cls, path: str | os.PathLike[str], protos: P4Protos | None = None
    ) -> P4InfoHelper:
        """Read a P4Info file: text format (``.txt``, ``.txtpb``, ``.pb.txt``) or binary."""
        protos = protos or load()
        p = Path(path)
        try:
            data = p.read_bytes()
        except OSError as e:
            raise P4InfoError(f"{p}: cannot read P4Info: {e}") from e
        msg = protos.p4info["P4Info"]()
        try:
            if p.suffix in {".txt", ".txtpb", ".textproto", ".pbtxt"} or p.name.endswith(".pb.txt"):
                protos.text_format.Parse(data.decode(), msg)
            else:
                msg.ParseFromString(data)
        except Exception as e:  # text_format.ParseError, DecodeError, UnicodeDecodeError
            raise P4InfoError(f"{p}: not a P4Info: {e}") from e
        return cls(msg, protos)

    # ---- lookups ------------------------------------------------------------------

    @staticmethod
    def _find(kind: str, table: dict[str, Any], name: str) -> Any:
        if name in table:
            return table[name]
        by_alias = [v for v in table.values() if v.preamble.alias == name]
        if len(by_alias) == 1:
            return by_alias[0]
        known = ", ".join(sorted(table)) or "none"
        raise P4InfoError(f"{kind} {name!r} is not in the P4Info (known: {known})")

    def table(self, name: str) -> Any:
        return self._find("table", self._tables, name)

    def action(self, name: str) -> Any:
        return self._find("action", self._actions, name)

    def counter(self, name: str) -> Any:
        return self._find("counter", self._counters, name)

    def register(self, name: str) -> Any:
        return self._find("register", self._registers, name)

    def table_name(self, table_id: int) -> str:
        t = self._table_by_id.get(table_id)
        return str(t.preamble.name) if t is not None else f"<table id {table_id}>"

    def match_field(self, table: str, name: str) -> Any:
        t = self.table(table)
        for mf in t.match_fields:
            if mf.name == name:
                return mf
        known = ", ".join(mf.name for mf in t.match_fields)
        raise P4InfoError(f"table {table}: no match field {name!r} (fields: {known})")

    def action_param(self, action: str, name: str) -> Any:
        a = self.action(action)
        for p in a.params:
            if p.name == name:
                return p
        known = ", ".join(p.name for p in a.params) or "none"
        raise P4InfoError(f"action {action}: no parameter {name!r} (parameters: {known})")

    # ---- entries -> protobuf -----------------------------------------------------------

    def table_entry(self, entry: TableEntry) -> Any:
        """``entry`` as a ``p4.v1.TableEntry`` (ids resolved, values encoded)."""
        t = self.table(entry.table)
        te = self.protos.TableEntry(table_id=t.preamble.id, priority=entry.priority)
        for k, m in entry.match:
            self._add_match(te, entry.table, k, m)
        exact = self.protos.p4info["MatchField"].EXACT
        given = {k for k, _ in entry.match}
        for mf in t.match_fields:
            if mf.match_type == exact and mf.name not in given:
                raise P4InfoError(f"{entry.table}: exact field {mf.name} has no value")
        self._set_action(te, entry, t)
        return te

    def _add_match(self, te: Any, table: str, k: str, m: Exact | Lpm) -> None:
        kinds = self.protos.p4info["MatchField"]
        mf = self.match_field(table, k)
        where = f"{table} field {k}"
        value = to_int(m.value, where)
        if isinstance(m, Lpm):
            if mf.match_type != kinds.LPM:
                raise P4InfoError(f"{where}: is not an lpm field")
            if not 0 <= m.prefix_len <= mf.bitwidth:
                raise P4InfoError(f"{where}: prefix length {m.prefix_len} outside 0..{mf.bitwidth}")
            if value & ((1 << (mf.bitwidth - m.prefix_len)) - 1):
                raise P4InfoError(f"{where}: {m.value}/{m.prefix_len} has bits set past the prefix")
            if m.prefix_len == 0:
                return  # a don't-care match is left out
            fm = te.match.add(field_id=mf.id)
            fm.lpm.value = canonical_bytes(value, mf.bitwidth, where)
            fm.lpm.prefix_len = m.prefix_len
        else:
            if mf.match_type != kinds.EXACT:
                raise P4InfoError(f"{where}: is not an exact field")
            fm = te.match.add(field_id=mf.id)
            fm.exact.value = canonical_bytes(value, mf.bitwidth, where)

    def _set_action(self, te: Any, entry: TableEntry, table: Any) -> None:
        a = self.action(entry.action)
        allowed = self.table_actions(table)
        if a.preamble.name not in allowed:
            raise P4InfoError(
                f"{entry.table}: action {entry.action} is not one of the table's actions "
                f"({', '.join(allowed)})"
            )
        te.action.action.action_id = a.preamble.id
        given = dict(entry.params)
        for p in a.params:
            if p.name not in given:
                raise P4InfoError(f"{entry.table}: action {entry.action} needs parameter {p.name}")
        for k, v in entry.params:
            p = self.action_param(entry.action, k)
            where = f"{entry.table} action {entry.action} parameter {k}"
            value = canonical_bytes(to_int(v, where), p.bitwidth, where)
            te.action.action.params.add(param_id=p.id, value=value)

    def table_actions(self, table: Any) -> list[str]:
        """Names of the actions ``table`` (a P4Info table) allows."""
        by_id = {a.preamble.id: a.preamble.name for a in self.p4info.actions}
        return [by_id.get(r.id, f"<action id {r.id}>") for r in table.action_refs]

    def updates(self, entries: Iterable[TableEntry], kind: str = "INSERT") -> list[Any]:
        """``p4.v1.Update`` messages of type ``kind`` (INSERT, MODIFY, DELETE)."""
        u = self.protos.Update
        out = []
        for e in entries:
            upd = u(type=u.Type.Value(kind))
            upd.entity.table_entry.CopyFrom(self.table_entry(e))
            out.append(upd)
        return out

    def table_entity(self, name: str) -> Any:
        """A ``p4.v1.Entity`` that reads every entry of table ``name``."""
        ent = self.protos.Entity()
        ent.table_entry.table_id = self.table(name).preamble.id
        return ent

    def counter_entity(self, name: str, index: int | None = None) -> Any:
        """A ``p4.v1.Entity`` that reads counter ``name`` (every index when ``None``)."""
        c = self.counter(name)
        ent = self.protos.Entity()
        ent.counter_entry.counter_id = c.preamble.id
        if index is not None:
            if not 0 <= index < c.size:
                raise P4InfoError(f"counter {name}: index {index} outside 0..{c.size - 1}")
            ent.counter_entry.index.index = index
        return ent

    def register_update(self, name: str, index: int, value: int) -> Any:
        """A MODIFY ``p4.v1.Update`` that sets cell ``index`` of register ``name``
        (e.g. the loss-injection probability) to ``value``."""
        r = self.register(name)
        where = f"register {name}"
        if not 0 <= index < r.size:
            raise P4InfoError(f"{where}: index {index} outside 0..{r.size - 1}")
        spec = r.type_spec
        if spec.WhichOneof("type_spec") != "bitstring":
            raise P4InfoError(f"{where}: only bit<W> registers are supported")
        bits = spec.bitstring
        width = getattr(bits, bits.WhichOneof("type_spec")).bitwidth
        u = self.protos.Update
        upd = u(type=u.MODIFY)
        re_ = upd.entity.register_entry
        re_.register_id = r.preamble.id
        re_.index.index = index
        re_.data.bitstring = canonical_bytes(value, width, where)
        return upd
