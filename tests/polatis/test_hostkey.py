"""NETCONF checks the switch's SSH host key before it sends the password."""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import os
from pathlib import Path

import asyncssh
import pytest

from controller.drivers.config import OcsConfigError
from controller.drivers.hostkey import (
    HostKeyPolicy,
    HostKeyRefused,
    check_host_key,
    fingerprint_sha256,
    parse_fingerprint,
)
from controller.drivers.polatis.errors import DeviceHostKeyRefused
from controller.drivers.registry import make_driver, parse_ocs_config
from emulator.polatis import NetconfServer, PolatisDevice
from emulator.polatis.netconf_server import host_key_fingerprint, load_host_key

from .conftest import ENV, FINGERPRINT, PASSWORD, SIZE, ocs_config

OTHER = host_key_fingerprint(asyncssh.generate_private_key("ssh-ed25519"))


def _known_hosts_line(name: str, key: asyncssh.SSHKey, hashed: bool = False) -> str:
    blob = base64.b64encode(key.public_data).decode()
    if hashed:
        salt = os.urandom(20)
        digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
        name = f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"
    return f"{name} {key.get_algorithm()} {blob}\n"


def test_a_wrong_pinned_key_is_refused_before_the_password_is_sent(
        netconf: NetconfServer) -> None:
    with pytest.raises(DeviceHostKeyRefused) as err:
        make_driver(ocs_config("netconf", netconf.port, host_key_fingerprint=OTHER), env=ENV)
    text = str(err.value)
    assert f"offered SSH host key ssh-ed25519 {FINGERPRINT}" in text
    assert f"ocs.host_key_fingerprint pins {OTHER}" in text
    assert netconf.password_attempts == 0
    assert PASSWORD not in text


def test_an_unpinned_switch_is_refused_naming_the_key_to_set(netconf: NetconfServer) -> None:
    config = ocs_config("netconf", netconf.port)
    del config["host_key_fingerprint"]
    with pytest.raises(DeviceHostKeyRefused) as err:
        make_driver(config, env=ENV)
    assert f'host_key_fingerprint: "{FINGERPRINT}"' in str(err.value)
    assert "insecure_skip_host_key: true" in str(err.value)
    assert netconf.password_attempts == 0


def test_the_pinned_key_logs_in(netconf: NetconfServer, device: PolatisDevice) -> None:
    with make_driver(ocs_config("netconf", netconf.port), env=ENV) as driver:
        driver.apply(0, add=[(1, 2)])
        assert device.pairs() == {1: SIZE + 2, 2: SIZE + 1}
    assert netconf.password_attempts == 1


@pytest.mark.parametrize("hashed", [False, True])
def test_known_hosts_holds_the_key(tmp_path: Path, netconf: NetconfServer,
                                   hashed: bool) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("# lab switches\n" + _known_hosts_line(
        f"[127.0.0.1]:{netconf.port}", netconf.host_key, hashed))
    with make_driver(ocs_config("netconf", netconf.port, known_hosts=str(known)),
                     env=ENV) as driver:
        assert driver.describe()[0].rail == 0
    # another key for this host: an impostor, refused
    known.write_text(_known_hosts_line(f"[127.0.0.1]:{netconf.port}",
                                       asyncssh.generate_private_key("ssh-ed25519"), hashed))
    with pytest.raises(DeviceHostKeyRefused, match="not the key"):
        make_driver(ocs_config("netconf", netconf.port, known_hosts=str(known)), env=ENV)
    # no line for this host: refused, saying how to add it
    known.write_text(_known_hosts_line("[10.0.0.9]:830", netconf.host_key))
    with pytest.raises(DeviceHostKeyRefused, match=f"ssh-keyscan -p {netconf.port} 127.0.0.1"):
        make_driver(ocs_config("netconf", netconf.port, known_hosts=str(known)), env=ENV)
    assert netconf.password_attempts == 1


def test_insecure_skip_connects_and_warns_every_time(netconf: NetconfServer,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    config = ocs_config("netconf", netconf.port, insecure_skip_host_key=True)
    assert "host_key_fingerprint" not in config
    caplog.set_level(logging.WARNING, logger="controller.drivers.polatis.netconf")
    for _ in range(2):
        with make_driver(config, env=ENV):
            pass
    warnings = [r for r in caplog.records if "NOT checked" in r.getMessage()]
    assert len(warnings) == 2


def test_host_key_settings_are_validated() -> None:
    base = {"driver": "polatis-netconf", "host": "h"}
    with pytest.raises(OcsConfigError, match=r"ocs\.host_key_fingerprint: must be an OpenSSH"):
        parse_ocs_config({**base, "host_key_fingerprint": "aa:bb:cc"})
    with pytest.raises(OcsConfigError, match="give one of"):
        parse_ocs_config({**base, "host_key_fingerprint": FINGERPRINT, "known_hosts": "k"})
    with pytest.raises(OcsConfigError, match="insecure_skip_host_key: must be true or false"):
        parse_ocs_config({**base, "insecure_skip_host_key": "yes"})
    with pytest.raises(OcsConfigError, match=r"ocs\.host_key_fingerprint: applies to NETCONF"):
        parse_ocs_config({"driver": "polatis-tl1", "host": "h",
                          "host_key_fingerprint": FINGERPRINT})
    dev = parse_ocs_config({**base, "host_key_fingerprint": FINGERPRINT}).devices[0]
    assert dev.host_key == HostKeyPolicy(fingerprint=FINGERPRINT)
    assert dev.to_json()["host_key_fingerprint"] == FINGERPRINT


def test_fingerprint_is_openssh_sha256() -> None:
    blob = b"\x00\x00\x00\x0bssh-ed25519" + bytes(36)
    digest = base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
    assert fingerprint_sha256(blob) == f"SHA256:{digest}"
    assert parse_fingerprint(f" SHA256:{digest} ") == f"SHA256:{digest}"
    check_host_key(HostKeyPolicy(fingerprint=f"SHA256:{digest}"), "h", 830, "ssh-ed25519", blob)
    with pytest.raises(HostKeyRefused, match="not pinned"):
        check_host_key(HostKeyPolicy(), "h", 830, "ssh-ed25519", blob)
    with pytest.raises(HostKeyRefused, match="cannot read known_hosts"):
        check_host_key(HostKeyPolicy(known_hosts=Path("/nonexistent/kh")), "h", 830,
                       "ssh-ed25519", blob)


def test_a_simulator_key_file_is_stable_and_private(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "sim_host_key"
    first = host_key_fingerprint(load_host_key(path))
    assert path.stat().st_mode & 0o777 == 0o600
    assert host_key_fingerprint(load_host_key(path)) == first
    device = PolatisDevice(SIZE)
    with NetconfServer(device, host_key=path) as server:
        assert server.host_key_fingerprint == first
