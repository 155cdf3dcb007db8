"""CALIENT TL1: port names, command forms and reply fields, pure (driver and simulator share it).

Commands, as public clients of real switches send them (sources in ``docs/hardware.md``)::

    ACT-USER::<user>:<ctag>::<password>;         log in
    ENT-CRS::<src>,<dst>:<ctag>::,<2WAY|1WAY>;   reserve a connection (AS=UMA, OS=RDY)
    ACT-CRS::<src>,<dst>:<ctag>::<name>;         put it in service: the mirrors move (AS=IS)
    CANC-CRS::<src>,<dst>:<ctag>::<name>;        take it out of service (no light)
    DLT-CRS::<src>,<dst>:<ctag>::,<group>,<name>; delete it
    RTRV-CRS:::<ctag>::ALL;          "<name>:SRCPORT=..,DSTPORT=..,CONNTYPE=..,AS=..,OS=..,OC=.."
    RTRV-PORT::ALL:<ctag>;           "<port>:<type>,..:INAS=..,INOC=..,OUTAS=..,OUTOC=.."
    RTRV-PORT-SUM::ALL:<ctag>;       "<port>:ALIAS=..,INPWR=<dBm|NONE>,OUTPWR=<dBm|NONE>,.."
    RTRV-NE:::<ctag>;                "<sid>:SERIALNUMBER=..,SWPACKAGE=..,CHASSISTYPE=.."
    CANC-USER::<user>:<ctag>:;                   log out

A port is a dotted triple (``1.1.1``) and is duplex: it has an input (light into the switch)
and an output. A connection is named ``<src>-<dst>`` (``2WAY``: both directions) or
``<src>><dst>`` (``1WAY``: src's input to dst's output). Replies use the GR-831 framing of
:mod:`controller.drivers.polatis.tl1` (``<SID> <date> <time>``, ``M  <ctag> COMPLD|DENY``,
quoted data lines, ``;``), so its framer and parser serve both vendors.

Port order: the driver numbers a switch's ports ``1..N`` in (shelf, slot, port) order of what
``RTRV-PORT`` lists; :func:`port_name` is the simulator's layout of 8 ports per slot and 8 slots
per shelf (``1`` = ``1.1.1``, ``9`` = ``1.2.1``, ``65`` = ``2.1.1``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

DEFAULT_PORT = 3083  # the TL1 port public clients use (MonALISA's CalientTelnet)
DEFAULT_GROUP = "SYSTEM"  # the group a connection entered without one falls in (phosphorus)
PORTS_PER_SLOT = 8
SLOTS_PER_SHELF = 8
NO_LIGHT = "NONE"  # what INPWR/OUTPWR read without light

_TRIPLE_RE = re.compile(r"^\d+\.\d+\.\d+$")
_CONN_RE = re.compile(r"^(\d+\.\d+\.\d+)([->])(\d+\.\d+\.\d+)$")


# --- names -----------------------------------------------------------------------------------

def port_name(index: int) -> str:
    """The simulator's dotted name of port ``index`` (1-based)."""
    if index < 1:
        raise ValueError(f"port index must be >= 1, got {index}")
    i = index - 1
    per_shelf = PORTS_PER_SLOT * SLOTS_PER_SHELF
    slot = (i // PORTS_PER_SLOT) % SLOTS_PER_SHELF + 1
    return f"{i // per_shelf + 1}.{slot}.{i % PORTS_PER_SLOT + 1}"


def port_key(name: str) -> tuple[int, int, int]:
    """``"1.2.3"`` -> ``(1, 2, 3)``, for ordering; ValueError for anything else."""
    if not _TRIPLE_RE.match(name.strip()):
        raise ValueError(f"not a CALIENT port name (shelf.slot.port): {name!r}")
    a, b, c = (int(x) for x in name.strip().split("."))
    return a, b, c


def is_port_name(text: str) -> bool:
    return bool(_TRIPLE_RE.match(text.strip()))


def conn_name(src: str, dst: str, two_way: bool) -> str:
    return f"{src}{'-' if two_way else '>'}{dst}"


def parse_conn_name(text: str) -> tuple[str, str, bool] | None:
    """``(src, dst, two_way)`` of a connection name, or None if ``text`` is not one."""
    m = _CONN_RE.match(text.strip())
    return (m.group(1), m.group(3), m.group(2) == "-") if m else None


# --- commands --------------------------------------------------------------------------------

def ent_crs(src: str, dst: str, two_way: bool, ctag: int | str) -> str:
    return f"ENT-CRS::{src},{dst}:{ctag}::,{'2WAY' if two_way else '1WAY'};"


def act_crs(src: str, dst: str, two_way: bool, ctag: int | str) -> str:
    return f"ACT-CRS::{src},{dst}:{ctag}::{conn_name(src, dst, two_way)};"


def canc_crs(src: str, dst: str, two_way: bool, ctag: int | str) -> str:
    return f"CANC-CRS::{src},{dst}:{ctag}::{conn_name(src, dst, two_way)};"


def dlt_crs(src: str, dst: str, two_way: bool, ctag: int | str,
            group: str = DEFAULT_GROUP) -> str:
    return f"DLT-CRS::{src},{dst}:{ctag}::,{group},{conn_name(src, dst, two_way)};"


def rtrv_crs(ctag: int | str) -> str:
    return f"RTRV-CRS:::{ctag}::ALL;"


def rtrv_port(ctag: int | str) -> str:
    return f"RTRV-PORT::ALL:{ctag};"


def rtrv_port_sum(ctag: int | str) -> str:
    return f"RTRV-PORT-SUM::ALL:{ctag};"


def rtrv_ne(ctag: int | str) -> str:
    return f"RTRV-NE:::{ctag};"


# --- reply lines -----------------------------------------------------------------------------

def split_line(line: str) -> tuple[str, dict[str, str]]:
    """A data line's AID (before the first ``:``) and its ``KEY=VALUE`` fields."""
    aid, _, rest = line.strip().partition(":")
    fields: dict[str, str] = {}
    for block in rest.split(":"):
        for item in block.split(","):
            key, sep, value = item.partition("=")
            if sep:
                fields[key.strip().upper()] = value.strip()
    return aid.strip(), fields


@dataclass(frozen=True)
class Connection:
    """One connection as RTRV-CRS shows it."""

    src: str
    dst: str
    two_way: bool
    group: str = DEFAULT_GROUP
    admin: str = "UMA"  # AS: UMA reserved, IS in service
    oper: str = "RDY"  # OS: RDY reserved (or switching), IS carrying light
    capacity: str = "OK"  # OC: OK, or FAIL when a port of it failed

    @property
    def name(self) -> str:
        return conn_name(self.src, self.dst, self.two_way)

    @property
    def in_service(self) -> bool:
        """Activated and settled: light passes."""
        return self.admin == "IS" and self.oper == "IS"

    def to_line(self) -> str:
        return (f"{self.name}:SRCPORT={self.src},DSTPORT={self.dst},GRPNAME={self.group},"
                f"CONNNAME={self.name},CONNTYPE={'2WAY' if self.two_way else '1WAY'},"
                f"AS={self.admin},OS={self.oper},OC={self.capacity},PS=UPR,AL=CL")


def parse_crs(data: Sequence[str]) -> list[Connection]:
    """The connections of RTRV-CRS data lines (lines without SRCPORT/DSTPORT are skipped)."""
    out = []
    for line in data:
        _aid, f = split_line(line)
        src, dst = f.get("SRCPORT", ""), f.get("DSTPORT", "")
        if not (is_port_name(src) and is_port_name(dst)):
            continue
        out.append(Connection(src, dst, f.get("CONNTYPE", "2WAY").upper() == "2WAY",
                              f.get("GRPNAME", DEFAULT_GROUP), f.get("AS", "").upper(),
                              f.get("OS", "").upper(), f.get("OC", "").upper()))
    return out


@dataclass(frozen=True)
class PortHealth:
    """A port's input and output condition as RTRV-PORT shows them (``INOC``/``OUTOC``)."""

    name: str
    in_ok: bool = True
    out_ok: bool = True

    def to_line(self, connected: bool) -> str:
        state = "IS" if connected else "OOS-NP"
        inoc, outoc = ("OK" if self.in_ok else "FAIL"), ("OK" if self.out_ok else "FAIL")
        return (f"{self.name}:WX,NONE,NONE:INAS={state},INOS={state[:3]},INOC={inoc},"
                f"INRS=NPR,OUTAS={state},OUTOS={state[:3]},OUTOC={outoc},OUTRS=NPR")


def parse_ports(data: Sequence[str]) -> list[PortHealth]:
    """RTRV-PORT data lines -> the ports listed, in the order given."""
    out = []
    for line in data:
        aid, f = split_line(line)
        if is_port_name(aid):
            out.append(PortHealth(aid, f.get("INOC", "OK").upper() == "OK",
                                  f.get("OUTOC", "OK").upper() == "OK"))
    return out


def format_power(dbm: float | None) -> str:
    return NO_LIGHT if dbm is None else f"{dbm:.2f}"


def parse_power(text: str) -> float:
    """A power field: dBm, or ``-inf`` for ``NONE`` (no light measured)."""
    t = text.strip().upper()
    if t in (NO_LIGHT, ""):
        return -math.inf
    return float(t)


def port_sum_line(name: str, in_dbm: float | None, out_dbm: float | None,
                  conns: Iterable[tuple[str, bool]] = ()) -> str:
    """One RTRV-PORT-SUM line; ``conns`` are (connection name, in service) on the port."""
    parts = [f"{name}:ALIAS=NONE,INPWR={format_power(in_dbm)},OUTPWR={format_power(out_dbm)}"]
    listed = list(conns)[:2]
    for i in range(2):
        cname, active = listed[i] if i < len(listed) else (NO_LIGHT, False)
        state = "ACT" if active else NO_LIGHT
        parts.append(f"CONNNAME{i + 1}={cname},CONNSTATE{i + 1}={state}")
    return ",".join(parts)


def parse_port_sum(data: Sequence[str]) -> dict[str, tuple[float, float]]:
    """RTRV-PORT-SUM lines -> port name -> (input dBm, output dBm); ``-inf`` is no light."""
    out: dict[str, tuple[float, float]] = {}
    for line in data:
        aid, f = split_line(line)
        if is_port_name(aid):
            try:
                out[aid] = (parse_power(f.get("INPWR", NO_LIGHT)),
                            parse_power(f.get("OUTPWR", NO_LIGHT)))
            except ValueError:
                continue
    return out


def ne_line(sid: str, fields: Mapping[str, str]) -> str:
    return f"{sid}:" + ",".join(f"{k}={v}" for k, v in fields.items())


def parse_ne(data: Sequence[str]) -> dict[str, str]:
    """RTRV-NE's fields (SERIALNUMBER, SWPACKAGE, STATUS, CHASSISTYPE, ...), upper-case keys."""
    out: dict[str, str] = {}
    for line in data:
        out.update(split_line(line)[1])
    return out
