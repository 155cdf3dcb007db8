"""Errors of the Polatis hardware drivers: each names the device and, where known, the ports.

A :class:`PolatisError` is a device or transport fault, never a rule violation: rule
violations found before anything is sent are :class:`controller.ocs.ReconfigurationRejected`.
After any :class:`PolatisError` during a reconfiguration the driver re-reads the device's
cross-connects before it sends anything else (see :mod:`controller.drivers.polatis.driver`).
"""

from __future__ import annotations

from collections.abc import Sequence


class PolatisError(RuntimeError):
    """A Polatis device could not be reached, refused us, or failed mid-operation."""

    def __init__(self, device: str, reason: str) -> None:
        self.device = device
        self.reason = reason
        super().__init__(f"{device}: {reason}")


class DeviceUnreachable(PolatisError):
    """No TCP/SSH connection to the device (wrong host or port, device down, firewall)."""


class DeviceAuthError(PolatisError):
    """The device refused the credentials."""


class DeviceHostKeyRefused(PolatisError):
    """The switch's SSH host key is not pinned or not the pinned one; no password was sent."""


class DeviceTimeout(PolatisError):
    """The device did not answer within the configured ``timeout_s``."""


class DeviceSessionLost(PolatisError):
    """The management session dropped; an edit in flight may or may not have been applied."""


class DeviceProtocolError(PolatisError):
    """The device spoke something we do not understand (not a Polatis, unknown revision)."""


class DeviceMismatch(PolatisError):
    """The device is not the one configured: a different size, or rail ports it does not have."""


class DeviceRejected(PolatisError):
    """The device refused an edit (NETCONF ``rpc-error`` or TL1 ``DENY``).

    ``ports`` are rail ports when the driver could map them (``rail`` is then set), else the
    device's own port numbers; ``code`` is the NETCONF error-tag or the TL1 error code.
    """

    def __init__(self, device: str, reason: str, *, code: str, ports: Sequence[int] = (),
                 rail: int | None = None) -> None:
        self.code = code
        self.ports = tuple(sorted(set(ports)))
        self.rail = rail
        where = f"rail {rail}, " if rail is not None else ""
        port_text = ", ".join(str(p) for p in self.ports) or "?"
        super().__init__(device, f"{where}port(s) {port_text}: {reason} [{code}]")
        self.reason = reason
