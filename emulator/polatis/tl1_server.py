"""The device's TL1 agent over plain TCP, serving the same :class:`PolatisDevice` as NETCONF.

Commands (forms in :mod:`controller.drivers.polatis.tl1`): ACT-USER, CANC-USER, ENT-PATCH,
DLT-PATCH, RTRV-PATCH, RTRV-NETYPE, RTRV-PORT-POWER, RTRV-PORT-SHUTTER (``OPEN``, or ``FAILED``
for a port failed by fault injection: the TL1 module says why that word). Every command but
ACT-USER needs a login. An ENT-PATCH creates (an ingress or egress already in use is refused with
SAAS); DLT-PATCH takes either end of a patch. Faults as for NETCONF: slow replies, and a
connection dropped right after an applied ENT/DLT-PATCH, before its reply.
"""

from __future__ import annotations

import re

from controller.drivers.polatis.tl1 import Tl1Command, shutter_state
from emulator.polatis.model import EditOp, PolatisDevice
from emulator.tl1_server_base import Tl1Deny, Tl1Result, Tl1ServerBase


def _ports(aid: str) -> list[int]:
    """Ports of an access identifier: ``5``, ``1&3&7`` or the range ``1&&8``."""
    out: list[int] = []
    for part in re.split(r"&(?!&)", aid.replace("&&", "\0")):
        a, sep, b = part.partition("\0")
        if not (a.strip().isdigit() and (not sep or b.strip().isdigit())):
            raise Tl1Deny("IIAC", f"bad port list {aid!r}")
        out.extend(range(int(a), int(b) + 1) if sep else [int(a)])
    return out


class Tl1Server(Tl1ServerBase[PolatisDevice]):
    """TL1 over TCP for one :class:`PolatisDevice`."""

    login_required_comment = "log in with ACT-USER first"

    def __init__(self, device: PolatisDevice, *, host: str = "127.0.0.1", port: int = 0,
                 username: str = "admin", password: str = "root", sid: str = "POLATIS") -> None:
        super().__init__(device, host=host, port=port, username=username, password=password,
                         sid=sid)

    async def _serve(self, cmd: Tl1Command) -> Tl1Result:
        device = self.device
        if cmd.verb == "RTRV-PATCH":
            pairs = device.pairs()
            wanted = set(_ports(cmd.aid)) if cmd.aid else None
            return [f"{i},{e}" for i, e in sorted(pairs.items())
                    if wanted is None or i in wanted or e in wanted], None
        if cmd.verb == "RTRV-NETYPE":
            return [f"POLATIS,{device.model},OPTICAL SWITCH,{device.software}"], None
        if cmd.verb == "RTRV-PORT-POWER":
            now = device.clock()
            ports = self._all_ports(cmd.aid)
            return [f"{p}:{device.power_dbm(p, now):.2f}" for p in ports], None
        if cmd.verb == "RTRV-PORT-SHUTTER":
            ports = self._all_ports(cmd.aid)
            return [f"{p}:{shutter_state(device.port_status(p))}" for p in ports], None
        if cmd.verb in ("ENT-PATCH", "DLT-PATCH"):
            ops = self._patch_ops(cmd)
            return await self._apply_edit(lambda: device.perform(ops))
        raise Tl1Deny("ICNV", f"command {cmd.verb} is not supported")

    def _all_ports(self, aid: str) -> list[int]:
        """The ports of ``aid`` (every port if blank), each checked against the switch size."""
        n = 2 * self.device.size
        ports = _ports(aid) if aid else list(range(1, n + 1))
        bad = [p for p in ports if not 1 <= p <= n]
        if bad:
            raise Tl1Deny("IIAC", f"port {bad[0]} is out of range 1..{n}")
        return ports

    def _patch_ops(self, cmd: Tl1Command) -> list[EditOp]:
        device = self.device
        if cmd.verb == "ENT-PATCH":
            ins, sep, outs = cmd.aid.partition(",")
            if not sep:
                raise Tl1Deny("IIAC", f"ENT-PATCH needs <in>,<out>, got {cmd.aid!r}")
            ingress, egress = _ports(ins), _ports(outs)
            if len(ingress) != len(egress):
                raise Tl1Deny("IIAC", f"{len(ingress)} ingress but {len(egress)} egress ports")
            return [EditOp("create", i, e) for i, e in zip(ingress, egress, strict=True)]
        pairs = device.pairs()
        by_egress = {e: i for i, e in pairs.items()}
        ops = []
        for port in _ports(cmd.aid):
            if port in pairs:
                ops.append(EditOp("delete", port))
            elif port in by_egress:
                ops.append(EditOp("delete", by_egress[port]))
            elif not 1 <= port <= 2 * device.size:
                raise Tl1Deny("IIAC", f"port {port} is out of range 1..{2 * device.size}")
            else:
                raise Tl1Deny("IENE", f"no patch on port {port}")
        return ops
