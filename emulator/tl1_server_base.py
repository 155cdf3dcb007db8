"""What every simulated vendor's TL1 agent shares: the asyncio TCP lifecycle, the client loop
(``;``-framed commands, slow replies, dropped lines), the reply framing and the login gate.

A vendor server subclasses :class:`Tl1ServerBase` and implements only :meth:`~Tl1ServerBase._serve`,
its commands after login; it raises :class:`Tl1Deny` for a DENY and hands each switch edit to
:meth:`~Tl1ServerBase._apply_edit`, which applies it off the loop and plays the drop fault.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import hmac
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from controller.drivers.polatis.tl1 import Tl1Command, format_reply, parse_command
from emulator.polatis.model import DeviceError
from emulator.polatis.server import BackgroundServer

#: what a command's handling returns: the reply's data lines and an action
#: (None, "close" after the reply, or "drop" the line without one)
Tl1Result = tuple[list[str], str | None]


class Tl1Faults(Protocol):
    """The fault knobs the shared loop plays (both vendors' fault classes have them)."""

    @property
    def reply_delay_s(self) -> float: ...

    def take_drop(self) -> bool: ...


class Tl1Device(Protocol):
    @property
    def faults(self) -> Tl1Faults: ...


DeviceT = TypeVar("DeviceT", bound=Tl1Device)


@dataclass
class Tl1Conn:
    """One TCP session's state: who logged in (None before ACT-USER)."""

    user: str | None = None


class Tl1Deny(Exception):
    """A DENY to send back, with its TL1 error code and comment."""

    def __init__(self, code: str, comment: str) -> None:
        self.code = code
        self.comment = comment
        super().__init__(f"{code}: {comment}")


class Tl1ServerBase(BackgroundServer, Generic[DeviceT]):
    """TL1 over TCP for one simulated device; subclasses implement :meth:`_serve`."""

    #: the comment of the PLNA DENY for a command sent before ACT-USER
    login_required_comment = "Login Not Active"

    def __init__(self, device: DeviceT, *, host: str, port: int, username: str, password: str,
                 sid: str) -> None:
        super().__init__(host, port)
        self.device = device
        self.username = username
        self.password = password
        self.sid = sid
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[Any]] = set()

    @abc.abstractmethod
    async def _serve(self, cmd: Tl1Command) -> Tl1Result:
        """Handle one vendor command from a logged-in session (raise :class:`Tl1Deny`)."""

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
        conn = Tl1Conn()
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

    async def _command(self, text: str, conn: Tl1Conn) -> tuple[str, str | None]:
        """Handle one command; returns the reply and an action (None, "close" or "drop")."""
        try:
            cmd = parse_command(text)
        except ValueError as exc:
            return format_reply("0", ok=False, code="IISP", comment=str(exc), sid=self.sid), None
        try:
            data, action = await self._execute(cmd, conn)
        except Tl1Deny as deny:
            return format_reply(cmd.ctag, ok=False, code=deny.code, comment=deny.comment,
                                sid=self.sid), None
        if action == "drop":
            return "", "drop"
        return format_reply(cmd.ctag, data=data, sid=self.sid), action

    async def _execute(self, cmd: Tl1Command, conn: Tl1Conn) -> Tl1Result:
        """The login gate (ACT-USER, CANC-USER, PLNA before login), then :meth:`_serve`."""
        if cmd.verb == "ACT-USER":
            password = cmd.params[1] if len(cmd.params) > 1 else ""
            if not (hmac.compare_digest(cmd.aid.encode(), self.username.encode())
                    and hmac.compare_digest(password.encode(), self.password.encode())):
                raise Tl1Deny("PIUI", "login incorrect")
            conn.user = cmd.aid
            return [], None
        if conn.user is None:
            raise Tl1Deny("PLNA", self.login_required_comment)
        if cmd.verb == "CANC-USER":
            conn.user = None
            return [], "close"
        return await self._serve(cmd)

    async def _apply_edit(self, edit: Callable[[], object]) -> Tl1Result:
        """Apply a switch edit off the loop (it may wait out the switching time); a refused one
        is a DENY with the device's code, an applied one may drop the line (the drop fault)."""
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, edit)
        except DeviceError as err:
            raise Tl1Deny(err.tl1_code, err.message) from None
        if self.device.faults.take_drop():
            return [], "drop"
        return [], None
