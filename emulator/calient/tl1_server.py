"""The simulated CALIENT switch's TL1 agent over plain TCP (127.0.0.1 by default).

Commands (forms in :mod:`controller.drivers.calient.wire`): ACT-USER, CANC-USER, ENT-CRS,
ACT-CRS, CANC-CRS, DLT-CRS, RTRV-CRS, RTRV-PORT, RTRV-PORT-SUM, RTRV-NE; every one but
ACT-USER needs a login. The public clients disagree on where a connection's name goes (after
the group, before it, or alone, with or without the ``src,dst`` AID), so the agent takes a
connection from any field that is a connection name (``a-b``, ``a>b``) and else from the AID.
ENT-CRS takes ``[<group>],<1WAY|2WAY>`` (default ``2WAY``). Faults: refused edits, a failed
port, slow replies, and a line dropped right after an applied edit, before its reply.
"""

from __future__ import annotations

from collections.abc import Callable

from controller.drivers.calient import wire
from controller.drivers.polatis.tl1 import Tl1Command
from emulator.calient.model import CalientDevice
from emulator.tl1_server_base import Tl1Deny, Tl1Result, Tl1ServerBase

EDITS = ("ENT-CRS", "ACT-CRS", "CANC-CRS", "DLT-CRS")


class CalientTl1Server(Tl1ServerBase[CalientDevice]):
    """TL1 over TCP for one :class:`CalientDevice`."""

    def __init__(self, device: CalientDevice, *, host: str = "127.0.0.1", port: int = 0,
                 username: str = "admin", password: str = "root", sid: str = "CALIENT01"
                 ) -> None:
        super().__init__(device, host=host, port=port, username=username, password=password,
                         sid=sid)

    async def _serve(self, cmd: Tl1Command) -> Tl1Result:
        device = self.device
        now = device.clock()
        if cmd.verb == "RTRV-NE":
            return [wire.ne_line(self.sid, {
                "SERIALNUMBER": device.serial, "SWPACKAGE": device.software, "STATUS": "OK",
                "CHASSISTYPE": device.model, "PLATFORM": "SIM"})], None
        if cmd.verb == "RTRV-PORT":
            lit = {p for c in device.connections().values() if c.active for p in (c.src, c.dst)}
            return [wire.PortHealth(device.names[p - 1], not device.is_failed(p),
                                    not device.is_failed(p)).to_line(p in lit)
                    for p in self._ports(cmd.aid)], None
        if cmd.verb == "RTRV-PORT-SUM":
            return [wire.port_sum_line(device.names[p - 1], device.in_dbm(p),
                                       device.out_dbm(p, now), device.conns_on(p))
                    for p in self._ports(cmd.aid)], None
        if cmd.verb == "RTRV-CRS":
            names = sorted(device.connections())
            if cmd.aid and cmd.aid.upper() != "ALL":  # one connection, by AID or name
                wanted = self._target(cmd, required=False)
                names = [n for n in names if n == wanted]
            return [device.state_of(n, now).to_line() for n in names], None
        if cmd.verb in EDITS:
            return await self._apply_edit(self._edit(cmd))
        raise Tl1Deny("ICNV", f"command {cmd.verb} is not supported")

    def _edit(self, cmd: Tl1Command) -> Callable[[], object]:
        device = self.device
        if cmd.verb == "ENT-CRS":
            src, dst = self._pair(cmd.aid)
            items = [x.strip() for x in ",".join(cmd.params).split(",") if x.strip()]
            kinds = [x.upper() for x in items if x.upper() in ("1WAY", "2WAY")]
            groups = [x for x in items if x.upper() not in ("1WAY", "2WAY")]
            two_way = (kinds[-1] if kinds else "2WAY") == "2WAY"
            group = groups[0] if groups else wire.DEFAULT_GROUP
            return lambda: device.enter(src, dst, two_way, group)
        name = self._target(cmd, required=True)
        assert name is not None
        verb = {"ACT-CRS": device.activate, "CANC-CRS": device.cancel,
                "DLT-CRS": device.delete}[cmd.verb]
        return lambda: verb(name)

    def _target(self, cmd: Tl1Command, *, required: bool) -> str | None:
        """The connection a command names: a name in its fields, else its ``src,dst`` AID."""
        device = self.device
        for item in (x.strip() for block in cmd.params for x in block.split(",")):
            parsed = wire.parse_conn_name(item)
            if parsed is not None:
                if item in device.connections():
                    return item
                src, dst, _ = parsed
                found = device.find(self._index(src), self._index(dst))
                if found is not None:
                    return found
        if cmd.aid:
            found = device.find(*self._pair(cmd.aid))
            if found is not None:
                return found
        if required:
            raise Tl1Deny("IENE", f"Invalid Connection: no connection {cmd.aid or cmd.params}")
        return None

    def _pair(self, aid: str) -> tuple[int, int]:
        src, sep, dst = aid.partition(",")
        if not sep:
            raise Tl1Deny("IIAC", f"need <src>,<dst> ports, got {aid!r}")
        return self._index(src), self._index(dst)

    def _index(self, name: str) -> int:
        index = self.device.index.get(name.strip())
        if index is None:
            raise Tl1Deny("IIAC", f"Invalid AID: no port {name.strip()!r}")
        return index

    def _ports(self, aid: str) -> list[int]:
        """Ports of an AID: blank/ALL/0 (every port), names joined by ``&``, or a prefix."""
        names = self.device.names
        if aid.strip().upper() in ("", "ALL", "0"):
            return list(range(1, len(names) + 1))
        out: list[int] = []
        for part in aid.split("&"):
            part = part.strip()
            if part in self.device.index:
                out.append(self.device.index[part])
                continue
            match = [i for i, n in enumerate(names, start=1) if n.startswith(part + ".")]
            if not match:
                raise Tl1Deny("IIAC", f"Invalid AID: no port {part!r}")
            out.extend(match)
        return out
