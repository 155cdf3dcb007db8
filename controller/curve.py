"""Who may talk to the Opus service: ZeroMQ CURVE keys, and when they are required.

``opus-testbed keys`` (:func:`make_keys`) writes, into a directory only the user can read
(mode 700; secret files 600)::

    ~/.opus/keys/
      server.key          server.key_secret        the service's key pair
      client.key          client.key_secret        a client's (the shims', the runner's)
      authorized_clients/client.key                 public keys the service lets in

The files are in ZeroMQ's certificate format (``zmq.auth.load_certificate`` reads them). A
client needs ``server.key`` and its own pair; the service needs its pair and
``authorized_clients/``. Another client is let in by copying its public ``.key`` file there.

**When authentication is required** (:func:`needs_auth`): whenever the service binds an
address outside loopback and the run's own namespaces. Loopback is ``127.0.0.0/8``, ``::1``
and ``localhost``; ``ipc://`` and ``inproc://`` endpoints are local too. The run's own
namespaces are the emulated run's frontend network (``198.18.<slot>.0/24``,
:func:`emulator.naming.frontend_network`): the Mininet hosts of that run are its only other
members, and the service binds the root namespace's end of it. (Linux accepts a packet for a
local address on any interface: a machine on the same link that routes ``198.18.0.0/15`` to
this one could reach that address; ``docs/security.md`` says what to do on a shared
network.) Anything else -- ``*``, ``0.0.0.0``, a lab address -- needs keys;
a service without them refuses to start (:class:`AuthRequired`).

A client without a valid key never reaches the core: ZeroMQ ends its handshake (a client
without CURVE fails the handshake; a key not in ``authorized_clients`` is denied by the ZAP
handler, :class:`CurveServer`), and each refusal is logged with the peer's address.
Secret keys never appear in messages, logs or ``repr``: only public keys' fingerprints do.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq

log = logging.getLogger(__name__)

DEFAULT_KEYS_DIR = Path("~/.opus/keys")
KEYS_DIR_ENV = "OPUS_KEYS_DIR"
AUTHORIZED = "authorized_clients"
ZAP_DOMAIN = "opus"
#: a refusal of one kind from one host is logged at most this often (its retries are counted)
REFUSAL_LOG_INTERVAL_S = 10.0


class AuthRequired(RuntimeError):
    """The service would bind an address others can reach, and has no keys."""


class KeysError(ValueError):
    """A keys directory that is missing, unsafe (readable by others) or malformed."""


def keys_dir(path: str | Path | None = None) -> Path:
    """``path``, else ``$OPUS_KEYS_DIR``, else ``~/.opus/keys``."""
    chosen = path or os.environ.get(KEYS_DIR_ENV) or DEFAULT_KEYS_DIR
    return Path(chosen).expanduser()


def key_fingerprint(public_z85: bytes | str) -> str:
    """A short, public name for a public key (SHA-256 of its Z85 text, 16 hex digits)."""
    text = public_z85 if isinstance(public_z85, bytes) else public_z85.encode()
    return hashlib.sha256(text).hexdigest()[:16]


# --- the rule ---------------------------------------------------------------------------------

def endpoint_host(endpoint: str) -> tuple[str, str]:
    """``(transport, host)`` of a ZeroMQ endpoint (``tcp://HOST:PORT`` -> ``("tcp", HOST)``)."""
    transport, sep, rest = endpoint.partition("://")
    if not sep:
        raise ValueError(f"not a ZeroMQ endpoint (transport://address): {endpoint!r}")
    if transport != "tcp":
        return transport, rest
    host = rest.rpartition(":")[0] if ":" in rest else rest
    if ";" in host:  # tcp://SOURCE;DEST: the destination binds
        host = host.rpartition(";")[2]
    return transport, host.strip("[]")


def needs_auth(endpoint: str, trusted_networks: Iterable[str] = ()) -> bool:
    """Whether binding ``endpoint`` needs CURVE: True unless it is loopback, local IPC, or
    an address inside ``trusted_networks`` (the run's own frontend network)."""
    transport, host = endpoint_host(endpoint)
    if transport in ("ipc", "inproc"):
        return False
    if transport != "tcp":
        return True
    if host == "localhost":
        return False
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:  # `*`, an interface name, a host name: not provably local
        return True
    if addr.is_loopback:
        return False
    return not any(addr in ipaddress.ip_network(net, strict=False) for net in trusted_networks)


# --- key files -------------------------------------------------------------------------------

@dataclass(frozen=True)
class KeyPair:
    """A CURVE key pair in Z85 text; ``secret`` never shows in ``repr``."""

    public: bytes
    secret: bytes = field(repr=False)

    @property
    def fingerprint(self) -> str:
        return key_fingerprint(self.public)


@dataclass(frozen=True)
class ServerKeys:
    pair: KeyPair
    authorized: frozenset[bytes]  # public keys (Z85) of the clients let in


@dataclass(frozen=True)
class ClientKeys:
    pair: KeyPair
    server_public: bytes


def _write(path: Path, text: str, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(path, mode)


def _cert(public: bytes, secret: bytes | None) -> str:
    kind = "Secret" if secret is not None else "Public"
    lines = [f"#   ZeroMQ CURVE {kind} Certificate (opus-testbed keys)",
             "#   DO NOT PROVIDE THIS FILE TO OTHER USERS" if secret is not None
             else "#   A public key: give it to whoever must know this party",
             "", "metadata", "curve", f'    public-key = "{public.decode()}"']
    if secret is not None:
        lines.append(f'    secret-key = "{secret.decode()}"')
    return "\n".join(lines) + "\n"


def make_keys(directory: str | Path | None = None, *, force: bool = False) -> Path:
    """Write a server and a client key pair into ``directory`` (see the module docstring);
    refuses to replace existing keys unless ``force``. Returns the directory."""
    if not zmq.has("curve"):
        raise KeysError("this libzmq was built without CURVE (zmq.has('curve') is False)")
    d = keys_dir(directory)
    if (d / "server.key_secret").exists() and not force:
        raise KeysError(f"{d} already holds keys; pass --force to replace them (clients "
                        "holding the old server key will then be refused)")
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(d, 0o700)
    (d / AUTHORIZED).mkdir(exist_ok=True, mode=0o700)
    os.chmod(d / AUTHORIZED, 0o700)
    for name in ("server", "client"):
        public, secret = zmq.curve_keypair()
        _write(d / f"{name}.key_secret", _cert(public, secret), 0o600)
        _write(d / f"{name}.key", _cert(public, None), 0o644)
        if name == "client":
            _write(d / AUTHORIZED / "client.key", _cert(public, None), 0o644)
    return d


def _private_dir(d: Path) -> None:
    try:
        mode = d.stat().st_mode
    except OSError as exc:
        raise KeysError(f"no keys directory {d} ({exc.strerror or exc}); make one with "
                        f"`opus-testbed keys --dir {d}`") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeysError(f"{d} is accessible by group or others (mode {stat.S_IMODE(mode):o}); "
                        f"run `chmod 700 {d}`")


def _read_cert(path: Path, *, secret: bool) -> KeyPair:
    try:
        mode = path.stat().st_mode
        text = path.read_text()
    except OSError as exc:
        raise KeysError(f"cannot read {path}: {exc.strerror or exc}") from None
    if secret and mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeysError(f"{path} is accessible by group or others (mode "
                        f"{stat.S_IMODE(mode):o}); run `chmod 600 {path}`")
    values: dict[str, bytes] = {}
    for line in text.splitlines():
        name, sep, value = line.strip().partition("=")
        if sep and name.strip() in ("public-key", "secret-key"):
            values[name.strip()] = value.strip().strip('"').encode()
    public = values.get("public-key", b"")
    if len(public) != 40 or (secret and len(values.get("secret-key", b"")) != 40):
        raise KeysError(f"{path} is not a ZeroMQ CURVE certificate "
                        f"({'secret' if secret else 'public'} key file)")
    return KeyPair(public, values.get("secret-key", b""))


def load_server_keys(directory: str | Path | None = None) -> ServerKeys:
    d = keys_dir(directory)
    _private_dir(d)
    pair = _read_cert(d / "server.key_secret", secret=True)
    authorized = frozenset(_read_cert(p, secret=False).public
                           for p in sorted((d / AUTHORIZED).glob("*.key")))
    return ServerKeys(pair, authorized)


def load_client_keys(directory: str | Path | None = None) -> ClientKeys:
    d = keys_dir(directory)
    _private_dir(d)
    return ClientKeys(_read_cert(d / "client.key_secret", secret=True),
                      _read_cert(d / "server.key", secret=False).public)


def client_socket(sock: zmq.Socket[Any], keys: ClientKeys | None) -> None:
    """Make ``sock`` (before connect) a CURVE client with ``keys`` (None: plain)."""
    if keys is None:
        return
    sock.curve_secretkey = keys.pair.secret
    sock.curve_publickey = keys.pair.public
    sock.curve_serverkey = keys.server_public


# --- the service's side ------------------------------------------------------------------------

class _Provider:
    """ZAP credentials callback: lets in the authorized public keys, reports every other."""

    def __init__(self, server: CurveServer) -> None:
        self.server = server

    def callback(self, domain: str, key: bytes) -> bool:
        if key in self.server.keys.authorized:
            return True
        self.server._refuse(f"client key {key_fingerprint(key)} is not in {AUTHORIZED}",
                            self.server._zap_peer)
        return False


class CurveServer:
    """CURVE on one bound socket: the ZAP handler (authorized keys only) and a monitor that
    logs the handshakes refused. ``on_refused(reason, peer)`` is called from their threads.
    """

    def __init__(self, ctx: zmq.Context[Any], keys: ServerKeys,
                 on_refused: Callable[[str, str], None]) -> None:
        from zmq.auth.thread import ThreadAuthenticator

        owner = self

        class _Authenticator(ThreadAuthenticator):
            async def handle_zap_message(self, msg: list[bytes]) -> None:
                # the peer's address, for the refusal's log line (one request at a time)
                owner._zap_peer = msg[3].decode(errors="replace") if len(msg) > 3 else ""
                await super().handle_zap_message(msg)

        self.keys = keys
        self.refused = 0
        self._zap_peer = ""
        self._on_refused = on_refused
        self._lock = threading.Lock()
        self._logged: dict[tuple[str, str], tuple[float, int]] = {}
        self._auth = _Authenticator(ctx, log=logging.getLogger(f"{__name__}.zap"))
        self._auth.start()
        self._auth.configure_curve_callback(ZAP_DOMAIN, credentials_provider=_Provider(self))
        self._monitor: zmq.Socket[Any] | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def secure(self, sock: zmq.Socket[Any]) -> None:
        """Make ``sock`` (before bind) a CURVE server and watch its handshakes."""
        sock.curve_server = True
        sock.curve_secretkey = self.keys.pair.secret
        sock.curve_publickey = self.keys.pair.public
        sock.zap_domain = ZAP_DOMAIN.encode()
        events = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                  | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
        self._monitor = sock.get_monitor_socket(events)
        self._thread = threading.Thread(target=self._watch, args=(self._monitor,),
                                        name="opus-curve-monitor", daemon=True)
        self._thread.start()

    def _refuse(self, reason: str, peer: str) -> None:
        """Count a refusal; log it and tell ``on_refused``, at most once per
        :data:`REFUSAL_LOG_INTERVAL_S` per (reason, peer): a refused client's ZeroMQ retries
        every 0.1 s. ``peer`` is the client's address where known (ZAP gives it)."""
        now = time.monotonic()
        with self._lock:
            self.refused += 1
            last, quiet = self._logged.get((reason, peer), (-1e9, 0))
            if now - last < REFUSAL_LOG_INTERVAL_S:
                self._logged[(reason, peer)] = (last, quiet + 1)
                return
            self._logged[(reason, peer)] = (now, 0)
        more = f" ({quiet} more since the last report)" if quiet else ""
        log.warning("refused a client%s: %s%s", f" from {peer}" if peer else "", reason, more)
        self._on_refused(reason + more, peer)

    def _watch(self, monitor: zmq.Socket[Any]) -> None:
        from zmq.utils.monitor import recv_monitor_message

        while not self._stop.is_set():
            if not monitor.poll(100):
                continue
            try:
                msg = recv_monitor_message(monitor)
            except zmq.ZMQError:
                return
            event = int(msg["event"])
            if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                continue  # the ZAP handler named the key already
            # libzmq names the connection by its local end here; only ZAP sees the peer
            endpoint = msg.get("endpoint", b"")
            local = (endpoint.decode(errors="replace") if isinstance(endpoint, bytes)
                     else str(endpoint))
            reason = ("handshake failed: not a CURVE client of this server's public key"
                      if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL else
                      "handshake failed: the client hung up or spoke no ZMTP")
            self._refuse(f"{reason} (connection to {local})", "")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)
        if self._monitor is not None:
            self._monitor.close(0)
        self._auth.stop()

