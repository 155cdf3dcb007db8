"""The device's TL1 agent over plain TCP, serving the same :class:`PolatisDevice` as NETCONF.

Commands (forms in :mod:`controller.drivers.polatis.tl1`): ACT-USER, CANC-USER, ENT-PATCH,
DLT-PATCH, RTRV-PATCH, RTRV-NETYPE, RTRV-PORT-POWER, RTRV-PORT-SHUTTER (``OPEN``, or ``FAILED``
for a port failed by fault injection: the TL1 module says why that word). Every command but
ACT-USER needs a login. An ENT-PATCH creates (an ingress or egress already in use is refused with
SAAS); DLT-PATCH takes either end of a patch. Faults as for NETCONF: slow replies, and a
connection dropped right after an applied ENT/DLT-PATCH, before its reply.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import re
from dataclasses import dataclass
from typing import Any

from controller.drivers.polatis.tl1 import (
    Tl1Command,
    format_reply,
    parse_command,
    shutter_state,
)
from emulator.polatis.model import DeviceError, EditOp, PolatisDevice
from emulator.polatis.server import BackgroundServer


@dataclass
class _Conn:
    user: str | None = None


class _Reply(Exception):
    """A DENY to send back."""

    def __init__(self, code: str, comment: str) -> None:
        self.code = code
        self.comment = comment
        super().__init__(f"{code}: {comment}")


def _ports(aid: str) -> list[int]:
    """Ports of an access identifier: ``5``, ``1&3&7`` or the range ``1&&8``."""
    out: list[int] = []
    for part in re.split(r"&(?!&)", aid.replace("&&", "\0")):
        a, sep, b = part.partition("\0")
        if not (a.strip().isdigit() and (not sep or b.strip().isdigit())):
            raise _Reply("IIAC", f"bad port list {aid!r}")
        out.extend(range(int(a), int(b) + 1) if sep else [int(a)])
    return out


class Tl1Server(BackgroundServer):
    """TL1 over TCP for one :class:`PolatisDevice`."""

    def __init__(self, device: PolatisDevice, *, host: str = "127.0.0.1", port: int = 0,
                 username: str = "admin", password: str = "root", sid: str = "POLATIS") -> None:
        super().__init__(host, port)
        self.device = device
        self.username = username
        self.password = password
        self.sid = sid
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[Any]] = set()

    async def _start(self) -> int:
        self._server = await asyncio.start_server(self._client, self.host, self.port)
        return int(self._server.sockets[0].getsockname()[1])

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        conn = _Conn()
        buf = ""
        try:
            while True:
                data = await reader.read(4096)
                if not data:
                    return
                buf += data.decode(errors="replace")
                while ";" in buf:
                    text, _, buf = buf.partition(";")
                    if not text.strip():
                        continue
                    reply, action = await self._command(text, conn)
                    if action == "drop":
                        writer.transport.abort()
                        return
                    if self.device.faults.reply_delay_s:
                        await asyncio.sleep(self.device.faults.reply_delay_s)
                    writer.write(reply.encode())
                    await writer.drain()
                    if action == "close":
                        return
        except (asyncio.CancelledError, OSError):
            writer.transport.abort()
        finally:
            self._writers.discard(writer)
            self._tasks.discard(task)
            with contextlib.suppress(Exception):
                writer.close()

    async def _command(self, text: str, conn: _Conn) -> tuple[str, str | None]:
        """Handle one command; returns the reply and an action (None, "close" or "drop")."""
        try:
            cmd = parse_command(text)
        except ValueError as exc:
            return format_reply("0", ok=False, code="IISP", comment=str(exc), sid=self.sid), None
        try:
            data, action = await self._execute(cmd, conn)
        except _Reply as deny:
            return format_reply(cmd.ctag, ok=False, code=deny.code, comment=deny.comment,
                                sid=self.sid), None
        if action == "drop":
            return "", "drop"
        return format_reply(cmd.ctag, data=data, sid=self.sid), action

    async def _execute(self, cmd: Tl1Command, conn: _Conn) -> tuple[list[str], str | None]:
        device = self.device
        if cmd.verb == "ACT-USER":
            password = cmd.params[1] if len(cmd.params) > 1 else ""
            if not (hmac.compare_digest(cmd.aid.encode(), self.username.encode())
                    and hmac.compare_digest(password.encode(), self.password.encode())):
                raise _Reply("PIUI", "login incorrect")
            conn.user = cmd.aid
            return [], None
        if conn.user is None:
            raise _Reply("PLNA", "log in with ACT-USER first")
        if cmd.verb == "CANC-USER":
            conn.user = None
            return [], "close"
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
            loop = asyncio.get_running_loop()
            try:
                await loop.run_in_executor(None, lambda: device.perform(ops))
            except DeviceError as err:
                raise _Reply(err.tl1_code, err.message) from None
            if device.faults.take_drop():
                return [], "drop"
            return [], None
        raise _Reply("ICNV", f"command {cmd.verb} is not supported")

    def _all_ports(self, aid: str) -> list[int]:
        """The ports of ``aid`` (every port if blank), each checked against the switch size."""
        n = 2 * self.device.size
        ports = _ports(aid) if aid else list(range(1, n + 1))
        bad = [p for p in ports if not 1 <= p <= n]
        if bad:
            raise _Reply("IIAC", f"port {bad[0]} is out of range 1..{n}")
        return ports

    def _patch_ops(self, cmd: Tl1Command) -> list[EditOp]:
        device = self.device
        if cmd.verb == "ENT-PATCH":
            ins, sep, outs = cmd.aid.partition(",")
            if not sep:
                raise _Reply("IIAC", f"ENT-PATCH needs <in>,<out>, got {cmd.aid!r}")
            ingress, egress = _ports(ins), _ports(outs)
            if len(ingress) != len(egress):
                raise _Reply("IIAC", f"{len(ingress)} ingress but {len(egress)} egress ports")
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
                raise _Reply("IIAC", f"port {port} is out of range 1..{2 * device.size}")
            else:
                raise _Reply("IENE", f"no patch on port {port}")
        return ops
