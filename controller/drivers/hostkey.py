"""Whether an SSH host key is the switch's: the policy a NETCONF session checks before it logs in.

A lab switch is pinned one of two ways in its ``ocs:`` mapping:

* ``host_key_fingerprint: "SHA256:..."`` -- the key's SHA-256 fingerprint as OpenSSH prints it
  (``ssh-keygen -lf key.pub``, or ``ssh-keyscan -p 830 HOST | ssh-keygen -lf -``);
* ``known_hosts: FILE`` -- an OpenSSH ``known_hosts`` file (``HOST`` or ``[HOST]:PORT`` lines,
  hashed or not) that must hold the key the switch offers.

With neither, the first connection is refused before the password is sent, and the error
names the fingerprint the switch offered and the key to set. ``insecure_skip_host_key: true``
accepts any key (the session then says so on every run). A key that differs from the pin is
always refused: someone may pose as the switch to be handed its password.

:func:`check_host_key` is pure (the key as its type name and wire blob); the NETCONF session
(:mod:`controller.drivers.polatis.netconf`) calls it from inside the SSH handshake, before
authentication.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from dataclasses import dataclass
from pathlib import Path

_FINGERPRINT_RE = re.compile(r"^SHA256:[A-Za-z0-9+/]{43}$")


class HostKeyRefused(Exception):
    """The switch's SSH host key is not pinned, or not the pinned one; nothing was sent."""


@dataclass(frozen=True)
class HostKeyPolicy:
    """How one switch's host key is checked (at most one of the three is set)."""

    fingerprint: str | None = None  # "SHA256:..." (OpenSSH's form)
    known_hosts: Path | None = None
    insecure_skip: bool = False

    @property
    def pinned(self) -> bool:
        return self.fingerprint is not None or self.known_hosts is not None

    def describe(self) -> str:
        if self.fingerprint is not None:
            return f"pinned {self.fingerprint}"
        if self.known_hosts is not None:
            return f"known_hosts {self.known_hosts}"
        return "NOT CHECKED (insecure_skip_host_key)" if self.insecure_skip else "not pinned"

    def to_json(self) -> dict[str, object]:
        return {"host_key_fingerprint": self.fingerprint,
                "known_hosts": str(self.known_hosts) if self.known_hosts else None,
                "insecure_skip_host_key": self.insecure_skip}


def fingerprint_sha256(key_blob: bytes) -> str:
    """OpenSSH's SHA-256 fingerprint of a public key's wire blob: ``SHA256:`` + unpadded
    base64."""
    digest = hashlib.sha256(key_blob).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def parse_fingerprint(text: str) -> str:
    """``text`` if it is an OpenSSH SHA-256 fingerprint (``SHA256:`` + 43 base64 characters);
    raises ``ValueError`` saying the expected form otherwise."""
    value = text.strip()
    if not _FINGERPRINT_RE.match(value):
        raise ValueError(f"must be an OpenSSH SHA-256 fingerprint such as "
                         f"'SHA256:{'A' * 43}' (ssh-keygen -lf KEY.pub), got {text!r}")
    return value


def check_host_key(policy: HostKeyPolicy, host: str, port: int, key_type: str,
                   key_blob: bytes, *, key: str = "ocs") -> None:
    """Raise :class:`HostKeyRefused` unless the key ``host:port`` offered passes ``policy``.

    ``key`` is where the settings live (e.g. ``ocs.rails[1]``), for the message.
    """
    offered = fingerprint_sha256(key_blob)
    if policy.fingerprint is not None:
        if offered == policy.fingerprint:
            return
        raise HostKeyRefused(
            f"the switch offered SSH host key {key_type} {offered}, but "
            f"{key}.host_key_fingerprint pins {policy.fingerprint}; refusing to log in "
            "(another machine may pose as the switch, or its key changed: check the key on "
            "the switch's console before changing the pin)")
    if policy.known_hosts is not None:
        known = known_host_keys(policy.known_hosts, host, port)
        if (key_type, key_blob) in known:
            return
        if known:
            raise HostKeyRefused(
                f"the switch offered SSH host key {key_type} {offered}, which is not the "
                f"key {policy.known_hosts} holds for {_names(host, port)[-1]}; refusing to "
                "log in (another machine may pose as the switch, or its key changed)")
        raise HostKeyRefused(
            f"{policy.known_hosts} ({key}.known_hosts) has no key for "
            f"{' or '.join(_names(host, port))}; the switch offered {key_type} {offered}. "
            f"If that is the switch's key, add it: `ssh-keyscan -p {port} {host} >> "
            f"{policy.known_hosts}`, or pin it with {key}.host_key_fingerprint: \"{offered}\"")
    if policy.insecure_skip:
        return
    raise HostKeyRefused(
        f"the switch's SSH host key is not pinned, so the password was not sent. It offered "
        f"{key_type} {offered}. If that is the switch's key (compare it with the switch's "
        f"console), pin it in the ocs: mapping with\n    host_key_fingerprint: \"{offered}\"\n"
        f"or name a known_hosts file holding it (known_hosts: FILE; e.g. `ssh-keyscan -p "
        f"{port} {host} >> FILE`). `insecure_skip_host_key: true` skips the check (anyone on "
        "the management network could then pose as the switch).")


def known_host_keys(path: Path, host: str, port: int) -> set[tuple[str, bytes]]:
    """``(key type, wire blob)`` of every key ``path`` (OpenSSH known_hosts) holds for
    ``host`` on ``port``; hashed names (``|1|salt|hash``) are matched too.

    Raises ``HostKeyRefused`` if the file cannot be read (no file, no trust).
    """
    try:
        text = path.read_text()
    except OSError as exc:
        raise HostKeyRefused(f"cannot read known_hosts file {path}: "
                             f"{exc.strerror or exc}") from None
    names = _names(host, port)
    found: set[tuple[str, bytes]] = set()
    for line in text.splitlines():
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        if fields[0].startswith("@"):  # @revoked / @cert-authority: not a plain pin
            continue
        if len(fields) < 3:
            continue
        patterns, key_type, blob64 = fields[0], fields[1], fields[2]
        if not any(_matches(pattern, name) for pattern in patterns.split(",")
                   for name in names):
            continue
        try:
            blob = base64.b64decode(blob64, validate=True)
        except (binascii.Error, ValueError):
            continue
        found.add((key_type, blob))
    return found


def _names(host: str, port: int) -> list[str]:
    """How known_hosts names ``host``: bare on port 22, ``[host]:port`` otherwise."""
    return [host] if port == 22 else [host, f"[{host}]:{port}"]


def _matches(pattern: str, name: str) -> bool:
    if pattern.startswith("|1|"):
        try:
            _, _, salt64, hash64 = pattern.split("|")
            salt = base64.b64decode(salt64)
            want = base64.b64decode(hash64)
        except (ValueError, binascii.Error):
            return False
        return hmac.compare_digest(hmac.new(salt, name.encode(), hashlib.sha1).digest(), want)
    return pattern == name
