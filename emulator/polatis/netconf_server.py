"""The device's NETCONF agent: SSH (asyncssh) subsystem ``netconf``, RFC 6241/6242.

Per session: our hello (base:1.0, base:1.1 unless disabled, writable-running,
rollback-on-error, and the ``optical-switch`` module at the device's revision), the client's
hello, then ``]]>]]>`` framing or chunked framing once both sides announce base:1.1. RPCs:
``get`` and ``get-config`` (subtree filters), ``edit-config`` on ``running`` (merge, create,
replace, delete, remove; atomic: a refused edit changes nothing), ``lock``/``unlock`` (accepted),
``close-session``, ``kill-session``. Faults from ``device.faults`` apply to every session: slow
replies, and a session dropped right after an applied edit, before its reply.

Host key: stable, so that clients can pin it (``host_key_fingerprint``). By default every
server of one process presents the same Ed25519 key (:func:`process_host_key`, made once);
``host_key=PATH`` loads the key from an OpenSSH private key file, or creates it there (mode
600) if absent, so a simulator keeps its key across restarts (``opus-testbed ocs simulate
--host-key FILE``). :attr:`NetconfServer.host_key_fingerprint` is what a client pins.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import os
import threading
from pathlib import Path
from typing import Any

import asyncssh
from lxml import etree

from controller.drivers.hostkey import fingerprint_sha256
from controller.drivers.polatis.xml import NC_NS, capability
from emulator.polatis.datastore import parse_edit, render, rpc_error, subtree_filter
from emulator.polatis.framing import FrameError, Framer, encode
from emulator.polatis.model import DeviceError, PolatisDevice
from emulator.polatis.server import BackgroundServer

BASE_10 = "urn:ietf:params:netconf:base:1.0"
BASE_11 = "urn:ietf:params:netconf:base:1.1"
EXTRA_CAPABILITIES = (
    "urn:ietf:params:netconf:capability:writable-running:1.0",
    "urn:ietf:params:netconf:capability:rollback-on-error:1.0",
)
_PARSER = etree.XMLParser(resolve_entities=False, no_network=True, remove_blank_text=True)


def _nc(tag: str) -> str:
    return f"{{{NC_NS}}}{tag}"


_PROCESS_KEY: asyncssh.SSHKey | None = None
_PROCESS_KEY_LOCK = threading.Lock()


def process_host_key() -> asyncssh.SSHKey:
    """The Ed25519 host key every simulator of this process presents unless given another."""
    global _PROCESS_KEY
    with _PROCESS_KEY_LOCK:
        if _PROCESS_KEY is None:
            _PROCESS_KEY = asyncssh.generate_private_key("ssh-ed25519")
        return _PROCESS_KEY


def load_host_key(path: str | Path) -> asyncssh.SSHKey:
    """The host key in ``path`` (OpenSSH private key), created there with mode 600 if absent."""
    path = Path(path).expanduser()
    if path.exists():
        return asyncssh.read_private_key(str(path))
    key = asyncssh.generate_private_key("ssh-ed25519")
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(key.export_private_key("openssh"))
    return key


def host_key_fingerprint(key: asyncssh.SSHKey) -> str:
    """OpenSSH's ``SHA256:...`` fingerprint of ``key``'s public half."""
    return fingerprint_sha256(key.public_data)


class _Drop(Exception):
    """Fault injection: abort the session without a reply."""


class _Auth(asyncssh.SSHServer):
    def __init__(self, owner: NetconfServer) -> None:
        self._owner = owner
        self._conn: Any = None

    def connection_made(self, conn: Any) -> None:
        self._conn = conn
        self._owner._conns.add(conn)

    def connection_lost(self, exc: Exception | None) -> None:
        self._owner._conns.discard(self._conn)

    def begin_auth(self, username: str) -> bool:
        return True

    def password_auth_supported(self) -> bool:
        return True

    def validate_password(self, username: str, password: str) -> bool:
        self._owner.password_attempts += 1
        ok_user = hmac.compare_digest(username.encode(), self._owner.username.encode())
        ok_pass = hmac.compare_digest(password.encode(), self._owner.password.encode())
        return ok_user and ok_pass


class NetconfServer(BackgroundServer):
    """NETCONF over SSH for one :class:`PolatisDevice`."""

    def __init__(self, device: PolatisDevice, *, host: str = "127.0.0.1", port: int = 0,
                 username: str = "admin", password: str = "root", base11: bool = True,
                 host_key: asyncssh.SSHKey | str | Path | None = None) -> None:
        super().__init__(host, port)
        self.device = device
        self.host_key = (process_host_key() if host_key is None else
                         host_key if isinstance(host_key, asyncssh.SSHKey) else
                         load_host_key(host_key))
        self.username = username
        self.password = password
        self.base11 = base11
        self.sessions_opened = 0
        self.password_attempts = 0  # logins tried: a client that refused our key sends none
        self._ids = itertools.count(1)
        self._acceptor: Any = None
        self._conns: set[Any] = set()
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def host_key_fingerprint(self) -> str:
        """What a client pins (``ocs.host_key_fingerprint``)."""
        return host_key_fingerprint(self.host_key)

    @property
    def host_key_type(self) -> str:
        return str(self.host_key.get_algorithm())

    def capabilities(self) -> list[str]:
        caps = [BASE_10, *([BASE_11] if self.base11 else []), *EXTRA_CAPABILITIES,
                capability(self.device.revision)]
        return caps

    async def _start(self) -> int:
        self._acceptor = await asyncssh.create_server(
            lambda: _Auth(self), self.host, self.port, server_host_keys=[self.host_key],
            process_factory=self._process, encoding=None, allow_scp=False,
            agent_forwarding=False, x11_forwarding=False, line_editor=False)
        return int(self._acceptor.get_port())

    async def _stop(self) -> None:
        if self._acceptor is not None:
            self._acceptor.close()
        for conn in list(self._conns):
            conn.abort()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._acceptor is not None:
            await self._acceptor.wait_closed()

    async def _process(self, process: asyncssh.SSHServerProcess[bytes]) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            if process.subsystem != "netconf":
                process.stderr.write(b"only the netconf subsystem is served here\n")
                process.exit(1)
                return
            await self._session(process)
        except (asyncio.CancelledError, _Drop, FrameError, OSError,
                asyncssh.Error, BrokenPipeError):
            process.get_extra_info("connection").abort()
        finally:
            self._tasks.discard(task)

    async def _session(self, process: asyncssh.SSHServerProcess[bytes]) -> None:
        session_id = next(self._ids)
        self.sessions_opened += 1
        hello = etree.Element(_nc("hello"), nsmap={None: NC_NS})
        caps = etree.SubElement(hello, _nc("capabilities"))
        for cap in self.capabilities():
            etree.SubElement(caps, _nc("capability")).text = cap
        etree.SubElement(hello, _nc("session-id")).text = str(session_id)
        process.stdout.write(encode(etree.tostring(hello, xml_declaration=True,
                                                   encoding="UTF-8"), chunked=False))
        framer = Framer()
        got_hello = False
        while True:
            data = await process.stdin.read(65536)
            if not data:
                break
            framer.feed(data)
            while (msg := framer.pop()) is not None:
                if not got_hello:
                    framer.chunked = self._client_hello(msg)
                    got_hello = True
                    continue
                reply, close = await self._rpc(msg, session_id)
                if self.device.faults.reply_delay_s:
                    await asyncio.sleep(self.device.faults.reply_delay_s)
                process.stdout.write(encode(reply, chunked=framer.chunked))
                await process.stdout.drain()
                if close:
                    process.exit(0)
                    return
        process.exit(0)

    def _client_hello(self, msg: bytes) -> bool:
        """Parse the client's hello; True when both sides speak base:1.1 (chunked framing)."""
        try:
            root = etree.fromstring(msg, _PARSER)
        except etree.XMLSyntaxError as exc:
            raise FrameError(f"client hello is not XML: {exc}") from None
        if root.tag != _nc("hello"):
            raise FrameError(f"expected the client's hello, got {root.tag}")
        caps = {(c.text or "").strip() for c in root.iter(_nc("capability"))}
        return self.base11 and BASE_11 in caps

    async def _rpc(self, msg: bytes, session_id: int) -> tuple[bytes, bool]:
        """Handle one RPC; returns the reply bytes and whether to end the session."""
        reply = etree.Element(_nc("rpc-reply"), nsmap={None: NC_NS})
        try:
            root = etree.fromstring(msg, _PARSER)
        except etree.XMLSyntaxError as exc:
            reply.append(rpc_error(DeviceError("malformed-message", f"not XML: {exc}")))
            return etree.tostring(reply), False
        for name, value in root.attrib.items():  # RFC 6241: echo the rpc's attributes
            reply.set(name, value)
        close = False
        try:
            if root.tag != _nc("rpc"):
                raise DeviceError("malformed-message", f"expected rpc, got {root.tag}")
            if root.get("message-id") is None:
                raise DeviceError("missing-attribute", "rpc without message-id")
            op = next((c for c in root if isinstance(c.tag, str)), None)
            if op is None:
                raise DeviceError("malformed-message", "empty rpc")
            name = etree.QName(op)
            if name.namespace != NC_NS:
                raise DeviceError("operation-not-supported",
                                  f"operation {name.localname} is not supported")
            close = await self._dispatch(name.localname, op, reply)
        except DeviceError as err:
            for child in list(reply):
                reply.remove(child)
            reply.append(rpc_error(err))
        return etree.tostring(reply), close

    async def _dispatch(self, op_name: str, op: etree._Element,
                        reply: etree._Element) -> bool:
        device = self.device
        if op_name in ("get", "get-config"):
            if op_name == "get-config":
                source = op.find(_nc("source"))
                if source is None or source.find(_nc("running")) is None:
                    raise DeviceError("invalid-value", "only the running datastore exists")
            filt = op.find(_nc("filter"))
            if filt is not None and filt.get("type", "subtree") != "subtree":
                raise DeviceError("operation-not-supported",
                                  f"filter type {filt.get('type')!r}: only subtree")
            nodes = render(device, device.clock(), config_only=op_name == "get-config")
            data = etree.SubElement(reply, _nc("data"))
            for node in subtree_filter(nodes, filt):
                data.append(node)
            return False
        if op_name == "edit-config":
            target = op.find(_nc("target"))
            if target is None or target.find(_nc("running")) is None:
                raise DeviceError("invalid-value", "only the running datastore is writable")
            config = next((c for c in op if isinstance(c.tag, str)
                           and etree.QName(c).localname == "config"), None)
            if config is None:
                raise DeviceError("missing-element", "edit-config without config")
            default = op.findtext(_nc("default-operation"), "merge").strip()
            ops, clear_first = parse_edit(config, list_name=device.list_name,
                                          revision=device.revision, default_operation=default)
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, lambda: device.perform(
                ops, clear_first=clear_first))
            if device.faults.take_drop():
                raise _Drop
            etree.SubElement(reply, _nc("ok"))
            return False
        if op_name in ("lock", "unlock", "discard-changes", "validate", "kill-session"):
            etree.SubElement(reply, _nc("ok"))
            return False
        if op_name == "close-session":
            etree.SubElement(reply, _nc("ok"))
            return True
        raise DeviceError("operation-not-supported", f"operation {op_name} is not supported")
