"""One TL1 login on one CALIENT switch, as a :class:`DeviceSession` of N x N ``ingress -> egress``
pairs, so the device-neutral driver engine (:mod:`controller.drivers.polatis.driver`) drives it.

The view: the switch's ports, in (shelf, slot, port) order of ``RTRV-PORT``, are ``1..N``; port
``p``'s input is ingress ``p`` and its output egress ``N+p`` (as a Polatis rail is cabled). A
``2WAY`` connection ``a-b`` is the pairs ``a -> N+b`` and ``b -> N+a`` (a duplex rail circuit);
a ``1WAY`` ``a>b`` is ``a -> N+b`` alone (a stray half to the driver). A connection that is
reserved but not in service (``ENT-CRS`` without ``ACT-CRS``, e.g. left by a line dropped
mid-batch) holds its ports and carries no light: it is read as its first pair alone, a stray
half, so the driver counts no circuit, reads its ports dark and deletes it in the next edit that
sets them.

An edit is break-before-make in four steps: ``CANC-CRS`` then ``DLT-CRS`` for every connection
that loses a pair, ``ENT-CRS`` for every new one (reserved: nothing moves), ``ACT-CRS`` for
each, back to back (the mirrors move together: a bulk switch), then ``RTRV-CRS`` every
``poll_s`` until each new connection reads ``AS=IS,OS=IS`` (within ``timeout_s``). Whether a real
switch answers ``ACT-CRS`` before or after its mirrors settle is not public; polling covers
both (public code that drove S-series switches polled ``RTRV-CRS`` after ``ACT-CRS``).

Light: ``RTRV-PORT-SUM`` ``OUTPWR`` is egress ``N+p``'s reading, ``INPWR`` ingress ``p``'s;
``NONE`` (no light) reads ``-inf`` dBm, below any ``dark_below_dbm``. Status: a port whose
``RTRV-PORT`` ``INOC``/``OUTOC`` is not ``OK`` has its ingress/egress ``FAILED``.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Sequence
from functools import partial

from controller.drivers.calient import wire
from controller.drivers.polatis import errors
from controller.drivers.polatis.session import DeviceInfo
from controller.drivers.polatis.tl1 import Tl1Session


class CalientSession(Tl1Session):
    """A logged-in TL1 session on one CALIENT switch (commands serialised by a lock)."""

    def __init__(self, host: str, port: int = wire.DEFAULT_PORT, *, username: str,
                 password: str, timeout_s: float = 10.0, poll_s: float = 0.005) -> None:
        super().__init__(host, port, username=username, password=password,
                         timeout_s=timeout_s)
        self.name = f"calient-tl1 {host}:{port}"
        self.poll_s = poll_s
        self._names: list[str] = []  # view port p -> dotted name at p - 1
        self._index: dict[str, int] = {}

    # --- DeviceSession -----------------------------------------------------------------------

    def open(self) -> DeviceInfo:
        self._login()
        ne = wire.parse_ne(self._command(wire.rtrv_ne).data)
        ports = wire.parse_ports(self._command(wire.rtrv_port).data)
        if not ports:
            self.close()
            raise errors.DeviceProtocolError(self.name, "RTRV-PORT listed no ports")
        self._names = sorted((p.name for p in ports), key=wire.port_key)
        self._index = {name: i for i, name in enumerate(self._names, start=1)}
        self._size = len(self._names)
        n = self._size
        return DeviceInfo(model=ne.get("CHASSISTYPE", "CALIENT"), ingress_ports=n,
                          egress_ports=n, protocol="tl1", serial=ne.get("SERIALNUMBER", ""),
                          software=ne.get("SWPACKAGE", ""))

    def read_pairs(self) -> dict[int, int]:
        """Every connection as ``ingress -> egress`` pairs; one not in service as its first
        pair only (a stray half: it holds the ports, and no light passes)."""
        pairs: dict[int, int] = {}
        for conn in self._connections():
            a, b = self._index.get(conn.src), self._index.get(conn.dst)
            if a is None or b is None:
                continue
            pairs[a] = self._size + b
            if conn.two_way and conn.admin == "IS":
                pairs[b] = self._size + a
        return pairs

    def edit(self, delete_ingress: Sequence[int], add: Sequence[tuple[int, int]]) -> None:
        n = self._size
        current = self._connections()
        by_input: dict[str, wire.Connection] = {}
        for conn in current:
            by_input[conn.src] = conn
            if conn.two_way:
                by_input[conn.dst] = conn
        victims: dict[str, wire.Connection] = {}
        for ingress in delete_ingress:
            victim = by_input.get(self._name(ingress))
            if victim is None:
                raise errors.DeviceRejected(self.name, f"no connection on port "
                                            f"{self._name(ingress)}", code="IENE",
                                            ports=(ingress,))
            victims[victim.name] = victim
        for conn in victims.values():
            ports = self._ports_of(conn)
            if conn.admin == "IS":
                self._command(partial(wire.canc_crs, conn.src, conn.dst, conn.two_way),
                              ports=ports)
            self._command(partial(wire.dlt_crs, conn.src, conn.dst, conn.two_way,
                                  group=conn.group or wire.DEFAULT_GROUP), ports=ports)
        wanted = {(i, e - n) for i, e in add}
        new: list[tuple[str, str, bool, tuple[int, ...]]] = []
        for a, b in sorted(wanted):
            if (b, a) in wanted:
                if a < b:
                    new.append((self._name(a), self._name(b), True, (a, b, n + a, n + b)))
            else:
                new.append((self._name(a), self._name(b), False, (a, n + b)))
        entered: list[tuple[str, str, bool, tuple[int, ...]]] = []
        try:
            for src, dst, two_way, ports in new:
                self._command(partial(wire.ent_crs, src, dst, two_way), ports=ports)
                entered.append((src, dst, two_way, ports))
        except errors.DeviceRejected:
            for src, dst, two_way, _ports in entered:  # leave no reservation behind
                with contextlib.suppress(errors.DeviceRejected):
                    self._command(partial(wire.dlt_crs, src, dst, two_way))
            raise
        for src, dst, two_way, ports in new:
            self._command(partial(wire.act_crs, src, dst, two_way), ports=ports)
        self._await_service({wire.conn_name(s, d, t): p for s, d, t, p in new})

    def power_dbm(self) -> dict[int, float]:
        """Ingress ``p``: INPWR of port p; egress ``N+p``: its OUTPWR; ``-inf``: no light."""
        out: dict[int, float] = {}
        for name, (in_dbm, out_dbm) in wire.parse_port_sum(
                self._command(wire.rtrv_port_sum).data).items():
            p = self._index.get(name)
            if p is not None:
                out[p], out[self._size + p] = in_dbm, out_dbm
        return out

    def port_status(self) -> dict[int, str]:
        """ENABLED or FAILED per ingress/egress, from RTRV-PORT's INOC/OUTOC; empty if denied."""
        reply = self._command(wire.rtrv_port, check=False)
        if not reply.ok:
            return {}
        out: dict[int, str] = {}
        for health in wire.parse_ports(reply.data):
            p = self._index.get(health.name)
            if p is not None:
                out[p] = "ENABLED" if health.in_ok else "FAILED"
                out[self._size + p] = "ENABLED" if health.out_ok else "FAILED"
        return out

    # ---

    def _connections(self) -> list[wire.Connection]:
        return wire.parse_crs(self._command(wire.rtrv_crs).data)

    def _name(self, device_port: int) -> str:
        p = device_port - self._size if device_port > self._size else device_port
        if not 1 <= p <= self._size:
            raise errors.DeviceRejected(self.name, f"device port {device_port} is outside "
                                        f"1..{2 * self._size}", code="IIAC",
                                        ports=(device_port,))
        return self._names[p - 1]

    def _ports_of(self, conn: wire.Connection) -> tuple[int, ...]:
        return tuple(p for name in (conn.src, conn.dst)
                     if (p := self._index.get(name)) is not None)

    def _await_service(self, names: dict[str, tuple[int, ...]]) -> None:
        """Poll RTRV-CRS until every named connection is in service (AS=IS, OS=IS)."""
        if not names:
            return
        deadline = time.monotonic() + self.timeout_s
        while True:
            state = {c.name: c for c in self._connections()}
            pending = []
            for name, ports in names.items():
                conn = state.get(name)
                if conn is None or conn.capacity not in ("OK", ""):
                    why = "is gone" if conn is None else f"reads OC={conn.capacity}"
                    raise errors.DeviceRejected(self.name, f"connection {name} {why} after "
                                                "ACT-CRS", code="SROF", ports=ports)
                if not conn.in_service:
                    pending.append(name)
            if not pending:
                return
            if time.monotonic() >= deadline:
                raise errors.DeviceTimeout(self.name, f"connection(s) {', '.join(pending)} "
                                           f"not in service (OS=IS) within "
                                           f"{self.timeout_s:g} s of ACT-CRS")
            time.sleep(self.poll_s)


#: what ``power_dbm`` reads for no light (``NONE`` on the wire)
NO_LIGHT_DBM = -math.inf
