"""Polatis TL1 over TCP (port 3082 by default): message forms, framing, and the client session.

Commands (``<ctag>`` is a correlation tag the reply echoes; blank fields stay blank)::

    ACT-USER::<user>:<ctag>::<password>;     log in
    ENT-PATCH::<in>,<out>:<ctag>:;           connect ingress <in> to egress <out>
    DLT-PATCH::<in>:<ctag>:;                 delete the patch on <in>
    RTRV-PATCH:::<ctag>:;                    list patches, one data line "<in>,<out>" each
    RTRV-NETYPE:::<ctag>:;                   "<vendor>,<model>,<type>,<version>" (size in model)
    RTRV-PORT-POWER::<a>&&<b>:<ctag>:;       "<port>:<dBm>" per port in a..b
    RTRV-PORT-SHUTTER::<a>&&<b>:<ctag>:;     "<port>:<state>" per port in a..b
    CANC-USER::<user>:<ctag>:;               log out

Port status over TL1 is the shutter state: ``OPEN`` (enabled; ``RLS-PORT-SHUTTER`` opens) or
``CLOSED`` (disabled; ``OPR-PORT-SHUTTER`` closes), as public Polatis TL1 clients use it (e.g.
QualiSystems/cloudshell-L1-polatis reads ``RTRV-PORT-SHUTTER:<tid>:1&&<2N>:<ctag>:;`` and parses
``"<port>:<state>"``). What a real switch prints there for a *failed* port is not in any source
found; the simulator prints ``FAILED``, the word its NETCONF ``port-config`` status uses, and
:func:`parse_port_shutter` passes any state other than OPEN/CLOSED through upper-cased, so the
driver calls a port failed only on ``FAILED``. Check this against the switch's TL1 manual.

A reply (GR-831 style) is a header line with the source id, date and time, then
``M  <ctag> COMPLD`` or ``M  <ctag> DENY``; a DENY's next line holds a four-letter error code;
data lines are quoted, comments are ``/* ... */``; a line holding ``;`` ends the reply. The
server side of the framing (:func:`parse_command`, :func:`format_reply`) lives here too, so the
simulator and the driver share one implementation of the wire format.

Error codes (GR-833 names) used by the simulator: ``IIAC`` invalid port, ``SAAS`` port already
in use, ``IENE`` no such patch, ``PLNA`` not logged in, ``PIUI`` bad login, ``ICNV`` unknown
command, ``IISP`` bad syntax. A real switch may use others for the same faults.
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from controller.drivers.polatis import errors
from controller.drivers.polatis.session import DeviceInfo, DeviceSession
from controller.drivers.polatis.xml import size_from_model

DEFAULT_PORT = 3082


# --- command forms -------------------------------------------------------------------------

def act_user(user: str, password: str, ctag: int | str) -> str:
    return f"ACT-USER::{user}:{ctag}::{password};"


def canc_user(user: str, ctag: int | str) -> str:
    return f"CANC-USER::{user}:{ctag}:;"


def ent_patch(ingress: int, egress: int, ctag: int | str) -> str:
    return f"ENT-PATCH::{int(ingress)},{int(egress)}:{ctag}:;"


def dlt_patch(ingress: int, ctag: int | str) -> str:
    return f"DLT-PATCH::{int(ingress)}:{ctag}:;"


def rtrv_patch(ctag: int | str) -> str:
    return f"RTRV-PATCH:::{ctag}:;"


def rtrv_netype(ctag: int | str) -> str:
    return f"RTRV-NETYPE:::{ctag}:;"


def rtrv_port_power(first: int, last: int, ctag: int | str) -> str:
    return f"RTRV-PORT-POWER::{int(first)}&&{int(last)}:{ctag}:;"


def rtrv_port_shutter(first: int, last: int, ctag: int | str) -> str:
    return f"RTRV-PORT-SHUTTER::{int(first)}&&{int(last)}:{ctag}:;"


#: RTRV-PORT-SHUTTER state -> port status (the NETCONF ``port-config`` word)
SHUTTER_STATUS = {"OPEN": "ENABLED", "CLOSED": "DISABLED"}


def shutter_state(status: str) -> str:
    """The RTRV-PORT-SHUTTER state a port of ``status`` (ENABLED, DISABLED, FAILED) shows."""
    return next((k for k, v in SHUTTER_STATUS.items() if v == status), status)


# --- replies -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Tl1Reply:
    """One parsed response: ``ok`` for COMPLD, else ``code`` holds the DENY error code."""

    ctag: str
    ok: bool
    code: str | None = None
    data: tuple[str, ...] = ()  # quoted lines, quotes removed
    comments: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        """The DENY explanation (comments joined), or the code alone."""
        return "; ".join(self.comments) or (self.code or "")


_HEADER_RE = re.compile(r"^M\s+(\S+)\s+(COMPLD|DENY)\s*$")


def parse_reply(message: str) -> Tl1Reply | None:
    """Parse one framed message; None for autonomous (``A``) or in-progress messages."""
    lines = [ln.rstrip() for ln in message.replace("\r", "").split("\n")]
    for i, line in enumerate(lines):
        m = _HEADER_RE.match(line.strip())
        if not m:
            continue
        ctag, status = m.group(1), m.group(2)
        data: list[str] = []
        comments: list[str] = []
        code: str | None = None
        for body in lines[i + 1:]:
            s = body.strip()
            if s == ";" or not s:
                continue
            if s.startswith("/*"):
                comments.append(s.removeprefix("/*").removesuffix("*/").strip())
            elif s.startswith('"'):
                data.append(s.strip('"'))
            elif status == "DENY" and code is None:
                code = s.split()[0]
        return Tl1Reply(ctag, status == "COMPLD", code, tuple(data), tuple(comments))
    return None


@dataclass
class Tl1Framer:
    """Cuts a text stream into messages, each ending with a line that holds only ``;``."""

    _buf: str = ""

    def feed(self, chunk: str) -> list[str]:
        """Add ``chunk``; return the messages it completed, in order."""
        self._buf += chunk
        out: list[str] = []
        while True:
            m = re.search(r"(?m)^[ \t]*;[ \t]*\r?$", self._buf)
            if not m:
                return out
            end = self._buf.find("\n", m.end())
            end = len(self._buf) if end < 0 else end + 1
            out.append(self._buf[:end])
            self._buf = self._buf[end:]


def parse_patches(data: Sequence[str]) -> dict[int, int]:
    """``ingress -> egress`` from RTRV-PATCH data lines ``"<in>,<out>"``."""
    out: dict[int, int] = {}
    for line in data:
        m = re.fullmatch(r"\s*(\d+)\s*,\s*(\d+)\s*", line)
        if m:
            out[int(m.group(1))] = int(m.group(2))
    return out


def parse_port_shutter(data: Sequence[str]) -> dict[int, str]:
    """``port -> status`` (ENABLED, DISABLED, or another state upper-cased, e.g. FAILED) from
    RTRV-PORT-SHUTTER data lines ``"<port>:<state>"``."""
    out: dict[int, str] = {}
    for line in data:
        m = re.fullmatch(r"\s*(\d+)\s*:\s*(\S+)\s*", line)
        if m:
            state = m.group(2).upper()
            out[int(m.group(1))] = SHUTTER_STATUS.get(state, state)
    return out


def parse_port_power(data: Sequence[str]) -> dict[int, float]:
    out: dict[int, float] = {}
    for line in data:
        m = re.fullmatch(r"\s*(\d+)\s*:\s*(-?[\d.]+)\s*", line)
        if m:
            out[int(m.group(1))] = float(m.group(2))
    return out


# --- server side of the wire format --------------------------------------------------------

@dataclass(frozen=True)
class Tl1Command:
    """A parsed input command ``VERB:TID:AID:CTAG:...:params;``."""

    verb: str
    tid: str
    aid: str
    ctag: str
    params: tuple[str, ...]


def parse_command(text: str) -> Tl1Command:
    """Parse one command (without the ``;``); raises ValueError on bad syntax."""
    fields = text.strip().split(":")
    if len(fields) < 4 or not fields[0] or not fields[3].strip():
        raise ValueError(f"bad TL1 syntax: {text.strip()!r}")
    return Tl1Command(fields[0].strip().upper(), fields[1].strip(), fields[2].strip(),
                      fields[3].strip(), tuple(f.strip() for f in fields[4:]))


def format_reply(ctag: str, *, ok: bool = True, code: str | None = None,
                 data: Sequence[str] = (), comment: str | None = None, sid: str = "POLATIS",
                 now_s: float | None = None) -> str:
    """A complete response message, ready to send."""
    stamp = time.strftime("%y-%m-%d %H:%M:%S", time.gmtime(now_s))
    lines = [f"\r\n\n   {sid} {stamp}", f"M  {ctag} {'COMPLD' if ok else 'DENY'}"]
    if not ok:
        lines.append(f"   {code or 'SROF'}")
    lines += [f'   "{d}"' for d in data]
    if comment:
        lines.append(f"   /* {comment} */")
    lines.append(";")
    return "\r\n".join(lines) + "\r\n"


# --- the client session --------------------------------------------------------------------

class Tl1Session(DeviceSession):
    """A logged-in TL1 session over one TCP connection; commands are serialised by a lock."""

    def __init__(self, host: str, port: int = DEFAULT_PORT, *, username: str, password: str,
                 timeout_s: float = 10.0) -> None:
        super().__init__("tl1", host, port, username=username, password=password,
                         timeout_s=timeout_s)
        self._sock: socket.socket | None = None
        self._framer = Tl1Framer()
        self._pending: list[str] = []
        self._ctag = 0
        self._lock = threading.Lock()
        self._size = 0

    @property
    def connected(self) -> bool:
        return self._sock is not None

    def _login(self) -> None:
        """Close any old connection, connect afresh and log in (ACT-USER); shared by every TL1
        vendor's :meth:`open`, which then reads the switch."""
        self.close()
        try:
            sock = socket.create_connection((self.host, self.port), timeout=self.timeout_s)
        except TimeoutError as exc:
            raise errors.DeviceUnreachable(self.name,
                                           f"no answer within {self.timeout_s:g} s") from exc
        except OSError as exc:
            raise errors.DeviceUnreachable(self.name,
                                           f"cannot connect: {exc.strerror or exc}") from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock = sock
        self._framer = Tl1Framer()
        self._pending = []
        reply = self._command(partial(act_user, self.username, self._password), check=False)
        if not reply.ok:
            self._drop()
            raise errors.DeviceAuthError(self.name, f"login as {self.username!r} refused "
                                         f"({reply.code}: {reply.text})")

    def open(self) -> DeviceInfo:
        self._login()
        netype = self._command(rtrv_netype)
        fields = next(iter(netype.data), "").split(",")
        size = next((s for s in map(size_from_model, fields) if s), None)
        if size is None:
            self.close()
            raise errors.DeviceProtocolError(self.name, f"cannot read the switch size from "
                                             f"RTRV-NETYPE {netype.data!r}")
        self._size = size[0]
        return DeviceInfo(model=fields[1] if len(fields) > 1 else fields[0],
                          ingress_ports=size[0], egress_ports=size[1], protocol="tl1",
                          software=fields[3] if len(fields) > 3 else "")

    def read_pairs(self) -> dict[int, int]:
        return parse_patches(self._command(rtrv_patch).data)

    def edit(self, delete_ingress: Sequence[int], add: Sequence[tuple[int, int]]) -> None:
        for ingress in delete_ingress:
            self._command(partial(dlt_patch, ingress), ports=(ingress,))
        for ingress, egress in add:
            self._command(partial(ent_patch, ingress, egress), ports=(ingress, egress))

    def power_dbm(self) -> dict[int, float]:
        if not self._size:
            return {}
        return parse_port_power(
            self._command(partial(rtrv_port_power, 1, 2 * self._size)).data)

    def port_status(self) -> dict[int, str]:
        """Status per device port from RTRV-PORT-SHUTTER; empty if the switch denies it."""
        if not self._size:
            return {}
        reply = self._command(partial(rtrv_port_shutter, 1, 2 * self._size), check=False)
        return parse_port_shutter(reply.data) if reply.ok else {}

    def close(self) -> None:
        if self._sock is None:
            return
        with contextlib.suppress(errors.PolatisError):
            self._command(partial(canc_user, self.username), check=False,
                          timeout_s=min(self.timeout_s, 2.0))
        self._drop()

    # ---

    def _drop(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()

    def _command(self, build: Callable[[str], str], *, check: bool = True,
                 ports: Sequence[int] = (), timeout_s: float | None = None) -> Tl1Reply:
        """Send one command (``build(ctag) -> text``) and wait for the reply with its ctag."""
        with self._lock:
            if self._sock is None:
                raise errors.DeviceSessionLost(self.name, "not connected")
            self._ctag += 1
            ctag = str(self._ctag)
            text = build(ctag)
            sock = self._sock
            deadline = time.monotonic() + (timeout_s or self.timeout_s)
            try:
                sock.sendall(text.encode() + b"\r\n")
                reply: Tl1Reply | None = None
                while reply is None:
                    for message in list(self._pending):
                        self._pending.remove(message)
                        parsed = parse_reply(message)  # others: autonomous or stale replies
                        if parsed is not None and parsed.ctag == ctag:
                            reply = parsed
                            break
                    if reply is not None:
                        break
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise TimeoutError
                    sock.settimeout(remaining)
                    chunk = sock.recv(65536)
                    if not chunk:
                        raise ConnectionResetError("device closed the connection")
                    self._pending.extend(self._framer.feed(chunk.decode(errors="replace")))
            except TimeoutError as exc:
                self._drop()
                raise errors.DeviceTimeout(self.name, f"no reply to {text.split(':')[0]} within "
                                           f"{timeout_s or self.timeout_s:g} s") from exc
            except OSError as exc:
                self._drop()
                raise errors.DeviceSessionLost(self.name, f"session lost during "
                                               f"{text.split(':')[0]}: {exc}") from exc
        if check and not reply.ok:
            raise errors.DeviceRejected(self.name, f"{text.split(':')[0]} denied: {reply.text}",
                                        code=reply.code or "DENY", ports=ports)
        return reply
