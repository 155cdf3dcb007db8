"""Polatis NETCONF session (SSH, port 830) over ncclient.

One ncclient manager per device. On open, the hello's ``optical-switch`` capability gives the
module revision (and with it the list name ``pair`` or ``pairs``), ``product-information``
gives the size. A batch is one ``edit-config`` on ``running`` (deletes, then merges), with
``rollback-on-error`` when the device offers it, so that a refused batch changes nothing.
ncclient's exceptions are mapped onto :mod:`controller.drivers.polatis.errors`: a refused login, an
unreachable host, an RPC timeout, a dropped session, and ``rpc-error`` replies (the error-tag,
message and the ports named in the error-path or message are kept).

Host key: the switch's SSH host key is checked against the device's
:class:`~controller.drivers.hostkey.HostKeyPolicy` inside the SSH handshake, before the password
is sent (ncclient's own check reads only ``~/.ssh/known_hosts`` and hands its callback an MD5
fingerprint, so the session is built here with a checking subclass of ncclient's
``SSHSession``); a refused key is :class:`~controller.drivers.polatis.errors.DeviceHostKeyRefused`.
With ``insecure_skip_host_key`` every open logs a warning.

Latency: ncclient's transport thread sends queued requests only when its ``select`` wakes, every
``ncclient.transport.session.TICK`` (0.1 s), which adds up to 100 ms to each RPC -- four times a
Polatis switching time. Opening a session lowers that process-wide tick to ``POLL_INTERVAL_S``
(an idle wake-up every 5 ms costs nothing measurable).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from typing import Any

from controller.drivers.hostkey import HostKeyPolicy, HostKeyRefused, check_host_key
from controller.drivers.polatis import errors, xml
from controller.drivers.polatis.session import DeviceInfo, DeviceSession

log = logging.getLogger(__name__)

DEFAULT_PORT = 830
POLL_INTERVAL_S = 0.005
ROLLBACK_CAPABILITY = "urn:ietf:params:netconf:capability:rollback-on-error:1.0"


class NetconfSession(DeviceSession):
    """A NETCONF session to one Polatis switch."""

    def __init__(self, host: str, port: int = DEFAULT_PORT, *, username: str, password: str,
                 timeout_s: float = 10.0, host_key: HostKeyPolicy | None = None,
                 config_key: str = "ocs") -> None:
        super().__init__("netconf", host, port, username=username, password=password,
                         timeout_s=timeout_s)
        #: how the switch's SSH host key is checked (default: not pinned, so refused)
        self.host_key = host_key or HostKeyPolicy()
        self._config_key = config_key
        self.revision: str | None = None
        self.list_name = "pair"
        self._mgr: Any = None
        self._rollback = False

    @property
    def connected(self) -> bool:
        return self._mgr is not None and bool(self._mgr.connected)

    def open(self) -> DeviceInfo:
        from ncclient.transport import session as nc_session
        from ncclient.transport.errors import AuthenticationError, SSHError, TransportError

        nc_session.TICK = min(nc_session.TICK, POLL_INTERVAL_S)  # see the module docstring
        self.close()
        if self.host_key.insecure_skip:
            log.warning("%s: the switch's SSH host key is NOT checked "
                        "(insecure_skip_host_key: true); anyone on the management network "
                        "could pose as the switch and be handed its password", self.name)
        refused: list[HostKeyRefused] = []
        try:
            self._mgr = _connect(self, refused)
        except AuthenticationError as exc:
            raise errors.DeviceAuthError(self.name, f"login as {self.username!r} refused") from exc
        except SSHError as exc:
            if refused:
                raise errors.DeviceHostKeyRefused(self.name, str(refused[0])) from None
            raise errors.DeviceUnreachable(self.name, f"cannot open an SSH session: {exc}") from exc
        except (TransportError, OSError) as exc:
            raise errors.DeviceUnreachable(self.name, f"NETCONF session failed: {exc}") from exc
        self._mgr.timeout = self.timeout_s
        caps = [str(c) for c in self._mgr.server_capabilities]
        revision = xml.optical_switch_revision(caps)
        if revision is None:
            self.close()
            raise errors.DeviceProtocolError(
                self.name, "hello does not announce the optical-switch YANG module "
                f"({xml.OPSW_NS}); not a Polatis switch?")
        self.revision = revision
        self.list_name = xml.pair_list_name(revision)
        self._rollback = ROLLBACK_CAPABILITY in caps
        try:
            info = xml.parse_product_information(self._get(xml.product_information_filter()))
        except ValueError as exc:
            self.close()
            raise errors.DeviceProtocolError(self.name, f"product-information: {exc}") from exc
        return DeviceInfo(model=info.model, ingress_ports=info.ingress_ports,
                          egress_ports=info.egress_ports, protocol="netconf",
                          revision=revision, serial=info.serial, software=info.software)

    def read_pairs(self) -> dict[int, int]:
        return xml.parse_pairs(self._get(xml.crossconnects_filter()))

    def edit(self, delete_ingress: Sequence[int], add: Sequence[tuple[int, int]]) -> None:
        if not delete_ingress and not add:
            return
        config = xml.edit_crossconnects(add, delete_ingress, self.list_name)
        ports = [*delete_ingress, *(p for pair in add for p in pair)]
        self._call("edit-config", ports, lambda m: m.edit_config(
            target="running", config=config,
            error_option="rollback-on-error" if self._rollback else None))

    def power_dbm(self) -> dict[int, float]:
        return xml.parse_opm_power(self._get(xml.opm_power_filter()))

    def port_status(self) -> dict[int, str]:
        return xml.parse_port_status(self._get(xml.port_config_filter()))

    def close(self, *, graceful: bool = True) -> None:
        """Log out (``close-session`` unless the session is known lost) and disconnect."""
        mgr, self._mgr = self._mgr, None
        if mgr is None:
            return
        # Closing must not raise: the session may already be gone.
        with contextlib.suppress(Exception):
            if graceful and mgr.connected:
                mgr.timeout = min(self.timeout_s, 2.0)
                mgr.close_session()
        with contextlib.suppress(Exception):
            mgr._session.close()  # stop ncclient's transport thread now

    # ---

    def _get(self, subtree: str) -> Any:
        return self._call("get", (), lambda m: m.get(filter=("subtree", subtree))).data_ele

    def _call(self, what: str, ports: Sequence[int], fn: Any) -> Any:
        from ncclient.operations.errors import TimeoutExpiredError
        from ncclient.operations.rpc import RPCError
        from ncclient.transport.errors import TransportError

        mgr = self._mgr
        if mgr is None or not mgr.connected:
            self._mgr = None
            raise errors.DeviceSessionLost(self.name, f"{what}: not connected")
        try:
            return fn(mgr)
        except RPCError as exc:
            raise self._rejected(what, exc, ports) from exc
        except TimeoutExpiredError as exc:
            self.close(graceful=False)  # a late reply must not be taken for the next request's
            raise errors.DeviceTimeout(self.name, f"no reply to {what} within "
                                       f"{self.timeout_s:g} s") from exc
        except (TransportError, OSError, EOFError) as exc:
            self.close(graceful=False)
            raise errors.DeviceSessionLost(self.name, f"session lost during {what}: "
                                           f"{exc or type(exc).__name__}") from exc
        except errors.PolatisError:
            raise
        except Exception as exc:  # ncclient raises bare errors when the transport vanishes
            if not mgr.connected:
                self.close(graceful=False)
                raise errors.DeviceSessionLost(self.name, f"session lost during {what}: "
                                               f"{exc}") from exc
            raise

    def _rejected(self, what: str, exc: Any, ports: Sequence[int]) -> errors.DeviceRejected:
        tag = str(getattr(exc, "tag", None) or "rpc-error")
        message = str(getattr(exc, "message", None) or exc).strip()
        named = xml.ports_in_error(getattr(exc, "path", None), message)
        return errors.DeviceRejected(self.name, f"{what} refused: {message}", code=tag,
                                     ports=[p for _kind, p in named] or list(ports))


def _connect(session: NetconfSession, refused: list[HostKeyRefused]) -> Any:
    """An ncclient manager whose SSH handshake checks the host key by ``session.host_key``
    (as ``ncclient.manager.connect_ssh`` builds one, with a checking ``SSHSession``); a
    refusal is appended to ``refused`` and ends the handshake before authentication."""
    from ncclient import manager, operations
    from ncclient.transport.ssh import SSHSession

    class _CheckedSSHSession(SSHSession):
        def load_known_hosts(self, filename: str | None = None) -> None:
            """Read no ``~/.ssh/known_hosts``: the policy alone decides."""

        def check(self, _host: str, _md5: str) -> bool:
            key = self._transport.get_remote_server_key()
            try:
                check_host_key(session.host_key, session.host, session.port, key.get_name(),
                               key.asbytes(), key=session._config_key)
            except HostKeyRefused as exc:
                refused.append(exc)
                return False
            return True

    handler = manager.make_device_handler(None, [])
    handler.add_additional_netconf_params({})  # as connect_ssh: no extra capabilities
    ssh = _CheckedSSHSession(handler)
    try:
        ssh.connect(host=session.host, port=session.port, username=session.username,
                    password=session._password, hostkey_verify=True,
                    unknown_host_cb=ssh.check, look_for_keys=False, allow_agent=False,
                    timeout=session.timeout_s)
    except Exception:
        if ssh.transport:
            ssh.close()
        raise
    return manager.Manager(ssh, handler, timeout=session.timeout_s,
                           raise_mode=operations.RaiseMode.ALL)
